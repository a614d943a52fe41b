#!/bin/sh
# qwen3-8b decode-bs1, no flags, bf16, one process a run, one each (the session's device time was nearly spent), each side from a copy under .clean/ (carry
# .clean): cur = 7ed58af (one sequence's 32-key splits landed), new = 96ed522 (128-key splits); then the memory
# check's GPU test alone, which failed in the whole suite at 7ed58af when other workers took the GPU's memory.
#   sh reports/results/bench/decode_split_ab/run_8b_landed.sh OUT
out=$1
export OMP_NUM_THREADS=2
run() {  # label, tree
    (cd ".clean/$2" && timeout 60 python -m twinfer.cli bench decode-bs1 --shape qwen3-8b --dtype bfloat16 \
        --engine fast --no-progress --commit "$(head -c 40 COMMIT)-$2" --json "$out/$1.json" >"$out/$1.log" 2>&1)
    echo "$1 rc=$?"; grep -E '^fast ' "$out/$1.log"
}
timeout 90 python -m pytest -q -p no:cacheprovider tests/reports/test_memory_check.py -k test_real_figures_on_a_gpu \
    > "$out/memory_check_alone.log" 2>&1; echo "memory check alone rc=$?"; tail -1 "$out/memory_check_alone.log"
run 8b-cur-1 cur
run 8b-new-1 new
