#!/usr/bin/env bash
# One H200 call for the batch-invariant mode's packed attention tiles (commit 6647519 on), run from a
# `git archive` of the commit under test unpacked in .clean/ (carry ".clean"; run from the repository root).
# Not yet run: written when the session's device time was spent. In order:
# 1. correctness first: the GPU kernel tests of the prefill kernel (packed tiles bitwise the same
#    however a prompt is chunked), the engine's batch-invariant GPU tests, and tests/test_fast_gpu.py
#    (with async scheduling against step by step, bit for bit);
# 2. the attention microbenchmark (reports/invariant_attention_bench.py);
# 3. decode-bs1 and offline-256 with the mode on and off, one at a time.
set -o pipefail
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=2
: "${COMMIT:?set COMMIT to the commit under test}"
cd .clean || exit 1
R=$OUT/r
mkdir -p "$R"
(TWINFER_RESULTS_DIR=$R timeout 200 python -m pytest -q -p no:cacheprovider -rA -n 8 -m gpu \
    tests/kernels/test_prefill_attention.py tests/test_batch_invariant_gpu.py tests/test_fast_gpu.py \
    > "$R/gpu_tests.log" 2>&1
    echo "rc=$?" >> "$R/gpu_tests.log")
timeout 90 python -m reports.invariant_attention_bench --json "$R/attention_bench.json" > "$R/attention_bench.log" 2>&1
COMMON=(--shape qwen3-0.6b --dtype bfloat16 --no-progress --max-model-len 2048 --commit "$COMMIT" --engine fast)
for mode in no-batch-invariant batch-invariant; do
    timeout 40 python -m twinfer.cli bench decode-bs1 "${COMMON[@]}" --$mode --profile \
        --json "$R/decode-bs1-$mode.json" > "$R/decode-bs1-$mode.log" 2>&1
    timeout 70 python -m twinfer.cli bench offline-256 "${COMMON[@]}" --$mode --max-num-seqs 256 \
        --max-num-batched-tokens 8192 --json "$R/offline-256-$mode.json" > "$R/offline-256-$mode.log" 2>&1
done
tail -n 4 "$R"/*.log
tar czf "$OUT/results.tgz" -C "$OUT" r
