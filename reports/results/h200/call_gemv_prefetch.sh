#!/usr/bin/env bash
# One single-H200 call: the GEMV reading its first weight tile before its PDL wait (fb20366, since reverted: slower),
# A/B against the commit before.
# Run in a clean working tree of the commit under test (CALL_ROOT=.; NEW), with a `git archive` of the commit
# before it unpacked in .ab/old (OLD):
# 1. GPU tests: the GEMV with and without PDL at the engine's shapes (same bits), the PDL chain, the GEMV's own
#    tests, the fast engine's PDL, graph and async tests;
# 2. decode-bs1 with --async-scheduling --programmatic-dependent-launch, old and new alternating: qwen3-0.6b and
#    the 8B's 2-way rank share two rounds, qwen3-8b one; then qwen3-0.6b (new) beside transformers' generate.
: "${OLD:?set OLD to the commit before}" "${NEW:?set NEW to the commit under test}"
CALL_ROOT=. source reports/results/h200/call_lib.sh
run gpu_tests 150 python -m pytest -q -p no:cacheprovider -n 8 -m gpu -rA tests/kernels/test_pdl.py \
    tests/kernels/test_gemv.py tests/test_fast_gpu.py -k "pdl or programmatic or gemv or Gemv or graphs or async"
BENCH=(--dtype bfloat16 --engine fast --max-model-len 2048 --no-progress --async-scheduling
    --programmatic-dependent-launch)
for round in 1 2; do
    for side in old new; do
        dir=.; commit=$NEW; [[ $side == old ]] && dir=.ab/old && commit=$OLD
        run_in "$dir" "0.6b-$side-$round" 45 python -m twinfer.cli bench decode-bs1 --shape qwen3-0.6b "${BENCH[@]}" \
            --commit "$commit" --repeats 5 --json "$R/decode-bs1-0.6b-$side-$round.json"
        [[ $round == 1 ]] && run_in "$dir" "8b-$side-$round" 50 python -m twinfer.cli bench decode-bs1 --shape qwen3-8b \
            "${BENCH[@]}" --commit "$commit" --repeats 3 --json "$R/decode-bs1-8b-$side-$round.json"
        run_in "$dir" "8b-share2-$side-$round" 40 python -m twinfer.cli bench decode-bs1 --shape qwen3-8b --rank-share 2 \
            "${BENCH[@]}" --commit "$commit" --repeats 5 --json "$R/decode-bs1-8b-share2-$side-$round.json"
    done
done
run 0.6b-new-hf 80 python -m twinfer.cli bench decode-bs1 --shape qwen3-0.6b "${BENCH[@]}" --commit "$NEW" \
    --baseline hf --json "$R/decode-bs1-0.6b-new-hf.json"
cat "$R/done.txt"
grep -E "passed|failed" "$R/gpu_tests.log" | tail -n 3
for f in "$R"/[08]*.log; do echo "== $f"; tr '\r' '\n' < "$f" | grep -E '^(fast|hf) ' | cut -c1-120; done
tar czf "$OUT/results.tgz" -C "$OUT" r && rm -rf "$R"
