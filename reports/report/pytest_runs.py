"""Running a pytest selection in a subprocess and reading its outcome per test from JUnit XML."""

from __future__ import annotations

import importlib.util
import logging
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

# The repository root: the suites run from a source checkout (an installed wheel has no tests/ or fuzz/).
REPO_ROOT = Path(__file__).resolve().parents[2]

PASSED, FAILED, SKIPPED, ERROR = "passed", "failed", "skipped", "error"
MAX_MESSAGE_CHARS = 400


@dataclass(frozen=True)
class TestOutcome:
    __test__ = False  # not a pytest test class

    file: str  # repository-relative path of the test module
    name: str  # test function name with its parameters, e.g. test_x[dtype0]
    outcome: str  # PASSED, FAILED, SKIPPED or ERROR
    message: str


@dataclass(frozen=True)
class PytestRun:
    command: str
    returncode: int | None  # None: killed after the time limit
    wall_time_s: float
    outcomes: tuple[TestOutcome, ...]
    output_tail: str


def run_pytest(
    selection: Sequence[str], junit_path: Path, timeout_s: float, extra_env: Mapping[str, str] | None = None
) -> PytestRun:
    """`python -m pytest -q <selection> --junitxml=<junit_path>` from the repository root.

    TWINFER_REPORT_PYTEST_WORKERS=N spreads the run over N pytest-xdist workers (when xdist is installed),
    e.g. for the GPU kernel tests on a machine with many cores."""
    workers = _xdist_workers()
    arguments = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit_path}", *workers]
    arguments += list(selection)
    environment = {**os.environ, **(extra_env or {})}
    command = " ".join(["python -m pytest -q", *workers, *selection])
    started = time.monotonic()
    try:
        finished = subprocess.run(
            arguments, cwd=REPO_ROOT, env=environment, capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except subprocess.TimeoutExpired as expired:
        tail = _tail(expired.stdout)
        return PytestRun(command, None, time.monotonic() - started, _read_junit(junit_path), tail)
    wall = time.monotonic() - started
    return PytestRun(
        command, finished.returncode, wall, _read_junit(junit_path), _tail(finished.stdout + finished.stderr)
    )


def _xdist_workers() -> list[str]:
    """-n N from TWINFER_REPORT_PYTEST_WORKERS; else -n 0, overriding the project's `-n auto` (one run in
    one process: this one may itself be a pytest worker)."""
    if importlib.util.find_spec("xdist") is None:
        return []
    workers = os.environ.get("TWINFER_REPORT_PYTEST_WORKERS", "")
    return ["-n", workers if workers.isdigit() and int(workers) >= 2 else "0"]


def _tail(text: str | bytes | None, chars: int = 2000) -> str:
    if text is None:
        return ""
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    return text[-chars:]


def _read_junit(path: Path) -> tuple[TestOutcome, ...]:
    if not path.is_file():
        return ()
    try:
        root = ElementTree.parse(path).getroot()
    except ElementTree.ParseError as error:
        logger.warning("unreadable JUnit XML %s: %s", path, error)
        return ()
    return tuple(_outcome(case) for case in root.iter("testcase"))


def _outcome(case: ElementTree.Element) -> TestOutcome:
    for tag, outcome in (("failure", FAILED), ("error", ERROR), ("skipped", SKIPPED)):
        child = case.find(tag)
        if child is not None:
            message = child.get("message") or (child.text or "")
            return TestOutcome(
                _module_path(case.get("classname", "")), case.get("name", ""), outcome, message[:MAX_MESSAGE_CHARS]
            )
    return TestOutcome(_module_path(case.get("classname", "")), case.get("name", ""), PASSED, "")


def _module_path(classname: str) -> str:
    """`tests.fast.kernels.test_x` (or `tests.fast.kernels.test_x.TestClass`) -> `tests/fast/kernels/test_x.py`."""
    parts = classname.split(".")
    for end in range(len(parts), 0, -1):
        candidate = "/".join(parts[:end]) + ".py"
        if (REPO_ROOT / candidate).is_file():
            return candidate
    return "/".join(parts) + ".py"
