#!/usr/bin/env bash
# One single-H200 call, in a clean working tree of the commit under test (CALL_ROOT=.): the decode split kernel
# with one loop over the tiles of all a program's splits (no loop over splits around a loop over tiles).
# 1. the decode kernel's GPU tests; 2. reports.decode_splits_bench, default grid and --sweep-grid;
# 3. decode-sweep on qwen3-0.6b at the default context and at --max-model-len 2048, as in decode_peel_b8d827d/.
: "${COMMIT:?set COMMIT to the commit under test}"
CALL_ROOT=. source reports/results/h200/call_lib.sh
run gpu_tests 80 python -m pytest -q -p no:cacheprovider -n 8 -m gpu -rA tests/kernels/test_decode_attention.py
run splits 40 python -m reports.decode_splits_bench --json "$R/decode_splits.json"
run grid_sweep 50 python -m reports.decode_splits_bench --sweep-grid --json "$R/decode_grid_sweep.json"
SWEEP=(bench decode-sweep --shape qwen3-0.6b --dtype bfloat16 --engine fast --no-progress --async-scheduling
       --max-num-seqs 256 --max-num-batched-tokens 8192 --commit "$COMMIT")
run sweep-default 75 python -m twinfer.cli "${SWEEP[@]}" --json "$R/sweep-default.json"
run sweep-2048 60 python -m twinfer.cli "${SWEEP[@]}" --max-model-len 2048 --json "$R/sweep-2048.json"
cat "$R/done.txt"
grep -E "^(FAILED|ERROR)|passed|failed" "$R/gpu_tests.log" | tail -n 5
cut -c1-200 "$R/splits.log"
for f in "$R"/sweep*.log; do echo "== $f"; tr '\r' '\n' < "$f" | grep -E '^(fast|hf) ' | cut -c1-120; done
tar czf "$OUT/results.tgz" -C "$OUT" r && rm -rf "$R"
