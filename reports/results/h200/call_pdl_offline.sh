#!/usr/bin/env bash
# One single-H200 call, in a clean working tree of the commit under test (CALL_ROOT=.): does programmatic
# dependent launch help or hurt beyond batch 1? offline-256 with --async-scheduling, PDL off and on
# alternating, two rounds; decode-sweep with --async-scheduling and PDL (to set beside bench/offline_launch_ahead/).
: "${COMMIT:?set COMMIT to the commit under test}"
CALL_ROOT=. source reports/results/h200/call_lib.sh
COMMON=(--shape qwen3-0.6b --dtype bfloat16 --engine fast --max-model-len 2048 --no-progress --async-scheduling \
    --max-num-seqs 256 --max-num-batched-tokens 8192 --commit "$COMMIT")
for round in 1 2; do
    for mode in no-programmatic-dependent-launch programmatic-dependent-launch; do
        run "offline-256-$mode-$round" 60 python -m twinfer.cli bench offline-256 "${COMMON[@]}" --$mode \
            --json "$R/offline-256-$mode-$round.json"
    done
done
run decode-sweep-programmatic-dependent-launch 90 python -m twinfer.cli bench decode-sweep "${COMMON[@]}" \
    --programmatic-dependent-launch --json "$R/decode-sweep-programmatic-dependent-launch.json"
cat "$R/done.txt"
for f in "$R"/*.log; do echo "== $f"; tr '\r' '\n' < "$f" | grep -E '^(fast|hf) ' | cut -c1-120; done
tar czf "$OUT/results.tgz" -C "$OUT" r && rm -rf "$R"
