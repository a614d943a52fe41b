#!/usr/bin/env bash
# One single-H200 call, run from a `git archive` of the commit under test unpacked in .clean/ (carry ".clean"):
# decode-bs1 with and without --async-scheduling, each beside transformers' generate in the same process,
# on qwen3-0.6b and qwen3-8b.
: "${COMMIT:?set COMMIT to the commit under test}"
source .clean/reports/results/h200/call_lib.sh
COMMON=(--dtype bfloat16 --no-progress --commit "$COMMIT" --engine fast --baseline hf)
for shape in qwen3-0.6b qwen3-8b; do
    for mode in sync async; do
        extra=()
        [[ $mode == async ]] && extra=(--async-scheduling)
        run $shape-$mode 150 python -m twinfer.cli bench decode-bs1 --shape $shape --max-model-len 2048 "${COMMON[@]}" \
            "${extra[@]}" --json "$R/decode-bs1-$shape-$mode-hf.json"
    done
done
cat "$R/done.txt"
for f in "$R"/*.log; do echo "== $f"; tr '\r' '\n' < "$f" | grep -v '%|' | grep -E '^(fast|hf) ' | cut -c1-200; done
tar czf "$OUT/results.tgz" -C "$OUT" r && rm -rf "$R"
