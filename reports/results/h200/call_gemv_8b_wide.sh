#!/usr/bin/env bash
# One single-H200 call, run from a `git archive` of the commit under test unpacked in .clean/ (carry ".clean"):
# the GEMV's wide sweep at one row on the whole Qwen3-8B shapes (only a quick sweep had been run there).
: "${COMMIT:?set COMMIT to the commit under test}"
source .clean/reports/results/h200/call_lib.sh
run gemv-8b-m1-wide 300 python -m reports.gemv_bench --models Qwen3-8B --rows 1 --sweep wide --commit "$COMMIT" \
    --json "$R/gemv-8b-m1-wide.json"
cat "$R/done.txt"
grep -v "^compile error" "$R/gemv-8b-m1-wide.log" | tail -n 8 | cut -c1-200
tar czf "$OUT/results.tgz" -C "$OUT" r && rm -rf "$R"
