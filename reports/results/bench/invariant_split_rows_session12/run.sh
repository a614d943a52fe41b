#!/bin/sh
# Batch-invariant offline-256 at 5b6cd25 ran 20,675 tok/s, -9.4% against no flags (the target: within 5%),
# with its matmul 1.53 s against the default mode's 0.87 s (../targets_session12/): nearly every projection took the
# split path, 256-row decode steps too, where c949ea7's kernel sweep had the fused path faster (a forward pass's
# projections 1.51 x cuBLAS against 1.92). experiment/invariant-fused-from-rows takes the split path only
# up to SPLIT_MAX_ROWS = 64 rows (the same bits either way). One call, carry [".clean"]:
#   1. the invariant matmul's kernel sweep from the tree sent (experiment/invariant-fused-from-rows checked out:
#      its TIMED_ROWS has 128 too), default / fused / split at Qwen3-0.6B's shapes: where the crossover is;
#   2. offline-256 (qwen3-0.6b, bf16, --batch-invariant), 5b6cd25 against 5b6cd25 with the branch's matmul.py,
#      alternating, two of each, from copies under .clean/ (head; invfused), the first pair with --profile.
#   trees: mkdir -p .clean/invfused && cp -r .clean/head/. .clean/invfused/ && \
#     git show experiment/invariant-fused-from-rows:fast/kernels/matmul.py > .clean/invfused/fast/kernels/matmul.py && \
#     echo "$(git rev-parse experiment/invariant-fused-from-rows) (5b6cd25 with its matmul.py)" > .clean/invfused/COMMIT
#   sh reports/results/bench/invariant_split_rows_session12/run.sh OUT
out=$1
timeout 150 python -m reports.bench.kernels.invariant_matmul --shapes qwen3-0.6b --configs default,fused,split \
    --json "$out/invariant_matmul_bench.json" >"$out/invariant_matmul_bench.log" 2>&1
echo "sweep rc=$?"; grep -A4 "^forward pass" "$out/invariant_matmul_bench.log"
run() {  # label, tree, extra flags
    (cd ".clean/$2" && timeout 110 python -m twinfer.cli bench offline-256 --shape qwen3-0.6b --dtype bfloat16 \
        --engine fast --no-progress --batch-invariant --commit "$(head -c 40 COMMIT)-$2" --json "$out/$1.json" $3 \
        >"$out/$1.log" 2>&1)
    echo "$1 rc=$?"; grep -E '^(fast|hf) ' "$out/$1.log"
}
run offline-inv-head-1 head --profile
run offline-inv-invfused-1 invfused --profile
run offline-inv-head-2 head ""
run offline-inv-invfused-2 invfused ""
