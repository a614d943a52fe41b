#!/usr/bin/env bash
# One nvidia-h200-x2 call, run from a `git archive` of the commit under test unpacked in .clean/.
# 1. Both GPUs: a small two-rank engine started twice in one process (qwen3-0.6b shape, workloads at 5%),
#    with Python tracebacks of every process every 50 s (.dbg/sitecustomize.py) in case it hangs again.
# 2. GPU 0: the fast engine's GPU tests with the GEMV wired in, then decode-bs1 (0.6b and 8b) beside
#    transformers, profiled. GPU 1: long-context beside transformers, with room for transformers.
set -o pipefail
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=2
: "${COMMIT:?set COMMIT to the commit under test}"
ROOT=$PWD
cd .clean || exit 1
R=$OUT/r
mkdir -p "$R/tp" "$R/tests" "$R/bench"
START=$SECONDS
run() {  # run GPUS NAME LIMIT_S COMMAND...
    local gpus=$1 name=$2 limit=$3; shift 3
    local left=$((575 - (SECONDS - START)))
    if ((left < limit)); then echo "skipped $name: ${left}s left" >> "$R/skipped.txt"; return; fi
    CUDA_VISIBLE_DEVICES=$gpus timeout "$limit" "$@" > "$R/$name.log" 2>&1
    echo "$name rc=$? at $((SECONDS - START))s" >> "$R/done.txt"
}
COMMON=(--dtype bfloat16 --no-progress --commit "$COMMIT" --engine fast)
run 0,1 tp/tp_small 150 env PYTHONPATH="$ROOT/.dbg" TWINFER_DUMP_AFTER_S=50 TWINFER_LOG_INFO=1 \
    python -m reports.tp_bench --shape qwen3-0.6b --ranks 2,2 --repeats 1 --scale 0.05 --json "$R/tp/tp_small.json"
(
    run 0 tests/gpu_tests 170 python -m pytest -q -p no:cacheprovider -n 8 -m gpu -rf \
        tests/test_fast_gpu.py tests/kernels/test_gemv.py tests/test_cuda_graph_sizes.py
    run 0 bench/decode-bs1 70 python -m twinfer.cli bench decode-bs1 --shape qwen3-0.6b "${COMMON[@]}" \
        --max-model-len 2048 --baseline hf --profile --json "$R/bench/decode-bs1.json"
    run 0 bench/decode-bs1-8b 150 python -m twinfer.cli bench decode-bs1 --shape qwen3-8b "${COMMON[@]}" \
        --max-model-len 2048 --baseline hf --profile --json "$R/bench/decode-bs1-qwen3-8b.json"
) &
run 1 bench/long-context 330 python -m twinfer.cli bench long-context --shape qwen3-0.6b "${COMMON[@]}" \
    --repeats 2 --max-num-batched-tokens 16384 --baseline hf --json "$R/bench/long-context.json"
wait
cat "$R/done.txt" "$R/skipped.txt" 2>/dev/null
grep -v '%|' "$R/tp/tp_small.log" | tail -n 40
tail -n 4 "$R"/tests/*.log "$R"/bench/*.log
