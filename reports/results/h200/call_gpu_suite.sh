#!/usr/bin/env bash
# One single-H200 call, run from a `git archive` of the commit under test unpacked in .clean/ (carry ".clean"):
# every GPU test of tests/ and fuzz/ (-m gpu, -n 8); the two-GPU tests skip on one GPU.
source .clean/reports/results/h200/call_lib.sh
run gpu_suite 540 python -m pytest -q -p no:cacheprovider -n 8 -m gpu -rA --durations=25 tests fuzz
cat "$R/done.txt"
grep -E "^(FAILED|ERROR)|passed|failed" "$R/gpu_suite.log" | tail -n 30
tar czf "$OUT/results.tgz" -C "$OUT" r && rm -rf "$R"
