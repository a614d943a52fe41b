"""The fuzz statistics JSON written at session end, right with and without pytest-xdist.

fuzz/conftest.py takes its hooks from here. Without xdist the session's own counters
(fuzz/stats.py) are written. Under xdist every worker counts only the tests it ran: each hands its
counters to the controller through `workeroutput`, the controller sums them as each worker goes
down (`pytest_testnodedown`) and alone writes the file, with the whole run's test outcomes.

The file is `$TWINFER_FUZZ_STATS`, by default `.fuzz-stats/<profile>.json` under the repository root.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from fuzz import stats

REPO_ROOT = Path(__file__).resolve().parent.parent
STATS_PATH_VARIABLE = "TWINFER_FUZZ_STATS"
WORKER_OUTPUT_KEY = "twinfer_fuzz_stats"
TOTALLED = (
    "examples",
    "steps",
    "snapshot_checks",
    "snapshot_verdicts_shared",  # of the snapshot checks: equal to the first implementation's (fuzz/shared_checks.py)
    "invariant_evaluations",
    "model_comparisons",
    "twin_comparisons",
    "implementation_comparisons",
)

PLANTED = "planted/"  # the label prefix of the planted-bug runs

_session_started = time.monotonic()


def pytest_sessionstart(session: pytest.Session) -> None:
    global _session_started
    _session_started = time.monotonic()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object | None) -> None:
    """xdist, on the controller: a worker is done; add its counters to the session's."""
    stats.merge(getattr(node, "workeroutput", {}).get(WORKER_OUTPUT_KEY, {}))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: the controller writes the file
        workeroutput[WORKER_OUTPUT_KEY] = stats.all_counters()
        return
    machines = stats.all_counters()
    if not machines:
        return  # no fuzzer ran (e.g. only tests/ was selected)
    write_record(stats_path(), record(session, exitstatus, machines))


def stats_path() -> Path:
    from hypothesis import settings  # here, not at import: an xdist worker's hooks never need it

    profile = settings.get_current_profile_name()
    return Path(os.environ.get(STATS_PATH_VARIABLE) or REPO_ROOT / ".fuzz-stats" / f"{profile}.json")


def record(session: pytest.Session, exitstatus: int, machines: dict[str, dict[str, int]]) -> dict[str, Any]:
    from hypothesis import settings

    active = settings.default
    return {
        "profile": settings.get_current_profile_name(),
        "settings": {"max_examples": active.max_examples, "stateful_step_count": active.stateful_step_count},
        "command": " ".join(["python -m pytest", *session.config.invocation_params.args]),
        "git_commit": _git_commit(),
        "exit_status": int(exitstatus),
        "result": result(exitstatus),
        # every check that raised, as the machines counted it (fuzz/strategies.py): what an interrupted run
        # found before it was stopped (planted-bug runs left out: their checks are meant to raise)
        "failures_counted": failures_counted(machines),
        "test_outcomes": _outcomes(session),
        "wall_time_s": round(time.monotonic() - _session_started, 1),
        "totals": totals(machines),
        "machines": machines,
    }


def failures_counted(machines: dict[str, dict[str, int]]) -> int:
    """Every check that raised, as the machines counted it, planted-bug runs left out (their checks are meant to
    raise)."""
    return sum(values.get("failures", 0) for label, values in machines.items() if not label.startswith(PLANTED))


def killed_record(
    live: dict[str, Any], started_at: float, killed_at: float, command: str, commit: str
) -> dict[str, Any]:
    """The record of a run killed when the SIGINT at its time limit did not end it (so no session-end record was
    written): its counters as last written live (fuzz/stats.py, at most LIVE_EVERY_S apart while it steps). Its
    verdict is the failures counted in them, which cover exactly the steps counted beside them; what ran after
    that write (at most until `killed_at`) is not covered. Times are the epoch seconds `date +%s.%N` gives."""
    machines = live["machines"]
    return {
        "command": command,
        "git_commit": commit,
        "exit_status": 137,
        "result": "killed",
        "failures_counted": failures_counted(machines),
        "counters_written_after_s": round(live["written_at"] - started_at, 1),
        "killed_after_s": round(killed_at - started_at, 1),
        "totals": totals(machines),
        "machines": machines,
    }


def result(exitstatus: int) -> str:
    """passed; interrupted (stopped by a signal at a time limit: its verdict is `failures_counted`); failed. (A run
    killed after that signal writes no record of its own: `killed_record`.)"""
    if int(exitstatus) == pytest.ExitCode.OK:
        return "passed"
    if int(exitstatus) == pytest.ExitCode.INTERRUPTED:
        return "interrupted"
    return "failed"


def write_record(destination: Path, content: dict[str, Any]) -> None:
    destination.parent.mkdir(parents=True, exist_ok=True)
    destination.write_text(json.dumps(content, indent=2) + "\n")


def totals(machines: dict[str, dict[str, int]]) -> dict[str, int]:
    """The fuzzing counters summed over machines, planted-bug runs left out: they prove the
    checks work; they are not fuzzing coverage."""
    summed: dict[str, int] = {}
    for label, values in machines.items():
        if label.startswith(PLANTED):
            continue
        for name in TOTALLED:
            summed[name] = summed.get(name, 0) + values.get(name, 0)
    return summed


def _git_commit() -> str | None:
    try:
        result = subprocess.run(
            ["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return result.stdout.strip() or None


def _outcomes(session: pytest.Session) -> dict[str, int]:
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None:
        return {}
    return {outcome: len(reports) for outcome, reports in reporter.stats.items() if outcome}
