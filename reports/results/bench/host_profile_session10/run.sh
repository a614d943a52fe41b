#!/bin/sh
# Why the shipped model's decode-bs1-edit (no flags) takes ~1.0 ms a token in this tree and 0.35-0.58 ms in ca03d96's
# on the H200 (../offline_hf_session9/, ../speculative_session8/), with the same device work and a host path that
# costs the same on the CPU (../../host/edit_host_path_session9/). The engine diff since ca03d96 holds nothing that
# costs 0.65 ms of host time a step (the session-10 note), so first: is it the code or where it runs from? Plain
# runs of this tree from the repository root (where `pip install -e .` put it) and of the same commit as a copy in
# .clean/head (as ca03d96 runs, from .clean/ca03d96), then each of the two places under cProfile.
#   mkdir -p .clean/head && git archive HEAD fast spec twinfer reports/__init__.py reports/bench | tar -x -C .clean/head \
#     --exclude=twinfer/models/stdlib-tiny    (and .clean/ca03d96 likewise from ca03d96; carry .clean)
#   sh reports/results/bench/host_profile_session10/run.sh COMMIT OUT
commit=$1 out=$2
for tree in .clean/*/; do ln -sfn "$(pwd)/twinfer/models/stdlib-tiny" "${tree}twinfer/models/stdlib-tiny"; done
bench="bench decode-bs1-edit --model twinfer/models/stdlib-tiny --dtype bfloat16 --engine fast --no-progress"
plain() {  # label, tree, commit
    (cd "$2" && timeout 40 python -m twinfer.cli $bench --commit "$3" --json "$out/$1.json" >"$out/$1.log" 2>&1)
    echo "$1 rc=$?"; grep '^fast ' "$out/$1.log"
}
profiled() {  # label, tree, commit
    (cd "$2" && timeout 45 python -m cProfile -o "$out/$1.prof" -m twinfer.cli $bench --commit "$3" \
        --json "$out/$1.json" >"$out/$1.log" 2>&1)
    echo "$1 (cProfile) rc=$?"; grep '^fast ' "$out/$1.log"
}
plain root . "$commit"
plain head-copy .clean/head "$commit"
plain ca03d96 .clean/ca03d96 ca03d96
profiled root-profiled . "$commit"
profiled ca03d96-profiled .clean/ca03d96 ca03d96
