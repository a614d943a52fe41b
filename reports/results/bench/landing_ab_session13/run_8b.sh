#!/bin/sh
# qwen3-8b decode-bs1, no flags, bf16, one process a run, alternating, each side from a copy under .clean/ (carry
# .clean): new = the commit that keeps the last-program fusions only where they paid (at 8B: neither), head =
# 5b6cd25 (both on), base = 8b0c94d (before the fusions). The first call of this session (run.sh) had head 5.071
# and 5.074 ms; the second (in RESULTS.md) head 5.075, without linear_add_rmsnorm 4.774, without the last-program
# reduction 4.912, without either 4.585.
#   trees: .clean/new = git archive of the commit under test, as run.sh's mk
#   sh reports/results/bench/landing_ab_session13/run_8b.sh OUT
out=$1
run() {  # label, tree
    (cd ".clean/$2" && timeout 60 python -m twinfer.cli bench decode-bs1 --shape qwen3-8b --dtype bfloat16 \
        --engine fast --no-progress --commit "$(head -c 40 COMMIT)-$2" --json "$out/$1.json" >"$out/$1.log" 2>&1)
    echo "$1 rc=$?"; grep -E '^fast ' "$out/$1.log"
}
run 8b-new-1 new
run 8b-head-1 head
run 8b-base-1 base
run 8b-new-2 new
run 8b-base-2 base
