#!/usr/bin/env bash
# One H200 call, run from a `git archive` of the commit under test unpacked in .clean/ (carry ".clean"):
# correctness first, then kernel benchmarks, then engine timings one at a time.
# 1. GPU tests: the invariant matmul (fixed K chunks: split and fused paths bitwise equal at every M), the
#    prefill kernel (packed rows), batch-invariant mode's needle tests, the fast engine's GPU tests;
# 2. decode attention sweep (split-KV decode kernel against packed rows, batch 1-256) and the invariant
#    matmul benchmark;
# 3. decode-bs1 and offline-256 with batch-invariant mode on and off.
set -o pipefail
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=2
: "${COMMIT:?set COMMIT to the commit under test}"
cd .clean || exit 1
R=$OUT/r
mkdir -p "$R"
START=$SECONDS
run() {  # run NAME LIMIT_S COMMAND...: skipped when the call has less than LIMIT_S left
    local name=$1 limit=$2; shift 2
    local left=$((580 - (SECONDS - START)))
    if ((left < limit)); then echo "skipped $name: ${left}s left" >> "$R/done.txt"; return; fi
    timeout "$limit" "$@" > "$R/$name.log" 2>&1
    echo "$name rc=$? at $((SECONDS - START))s" >> "$R/done.txt"
}
run gpu_tests 190 env TWINFER_RESULTS_DIR="$R" python -m pytest -q -p no:cacheprovider -rA -n 8 -m gpu \
    tests/kernels/test_matmul.py tests/kernels/test_prefill_attention.py tests/test_batch_invariant_gpu.py \
    tests/test_fast_gpu.py
run decode_attention_bench 60 python -m reports.decode_attention_bench --json "$R/decode_attention_sweep.json"
run invariant_matmul_bench 70 python -m reports.invariant_matmul_bench --shapes qwen3-0.6b \
    --json "$R/invariant_matmul_bench.json"
COMMON=(--shape qwen3-0.6b --dtype bfloat16 --no-progress --max-model-len 2048 --commit "$COMMIT" --engine fast)
run decode-bs1-batch-invariant 40 python -m twinfer.cli bench decode-bs1 "${COMMON[@]}" --batch-invariant --profile \
    --json "$R/decode-bs1-batch-invariant.json"
run decode-bs1-no-batch-invariant 35 python -m twinfer.cli bench decode-bs1 "${COMMON[@]}" --no-batch-invariant \
    --json "$R/decode-bs1-no-batch-invariant.json"
for mode in batch-invariant no-batch-invariant; do
    run offline-256-$mode 55 python -m twinfer.cli bench offline-256 "${COMMON[@]}" --$mode --max-num-seqs 256 \
        --max-num-batched-tokens 8192 --json "$R/offline-256-$mode.json"
done
cat "$R/done.txt"
for f in "$R"/*.log; do echo "== $f"; tr '\r' '\n' < "$f" | grep -v '%|' | grep -v '^\s*$' | tail -n 8 | cut -c1-250; done
tar czf "$OUT/results.tgz" -C "$OUT" r && rm -rf "$R"
