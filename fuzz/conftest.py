"""Hypothesis profiles for the fuzzers, and the statistics each run writes.

Profiles: `ci` (default) is derandomised and sized to run the whole fuzz directory in a few
minutes on a 2-core machine; `deep` (`pytest fuzz --hypothesis-profile=deep`) runs thousands of
examples of up to 200 steps. The planted-bug tests and the engine fuzzer carry their own sizes.

At session end the counters in fuzz/stats.py are written as JSON to the path in the
environment variable TWINFER_FUZZ_STATS, by default `.fuzz-stats/<profile>.json` under the
repository root.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from fuzz import stats

REPO_ROOT = Path(__file__).resolve().parent.parent
STATS_PATH_VARIABLE = "TWINFER_FUZZ_STATS"

# Every failure must replay the same way on every machine: no randomness, no example database.
_REPRODUCIBLE = dict(
    derandomize=True,
    database=None,
    deadline=None,
    print_blob=False,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)
settings.register_profile("ci", max_examples=200, stateful_step_count=50, **_REPRODUCIBLE)
settings.register_profile("deep", max_examples=1200, stateful_step_count=200, **_REPRODUCIBLE)

# The fuzzers default to `ci`; a profile chosen on the command line (loaded by hypothesis's
# pytest plugin) is left alone.
if settings.get_current_profile_name() == "default":
    settings.load_profile("ci")

_session_started = time.monotonic()


def pytest_sessionstart(session: pytest.Session) -> None:
    global _session_started
    _session_started = time.monotonic()


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


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    profile = settings.get_current_profile_name()
    machines = stats.all_counters()
    if not machines:
        return  # no fuzzer ran (e.g. only tests/ was selected)
    destination = Path(os.environ.get(STATS_PATH_VARIABLE) or REPO_ROOT / ".fuzz-stats" / f"{profile}.json")
    destination.parent.mkdir(parents=True, exist_ok=True)
    active = settings.default
    record = {
        "profile": profile,
        "settings": {"max_examples": active.max_examples, "stateful_step_count": active.stateful_step_count},
        "command": " ".join(["python -m pytest", *session.config.invocation_params.args]),
        "git_commit": _git_commit(),
        "exit_status": int(exitstatus),
        "result": "passed" if int(exitstatus) == 0 else "failed",
        "test_outcomes": _outcomes(session),
        "wall_time_s": round(time.monotonic() - _session_started, 1),
        "totals": _totals(machines),
        "machines": machines,
    }
    destination.write_text(json.dumps(record, indent=2) + "\n")


def _totals(machines: dict[str, dict[str, int]]) -> dict[str, int]:
    totals: dict[str, int] = {}
    for label, values in machines.items():
        if label.startswith("planted/"):
            continue  # planted-bug runs prove the checks work; they are not fuzzing coverage
        for name in (
            "examples",
            "steps",
            "snapshot_checks",
            "invariant_evaluations",
            "model_comparisons",
            "twin_comparisons",
            "implementation_comparisons",
        ):
            totals[name] = totals.get(name, 0) + values.get(name, 0)
    return totals
