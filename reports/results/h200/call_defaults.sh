#!/usr/bin/env bash
# One single-H200 call, in the working tree of the commit under test (CALL_ROOT=.):
# 1. the GPU tests of the decode context buckets, CUDA graphs, async scheduling and PDL (the new defaults);
# 2. offline-256 with no flags (EngineConfig's defaults: 256 / 8192 / async on CUDA) against other batch settings,
#    alternating, two rounds; decode-bs1 with no flags against the old defaults with async (the earlier best) and
#    against --max-model-len 2048; decode-sweep with no flags (Qwen3's default 40,960-token context) against
#    --max-model-len 2048, alternating;
# 3. the figures with transformers beside them: decode-bs1 (qwen3-0.6b, qwen3-8b) with no flags; batch-invariant
#    mode's decode-bs1 and offline-256 with no other flags.
: "${COMMIT:?set COMMIT to the commit under test}"
CALL_ROOT=. CALL_BUDGET_S=585 source reports/results/h200/call_lib.sh
run gpu_tests 120 python -m pytest -q -p no:cacheprovider -n 4 -rA tests/test_fast_gpu.py tests/test_paged_attention.py \
    tests/kernels/test_decode_attention.py tests/test_cuda_graph_sizes.py
C=(--dtype bfloat16 --engine fast --no-progress --commit "$COMMIT")
OLD=(--max-num-seqs 64 --max-num-batched-tokens 2048 --async-scheduling)  # the old defaults + async: the earlier best
for round in 1 2; do
    run "offline-defaults-$round" 40 python -m twinfer.cli bench offline-256 --shape qwen3-0.6b "${C[@]}" \
        --json "$R/offline-256-defaults-$round.json"
    run "offline-budget16k-$round" 40 python -m twinfer.cli bench offline-256 --shape qwen3-0.6b "${C[@]}" \
        --max-num-batched-tokens 16384 --json "$R/offline-256-budget16k-$round.json"
done
run offline-seqs512 40 python -m twinfer.cli bench offline-256 --shape qwen3-0.6b "${C[@]}" \
    --max-num-seqs 512 --json "$R/offline-256-seqs512.json"
for round in 1 2; do
    run "bs1-defaults-$round" 30 python -m twinfer.cli bench decode-bs1 --shape qwen3-0.6b "${C[@]}" --repeats 5 \
        --json "$R/decode-bs1-defaults-$round.json"
    run "bs1-old-async-$round" 30 python -m twinfer.cli bench decode-bs1 --shape qwen3-0.6b "${C[@]}" --repeats 5 \
        "${OLD[@]}" --json "$R/decode-bs1-old-async-$round.json"
done
run bs1-2048 30 python -m twinfer.cli bench decode-bs1 --shape qwen3-0.6b "${C[@]}" --repeats 5 --max-model-len 2048 \
    --json "$R/decode-bs1-2048.json"
run sweep-defaults 45 python -m twinfer.cli bench decode-sweep --shape qwen3-0.6b "${C[@]}" \
    --json "$R/decode-sweep-defaults.json"
run sweep-2048 45 python -m twinfer.cli bench decode-sweep --shape qwen3-0.6b "${C[@]}" --max-model-len 2048 \
    --json "$R/decode-sweep-2048.json"
run bs1-hf 90 python -m twinfer.cli bench decode-bs1 --shape qwen3-0.6b "${C[@]}" --baseline hf \
    --json "$R/decode-bs1.json"
run bs1-8b-hf 120 python -m twinfer.cli bench decode-bs1 --shape qwen3-8b "${C[@]}" --baseline hf \
    --json "$R/decode-bs1-qwen3-8b.json"
run bs1-invariant 30 python -m twinfer.cli bench decode-bs1 --shape qwen3-0.6b "${C[@]}" --batch-invariant \
    --json "$R/decode-bs1-batch-invariant.json"
run offline-invariant 45 python -m twinfer.cli bench offline-256 --shape qwen3-0.6b "${C[@]}" --batch-invariant \
    --json "$R/offline-256-batch-invariant.json"
cat "$R/done.txt"
grep -E "passed|failed" "$R/gpu_tests.log" | tail -n 3
for f in "$R"/*.log; do echo "== $(basename "$f")"; tr '\r' '\n' < "$f" | grep -E '^(fast|hf) ' | cut -c1-150; done
