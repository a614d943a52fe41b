#!/usr/bin/env bash
# One single-H200 call, run from a `git archive` of the commit under test unpacked in .clean/ (carry ".clean"):
# the fast engine's GPU tests first (async scheduling with steps launched ahead, bit for bit against step by
# step, among them), then decode-bs1 with and without --async-scheduling: qwen3-0.6b and qwen3-8b each beside
# transformers' generate in the same process, and the 8B's 2-way rank share.
: "${COMMIT:?set COMMIT to the commit under test}"
source .clean/reports/results/h200/call_lib.sh
run gpu_tests 220 python -m pytest -q -p no:cacheprovider -n 8 -m gpu -rA tests/test_fast_gpu.py
COMMON=(--dtype bfloat16 --no-progress --commit "$COMMIT" --engine fast)
for mode in sync async; do
    extra=()
    [[ $mode == async ]] && extra=(--async-scheduling)
    run 0.6b-$mode 80 python -m twinfer.cli bench decode-bs1 --shape qwen3-0.6b --max-model-len 2048 "${COMMON[@]}" \
        --baseline hf "${extra[@]}" --json "$R/decode-bs1-0.6b-$mode-hf.json"
    run 8b-$mode 90 python -m twinfer.cli bench decode-bs1 --shape qwen3-8b --max-model-len 2048 "${COMMON[@]}" \
        --baseline hf "${extra[@]}" --json "$R/decode-bs1-8b-$mode-hf.json"
    run 8b-share2-$mode 45 python -m twinfer.cli bench decode-bs1 --shape qwen3-8b --rank-share 2 "${COMMON[@]}" \
        --repeats 5 "${extra[@]}" --json "$R/decode-bs1-8b-share2-$mode.json"
done
cat "$R/done.txt"
grep -E "passed|failed" "$R/gpu_tests.log" | tail -n 3
for f in "$R"/*.log; do echo "== $f"; tr '\r' '\n' < "$f" | grep -v '%|' | grep -E '^(fast|hf) ' | cut -c1-200; done
tar czf "$OUT/results.tgz" -C "$OUT" r && rm -rf "$R"
