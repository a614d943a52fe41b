#!/bin/sh
# Where the shipped model's decode-bs1-edit spends its host time on the H200 (no flags), in the commit under test
# and in ca03d96 (0.352 ms a token there against 1.029 ms at ccd736f: ../offline_hf_session9/): the whole bench
# process under cProfile in each tree. The tree: sh reports/results/bench/plans/build_bisect_trees.sh (carry .clean).
#   sh reports/results/bench/host_profile_session10/run.sh COMMIT OUT
commit=$1 out=$2
for tree in .clean/*/; do ln -sfn "$(pwd)/twinfer/models/stdlib-tiny" "${tree}twinfer/models/stdlib-tiny"; done
bench="bench decode-bs1-edit --model twinfer/models/stdlib-tiny --dtype bfloat16 --engine fast --no-progress"
timeout 40 python -m cProfile -o "$out/head.prof" -m twinfer.cli $bench --commit "$commit" --json "$out/head.json" >"$out/head.log" 2>&1
echo "head (cProfile) rc=$?"; grep '^fast ' "$out/head.log"
(cd .clean/ca03d96 && timeout 40 python -m cProfile -o "$out/ca03d96.prof" -m twinfer.cli $bench --commit ca03d96 --json "$out/ca03d96.json" >"$out/ca03d96.log" 2>&1)
echo "ca03d96 (cProfile) rc=$?"; grep '^fast ' "$out/ca03d96.log"
