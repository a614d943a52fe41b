# Sourced by the call scripts (bash) from the repository root, as .clean/reports/results/h200/call_lib.sh:
# sets pipefail and the environment every call runs with, enters ${CALL_ROOT:-.clean} (the `git archive` of
# the commit under test; CALL_ROOT=. for a call run in the working tree itself), and makes
# R=$OUT/${RESULTS_NAME:-r}, the results folder.
#
# Sourced by the call scripts (bash): run NAME LIMIT_S COMMAND... runs COMMAND with stdout and stderr in
# $R/NAME.log under `timeout`, and appends its exit status and the time so far to $R/done.txt.
# A step gets at most what is left of the call's budget (CALL_BUDGET_S, default 580 s of the device's 600);
# with less than 30 s left it is skipped, and says so. CALL_SIGNAL (default TERM) is what `timeout` sends:
# ABRT makes a Python run under PYTHONFAULTHANDLER=1 print every thread's stack before it ends.
set -o pipefail
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=2
cd "${CALL_ROOT:-.clean}" || exit 1
R=$OUT/${RESULTS_NAME:-r}
mkdir -p "$R"
START=$SECONDS
run() {
    local name=$1 limit=$2; shift 2
    local left=$((${CALL_BUDGET_S:-580} - (SECONDS - START)))
    if ((left < 30)); then echo "skipped $name: ${left}s left" >> "$R/done.txt"; return; fi
    ((limit > left)) && limit=$left
    mkdir -p "$(dirname "$R/$name.log")"
    timeout -s "${CALL_SIGNAL:-TERM}" -k 10 "$limit" "$@" > "$R/$name.log" 2>&1
    echo "$name rc=$? at $((SECONDS - START))s (limit ${limit}s)" >> "$R/done.txt"
}
run_in() {  # run_in DIR NAME LIMIT_S COMMAND...: run, as `run` does, with DIR as the working directory
    local dir=$1; shift
    (cd "$dir" && run "$@")
}
