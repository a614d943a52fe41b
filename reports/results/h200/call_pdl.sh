#!/usr/bin/env bash
# One single-H200 call for programmatic dependent launch (EngineConfig.programmatic_dependent_launch), in a
# clean working tree of the commit under test (CALL_ROOT=.):
# 1. GPU tests: each kernel and a layer's chain of them with and without PDL, eager and in a CUDA graph (same
#    bits); the fast engine with and without PDL (fp32 and bf16, graphs, chunked prefill, async scheduling);
# 2. decode-bs1 with --async-scheduling, PDL off and on alternating: qwen3-0.6b and qwen3-8b two rounds, the
#    8B's 2-way rank share one round; then qwen3-0.6b with PDL beside transformers' generate.
: "${COMMIT:?set COMMIT to the commit under test}"
CALL_ROOT=. source reports/results/h200/call_lib.sh
run gpu_tests 200 python -m pytest -q -p no:cacheprovider -n 8 -m gpu -rA tests/kernels/test_pdl.py \
    tests/test_fast_gpu.py -k "pdl or programmatic or async or graphs"
BENCH=(--dtype bfloat16 --engine fast --max-model-len 2048 --no-progress --async-scheduling --commit "$COMMIT")
for round in 1 2; do
    for mode in no-programmatic-dependent-launch programmatic-dependent-launch; do
        run "0.6b-$mode-$round" 45 python -m twinfer.cli bench decode-bs1 --shape qwen3-0.6b "${BENCH[@]}" --repeats 5 \
            --$mode --json "$R/decode-bs1-0.6b-$mode-$round.json"
        run "8b-$mode-$round" 50 python -m twinfer.cli bench decode-bs1 --shape qwen3-8b "${BENCH[@]}" --repeats 3 \
            --$mode --json "$R/decode-bs1-8b-$mode-$round.json"
        [[ $round == 1 ]] && run "8b-share2-$mode" 40 python -m twinfer.cli bench decode-bs1 --shape qwen3-8b \
            --rank-share 2 "${BENCH[@]}" --repeats 5 --$mode --json "$R/decode-bs1-8b-share2-$mode.json"
    done
done
run 0.6b-pdl-hf 80 python -m twinfer.cli bench decode-bs1 --shape qwen3-0.6b "${BENCH[@]}" --programmatic-dependent-launch \
    --baseline hf --json "$R/decode-bs1-0.6b-pdl-hf.json"
cat "$R/done.txt"
grep -E "passed|failed" "$R/gpu_tests.log" | tail -n 3
for f in "$R"/[08]*.log; do echo "== $f"; tr '\r' '\n' < "$f" | grep -E '^(fast|hf) ' | cut -c1-120; done
tar czf "$OUT/results.tgz" -C "$OUT" r && rm -rf "$R"
