#!/usr/bin/env bash
# The H200 run behind twinfer/models/stdlib-tiny (run from the repository root with OUT set).
# Trains two candidates that differ only in their step count, evaluates both with the reference
# engine (fp32 and bf16 on CUDA), and keeps the one that meets more of the acceptance figures
# (then: more greedy prompts identical for 64+ tokens, then: lower held-out loss). Both
# candidates' figures are kept: eval_steps800.json and eval_steps1500.json.
set -o pipefail
export PYTHONUNBUFFERED=1
: "${OUT:?set OUT to the output directory}"
python3 --version
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch, transformers, tokenizers; print(torch.__version__, transformers.__version__, tokenizers.__version__)"
for steps in 800 1500; do
    python3 -m reports.train_tiny "/tmp/stdlib-tiny-steps$steps" --max-steps "$steps" --max-train-seconds 100 || exit 1
    python3 -m reports.eval_tiny "/tmp/stdlib-tiny-steps$steps" --json "$OUT/eval_steps$steps.json" --device cuda
done
python3 - <<'PY'
import json, os, shutil
out = os.environ["OUT"]
def key(steps):
    record = json.load(open(f"{out}/eval_steps{steps}.json"))
    greedy = record["greedy_bfloat16_vs_float32"]["prompts_identical_for_64_or_more"]
    return (sum(record["acceptance"].values()), greedy, -record["float32"]["held_out_loss"])
for steps in (800, 1500):
    print(f"candidate steps={steps}: (acceptance met, greedy prompts >= 64, -held-out loss) = {key(steps)}")
best = max((800, 1500), key=key)
print(f"kept: steps={best}")
shutil.copytree(f"/tmp/stdlib-tiny-steps{best}", f"{out}/ckpt")
PY
