"""The kernel checks: tests/fast/kernels (every Triton kernel against a float64 torch reference) run in a
subprocess, summarised per test file. On the CPU the kernels run through Triton's interpreter and
the GPU-only cases are skipped; the page says how many."""

from __future__ import annotations

import tempfile
from collections import Counter
from pathlib import Path

from tqdm import tqdm

from reports.report.pytest_runs import ERROR, FAILED, PASSED, REPO_ROOT, SKIPPED, PytestRun, run_pytest
from reports.report.records import KernelSection, PytestFailure, PytestFileSummary, Status

KERNEL_TESTS = "tests/fast/kernels"
TIMEOUT_S = 1800.0
MAX_LISTED_FAILURES = 20


def kernel_section(device_type: str, timeout_s: float = TIMEOUT_S, root: Path = REPO_ROOT) -> KernelSection:
    if not (root / KERNEL_TESTS).is_dir():
        return KernelSection(
            Status.NOT_RUN, f"not run: {KERNEL_TESTS} is not in this installation (use a source checkout)"
        )
    # Triton reads TRITON_INTERPRET when a kernel is defined; tests/conftest.py sets it too, but only
    # when it is unset, so a CPU run states it explicitly.
    environment = {"TRITON_INTERPRET": "1"} if device_type == "cpu" else {}
    with tempfile.TemporaryDirectory(prefix="twinfer-kernels-") as scratch, tqdm(total=1, desc="kernel checks") as bar:
        run = run_pytest([KERNEL_TESTS], Path(scratch) / "junit.xml", timeout_s, environment)
        bar.update()
    return summarise_kernel_run(run, timeout_s)


def summarise_kernel_run(run: PytestRun, timeout_s: float = TIMEOUT_S) -> KernelSection:
    tallies: dict[str, Counter[str]] = {}
    for outcome in run.outcomes:
        tallies.setdefault(outcome.file, Counter())[outcome.outcome] += 1
    files = tuple(
        PytestFileSummary(file, tally[PASSED], tally[FAILED], tally[SKIPPED], tally[ERROR])
        for file, tally in sorted(tallies.items())
    )
    failures = tuple(
        PytestFailure(f"{o.file}::{o.name}", o.message) for o in run.outcomes if o.outcome in (FAILED, ERROR)
    )
    totals = Counter(o.outcome for o in run.outcomes)
    counts = f"{totals[PASSED]} passed, {totals[FAILED] + totals[ERROR]} failed, {totals[SKIPPED]} skipped"
    if run.returncode is None:
        status, detail = Status.NOT_RUN, f"not run: did not finish within {timeout_s:.0f} s ({counts} by then)"
    elif failures or (run.returncode != 0 and not run.outcomes):
        status, detail = Status.FAILED, f"{counts}" if failures else f"pytest failed to run: {run.output_tail[-300:]}"
    elif totals[PASSED] == 0:
        status, detail = Status.NOT_RUN, f"not run: every test was skipped ({counts})"
    else:
        status, detail = Status.PASSED, counts
    return KernelSection(
        status=status,
        detail=detail,
        command=run.command,
        wall_time_s=round(run.wall_time_s, 1),
        files=files,
        failures=failures[:MAX_LISTED_FAILURES],
    )
