#!/usr/bin/env bash
# One nvidia-h200-x2 call for tensor parallelism, run from a `git archive` of the commit under test
# unpacked in .clean/ (carry ".clean"):
# 0. the GPUs' interconnect (nvidia-smi topo -m, nvlink status): NVLink or PCIe decides the all-reduce times.
# 1. tp_bench --profile: all-reduce microbenchmark (rows 1, 64, 256), the 2-rank engine then the 1-rank engine
#    (qwen3-8b, bf16; PDL off, as in the earlier records), each phase also once under torch.profiler in rank 0's
#    process.
# 1b. the same with --async-scheduling (each step launched before the last one's tokens are read) and
#     --programmatic-dependent-launch on both engines: the settings of the best one-GPU figures (bench/pdl/).
# 1c. the same as 1b with --fused-all-reduce-norm (each decode layer's all-reduces fused with the add + RMSNorm
#     after them, fast/kernels/all_reduce_norm.py).
# PART=figures runs 0-1b; PART=tests runs 2 (the two do not fit in one call's ten minutes); PART=best runs 0, 1c
# and 1b (about 400 s: the 0.7x figure at the best settings, with and without the fused kernel).
# 2. each GPU test of tests/test_tensor_parallel_gpu.py in its own pytest process, with faulthandler: a run that
#    outlives its limit gets SIGABRT and prints every thread's Python stack (an earlier call's pytest passed its
#    four tests and then did not exit within its limit).
export PYTHONFAULTHANDLER=1 CALL_SIGNAL=ABRT CALL_BUDGET_S=585
RESULTS_NAME=tp source .clean/reports/results/h200/call_lib.sh
nvidia-smi topo -m > "$R/topology.txt" 2>&1
nvidia-smi nvlink -s >> "$R/topology.txt" 2>&1
export TWINFER_RESULTS_DIR=$R
[[ ${PART:-figures} == figures ]] && run tp_bench 240 python -m reports.tp_bench --ranks 2,1 --profile \
    --no-programmatic-dependent-launch --json "$R/tp_bench.json"
if [[ ${PART:-figures} == best ]]; then
    run tp_bench_fused 230 python -m reports.tp_bench --ranks 2,1 --async-scheduling --programmatic-dependent-launch \
        --fused-all-reduce-norm --json "$R/tp_bench_fused.json"
fi
if [[ ${PART:-figures} == figures || ${PART:-figures} == best ]]; then
    run tp_bench_async 200 python -m reports.tp_bench --ranks 2,1 --async-scheduling --programmatic-dependent-launch \
        --json "$R/tp_bench_async.json"
fi
[[ ${PART:-figures} == tests ]] && for test in test_fp32_two_ranks_against_the_reference test_fp32_cuda_graphs_on_and_off_identical_with_two_ranks \
    test_fp32_async_scheduling_with_two_ranks_identical_to_step_by_step test_one_shot_all_reduce_equals_nccl_in_fp32 \
    test_fused_all_reduce_norm_equals_nccl_in_fp32 test_bf16_two_ranks_near_tie_rule_qwen3_8b test_a_worker_killed_mid_generation_makes_rank_0_raise; do
    # The qwen3-8b test writes its 16 GB checkpoint first when the figures' call did not leave it on this machine.
    limit=150; [[ $test == *qwen3_8b ]] && limit=260; [[ $test == *killed* ]] && limit=220  # two: unfused, fused
    run "gpu_$test" $limit python -m pytest -q -p no:cacheprovider -rA -m gpu \
        "tests/test_tensor_parallel_gpu.py::$test"
done
head -n 12 "$R/topology.txt"
cat "$R/done.txt"
[[ ${PART:-figures} == tests ]] && run gpu_fused_kernel 120 python -m pytest -q -p no:cacheprovider -rA -m gpu \
    tests/kernels/test_all_reduce_norm.py
for f in "$R"/tp_bench*.log; do echo "== $f"; grep -v '%|' "$f" | tail -n 14; done
for f in "$R"/gpu_*.log; do echo "== $f"; tail -n 2 "$f"; done
tar czf "$OUT/tp.tgz" -C "$OUT" tp
