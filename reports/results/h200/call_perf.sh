#!/usr/bin/env bash
# One nvidia-h200-x2 call after the sampler kernel, start-up compilation and decode split changes.
# GPU 0: the GPU tests those changes touch, the server under load, batch-invariant mode on and off
# (offline-256), then the memory check. GPU 1: the workloads not yet measured beside transformers
# (prefix-shared, long-context, decode-bs1 on the 8B shape), then offline-256 and decode-bs1 again,
# profiled. Each item runs only if its time limit fits in what is left of the call.
set -o pipefail
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=2
: "${COMMIT:?set COMMIT to the commit under test}"
R=$OUT/r
mkdir -p "$R/tests" "$R/bench" "$R/memory" "$R/server" "$R/invariant"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || echo "wheels not installed" >> "$R/skipped.txt"
START=$SECONDS
COMMON=(--dtype bfloat16 --no-progress --commit "$COMMIT" --engine fast)
run() {  # run GPU NAME LIMIT_S COMMAND...
    local gpu=$1 name=$2 limit=$3; shift 3
    local left=$((575 - (SECONDS - START)))
    if ((left < limit)); then echo "skipped $name: ${left}s left" >> "$R/skipped.txt"; return; fi
    CUDA_VISIBLE_DEVICES=$gpu timeout "$limit" "$@" > "$R/$name.log" 2>&1
    echo "$name rc=$? at $((SECONDS - START))s" >> "$R/done.txt"
}
OFFLINE=(--shape qwen3-0.6b --max-model-len 2048 --max-num-seqs 256 --max-num-batched-tokens 8192)
(
    run 0 tests/gpu_tests 200 python -m pytest -q -p no:cacheprovider -n 8 -m gpu -rf \
        tests/kernels/test_gumbel_sample.py tests/kernels/test_decode_attention.py tests/test_sampler_independent.py \
        tests/test_fast_gpu.py tests/test_cuda_graph_sizes.py
    run 0 server/server_load 130 env PYTHONPATH=/tmp/site python -m reports.server_load --model qwen3-0.6b \
        --engine fast --dtype bfloat16 --clients 1,16,64,256 --modes thread,process --max-num-seqs 256 \
        --max-num-batched-tokens 8192 --max-model-len 2048 --json "$R/server/server_load.json"
    for mode in no-batch-invariant batch-invariant; do
        run 0 invariant/offline-256-$mode 75 python -m twinfer.cli bench offline-256 "${COMMON[@]}" "${OFFLINE[@]}" \
            --$mode --json "$R/invariant/offline-256-$mode.json"
    done
    run 0 memory/memory_check 200 python -m reports.memory_check --shape qwen3-0.6b --dtype bfloat16 --runs 10 \
        --max-num-seqs 256 --max-num-batched-tokens 8192 --max-model-len 2048 --no-progress --commit "$COMMIT" \
        --json "$R/memory/memory_check.json"
) &
run 1 bench/prefix-shared 120 python -m twinfer.cli bench prefix-shared --shape qwen3-0.6b "${COMMON[@]}" \
    --baseline hf --json "$R/bench/prefix-shared.json"
run 1 bench/long-context 130 python -m twinfer.cli bench long-context --shape qwen3-0.6b "${COMMON[@]}" \
    --repeats 2 --max-num-batched-tokens 16384 --baseline hf --json "$R/bench/long-context.json"
run 1 bench/decode-bs1-8b 150 python -m twinfer.cli bench decode-bs1 --shape qwen3-8b "${COMMON[@]}" \
    --max-model-len 2048 --baseline hf --json "$R/bench/decode-bs1-qwen3-8b.json"
run 1 bench/offline-256 100 python -m twinfer.cli bench offline-256 "${COMMON[@]}" "${OFFLINE[@]}" --profile \
    --json "$R/bench/offline-256.json"
run 1 bench/decode-bs1 60 python -m twinfer.cli bench decode-bs1 --shape qwen3-0.6b "${COMMON[@]}" \
    --max-model-len 2048 --baseline hf --profile --json "$R/bench/decode-bs1.json"
wait
cat "$R/done.txt" "$R/skipped.txt" 2>/dev/null
tail -n 5 "$R"/*/*.log
tar czf "$OUT/results.tgz" -C "$OUT" r
