#!/usr/bin/env bash
# One single-H200 call, run from a `git archive` of the commit under test unpacked in .clean/ (carry ".clean"):
# the GEMV at one rank's share of Qwen3-8B under 2-way tensor parallelism: a wide sweep at M=1 (decode-bs1),
# a quick one at M=2..16, and the whole model's shapes at M=1 with the defaults (the same run's baseline).
: "${COMMIT:?set COMMIT to the commit under test}"
source .clean/reports/results/h200/call_lib.sh
run gemv-tp2-m1-wide 300 python -m reports.gemv_bench --models Qwen3-8B-TP2 --rows 1 --sweep wide --commit "$COMMIT" \
    --json "$R/gemv-tp2-m1-wide.json"
run gemv-8b-m1 60 python -m reports.gemv_bench --models Qwen3-8B --rows 1 --sweep none --commit "$COMMIT" \
    --json "$R/gemv-8b-m1.json"
run gemv-tp2-quick 200 python -m reports.gemv_bench --models Qwen3-8B-TP2 --rows 2,4,8,16 --sweep quick \
    --commit "$COMMIT" --json "$R/gemv-tp2-quick.json"
cat "$R/done.txt"
for f in "$R"/*.log; do echo "== $f"; grep -v "^compile error" "$f" | tail -n 22 | cut -c1-200; done
tar czf "$OUT/results.tgz" -C "$OUT" r && rm -rf "$R"
