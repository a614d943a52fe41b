#!/usr/bin/env bash
# One nvidia-h200-x2 call for tensor parallelism, run from a `git archive` of the commit under test
# unpacked in .clean/ (so that edits in the working tree do not travel into the measurement).
# 1. tp_bench: all-reduce microbenchmark, then the 2-rank engine and the 1-rank engine (qwen3-8b, bf16).
# 2. the GPU tests of tests/test_tensor_parallel_gpu.py (fp32 0.6b shape, graphs on/off, one-shot vs NCCL,
#    a killed worker), then the bf16 near-tie test on the qwen3-8b shape (reuses tp_bench's checkpoint).
set -o pipefail
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=2
cd .clean || exit 1
R=$OUT/tp
mkdir -p "$R"
START=$SECONDS
run() {  # run NAME LIMIT_S COMMAND...
    local name=$1 limit=$2; shift 2
    local left=$((${CALL_BUDGET_S:-580} - (SECONDS - START)))
    if ((left < 30)); then echo "skipped $name: ${left}s left" >> "$R/skipped.txt"; return; fi
    ((limit > left)) && limit=$left
    timeout "$limit" "$@" > "$R/$name.log" 2>&1
    echo "$name rc=$? at $((SECONDS - START))s (limit ${limit}s)" >> "$R/done.txt"
}
export TWINFER_RESULTS_DIR=$R
run tp_bench 330 python -m reports.tp_bench --ranks 2,1 --json "$R/tp_bench.json"
run gpu_tests 160 python -m pytest -q -p no:cacheprovider -rA -m gpu tests/test_tensor_parallel_gpu.py -k "not qwen3_8b"
run gpu_tests_8b 200 python -m pytest -q -p no:cacheprovider -rA -m gpu tests/test_tensor_parallel_gpu.py -k qwen3_8b
cat "$R/done.txt" "$R/skipped.txt" 2>/dev/null
grep -v '%|' "$R/tp_bench.log" | tail -n 30
tail -n 15 "$R/gpu_tests.log" "$R/gpu_tests_8b.log"
tar czf "$OUT/tp.tgz" -C "$OUT" tp
