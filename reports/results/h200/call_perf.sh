#!/usr/bin/env bash
# One nvidia-h200-x2 call after the sampler kernel, start-up compilation and decode split changes.
# GPU 0: the GPU tests those changes touch, then the memory check (pool share, ten offline-256 runs),
# then prefix-shared beside transformers. GPU 1: offline-256, decode-bs1 (both profiled) and
# long-context beside transformers, then the GEMV microbenchmark if time remains.
set -o pipefail
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=2
: "${COMMIT:?set COMMIT to the commit under test}"
R=$OUT/r
mkdir -p "$R/tests" "$R/bench" "$R/memory"
START=$SECONDS
COMMON=(--shape qwen3-0.6b --dtype bfloat16 --no-progress --commit "$COMMIT" --engine fast)
run() {  # run GPU NAME LIMIT_S COMMAND...
    local gpu=$1 name=$2 limit=$3; shift 3
    local left=$((565 - (SECONDS - START)))
    if ((left < limit)); then echo "skipped $name: ${left}s left" >> "$R/skipped.txt"; return; fi
    CUDA_VISIBLE_DEVICES=$gpu timeout "$limit" "$@" > "$R/$name.log" 2>&1
    echo "$name rc=$? at $((SECONDS - START))s" >> "$R/done.txt"
}
GEMV_TESTS=$(ls tests/kernels/test_gemv.py 2>/dev/null)
(
    run 0 tests/gpu_tests 240 python -m pytest -q -p no:cacheprovider -n 4 -m gpu -rf \
        tests/kernels/test_gumbel_sample.py tests/kernels/test_decode_attention.py tests/test_sampler_independent.py \
        tests/test_fast_gpu.py tests/test_cuda_graph_sizes.py tests/test_batch_invariant_gpu.py $GEMV_TESTS
    run 0 memory/memory_check 230 python -m reports.memory_check --shape qwen3-0.6b --dtype bfloat16 --runs 10 \
        --max-num-seqs 256 --max-num-batched-tokens 8192 --max-model-len 2048 --no-progress --commit "$COMMIT" \
        --json "$R/memory/memory_check.json"
    run 0 bench/prefix-shared 150 python -m twinfer.cli bench prefix-shared "${COMMON[@]}" --baseline hf \
        --json "$R/bench/prefix-shared.json"
) &
run 1 bench/offline-256 330 python -m twinfer.cli bench offline-256 "${COMMON[@]}" --max-model-len 2048 \
    --max-num-seqs 256 --max-num-batched-tokens 8192 --baseline hf --profile --json "$R/bench/offline-256.json"
run 1 bench/decode-bs1 90 python -m twinfer.cli bench decode-bs1 "${COMMON[@]}" --max-model-len 2048 \
    --baseline hf --profile --json "$R/bench/decode-bs1.json"
run 1 bench/long-context 130 python -m twinfer.cli bench long-context "${COMMON[@]}" --repeats 2 --baseline hf \
    --max-num-batched-tokens 16384 \
    --json "$R/bench/long-context.json"
if [ -f reports/gemv_bench.py ]; then run 1 bench/gemv 100 python -m reports.gemv_bench --json "$R/bench/gemv.json"; fi
wait
cat "$R/done.txt" "$R/skipped.txt" 2>/dev/null
tail -n 4 "$R"/*/*.log
tar czf "$OUT/results.tgz" -C "$OUT" r
