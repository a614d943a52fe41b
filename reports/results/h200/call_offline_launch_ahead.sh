#!/usr/bin/env bash
# One single-H200 call: offline-256 with --async-scheduling before steps were launched ahead (51a2986, in
# .ab/old, a `git archive`; carry [".ab"]) and at the commit under test (the working tree), alternating, two
# rounds; then, at the commit under test, offline-256 step by step, decode-sweep with and without async
# scheduling, and decode-bs1 beside transformers' generate.
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
COMMON=(--shape qwen3-0.6b --dtype bfloat16 --engine fast --max-model-len 2048 --no-progress)
OFFLINE=(--max-num-seqs 256 --max-num-batched-tokens 8192)
for round in 1 2; do
    for side in old new; do
        commit=$([ "$side" = old ] && echo 51a2986 || echo "$COMMIT")
        dir=$([ "$side" = old ] && echo .ab/old || echo .)
        step "offline-256-async-$side-$round" 60 "$dir" python -m twinfer.cli bench offline-256 "${COMMON[@]}" \
            "${OFFLINE[@]}" --async-scheduling --commit "$commit" --json "$R/offline-256-async-$side-$round.json"
    done
done
step offline-256-sync-new 60 . python -m twinfer.cli bench offline-256 "${COMMON[@]}" "${OFFLINE[@]}" \
    --commit "$COMMIT" --json "$R/offline-256-sync-new.json"
for mode in no-async-scheduling async-scheduling; do
    step "decode-sweep-$mode" 90 . python -m twinfer.cli bench decode-sweep "${COMMON[@]}" --max-num-seqs 256 \
        --max-num-batched-tokens 8192 --$mode --commit "$COMMIT" --json "$R/decode-sweep-$mode.json"
done
step decode-bs1-async-hf 80 . python -m twinfer.cli bench decode-bs1 "${COMMON[@]}" --async-scheduling --baseline hf \
    --commit "$COMMIT" --json "$R/decode-bs1-async-hf.json"
cat "$R/done.txt"
for f in "$R"/*.log; do echo "== $f"; tr '\r' '\n' < "$f" | grep -E '^(fast|hf) ' | cut -c1-120; done
tar czf "$OUT/results.tgz" -C "$OUT" r && rm -rf "$R"
