#!/usr/bin/env bash
# One single-H200 call, run from a `git archive` of the commit under test unpacked in .clean/ (carry ".clean"):
# every GPU test of tests/ and fuzz/ (-m gpu, -n 8; the memory check's alone, after); the two-GPU tests skip on one GPU.
source .clean/reports/results/h200/call_lib.sh
# The memory check's GPU test counts the whole device's memory: it runs alone, after the others.
ALONE=tests/test_memory_check.py::test_real_figures_on_a_gpu
run gpu_suite 480 python -m pytest -q -p no:cacheprovider -n 8 -m gpu -rA --durations=25 tests fuzz --deselect "$ALONE"
run gpu_alone 90 python -m pytest -q -p no:cacheprovider -m gpu -rA "$ALONE"
cat "$R/done.txt"
grep -E "^(FAILED|ERROR)|passed|failed" "$R/gpu_suite.log" "$R/gpu_alone.log" | tail -n 30
tar czf "$OUT/results.tgz" -C "$OUT" r && rm -rf "$R"
