#!/usr/bin/env bash
# One H200 call, run from a `git archive` of the commit under test unpacked in .clean/ (carry ".clean"):
# offline-256 with async scheduling, three processes alone and one beside transformers' continuous batching
# (in that process, after the fast engine), then decode-bs1 beside transformers' generate.
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
COMMON=(--shape qwen3-0.6b --dtype bfloat16 --no-progress --max-model-len 2048 --commit "$COMMIT" --engine fast)
OFFLINE=(--max-num-seqs 256 --max-num-batched-tokens 8192 --async-scheduling)
for round in 1 2 3; do
    run offline-256-async-$round 55 python -m twinfer.cli bench offline-256 "${COMMON[@]}" "${OFFLINE[@]}" \
        --json "$R/offline-256-async-$round.json"
done
run offline-256-async-hf 300 python -m twinfer.cli bench offline-256 "${COMMON[@]}" "${OFFLINE[@]}" --baseline hf \
    --json "$R/offline-256-async-hf.json"
run decode-bs1-hf 70 python -m twinfer.cli bench decode-bs1 "${COMMON[@]}" --baseline hf --json "$R/decode-bs1-hf.json"
cat "$R/done.txt"
for f in "$R"/*.log; do echo "== $f"; tr '\r' '\n' < "$f" | grep -v '%|' | grep -v '^\s*$' | tail -n 5 | cut -c1-250; done
tar czf "$OUT/results.tgz" -C "$OUT" r && rm -rf "$R"
