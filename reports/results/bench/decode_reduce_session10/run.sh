#!/bin/sh
# qwen3-0.6b decode-bs1 (benchmarks.md), bf16, random weights, the fast engine, no engine flags: the commit under test
# (the decode kernel's last split program reduces: one attention launch a layer) against fe5cb44 (the reduction
# kernel), one process per run, alternating; transformers beside the first run, --profile in the second pair.
# The baseline tree: git archive fe5cb44 fast spec twinfer reports/__init__.py reports/bench into .clean/fe5cb44/.
#   sh reports/results/bench/decode_reduce_session10/run.sh COMMIT OUT
commit=$1 out=$2
bench="bench decode-bs1 --shape qwen3-0.6b --dtype bfloat16 --engine fast --no-progress"
run() {  # label, tree, commit, extra flags, time limit
    (cd "$2" && timeout "$5" python -m twinfer.cli $bench --commit "$3" --json "$out/$1.json" $4 >"$out/$1.log" 2>&1)
    echo "$1 rc=$?"; grep -E '^(fast|hf) ' "$out/$1.log"
}
run new-1 . "$commit" "--baseline hf" 70
run old-1 .clean/fe5cb44 fe5cb44 "" 35
run new-2 . "$commit" --profile 35
run old-2 .clean/fe5cb44 fe5cb44 --profile 35
