#!/usr/bin/env bash
# One single-H200 call, in a clean working tree of the commit under test (CALL_ROOT=.) with a `git archive` of
# the commit before in .ab/old: the decode kernel's split grid bounded by the SM count instead of max_seq_len.
# 1. GPU tests: the decode kernel (against float64, CUDA-graph replay) and the fast engine's GPU tests (graphs
#    on/off, async, PDL, bit-for-bit comparisons);
# 2. reports.decode_splits_bench at the new commit (the old one's is decode_splits_9613ba5/);
# 3. decode-sweep on qwen3-0.6b at the model's default context (no --max-model-len: 40,960), old and new
#    alternating, two rounds; then the new one at --max-model-len 2048 (the earlier benchmarks' setting).
: "${COMMIT:?set COMMIT to the commit under test}"
CALL_ROOT=. source reports/results/h200/call_lib.sh
run gpu_tests 200 python -m pytest -q -p no:cacheprovider -n 8 -m gpu -rA tests/kernels/test_decode_attention.py \
    tests/test_fast_gpu.py
run splits 60 python -m reports.decode_splits_bench --json "$R/decode_splits.json"
SWEEP=(bench decode-sweep --shape qwen3-0.6b --dtype bfloat16 --engine fast --no-progress --async-scheduling
       --max-num-seqs 256 --max-num-batched-tokens 8192)
for round in 1 2; do
    run_in .ab/old "sweep-old-$round" 60 python -m twinfer.cli "${SWEEP[@]}" --commit 9613ba5 --json "$R/sweep-old-$round.json"
    run "sweep-new-$round" 60 python -m twinfer.cli "${SWEEP[@]}" --commit "$COMMIT" --json "$R/sweep-new-$round.json"
done
run sweep-new-2048 60 python -m twinfer.cli "${SWEEP[@]}" --max-model-len 2048 --commit "$COMMIT" \
    --json "$R/sweep-new-2048.json"
cat "$R/done.txt"
grep -E "passed|failed" "$R/gpu_tests.log" | tail -n 3
cut -c1-200 "$R/splits.log"
for f in "$R"/sweep*.log; do echo "== $f"; tr '\r' '\n' < "$f" | grep -E '^(fast|hf) ' | cut -c1-120; done
tar czf "$OUT/results.tgz" -C "$OUT" r && rm -rf "$R"
