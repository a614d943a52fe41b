#!/usr/bin/env bash
# One nvidia-h200-x2 call: GPU 0 runs the deep-profile whole-engine fuzz of the fast engine; GPU 1
# profiles offline-256 and decode-bs1 (bench --profile), then runs decode-sweep and prefix-shared
# beside transformers while time remains.
set -o pipefail
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=4
: "${COMMIT:?set COMMIT to the commit under test}"
R=$OUT/r
mkdir -p "$R/fuzz" "$R/bench"
START=$SECONDS
(CUDA_VISIBLE_DEVICES=0 TWINFER_FUZZ_STATS=$R/fuzz/engine_fuzz_deep_stats.json timeout 560 python -m pytest -q \
    -p no:cacheprovider fuzz/test_engine_fuzz.py -k "fast" --hypothesis-profile=deep \
    > "$R/fuzz/engine_fuzz_deep.log" 2>&1; echo "rc=$? wall=$((SECONDS - START))s" >> "$R/fuzz/engine_fuzz_deep.log") &
COMMON=(--shape qwen3-0.6b --dtype bfloat16 --no-progress --max-model-len 2048 --commit "$COMMIT" --engine fast)
bench() {  # bench NAME LIMIT_S ARGS...
    local name=$1 limit=$2; shift 2
    local left=$((570 - (SECONDS - START)))
    if ((left < limit)); then echo "skipped $name: ${left}s left" >> "$R/bench/skipped.txt"; return; fi
    CUDA_VISIBLE_DEVICES=1 timeout "$limit" python -m twinfer.cli bench "$@" "${COMMON[@]}" --json "$R/bench/$name.json" \
        > "$R/bench/$name.log" 2>&1
    echo "$name rc=$? at $((SECONDS - START))s" >> "$R/bench/done.txt"
}
bench offline-256-profile 200 offline-256 --max-num-seqs 256 --max-num-batched-tokens 8192 --profile
bench decode-bs1-profile 60 decode-bs1 --profile
bench decode-sweep 220 decode-sweep --baseline hf
bench prefix-shared 120 prefix-shared --baseline hf
wait
cat "$R/bench/done.txt" "$R/bench/skipped.txt" 2>/dev/null
tail -n 3 "$R"/*/*.log
tar czf "$OUT/results.tgz" -C "$OUT" r
