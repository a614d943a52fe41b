#!/usr/bin/env bash
# One single-H200 call: offline-256 with --async-scheduling before steps were launched ahead (51a2986, in
# .ab/old, a `git archive`; carry [".ab"]) and at the commit under test (the working tree), alternating, two
# rounds; then, at the commit under test, offline-256 step by step, decode-sweep with and without async
# scheduling, and decode-bs1 beside transformers' generate.
: "${COMMIT:?set COMMIT to the commit under test}"
CALL_ROOT=. source reports/results/h200/call_lib.sh
COMMON=(--shape qwen3-0.6b --dtype bfloat16 --engine fast --max-model-len 2048 --no-progress)
OFFLINE=(--max-num-seqs 256 --max-num-batched-tokens 8192)
for round in 1 2; do
    for side in old new; do
        commit=$([ "$side" = old ] && echo 51a2986 || echo "$COMMIT")
        dir=$([ "$side" = old ] && echo .ab/old || echo .)
        run_in "$dir" "offline-256-async-$side-$round" 60 python -m twinfer.cli bench offline-256 "${COMMON[@]}" \
            "${OFFLINE[@]}" --async-scheduling --commit "$commit" --json "$R/offline-256-async-$side-$round.json"
    done
done
run_in . offline-256-sync-new 60 python -m twinfer.cli bench offline-256 "${COMMON[@]}" "${OFFLINE[@]}" \
    --commit "$COMMIT" --json "$R/offline-256-sync-new.json"
for mode in no-async-scheduling async-scheduling; do
    run_in . "decode-sweep-$mode" 90 python -m twinfer.cli bench decode-sweep "${COMMON[@]}" --max-num-seqs 256 \
        --max-num-batched-tokens 8192 --$mode --commit "$COMMIT" --json "$R/decode-sweep-$mode.json"
done
run_in . decode-bs1-async-hf 80 python -m twinfer.cli bench decode-bs1 "${COMMON[@]}" --async-scheduling --baseline hf \
    --commit "$COMMIT" --json "$R/decode-bs1-async-hf.json"
cat "$R/done.txt"
for f in "$R"/*.log; do echo "== $f"; tr '\r' '\n' < "$f" | grep -E '^(fast|hf) ' | cut -c1-120; done
tar czf "$OUT/results.tgz" -C "$OUT" r && rm -rf "$R"
