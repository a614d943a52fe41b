#!/usr/bin/env bash
# One single-H200 call, run from a `git archive` of the commit under test unpacked in .clean/ (carry ".clean"):
# the fused all-reduce + add + RMSNorm kernel's GPU tests (tests/kernels/test_all_reduce_norm.py -m gpu): 2 and
# 4 ranks on streams of one GPU against the unfused sequence, bit for bit, now with the bounded barrier wait; a
# peer that never arrives (the kernel must trap after its 0.5 s timeout) and one that arrives 1 s late (within
# a 10 s timeout: no trap, exact sums). The two-GPU test skips.
source .clean/reports/results/h200/call_lib.sh
run gpu_kernel 200 python -m pytest -q -p no:cacheprovider -m gpu -rA tests/kernels/test_all_reduce_norm.py
cat "$R/done.txt"
grep -E "^(PASSED|FAILED|ERROR|SKIPPED)|passed|failed" "$R/gpu_kernel.log" | tail -n 20
tar czf "$OUT/results.tgz" -C "$OUT" r && rm -rf "$R"
