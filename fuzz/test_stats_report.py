"""The session's fuzz statistics are the sum over every test that ran, with pytest-xdist (each
worker counts its own tests; the controller sums them and alone writes the file) and without."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis.errors import UnsatisfiedAssumption
from hypothesis.stateful import rule

from fuzz import stats
from fuzz.stats_report import PLANTED, REPO_ROOT, STATS_PATH_VARIABLE, killed_record, result
from fuzz.strategies import TIME_LIMIT_VARIABLE, CountedMachine, FuzzTimeLimit, checked_step, stop_at_time_limit

# Four tests, each counting its own power of ten, so a lost or doubled worker shows in the sums.
COUNTING_TESTS = """
import pytest

from fuzz import stats


@pytest.mark.parametrize("index", range(4))
def test_counts(index):
    stats.bump("machine", "steps", 10**index)
    stats.bump("machine", "examples")
    stats.bump(f"only-in-test-{index}", "steps", index + 1)
    stats.bump("planted/bug", "steps", 5)
    stats.bump("machine", "failures", index)
    stats.bump("planted/bug", "failures")  # a planted bug's checks are meant to raise
"""
EXPECTED_MACHINES = {
    "machine": {"examples": 4, "failures": 6, "steps": 1111},
    **{f"only-in-test-{index}": {"steps": index + 1} for index in range(4)},
    "planted/bug": {"failures": 4, "steps": 20},
}


def run_counting_session(directory: Path, *options: str) -> dict:
    """A pytest session over COUNTING_TESTS with the fuzz statistics hooks; the record it wrote."""
    result, record = run_fuzz_session(directory, COUNTING_TESTS, {}, *options)
    assert result.returncode == 0, result.stdout + result.stderr
    return record


def run_fuzz_session(
    directory: Path, tests: str, extra_env: dict[str, str], *options: str
) -> tuple[subprocess.CompletedProcess, dict]:
    """A pytest session over `tests` with the fuzz statistics hooks: how it ended, and the record it wrote."""
    (directory / "conftest.py").write_text(
        "from fuzz.stats_report import pytest_sessionfinish, pytest_sessionstart, pytest_testnodedown  # noqa: F401\n"
    )
    (directory / "test_session.py").write_text(tests)
    destination = directory / "stats.json"
    # Only the plugins named: a worker then starts in about a second.
    environment = os.environ | {
        "PYTHONPATH": str(REPO_ROOT),
        STATS_PATH_VARIABLE: str(destination),
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
        **extra_env,
    }
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(directory), *options],
        cwd=directory,
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return result, json.loads(destination.read_text())


@pytest.mark.parametrize("options", [("-p", "xdist", "-n", "2"), ()], ids=["xdist-2-workers", "serial"])
def test_statistics_are_summed_over_every_test(options: tuple[str, ...], tmp_path: Path) -> None:
    record = run_counting_session(tmp_path, *options)
    assert record["machines"] == EXPECTED_MACHINES
    # Totals leave the planted-bug runs out.
    assert record["totals"]["steps"] == 1111 + 1 + 2 + 3 + 4
    assert record["totals"]["examples"] == 4
    assert record["test_outcomes"] == {"passed": 4}
    assert record["result"] == "passed"
    assert record["failures_counted"] == 6, "the planted-bug runs' failures left out"


def test_exit_statuses_name_the_result() -> None:
    """A soak stopped by SIGINT at its time limit is "interrupted", not "failed": its verdict is the failures its
    machines counted (fuzz/strategies.py); every other non-zero status is a failure."""
    assert result(0) == "passed"
    assert result(2) == "interrupted"
    for status in (1, 3, 4, 5):  # tests failed, internal error, usage error, no tests collected
        assert result(status) == "failed", status


# A rule that draws from a space hypothesis cannot exhaust (a rule of no arguments is exhausted in a few examples,
# and the session would pass before its time limit).
TIMED_MACHINE_TESTS = """
import hypothesis.strategies as st
from hypothesis import settings
from hypothesis.stateful import rule

from fuzz.strategies import CountedMachine, checked_step


class Timed(CountedMachine):
    stats_label = "timed"

    @rule(value=st.binary(min_size=8, max_size=64))
    @checked_step
    def step(self, value):
        pass


TestTimed = Timed.TestCase
TestTimed.settings = settings(max_examples=10**6, stateful_step_count=5, deadline=None, database=None)
"""


def test_a_run_past_its_time_limit_ends_as_interrupted_with_its_record(tmp_path: Path) -> None:
    """$TWINFER_FUZZ_TIME_LIMIT_S: once it has passed, the next example's start ends the session as SIGINT would
    (exit status 2), so the session-end record is written: "interrupted", with the failures counted (none) and the
    examples run before the limit (a million were asked for)."""
    run, record = run_fuzz_session(tmp_path, TIMED_MACHINE_TESTS, {TIME_LIMIT_VARIABLE: "3"})
    assert run.returncode == pytest.ExitCode.INTERRUPTED, run.stdout + run.stderr
    assert record["result"] == "interrupted" and record["failures_counted"] == 0
    assert 0 < record["machines"]["timed"]["examples"] < 10**6


def test_a_bad_time_limit_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TIME_LIMIT_VARIABLE, "soon")
    with pytest.raises(ValueError, match=f"{TIME_LIMIT_VARIABLE} must be a number of seconds, got 'soon'"):
        stop_at_time_limit()
    monkeypatch.setenv(TIME_LIMIT_VARIABLE, "0")
    with pytest.raises(FuzzTimeLimit):
        stop_at_time_limit()


def test_a_killed_run_is_recorded_from_its_last_live_counters() -> None:
    """A run the SIGINT did not end is killed and writes no record: its record is its live counters, result
    "killed", its verdict the failures counted in them (planted-bug runs left out), and when they were written."""
    live = {
        "written_at": 1549.04,
        "machines": {
            "engine[fast]": {"engine_steps": 101, "examples": 3, "failures": 0},
            f"{PLANTED}bug": {"examples": 1, "failures": 5},
        },
    }
    record = killed_record(live, started_at=1000.0, killed_at=1555.0, command="python -m pytest x", commit="abc")
    assert record["result"] == "killed" and record["exit_status"] == 137
    assert record["failures_counted"] == 0
    assert (record["counters_written_after_s"], record["killed_after_s"]) == (549.0, 555.0)
    assert record["totals"]["examples"] == 3 and record["machines"] == live["machines"]
    live["machines"]["engine[fast]"]["failures"] = 2
    assert killed_record(live, 1000.0, 1555.0, "c", "abc")["failures_counted"] == 2


class _Machine(CountedMachine):
    stats_label = "counting failures"

    @rule()
    @checked_step
    def fails(self) -> None:
        raise AssertionError("a check that raised")

    @rule()
    @checked_step
    def declines(self) -> None:
        raise UnsatisfiedAssumption("discarded")  # what hypothesis.reject raises


def test_machines_count_each_failure_as_it_happens_but_not_a_discarded_example() -> None:
    """The live counters say whether a long run has failed so far: a run stopped before hypothesis reports it
    still shows its failures."""
    before = stats.counters(_Machine.stats_label).get("failures", 0)
    machine = _Machine()
    with pytest.raises(AssertionError):
        machine.fails()
    with pytest.raises(UnsatisfiedAssumption):
        machine.declines()
    assert stats.counters(_Machine.stats_label).get("failures", 0) == before + 1
