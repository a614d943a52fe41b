#!/bin/sh
# Which of the last-program fusions costs qwen3-8b decode-bs1 its time? At 5b6cd25 (all three fusions) the no-flag
# 8b decode-bs1 took 5.071 ms (GPU busy 5.056 ms a step) against 4.530 ms (busy 4.499) at b32b067 a session before,
# while the same call's 0.6b A/B gave 1.032 against 1.064 ms (../../fast_gpu/suite_and_report/run_5b6cd25/).
# Five trees in one call, alternating, each from a copy under .clean/ (carry .clean):
#   base: 8b0c94d (main before the fusions); head: 5b6cd25 (all three);
#   no2:  5b6cd25 with fast/model.py from 8b0c94d (o_proj and down without their add + RMSNorm: linear_add_rmsnorm
#         unused; the decode reduction in the last split program stays);
#   no1:  5b6cd25 with fast/attention.py and fast/kernels/decode_attention.py from 8b0c94d (the reduce kernel again;
#         linear_add_rmsnorm stays);
#   chunked: 5b6cd25 with fast/kernels/gemv.py from experiment/add-norm-chunked (the last program takes a
#         row wider than 1024 columns in passes; at 8B's o_proj a whole 4096-column row in 2 warps took the kernel
#         from 72 to 128 registers a thread, cuobjdump of the sm_90 build).
# (batch-invariant mode is not run: the third fusion only acts there.) In the order the decision needs them: 8b
# head/chunked/base/no2 with --profile, 0.6b chunked/head, 8b no1 with --profile, 0.6b no2; then linear_add_rmsnorm's
# tests on the GPU from the repository root (the tree sent is experiment/add-norm-chunked: its wide-row test and the
# 8B real shapes); then a second 8b round. Each run has its own time limit and writes its JSON and log to OUT at
# once, so what ran comes back if the call is cut.
#   trees: C=5b6cd25; mk() { mkdir -p .clean/$1 && git archive $C fast spec twinfer reports/__init__.py reports/bench \
#     | tar -x -C .clean/$1 --exclude=twinfer/models/stdlib-tiny; }; mk head; mk no2; mk no1; mk chunked; then the files
#     above from 8b0c94d or experiment/add-norm-chunked (git show REF:PATH > .clean/TREE/PATH)
#   sh reports/results/bench/fusions_ab_session12/run.sh OUT
out=$1
run() {  # label, tree, shape, extra flags, time limit
    (cd ".clean/$2" && timeout "$5" python -m twinfer.cli bench decode-bs1 --shape "$3" --dtype bfloat16 --engine fast \
        --no-progress --commit "$(head -c 40 COMMIT)-$2" --json "$out/$1.json" $4 >"$out/$1.log" 2>&1)
    echo "$1 rc=$?"; grep -E '^(fast|hf) ' "$out/$1.log"
}
run 8b-head-1 head qwen3-8b --profile 75
run 8b-chunked-1 chunked qwen3-8b --profile 75
run 8b-base-1 base qwen3-8b --profile 75
run 8b-no2-1 no2 qwen3-8b --profile 75
run 06b-chunked-1 chunked qwen3-0.6b "" 35
run 06b-head-1 head qwen3-0.6b "" 35
run 8b-no1-1 no1 qwen3-8b --profile 75
run 06b-no2-1 no2 qwen3-0.6b "" 35
timeout 120 python -m pytest -q -p no:cacheprovider tests/fast/kernels/test_gemv.py -k add_rmsnorm >"$out/gemv-tests.log" 2>&1
echo "gemv-tests rc=$?"; tail -1 "$out/gemv-tests.log"
run 8b-chunked-2 chunked qwen3-8b "" 60
run 8b-head-2 head qwen3-8b "" 60
run 8b-base-2 base qwen3-8b "" 60
