#!/usr/bin/env bash
# One single-H200 call, run in a clean working tree of the commit under test (CALL_ROOT=.): does the decode
# kernel's cost grow with max_model_len (its split count) at a fixed context?
# 1. reports.decode_splits_bench: decode_attention alone, max_seq_len 2048 / 8192 / 40960;
# 2. decode-bs1 at qwen3-0.6b with --max-model-len 2048 (every earlier benchmark) and without it (the
#    model's 40,960: what a user gets by default), async scheduling, PDL by default.
: "${COMMIT:?set COMMIT to the commit under test}"
CALL_ROOT=. source reports/results/h200/call_lib.sh
run splits 120 python -m reports.decode_splits_bench --json "$R/decode_splits.json"
BENCH=(--shape qwen3-0.6b --dtype bfloat16 --engine fast --no-progress --async-scheduling --commit "$COMMIT" --repeats 3)
run bs1-2048 60 python -m twinfer.cli bench decode-bs1 "${BENCH[@]}" --max-model-len 2048 --json "$R/decode-bs1-2048.json"
run bs1-default 60 python -m twinfer.cli bench decode-bs1 "${BENCH[@]}" --json "$R/decode-bs1-default.json"
cat "$R/done.txt"
cat "$R/splits.log" | cut -c1-200
for f in "$R"/bs1*.log; do echo "== $f"; tr '\r' '\n' < "$f" | grep -E '^(fast|hf) ' | cut -c1-160; done
tar czf "$OUT/results.tgz" -C "$OUT" r && rm -rf "$R"
