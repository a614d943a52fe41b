#!/bin/sh
# qwen3-0.6b decode-bs1 (benchmarks.md), bf16, random weights, the fast engine: the commit under test (the three
# last-program fusions: decode attention's reduction, o_proj and down with their add + RMSNorm, the invariant
# matmul's chunk sum) against the commit before them in .clean/base, one process per run, alternating: no flags
# (transformers beside the first), then batch-invariant mode, then no flags with --profile.
# Both sides run from a copy under .clean/ (the tree as the gate left it is copied to .clean/head here), so that
# where the code runs from is the same for both; one more no-flag run of the tree under test from the repository root
# (where `pip install -e .` points) tests whether the place alone moves the figure.
# The baseline tree (BASE: main before the fusions):
#   mkdir -p .clean/base && git archive BASE fast spec twinfer reports/__init__.py reports/bench \
#     | tar -x -C .clean/base --exclude=twinfer/models/stdlib-tiny && git rev-parse BASE > .clean/base/COMMIT
#   sh reports/results/bench/decode_fusions/run.sh COMMIT OUT
commit=$1 out=$2
base=$(cat .clean/base/COMMIT 2>/dev/null || echo base)
rm -rf .clean/head && mkdir -p .clean/head
tar -c --exclude=twinfer/models/stdlib-tiny --exclude=__pycache__ fast spec twinfer reports/__init__.py reports/bench \
    | tar -x -C .clean/head
bench="bench decode-bs1 --shape qwen3-0.6b --dtype bfloat16 --engine fast --no-progress"
run() {  # label, tree, commit, extra flags, time limit
    (cd "$2" && timeout "$5" python -m twinfer.cli $bench --commit "$3" --json "$out/$1.json" $4 >"$out/$1.log" 2>&1)
    echo "$1 rc=$?"; grep -E '^(fast|hf) ' "$out/$1.log"
}
run new-1 .clean/head "$commit" "--baseline hf" 70
run old-1 .clean/base "$base" "" 30
run new-root . "$commit" "" 30
run new-invariant .clean/head "$commit" --batch-invariant 30
run old-invariant .clean/base "$base" --batch-invariant 30
run new-2 .clean/head "$commit" --profile 35
