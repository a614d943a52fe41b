"""The fuzzing section: the fuzz suite run now with the `ci` profile, or the committed deep-run
records (reports/results/fuzz/deep_run*.json), with their statistics.

Numbers come from the statistics file the fuzz session writes (fuzz/conftest.py); which planted
bugs were caught comes from the per-test outcomes (each planted-bug test passes only when the
fuzzer finds its bug). A committed record has no per-test outcomes: its planted bugs count as
caught only if the whole run passed.
"""

from __future__ import annotations

import json
import logging
import tempfile
from pathlib import Path
from typing import Any

from tqdm import tqdm

from reports.report.pytest_runs import PASSED, REPO_ROOT, TestOutcome, run_pytest
from reports.report.records import FuzzMachine, FuzzRun, FuzzSection, PlantedBug, Status, combined_status

logger = logging.getLogger(__name__)

COMMITTED_GLOB = "reports/results/fuzz/deep_run*.json"
PLANTED_PREFIX = "planted/"
PLANTED_TEST = "test_fuzzer_finds_planted_bug"
STATS_VARIABLE = "TWINFER_FUZZ_STATS"  # where fuzz/conftest.py writes the session's statistics
CI_TIMEOUT_S = 1800.0


def committed_fuzz_section(root: Path = REPO_ROOT) -> FuzzSection:
    paths = sorted(root.glob(COMMITTED_GLOB))
    if not paths:
        return FuzzSection(Status.NOT_RUN, f"not run: no committed deep-run record ({COMMITTED_GLOB})", ())
    runs = []
    for path in paths:
        relative = str(path.relative_to(root))
        try:
            record = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as error:
            runs.append(FuzzRun("committed record", relative, Status.NOT_RUN, f"not run: unreadable record: {error}"))
            continue
        runs.append(fuzz_run_from_record(record, "committed record", relative, outcomes=None))
    return _section(tuple(runs))


def ci_fuzz_section(
    timeout_s: float = CI_TIMEOUT_S, root: Path = REPO_ROOT, selection: tuple[str, ...] = ("fuzz",)
) -> FuzzSection:
    if not (root / "fuzz" / "conftest.py").is_file():
        return FuzzSection(
            Status.NOT_RUN, "not run: the fuzz suite is not in this installation (use a source checkout)", ()
        )
    with tempfile.TemporaryDirectory(prefix="twinfer-fuzz-") as scratch, tqdm(total=1, desc="fuzz (ci profile)") as bar:
        stats_path = Path(scratch) / "stats.json"
        run = run_pytest(
            [*selection, "--hypothesis-profile=ci"],
            Path(scratch) / "junit.xml",
            timeout_s,
            {STATS_VARIABLE: str(stats_path)},
        )
        bar.update()
        if run.returncode is None:
            detail = f"not run: the ci fuzz session did not finish within {timeout_s:.0f} s"
            return _section((FuzzRun("ci run", "fuzz/", Status.NOT_RUN, detail, command=run.command),))
        if not stats_path.is_file():
            detail = (
                f"failed: the fuzz session wrote no statistics (exit status {run.returncode}): {run.output_tail[-300:]}"
            )
            return _section((FuzzRun("ci run", "fuzz/", Status.FAILED, detail, command=run.command),))
        record = json.loads(stats_path.read_text())
    return _section((fuzz_run_from_record(record, "ci run", "fuzz/", run.outcomes),))


def fuzz_run_from_record(
    record: dict[str, Any], source: str, path: str, outcomes: tuple[TestOutcome, ...] | None
) -> FuzzRun:
    """A FuzzRun from a statistics record (or a committed record wrapping one under "run")."""
    run = record.get("run", record)
    passed = run_passed(run)
    machines = run.get("machines", {})
    planted = tuple(
        PlantedBug(
            label.removeprefix(PLANTED_PREFIX),
            _caught(label.removeprefix(PLANTED_PREFIX), outcomes, run.get("result") == "passed"),
        )
        for label in sorted(machines)
        if label.startswith(PLANTED_PREFIX)
    )
    coverage = tuple(
        FuzzMachine(label, {name: int(value) for name, value in counters.items()})
        for label, counters in sorted(machines.items())
        if not label.startswith(PLANTED_PREFIX)
    )
    summary = ", ".join(f"{count} {outcome}" for outcome, count in sorted(run.get("test_outcomes", {}).items()))
    return FuzzRun(
        source=source,
        path=path,
        status=Status.PASSED if passed else Status.FAILED,
        detail=_detail(run, summary),
        profile=str(run.get("profile", "")),
        command=str(record.get("command") or run.get("command", "")),
        commit=str(run.get("git_commit") or record.get("git_commit") or ""),
        wall_time_s=run.get("wall_time_s"),
        totals={name: int(value) for name, value in run.get("totals", {}).items()},
        planted_bugs=planted,
        machines=coverage,
    )


def run_passed(run: dict[str, Any]) -> bool:
    """Passed; or stopped by a signal at its time limit (a soak ends so), or killed when that signal did not end it,
    with no failure counted by its machines, which count every check that raises as it happens (a killed run: in
    the counters it last wrote, with the steps they cover). A run recorded before they counted is not passed."""
    if run.get("result") == "passed":
        return True
    return run.get("result") in ("interrupted", "killed") and run.get("failures_counted") == 0


def _detail(run: dict[str, Any], summary: str) -> str:
    if run.get("result") == "interrupted":
        return f"interrupted at its time limit, {run.get('failures_counted', 'no count of')} failures counted"
    if run.get("result") == "killed":
        return (
            f"killed after its time limit, {run.get('failures_counted', 'no count of')} failures counted in the "
            f"counters it wrote {run.get('counters_written_after_s')} s in (killed at {run.get('killed_after_s')} s)"
        )
    return f"{run.get('result', 'unknown')}: {summary or 'no test outcomes recorded'}"


def _caught(name: str, outcomes: tuple[TestOutcome, ...] | None, whole_run_passed: bool) -> bool | None:
    """From the planted bug's own test where it has one (parametrized by name); otherwise from the whole
    run: a planted-bug test passes only when its bug is found, so a run where every test passed caught all."""
    test_id = f"{PLANTED_TEST}[{name.replace(' ', '-')}]"
    matching = [o for o in outcomes or () if o.name == test_id]
    if matching:
        return all(o.outcome == PASSED for o in matching)
    return True if whole_run_passed else None


def _section(runs: tuple[FuzzRun, ...]) -> FuzzSection:
    detail = "; ".join(f"{run.source} {run.path}: {run.detail}" for run in runs)
    return FuzzSection(combined_status(run.status for run in runs), detail, runs)
