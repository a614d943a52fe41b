#!/usr/bin/env bash
# The H200 run behind twinfer/models/stdlib-tiny (run from the repository root with OUT set).
# Trains two candidates that differ only in their step count, evaluates both with the reference
# engine (fp32 and bf16 on CUDA), and keeps the one that meets more of the acceptance figures
# (then: more greedy prompts identical for 64+ tokens, then: lower held-out loss). Both
# candidates' figures are kept: eval_steps<N>.json. STEPS lists the step counts (default 1000 1200).
set -o pipefail
export PYTHONUNBUFFERED=1
: "${OUT:?set OUT to the output directory}"
python3 --version
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch, transformers, tokenizers; print(torch.__version__, transformers.__version__, tokenizers.__version__)"
STEPS=${STEPS:-1000 1200}
for steps in $STEPS; do
    python3 -m reports.train_tiny "/tmp/stdlib-tiny-steps$steps" --max-steps "$steps" --max-train-seconds 100 || exit 1
    python3 -m reports.eval_tiny "/tmp/stdlib-tiny-steps$steps" --json "$OUT/eval_steps$steps.json" --device cuda
done
STEPS="$STEPS" python3 - <<'PY'
import json, os, shutil
out = os.environ["OUT"]
candidates = [int(s) for s in os.environ["STEPS"].split()]
def key(steps):
    record = json.load(open(f"{out}/eval_steps{steps}.json"))
    greedy = record["greedy_bfloat16_vs_float32"]["prompts_identical_for_64_or_more"]
    return (sum(record["acceptance"].values()), greedy, -record["float32"]["held_out_loss"])
for steps in candidates:
    print(f"candidate steps={steps}: (acceptance met, greedy prompts >= 64, -held-out loss) = {key(steps)}")
best = max(candidates, key=key)
print(f"kept: steps={best}")
shutil.copytree(f"/tmp/stdlib-tiny-steps{best}", f"{out}/ckpt")
PY
