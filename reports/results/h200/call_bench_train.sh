#!/usr/bin/env bash
# One H200 call: retrain the stdlib-tiny candidate, then the issue-7 benchmark runs (fast engine and
# transformers in the same process): offline-256 and decode-bs1 on the qwen3-0.6b shape, bf16.
# Run from the repository root with OUT set; everything comes back as $OUT/results.tgz plus the
# checkpoint's safetensors.
set -o pipefail
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=8
R=$OUT/r
mkdir -p "$R/bench" "$R/train"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$R/gpu.txt"
echo "${COMMIT:?set COMMIT to the commit under test}" | tee "$R/commit.txt"
(OUT=$R/train STEPS="${STEPS:-1100}" timeout 170 bash reports/results/trained_tiny/device_run.sh) > "$R/train/run.log" 2>&1
echo "train rc=$?"
COMMON=(--shape qwen3-0.6b --dtype bfloat16 --no-progress --max-model-len 2048 --commit "$COMMIT")
timeout 330 python -m twinfer.cli bench offline-256 "${COMMON[@]}" --engine fast --baseline hf \
    --max-num-seqs 256 --max-num-batched-tokens 8192 --json "$R/bench/offline-256.json" > "$R/bench/offline-256.log" 2>&1
echo "offline-256 rc=$?"
timeout 90 python -m twinfer.cli bench decode-bs1 "${COMMON[@]}" --engine fast --baseline hf \
    --json "$R/bench/decode-bs1.json" > "$R/bench/decode-bs1.log" 2>&1
echo "decode-bs1 rc=$?"
tail -5 "$R/bench/"*.log "$R/train/run.log"
if [ -f "$R/train/ckpt/model.safetensors" ]; then mv "$R/train/ckpt/model.safetensors" "$OUT/model.safetensors"; fi
tar czf "$OUT/results.tgz" -C "$OUT" r
