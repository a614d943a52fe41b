#!/usr/bin/env bash
# One nvidia-h200-x2 call (an nvidia-h200-x4 call with tensor parallelism on GPUs 0,1 was refused: that kind
# was not lent), run from a
# `git archive` of the commit under test unpacked in .clean/.
# GPU 0:    batch-invariant mode: the matmul benchmark, the GPU tests (invariance, the fast engine against the
#           reference and transformers, the sampler), offline-256 with the mode on (profiled) and off.
# GPU 1:    the server under load, offline-256 beside transformers (profiled), decode-bs1 with the mode on and off.
# Each item runs only if its limit fits in what is left of the call.
set -o pipefail
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=2
: "${COMMIT:?set COMMIT to the commit under test}"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || echo "wheels not installed" >> "$OUT/skipped.txt"
cd .clean || exit 1
R=$OUT/r
mkdir -p "$R/invariant" "$R/server" "$R/bench"
START=$SECONDS
run() {  # run GPUS NAME LIMIT_S COMMAND...
    local gpus=$1 name=$2 limit=$3; shift 3
    local left=$((570 - (SECONDS - START)))
    if ((left < 40)); then echo "skipped $name: ${left}s left" >> "$R/skipped.txt"; return; fi
    ((limit > left)) && limit=$left
    CUDA_VISIBLE_DEVICES=$gpus timeout "$limit" "$@" > "$R/$name.log" 2>&1
    echo "$name rc=$? at $((SECONDS - START))s (limit ${limit}s)" >> "$R/done.txt"
}
COMMON=(--dtype bfloat16 --no-progress --commit "$COMMIT" --engine fast)
OFFLINE=(--shape qwen3-0.6b --max-model-len 2048 --max-num-seqs 256 --max-num-batched-tokens 8192)
(
    run 0 invariant/invariant_matmul_bench 120 python -m reports.invariant_matmul_bench \
        --json "$R/invariant/invariant_matmul_bench.json" --shapes qwen3-0.6b,qwen3-8b
    run 0 invariant/gpu_tests 240 env TWINFER_RESULTS_DIR="$R/invariant" python -m pytest -q -p no:cacheprovider \
        -n 6 -m gpu -rA tests/test_batch_invariant_gpu.py tests/kernels/test_matmul.py tests/test_fast_gpu.py \
        tests/test_sampler_independent.py tests/kernels/test_gumbel_sample.py
    run 0 invariant/offline-256-batch-invariant 100 python -m twinfer.cli bench offline-256 "${COMMON[@]}" \
        "${OFFLINE[@]}" --batch-invariant --profile --json "$R/invariant/offline-256-batch-invariant.json"
    run 0 invariant/offline-256-no-batch-invariant 70 python -m twinfer.cli bench offline-256 "${COMMON[@]}" \
        "${OFFLINE[@]}" --no-batch-invariant --json "$R/invariant/offline-256-no-batch-invariant.json"
) &
(
    run 1 server/server_load 170 env PYTHONPATH=/tmp/site python -m reports.server_load --model qwen3-0.6b \
        --engine fast --dtype bfloat16 --clients 1,16,64,256 --modes thread,process --max-num-seqs 256 \
        --max-num-batched-tokens 8192 --max-model-len 2048 --client raw --clients-per-process 32 --json "$R/server/server_load.json"
    run 1 bench/offline-256 300 python -m twinfer.cli bench offline-256 "${COMMON[@]}" "${OFFLINE[@]}" \
        --baseline hf --profile --json "$R/bench/offline-256.json"
    for mode in batch-invariant no-batch-invariant; do
        run 1 invariant/decode-bs1-$mode 45 python -m twinfer.cli bench decode-bs1 --shape qwen3-0.6b \
            "${COMMON[@]}" --max-model-len 2048 --$mode --json "$R/invariant/decode-bs1-$mode.json"
    done
) &
wait
cat "$R/done.txt" "$R/skipped.txt" 2>/dev/null
for f in "$R"/*/*.log; do echo "== $f"; tr '\r' '\n' < "$f" | grep -v '%|' | grep -v '^\s*$' | tail -n 6 | cut -c1-300; done
tar czf "$OUT/results.tgz" -C "$OUT" r && rm -rf "$R"
