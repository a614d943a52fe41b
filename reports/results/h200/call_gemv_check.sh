#!/usr/bin/env bash
# One single-H200 call, run from a `git archive` of the commit under test unpacked in .clean/ (carry ".clean"):
# the GEMV's GPU tests and the fast engine's, then decode-bs1 on qwen3-8b whole and as a 2-way rank share
# (bench --rank-share 2) with the new one-row tensor-core tiles, with --profile.
: "${COMMIT:?set COMMIT to the commit under test}"
source .clean/reports/results/h200/call_lib.sh
run gpu_tests 200 python -m pytest -q -p no:cacheprovider -n 8 -m gpu -rf tests/kernels/test_gemv.py tests/test_fast_gpu.py
COMMON=(--shape qwen3-8b --dtype bfloat16 --no-progress --commit "$COMMIT" --engine fast --profile)
for share in 2 1; do
    run decode-bs1-share$share 120 python -m twinfer.cli bench decode-bs1 "${COMMON[@]}" --rank-share $share \
        --json "$R/decode-bs1-share$share.json"
done
cat "$R/done.txt"
tail -n 3 "$R/gpu_tests.log"
for f in "$R"/decode*.log; do echo "== $f"; tr '\r' '\n' < "$f" | grep -v '%|' | grep -v '^\s*$' | tail -n 3 | cut -c1-250; done
tar czf "$OUT/results.tgz" -C "$OUT" r && rm -rf "$R"
