#!/usr/bin/env bash
# One single-H200 call, run from a `git archive` of the commit under test unpacked in .clean/ (carry ".clean"):
# the qwen3-8b shape whole and as one rank's share of 2-way tensor parallelism (`bench --rank-share 2`: half
# the heads, KV heads, intermediate size and vocabulary, no collectives), decode-bs1 with --profile and
# offline-256, so the two-rank engine's step can be set against a rank's compute floor.
: "${COMMIT:?set COMMIT to the commit under test}"
source .clean/reports/results/h200/call_lib.sh
COMMON=(--shape qwen3-8b --dtype bfloat16 --no-progress --commit "$COMMIT" --engine fast)
for share in 1 2; do
    run decode-bs1-share$share 150 python -m twinfer.cli bench decode-bs1 "${COMMON[@]}" --rank-share $share --profile \
        --json "$R/decode-bs1-share$share.json"
done
for share in 2 1; do
    run offline-256-share$share 150 python -m twinfer.cli bench offline-256 "${COMMON[@]}" --rank-share $share \
        --json "$R/offline-256-share$share.json"
done
cat "$R/done.txt"
for f in "$R"/*.log; do echo "== $f"; tr '\r' '\n' < "$f" | grep -v '%|' | grep -v '^\s*$' | tail -n 6 | cut -c1-250; done
tar czf "$OUT/results.tgz" -C "$OUT" r && rm -rf "$R"
