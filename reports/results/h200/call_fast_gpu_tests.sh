#!/usr/bin/env bash
# One single-H200 call, run from a `git archive` of the commit under test unpacked in .clean/ (carry ".clean"):
# the fast engine's GPU tests (async scheduling bit for bit against step by step among them) and the GEMV's.
source .clean/reports/results/h200/call_lib.sh
run gpu_tests 400 python -m pytest -q -p no:cacheprovider -n 8 -m gpu -rA tests/test_fast_gpu.py tests/kernels/test_gemv.py
cat "$R/done.txt"
grep -E "^(PASSED|FAILED|ERROR)|passed|failed" "$R/gpu_tests.log" | tail -n 40
tar czf "$OUT/results.tgz" -C "$OUT" r && rm -rf "$R"
