#!/usr/bin/env bash
# One single-H200 call for the fused q/k norm + RoPE + KV store kernel (0c76ea7), run in a clean working tree
# of the commit under test, with a `git archive` of 84e116d (two kernels a layer) in .ab/old (carry [".ab"]).
# 1. the GPU tests at the new commit: the fused kernel against the two kernels in turn (bf16, fp16, fp32),
#    the elementwise and KV-store kernel tests, and the fast engine's GPU tests;
# 2. decode-bs1 with --async-scheduling, old and new alternating, two rounds, qwen3-0.6b and qwen3-8b;
# 3. decode-bs1 qwen3-8b at the new commit, sync and async, beside transformers, the async run profiled.
: "${COMMIT:?set COMMIT to the commit under test}"
set -o pipefail
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=2
R=$OUT/r
mkdir -p "$R"
START=$SECONDS
step() {  # step NAME LIMIT DIR COMMAND...: run COMMAND in DIR, output in $R/NAME.log
    local name=$1 limit=$2 dir=$3; shift 3
    (cd "$dir" && timeout -k 10 "$limit" "$@" > "$R/$name.log" 2>&1)
    echo "$name rc=$? at $((SECONDS - START))s" >> "$R/done.txt"
}
step gpu_tests 240 . python -m pytest -q -p no:cacheprovider -n 8 -m gpu -rA tests/kernels/test_qk_norm_rope_store_kv.py \
    tests/kernels/test_elementwise.py tests/kernels/test_kv_store.py tests/test_fast_gpu.py
BENCH=(--dtype bfloat16 --engine fast --max-model-len 2048 --no-progress --async-scheduling)
for round in 1 2; do
    for side in old new; do
        commit=$([ "$side" = old ] && echo 84e116d || echo "$COMMIT")
        dir=$([ "$side" = old ] && echo .ab/old || echo .)
        step "0.6b-$side-$round" 45 "$dir" python -m twinfer.cli bench decode-bs1 --shape qwen3-0.6b "${BENCH[@]}" \
            --repeats 5 --commit "$commit" --json "$R/decode-bs1-0.6b-$side-$round.json"
        step "8b-$side-$round" 50 "$dir" python -m twinfer.cli bench decode-bs1 --shape qwen3-8b "${BENCH[@]}" \
            --repeats 3 --commit "$commit" --json "$R/decode-bs1-8b-$side-$round.json"
    done
done
step 8b-new-async-hf-profile 90 . python -m twinfer.cli bench decode-bs1 --shape qwen3-8b "${BENCH[@]}" \
    --commit "$COMMIT" --baseline hf --profile --json "$R/decode-bs1-8b-new-async-hf-profile.json"
cat "$R/done.txt"
grep -E "passed|failed" "$R/gpu_tests.log" | tail -n 3
for f in "$R"/[08]*.log; do echo "== $f"; tr '\r' '\n' < "$f" | grep -E '^(fast|hf) ' | cut -c1-120; done
tar czf "$OUT/results.tgz" -C "$OUT" r && rm -rf "$R"
