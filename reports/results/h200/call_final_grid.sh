#!/usr/bin/env bash
# One single-H200 call, in a clean working tree of the commit under test (CALL_ROOT=.):
# 1. every GPU test of tests/ and fuzz/ (-m gpu, -n 8; the memory check's alone, after);
# 2. reports.decode_splits_bench with decode_attention's default grid (8 programs per SM);
# 3. decode-sweep on qwen3-0.6b at the default context and at --max-model-len 2048 (async scheduling).
: "${COMMIT:?set COMMIT to the commit under test}"
CALL_ROOT=. source reports/results/h200/call_lib.sh
ALONE=tests/test_memory_check.py::test_real_figures_on_a_gpu
run gpu_suite 330 python -m pytest -q -p no:cacheprovider -n 8 -m gpu -rA --durations=25 tests fuzz --deselect "$ALONE"
run gpu_alone 60 python -m pytest -q -p no:cacheprovider -m gpu -rA "$ALONE"
run splits 40 python -m reports.decode_splits_bench --json "$R/decode_splits.json"
SWEEP=(bench decode-sweep --shape qwen3-0.6b --dtype bfloat16 --engine fast --no-progress --async-scheduling
       --max-num-seqs 256 --max-num-batched-tokens 8192 --commit "$COMMIT")
run sweep-default 50 python -m twinfer.cli "${SWEEP[@]}" --json "$R/sweep-default.json"
run sweep-2048 50 python -m twinfer.cli "${SWEEP[@]}" --max-model-len 2048 --json "$R/sweep-2048.json"
cat "$R/done.txt"
grep -E "^(FAILED|ERROR)|passed|failed" "$R/gpu_suite.log" "$R/gpu_alone.log" | tail -n 20
cut -c1-200 "$R/splits.log"
for f in "$R"/sweep*.log; do echo "== $f"; tr '\r' '\n' < "$f" | grep -E '^(fast|hf) ' | cut -c1-120; done
tar czf "$OUT/results.tgz" -C "$OUT" r && rm -rf "$R"
