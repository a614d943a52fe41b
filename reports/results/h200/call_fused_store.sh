#!/usr/bin/env bash
# One single-H200 call for the fused q/k norm + RoPE + KV store kernel (0c76ea7), run in a clean working tree
# of the commit under test, with a `git archive` of 84e116d (two kernels a layer) in .ab/old (carry [".ab"]).
# 1. the GPU tests at the new commit: the fused kernel against the two kernels in turn (bf16, fp16, fp32),
#    the elementwise and KV-store kernel tests, and the fast engine's GPU tests;
# 2. decode-bs1 with --async-scheduling, old and new alternating, two rounds, qwen3-0.6b and qwen3-8b;
# 3. decode-bs1 qwen3-8b at the new commit with async scheduling, profiled, beside transformers (in the call
#    made its limit was 90 s, too short for transformers' part; now 150 s).
: "${COMMIT:?set COMMIT to the commit under test}"
CALL_ROOT=. source reports/results/h200/call_lib.sh
run_in . gpu_tests 240 python -m pytest -q -p no:cacheprovider -n 8 -m gpu -rA tests/kernels/test_qk_norm_rope_store_kv.py \
    tests/kernels/test_elementwise.py tests/kernels/test_kv_store.py tests/test_fast_gpu.py
BENCH=(--dtype bfloat16 --engine fast --max-model-len 2048 --no-progress --async-scheduling)
for round in 1 2; do
    for side in old new; do
        commit=$([ "$side" = old ] && echo 84e116d || echo "$COMMIT")
        dir=$([ "$side" = old ] && echo .ab/old || echo .)
        run_in "$dir" "0.6b-$side-$round" 45 python -m twinfer.cli bench decode-bs1 --shape qwen3-0.6b "${BENCH[@]}" \
            --repeats 5 --commit "$commit" --json "$R/decode-bs1-0.6b-$side-$round.json"
        run_in "$dir" "8b-$side-$round" 50 python -m twinfer.cli bench decode-bs1 --shape qwen3-8b "${BENCH[@]}" \
            --repeats 3 --commit "$commit" --json "$R/decode-bs1-8b-$side-$round.json"
    done
done
run_in . 8b-new-async-hf-profile 150 python -m twinfer.cli bench decode-bs1 --shape qwen3-8b "${BENCH[@]}" \
    --commit "$COMMIT" --baseline hf --profile --json "$R/decode-bs1-8b-new-async-hf-profile.json"
cat "$R/done.txt"
grep -E "passed|failed" "$R/gpu_tests.log" | tail -n 3
for f in "$R"/[08]*.log; do echo "== $f"; tr '\r' '\n' < "$f" | grep -E '^(fast|hf) ' | cut -c1-120; done
tar czf "$OUT/results.tgz" -C "$OUT" r && rm -rf "$R"
