#!/usr/bin/env bash
# One single-H200 call, run from a `git archive` of the commit under test unpacked in .clean/ (carry ".clean"):
# decode-bs1 with and without --async-scheduling, on qwen3-8b whole, on its 2-way rank share, and on
# qwen3-0.6b: how much of the host gap between decode steps scheduling ahead removes.
: "${COMMIT:?set COMMIT to the commit under test}"
source .clean/reports/results/h200/call_lib.sh
COMMON=(--dtype bfloat16 --no-progress --commit "$COMMIT" --engine fast --repeats 5)
for mode in sync async; do
    extra=()
    [[ $mode == async ]] && extra=(--async-scheduling)
    run 8b-$mode 100 python -m twinfer.cli bench decode-bs1 --shape qwen3-8b "${COMMON[@]}" "${extra[@]}" \
        --json "$R/decode-bs1-8b-$mode.json"
    run 8b-share2-$mode 100 python -m twinfer.cli bench decode-bs1 --shape qwen3-8b --rank-share 2 "${COMMON[@]}" \
        "${extra[@]}" --json "$R/decode-bs1-8b-share2-$mode.json"
    run 0.6b-$mode 60 python -m twinfer.cli bench decode-bs1 --shape qwen3-0.6b --max-model-len 2048 "${COMMON[@]}" \
        "${extra[@]}" --json "$R/decode-bs1-0.6b-$mode.json"
done
cat "$R/done.txt"
for f in "$R"/*.log; do echo "== $f"; tr '\r' '\n' < "$f" | grep -v '%|' | grep -v '^\s*$' | tail -n 1 | cut -c1-250; done
tar czf "$OUT/results.tgz" -C "$OUT" r && rm -rf "$R"
