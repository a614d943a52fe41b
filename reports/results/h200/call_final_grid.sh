#!/usr/bin/env bash
# One single-H200 call, in a clean working tree of the commit under test (CALL_ROOT=.) with a `git archive` of
# 9613ba5 (before the decode grid change) in .ab/old:
# 1. every GPU test of tests/ and fuzz/ (-m gpu, -n 8; the memory check's alone, after);
# 2. reports.decode_splits_bench with decode_attention's default grid (8 programs per SM);
# 3. decode-sweep on qwen3-0.6b at the default context (40,960), old and new alternating, two rounds; the new
#    one at --max-model-len 2048; decode-bs1 at --max-model-len 2048 (the standard setting), old and new.
: "${COMMIT:?set COMMIT to the commit under test}"
CALL_ROOT=. source reports/results/h200/call_lib.sh
ALONE=tests/test_memory_check.py::test_real_figures_on_a_gpu
run gpu_suite 300 python -m pytest -q -p no:cacheprovider -n 8 -m gpu -rA --durations=25 tests fuzz --deselect "$ALONE"
run gpu_alone 60 python -m pytest -q -p no:cacheprovider -m gpu -rA "$ALONE"
run splits 40 python -m reports.decode_splits_bench --json "$R/decode_splits.json"
COMMON=(--shape qwen3-0.6b --dtype bfloat16 --engine fast --no-progress --async-scheduling)
SWEEP=(bench decode-sweep "${COMMON[@]}" --max-num-seqs 256 --max-num-batched-tokens 8192)
for round in 1 2; do
    run_in .ab/old "sweep-old-$round" 45 python -m twinfer.cli "${SWEEP[@]}" --commit 9613ba5 --json "$R/sweep-old-$round.json"
    run "sweep-new-$round" 45 python -m twinfer.cli "${SWEEP[@]}" --commit "$COMMIT" --json "$R/sweep-new-$round.json"
done
run sweep-new-2048 45 python -m twinfer.cli "${SWEEP[@]}" --max-model-len 2048 --commit "$COMMIT" \
    --json "$R/sweep-new-2048.json"
BS1=(bench decode-bs1 "${COMMON[@]}" --max-model-len 2048 --repeats 5)
run_in .ab/old bs1-old 40 python -m twinfer.cli "${BS1[@]}" --commit 9613ba5 --json "$R/bs1-old.json"
run bs1-new 40 python -m twinfer.cli "${BS1[@]}" --commit "$COMMIT" --json "$R/bs1-new.json"
cat "$R/done.txt"
grep -E "^(FAILED|ERROR)|passed|failed" "$R/gpu_suite.log" "$R/gpu_alone.log" | tail -n 20
cut -c1-200 "$R/splits.log"
for f in "$R"/sweep*.log "$R"/bs1*.log; do echo "== $f"; tr '\r' '\n' < "$f" | grep -E '^(fast|hf) ' | cut -c1-120; done
tar czf "$OUT/results.tgz" -C "$OUT" r && rm -rf "$R"
