#!/bin/sh
# The landing candidate against main's engine code (5b6cd25), alternating, in one call, each side from a copy under
# .clean/ (carry .clean): head = 5b6cd25; cand = the landing commit (.clean/cand/COMMIT):
#   - linear_add_rmsnorm's last program takes rows wider than 1024 columns in passes (experiment/add-norm-chunked:
#     8B's o_proj GEMV from 128 back to 72 registers a thread in the sm_90 build) -> qwen3-8b decode-bs1, no flags
#     (5.071 ms at 5b6cd25 against 4.530 at b32b067 before the fusions);
#   - the invariant matmul's split path only up to 64 rows (experiment/invariant-fused-from-rows) -> batch-invariant
#     offline-256 (-9.4% against no flags at 5b6cd25);
#   - the arrival count in one helper (fast/kernels/arrival.py; the same code inlined) -> qwen3-0.6b decode-bs1 in
#     both modes, where every decode step runs all three users of it.
# Every run has its own time limit and writes its JSON and log to OUT at once; then the decode
# split kernel at 4 and 8 warps (decode_warps.py) and the invariant matmul's kernel sweep from the candidate
# (M = 128 added), if time is left.
#   trees: mk() { mkdir -p .clean/$1 && git archive $2 fast spec twinfer reports/__init__.py reports/bench \
#     | tar -x -C .clean/$1 --exclude=twinfer/models/stdlib-tiny && git rev-parse $2 > .clean/$1/COMMIT; }
#     mk head 5b6cd25; mk cand LANDING
#   sh reports/results/bench/landing_ab_session13/run.sh OUT
out=$1
run() {  # label, tree, workload, shape, extra flags, time limit
    (cd ".clean/$2" && timeout "$6" python -m twinfer.cli bench "$3" --shape "$4" --dtype bfloat16 --engine fast \
        --no-progress --commit "$(head -c 40 COMMIT)-$2" --json "$out/$1.json" $5 >"$out/$1.log" 2>&1)
    echo "$1 rc=$? at $(date +%s)"; grep -E '^(fast|hf) ' "$out/$1.log"
}
date +%s
for round in 1 2; do
    run 8b-head-$round head decode-bs1 qwen3-8b "" 70
    run 8b-cand-$round cand decode-bs1 qwen3-8b "" 70
done
for round in 1 2; do
    run offline-inv-head-$round head offline-256 qwen3-0.6b --batch-invariant 80
    run offline-inv-cand-$round cand offline-256 qwen3-0.6b --batch-invariant 80
done
for round in 1 2; do
    run 06b-head-$round head decode-bs1 qwen3-0.6b "" 35
    run 06b-cand-$round cand decode-bs1 qwen3-0.6b "" 35
done
run 06b-inv-head-1 head decode-bs1 qwen3-0.6b --batch-invariant 40
run 06b-inv-cand-1 cand decode-bs1 qwen3-0.6b --batch-invariant 40
script="$(pwd)/reports/results/bench/landing_ab_session13/decode_warps.py"
(cd .clean/cand && PYTHONPATH=. timeout 60 python "$script" >"$out/decode_warps.txt" 2>&1)
echo "decode-warps rc=$?"; cat "$out/decode_warps.txt"
(cd .clean/cand && timeout 100 python -m reports.bench.kernels.invariant_matmul --shapes qwen3-0.6b \
    --configs default,fused,split --commit "$(head -c 40 COMMIT)" --json "$out/invariant_matmul_bench.json" >"$out/invariant_matmul_bench.log" 2>&1)
echo "sweep rc=$?"; grep -A4 "^forward pass" "$out/invariant_matmul_bench.log"
