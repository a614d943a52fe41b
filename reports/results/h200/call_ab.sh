#!/usr/bin/env bash
# One H200 call of A/B timings, each pair alternating in one call (not yet run: written when the
# session's device time was spent):
# 1. decode-bs1 at a57bf4f (1.354 ms, bench/gemv/) against the commit under test, two rounds: settles
#    whether 1.619 ms at 816737a was the machine or the code (issue 8);
# 2. offline-256 with EngineConfig.async_scheduling off and on, two rounds, at the commit under test;
# 3. prefix-shared with batch-invariant mode on and off (are outputs identical with and without the cache?).
# Prepare on the host: `git archive a57bf4f | tar -x -C .ab/old` and `git archive $COMMIT | tar -x -C .ab/new`,
# then run with carry [".ab"] and COMMIT set.
set -o pipefail
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=2
: "${COMMIT:?set COMMIT to the commit under test}"
R=$OUT/r
mkdir -p "$R"
BENCH=(--shape qwen3-0.6b --dtype bfloat16 --engine fast --max-model-len 2048 --no-progress)
for round in 1 2; do
    for side in old new; do
        commit=$([ "$side" = old ] && echo a57bf4f || echo "$COMMIT")
        (cd ".ab/$side" && timeout 45 python -m twinfer.cli bench decode-bs1 "${BENCH[@]}" --commit "$commit" \
            --json "$R/decode-bs1-$side-$round.json" > "$R/decode-bs1-$side-$round.log" 2>&1)
    done
done
for round in 1 2; do
    for mode in no-async-scheduling async-scheduling; do
        (cd .ab/new && timeout 70 python -m twinfer.cli bench offline-256 "${BENCH[@]}" --commit "$COMMIT" \
            --$mode --max-num-seqs 256 --max-num-batched-tokens 8192 \
            --json "$R/offline-256-$mode-$round.json" > "$R/offline-256-$mode-$round.log" 2>&1)
    done
done
for mode in batch-invariant no-batch-invariant; do
    (cd .ab/new && timeout 60 python -m twinfer.cli bench prefix-shared --shape qwen3-0.6b --dtype bfloat16 --engine fast \
        --no-progress --commit "$COMMIT" --$mode --json "$R/prefix-shared-$mode.json" > "$R/prefix-shared-$mode.log" 2>&1)
done
grep -h "identical" "$R"/prefix-shared-*.log
python - "$R" <<'PY'
import json, sys, pathlib
for path in sorted(pathlib.Path(sys.argv[1]).glob("[do]*.json")):
    metrics = json.loads(path.read_text())["results"][0]["phases"][0]["metrics"]
    print(path.name, "tpot_ms", round(metrics["tpot_s"] * 1e3, 3), "tok/s", round(metrics["output_tokens_per_s"]),
          metrics["engine_step_timings"])
PY
tar czf "$OUT/results.tgz" -C "$OUT" r
