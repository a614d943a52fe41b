#!/usr/bin/env bash
# One H200 call: decode-bs1 at a57bf4f (1.354 ms, bench/gemv/) and at the commit under test, alternating,
# three times each, in one process environment: settles whether 1.619 ms at 816737a was the machine or
# the code (issue 8). Prepare on the host: `git archive a57bf4f | tar -x -C .ab/old` and
# `git archive $COMMIT | tar -x -C .ab/new`, then run with carry [".ab"]. Not yet run: written when the
# session's device time was spent.
set -o pipefail
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=2
: "${COMMIT:?set COMMIT to the commit under test}"
R=$OUT/r
mkdir -p "$R"
for round in 1 2 3; do
    for side in old new; do
        commit=$([ "$side" = old ] && echo a57bf4f || echo "$COMMIT")
        (cd ".ab/$side" && timeout 45 python -m twinfer.cli bench decode-bs1 --shape qwen3-0.6b --dtype bfloat16 \
            --engine fast --max-model-len 2048 --no-progress --commit "$commit" --json "$R/decode-bs1-$side-$round.json" \
            > "$R/decode-bs1-$side-$round.log" 2>&1)
    done
done
python - "$R" <<'PY'
import json, sys, pathlib
for path in sorted(pathlib.Path(sys.argv[1]).glob("*.json")):
    metrics = json.loads(path.read_text())["results"][0]["phases"][0]["metrics"]
    print(path.name, "tpot_ms", round(metrics["tpot_s"] * 1e3, 3), metrics["engine_step_timings"])
PY
tar czf "$OUT/results.tgz" -C "$OUT" r
