#!/usr/bin/env bash
# One H200 call: correctness runs side by side (batch-invariant GPU tests, the published report, the
# fast engine's deep engine fuzz), then timing runs one at a time (batch-invariant mode on and off,
# the server under load). Run from the repository root with OUT and COMMIT set.
set -o pipefail
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=4
: "${COMMIT:?set COMMIT to the commit under test}"
R=$OUT/r
mkdir -p "$R/invariant" "$R/report" "$R/server" "$R/fuzz"
(TWINFER_RESULTS_DIR=$R/invariant timeout 230 python -m pytest -q -p no:cacheprovider -m gpu \
    tests/test_batch_invariant_gpu.py > "$R/invariant/gpu_tests.log" 2>&1; echo "rc=$?" >> "$R/invariant/gpu_tests.log") &
(TWINFER_REPORT_PYTEST_WORKERS=6 timeout 230 python -m reports.report --device cuda --model twinfer/models/stdlib-tiny \
    --out "$R/report" --bench-json reports/results/bench/offline-256.json reports/results/bench/decode-bs1.json \
    > "$R/report/report.log" 2>&1; echo "rc=$?" >> "$R/report/report.log") &
(timeout 230 python -m pytest -q -p no:cacheprovider fuzz/test_engine_fuzz.py --hypothesis-profile=deep \
    > "$R/fuzz/engine_fuzz_deep.log" 2>&1; echo "rc=$?" >> "$R/fuzz/engine_fuzz_deep.log") &
wait
COMMON=(--shape qwen3-0.6b --dtype bfloat16 --no-progress --max-model-len 2048 --commit "$COMMIT" --engine fast)
for mode in no-batch-invariant batch-invariant; do
    timeout 50 python -m twinfer.cli bench decode-bs1 "${COMMON[@]}" --$mode \
        --json "$R/invariant/decode-bs1-$mode.json" > "$R/invariant/decode-bs1-$mode.log" 2>&1
    timeout 70 python -m twinfer.cli bench offline-256 "${COMMON[@]}" --$mode --max-num-seqs 256 \
        --max-num-batched-tokens 8192 --json "$R/invariant/offline-256-$mode.json" > "$R/invariant/offline-256-$mode.log" 2>&1
done
timeout 120 python -m reports.server_load --model qwen3-0.6b --engine fast --dtype bfloat16 --clients 1,16,64,256 \
    --modes thread --max-num-seqs 256 --max-num-batched-tokens 8192 --max-model-len 2048 \
    --json "$R/server/server_load.json" > "$R/server/server_load.log" 2>&1
echo "server rc=$?"
tail -n 3 "$R"/*/*.log
tar czf "$OUT/results.tgz" -C "$OUT" r
