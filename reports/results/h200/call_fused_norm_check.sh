#!/usr/bin/env bash
# One single-H200 call, run from a `git archive` of the commit under test unpacked in .clean/ (carry ".clean"):
# 1. the fast engine's GPU tests (the model's layer loop now hands each rank's term to the add + RMSNorm that
#    consumes it), the PDL tests, and the fused all-reduce + add + RMSNorm kernel's tests (ranks on streams of
#    this one GPU; the two-GPU test skips);
# 2. teeth: the same kernel tests on a copy whose kernel skips the barrier must fail.
source .clean/reports/results/h200/call_lib.sh
python -c "from torch._C._distributed_c10d import _SymmetricMemory as S; print(sorted(a for a in dir(S) if not a.startswith(\"__\")))" > "$R/symm_mem_handle.txt" 2>&1
run gpu_tests 330 python -m pytest -q -p no:cacheprovider -n 8 -m gpu -rA tests/test_fast_gpu.py \
    tests/kernels/test_pdl.py tests/kernels/test_all_reduce_norm.py
rm -rf /tmp/teeth && cp -r . /tmp/teeth
sed -i 's/^    _raise_then_wait(signal_pad_ptrs, row \* WORLD, rank, WORLD)$/    pass  # teeth: no barrier/' \
    /tmp/teeth/fast/kernels/all_reduce_norm.py
grep -c "teeth: no barrier" /tmp/teeth/fast/kernels/all_reduce_norm.py > "$R/teeth_patched.txt"
run_in /tmp/teeth teeth_no_barrier 150 python -m pytest -q -p no:cacheprovider -rA \
    "tests/kernels/test_all_reduce_norm.py::test_ranks_on_streams_of_one_gpu_equal_the_unfused_sequence"
cat "$R/done.txt" "$R/teeth_patched.txt" "$R/symm_mem_handle.txt"
grep -E "^(PASSED|FAILED|ERROR)|passed|failed" "$R/gpu_tests.log" | tail -n 40
grep -E "mismatching|passed|failed" "$R/teeth_no_barrier.log" | cut -c1-300 | tail -n 6
tar czf "$OUT/results.tgz" -C "$OUT" r && rm -rf "$R"
