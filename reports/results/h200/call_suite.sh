#!/usr/bin/env bash
# One single-H200 call, in the working tree of the commit under test (CALL_ROOT=.): the project installed as the
# README says (the server's packages from the wheels in .whl: the device image lacks them, and it is offline), then
# the whole suite (`python -m pytest`, no -m filter, 8 workers, -v so that a step killed at its limit still names
# every test that finished), then offline-256 and decode-bs1 with no flags against the 8192-token budget.
: "${COMMIT:?set COMMIT to the commit under test}"
CALL_ROOT=. CALL_BUDGET_S=585 source reports/results/h200/call_lib.sh
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site || exit 1
run install 60 python3 -m pip install --no-build-isolation --no-deps -e .
run suite 420 python -m pytest -n 8 -v -p no:cacheprovider -rfEs --durations=40
C=(--shape qwen3-0.6b --dtype bfloat16 --engine fast --no-progress --commit "$COMMIT")
run offline-defaults-1 40 twinfer bench offline-256 "${C[@]}" --json "$R/offline-256-defaults-1.json"
run offline-budget8k 40 twinfer bench offline-256 "${C[@]}" --max-num-batched-tokens 8192 \
    --json "$R/offline-256-budget8k.json"
run offline-defaults-2 40 twinfer bench offline-256 "${C[@]}" --json "$R/offline-256-defaults-2.json"
run bs1-defaults 30 twinfer bench decode-bs1 "${C[@]}" --repeats 5 --json "$R/decode-bs1-defaults.json"
cat "$R/done.txt"
grep -E "^(FAILED|ERROR)|[0-9]+ (passed|failed)" "$R/suite.log" | tail -n 40
for f in "$R"/offline*.log "$R"/bs1*.log; do echo "== $(basename "$f")"; tr '\r' '\n' < "$f" | grep -E '^(fast|hf) ' | cut -c1-120; done
