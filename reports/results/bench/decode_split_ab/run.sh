#!/bin/sh
# One H200 call: the decode kernel's small-batch micro-benchmark, then decode-bs1 (bf16, no flags) at qwen3-0.6b and
# qwen3-8b with each split variant, one process a run, alternating (variant_bench.py); COMMIT holds the tree's sha.
#   sh reports/results/bench/decode_split_ab/run.sh OUT
out=$1
export OMP_NUM_THREADS=2 PYTHONPATH=.  # variant_bench.py runs as a script: the tree on the path
timeout 60 python -m reports.bench.kernels.decode_splits --small-batch --json "$out/small_batch.json" \
    > "$out/small_batch.log" 2>&1; echo "micro rc=$?"
for round in 1 2; do
    for shape in qwen3-0.6b qwen3-8b; do
        for variant in s128n64 s32n32 s64n64; do
            timeout 70 python reports/results/bench/decode_split_ab/variant_bench.py $variant $shape \
                "$out/$shape-$variant-$round.json" > "$out/$shape-$variant-$round.log" 2>&1
            echo "$shape $variant $round rc=$? $(grep -E '^fast ' "$out/$shape-$variant-$round.log")"
        done
    done
done
