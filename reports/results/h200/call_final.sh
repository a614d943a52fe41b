#!/usr/bin/env bash
# One H200 call: batch-invariant GPU tests beside the published report (both correctness), then the
# server under load, then batch-invariant mode on and off (timing, one at a time). Needs the wheels of
# fastapi/starlette/pydantic/uvicorn/jsonschema (not in the device image) in .whl.
set -o pipefail
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=4
: "${COMMIT:?set COMMIT to the commit under test}"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site || exit 1
R=$OUT/r
mkdir -p "$R/invariant" "$R/report" "$R/server"
(TWINFER_RESULTS_DIR=$R/invariant timeout 150 python -m pytest -q -p no:cacheprovider -m gpu \
    tests/test_batch_invariant_gpu.py tests/kernels/test_prefill_attention.py -k "invariant or differ or hundred or chunked" \
    > "$R/invariant/gpu_tests.log" 2>&1; echo "rc=$?" >> "$R/invariant/gpu_tests.log") &
(TWINFER_REPORT_PYTEST_WORKERS=8 timeout 150 python -m reports.report --quick --device cuda \
    --model twinfer/models/stdlib-tiny --out "$R/report" \
    --bench-json reports/results/bench/offline-256.json reports/results/bench/decode-bs1.json \
    > "$R/report/report.log" 2>&1; echo "rc=$?" >> "$R/report/report.log") &
wait
timeout 120 python -m reports.server_load --model qwen3-0.6b --engine fast --dtype bfloat16 --clients 1,16,64,256 \
    --modes thread --max-num-seqs 256 --max-num-batched-tokens 8192 --max-model-len 2048 \
    --json "$R/server/server_load.json" > "$R/server/server_load.log" 2>&1
echo "server rc=$?"
COMMON=(--shape qwen3-0.6b --dtype bfloat16 --no-progress --max-model-len 2048 --commit "$COMMIT" --engine fast)
for mode in no-batch-invariant batch-invariant; do
    timeout 35 python -m twinfer.cli bench decode-bs1 "${COMMON[@]}" --$mode \
        --json "$R/invariant/decode-bs1-$mode.json" > "$R/invariant/decode-bs1-$mode.log" 2>&1
done
timeout 60 python -m twinfer.cli bench offline-256 "${COMMON[@]}" --batch-invariant --max-num-seqs 256 \
    --max-num-batched-tokens 8192 --json "$R/invariant/offline-256-batch-invariant.json" \
    > "$R/invariant/offline-256-batch-invariant.log" 2>&1
tail -n 4 "$R"/*/*.log
tar czf "$OUT/results.tgz" -C "$OUT" r
