"""`python -m reports.bench.plan PLAN [--out DIR] [--budget-s S] [--commit SHA]`: one device call's steps,
run in order under one time budget. The plan is data, kept in the record directory it produced.

A plan is a TOML file (or JSON with the same keys):

    description = "what the call measures"        # optional
    budget_s = 585                                # optional: the call's budget (default 580; --budget-s wins)
    [env]                                         # optional: for every step
    OMP_NUM_THREADS = "2"

    [[steps]]
    name = "offline-256"                          # its output goes to OUT/offline-256.log
    limit_s = 40                                  # the most it may take
    command = ["python", "-m", "twinfer.cli", "bench", "offline-256", "--commit", "{commit}",
               "--json", "{out}/offline-256.json"]
    cwd = "."                                     # optional, relative to where the runner runs
    env = {TWINFER_RESULTS_DIR = "{out}"}         # optional, this step only
    signal = "ABRT"                               # optional: sent at the limit (default TERM)
    stop_on_failure = true                        # optional: a failure skips every later step
    summary = "^(fast|hf) "                       # optional: the log lines the summary shows

`{out}` and `{commit}` in a command, cwd or env value stand for the output directory and the commit.

Each step gets at most its own limit and what is left of the budget; with under MIN_STEP_S left it is
skipped and says so. At its limit its process group gets `signal`, and SIGKILL KILL_AFTER_S later, as
`timeout -k` does; its status is then 124, or 137 when it had to be killed. OUT gets NAME.log per step
(stdout and stderr), done.txt (a line per step as it ends: `NAME rc=R at Ts (limit Ls)`, or `skipped NAME:
why`), commit.txt (--commit, else `git rev-parse HEAD`: a device's copy of the tree can carry stale git
metadata, so give the commit under test), tree.txt and the plan file itself.

tree.txt is the git tree id of the files the runner's folder holds as they are (the tracked ones and the untracked
ones git does not ignore; hashed through a scratch index, so the checkout's own index and HEAD, stale or not, play no
part): where it equals `git rev-parse COMMIT^{tree}`, the tree that ran is exactly COMMIT's, whatever commit.txt
says. "unknown" where git cannot tell (no git, or not a checkout).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

logger = logging.getLogger(__name__)

DEFAULT_BUDGET_S = 580.0  # of the device's 600 s a call, leaving time to hand the files back
MIN_STEP_S = 30.0  # a step with less than this left is skipped: too short to start a Python process and a GPU
KILL_AFTER_S = 10.0  # after the limit's signal, SIGKILL this much later
TIMED_OUT, KILLED, NOT_FOUND = 124, 137, 127  # the statuses `timeout` and a shell give
DONE_FILE, COMMIT_FILE, TREE_FILE = "done.txt", "commit.txt", "tree.txt"
STEP_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
PLAN_KEYS = {"description", "budget_s", "env", "steps"}
STEP_KEYS = {"name", "command", "limit_s", "cwd", "env", "signal", "stop_on_failure", "summary"}


class PlanError(ValueError):
    """A plan file that cannot be run as written."""


@dataclass(frozen=True)
class Step:
    name: str
    command: tuple[str, ...]
    limit_s: float
    cwd: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    limit_signal: signal.Signals = signal.SIGTERM  # the plan's `signal`
    stop_on_failure: bool = False
    summary: str | None = None  # a regular expression


@dataclass(frozen=True)
class Plan:
    steps: tuple[Step, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    budget_s: float | None = None
    description: str = ""


@dataclass(frozen=True)
class StepResult:
    name: str
    returncode: int | None  # None: skipped
    at_s: float  # seconds into the call when it ended, or was skipped
    limit_s: float | None = None  # the limit it ran under
    skipped_because: str | None = None

    def done_line(self) -> str:
        if self.returncode is None:
            return f"skipped {self.name}: {self.skipped_because}"
        return f"{self.name} rc={self.returncode} at {self.at_s:.0f}s (limit {self.limit_s:g}s)"


# ----------------------------------------------------------------------------- reading a plan


def load_plan(path: Path) -> Plan:
    """The plan in `path` (.json: JSON, anything else: TOML), checked: PlanError says what is wrong."""
    text = path.read_text()
    try:
        data = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
    except (json.JSONDecodeError, tomllib.TOMLDecodeError) as error:
        raise PlanError(f"{path}: not a plan file: {error}") from error
    return parse_plan(data, str(path))


def parse_plan(data: Mapping[str, object], where: str = "plan") -> Plan:
    _no_unknown_keys(data, PLAN_KEYS, where)
    steps = data.get("steps")
    if not isinstance(steps, list) or not steps:
        raise PlanError(f"{where}: `steps` must be a non-empty list of steps")
    parsed = tuple(_parse_step(step, f"{where}, step {index + 1}") for index, step in enumerate(steps))
    names = [step.name for step in parsed]
    if len(set(names)) != len(names):
        raise PlanError(f"{where}: step names must be unique (each names its log), got {names}")
    budget_s = data.get("budget_s")
    if budget_s is not None:
        budget_s = _positive_number(budget_s, f"{where}: budget_s")
    description = data.get("description", "")
    if not isinstance(description, str):
        raise PlanError(f"{where}: description must be text")
    return Plan(parsed, _string_map(data.get("env", {}), f"{where}: env"), budget_s, description)


def _parse_step(data: object, where: str) -> Step:
    if not isinstance(data, Mapping):
        raise PlanError(f"{where}: a step is a table of {sorted(STEP_KEYS)}")
    _no_unknown_keys(data, STEP_KEYS, where)
    name = data.get("name")
    if not isinstance(name, str) or not STEP_NAME.fullmatch(name):
        raise PlanError(f"{where}: name must be letters, digits, '.', '_' or '-' (it names a file), got {name!r}")
    command = data.get("command")
    if not isinstance(command, list) or not command or not all(isinstance(word, str) for word in command):
        raise PlanError(f"{where} ({name}): command must be a non-empty list of strings (argv, no shell)")
    cwd = data.get("cwd")
    if cwd is not None and not isinstance(cwd, str):
        raise PlanError(f"{where} ({name}): cwd must be a path")
    stop_on_failure = data.get("stop_on_failure", False)
    if not isinstance(stop_on_failure, bool):
        raise PlanError(f"{where} ({name}): stop_on_failure must be true or false")
    summary = data.get("summary")
    if summary is not None:
        try:
            re.compile(summary)
        except (re.error, TypeError) as error:
            raise PlanError(f"{where} ({name}): summary must be a regular expression: {error}") from error
    return Step(
        name=name,
        command=tuple(command),
        limit_s=_positive_number(data.get("limit_s"), f"{where} ({name}): limit_s"),
        cwd=cwd,
        env=_string_map(data.get("env", {}), f"{where} ({name}): env"),
        limit_signal=_signal(data.get("signal", "TERM"), f"{where} ({name}): signal"),
        stop_on_failure=stop_on_failure,
        summary=summary,
    )


def _no_unknown_keys(data: Mapping[str, object], known: set[str], where: str) -> None:
    unknown = set(data) - known
    if unknown:
        raise PlanError(f"{where}: unknown keys {sorted(unknown)} (known: {sorted(known)})")


def _positive_number(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise PlanError(f"{what} must be a positive number of seconds, got {value!r}")
    return float(value)


def _string_map(value: object, what: str) -> dict[str, str]:
    if not isinstance(value, Mapping) or not all(isinstance(v, str) for v in value.values()):
        raise PlanError(f"{what} must map names to strings")
    return dict(value)


def _signal(value: object, what: str) -> signal.Signals:
    name = value if isinstance(value, str) else ""
    try:
        return signal.Signals["SIG" + name.upper().removeprefix("SIG")]
    except KeyError:
        raise PlanError(f"{what} must name a signal (TERM, INT, ABRT, ...), got {value!r}") from None


# ----------------------------------------------------------------------------- running it


def run_plan(
    plan: Plan,
    out: Path,
    commit: str,
    budget_s: float | None = None,
    plan_file: Path | None = None,
    clock: Callable[[], float] = time.monotonic,
    tree: str | None = None,
) -> list[StepResult]:
    """Every step in order, as the module docstring says; returns each step's result. `budget_s` (else the
    plan's, else DEFAULT_BUDGET_S) counts from this call's start. `tree` (main: worktree_tree_id()) goes to
    tree.txt."""
    out.mkdir(parents=True, exist_ok=True)
    (out / COMMIT_FILE).write_text(commit + "\n")
    if tree is not None:
        (out / TREE_FILE).write_text(tree + "\n")
    if plan_file is not None and plan_file.resolve() != (out / plan_file.name).resolve():
        shutil.copyfile(plan_file, out / plan_file.name)
    budget = next(value for value in (budget_s, plan.budget_s, DEFAULT_BUDGET_S) if value is not None)
    words = {"{out}": str(out.resolve()), "{commit}": commit}
    start = clock()
    results: list[StepResult] = []
    stopped_by: str | None = None
    for step in plan.steps:
        left = budget - (clock() - start)
        if stopped_by is not None:
            result = StepResult(step.name, None, clock() - start, skipped_because=f"{stopped_by} failed")
        elif left < MIN_STEP_S:
            result = StepResult(step.name, None, clock() - start, skipped_because=f"{left:.0f}s left")
        else:
            limit = min(step.limit_s, left)
            environment = os.environ | _substituted(plan.env, words) | _substituted(step.env, words)
            returncode = run_step(step, out / f"{step.name}.log", limit, environment, words)
            result = StepResult(step.name, returncode, clock() - start, limit)
            if returncode != 0 and step.stop_on_failure:
                stopped_by = step.name
        logger.info("%s", result.done_line())
        with (out / DONE_FILE).open("a") as done:
            done.write(result.done_line() + "\n")
        results.append(result)
    return results


def run_step(step: Step, log_path: Path, limit_s: float, env: Mapping[str, str], words: Mapping[str, str]) -> int:
    """The step's command with stdout and stderr in `log_path`, in its own process group so that a step
    at its limit ends with everything it started; its exit status, or TIMED_OUT / KILLED / NOT_FOUND."""
    argv = [_substitute(word, words) for word in step.command]
    cwd = _substitute(step.cwd, words) if step.cwd is not None else None
    with log_path.open("wb") as log:
        try:
            process = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, cwd=cwd, env=dict(env), start_new_session=True
            )
        except (FileNotFoundError, PermissionError, NotADirectoryError) as error:
            log.write(f"cannot run {argv}: {error}\n".encode())
            return NOT_FOUND
        try:
            return process.wait(timeout=limit_s)
        except subprocess.TimeoutExpired:
            return _stop(process, step.limit_signal)


def _stop(process: subprocess.Popen, first_signal: signal.Signals) -> int:
    """End a step at its limit: `first_signal` to its process group, SIGKILL KILL_AFTER_S later."""
    _signal_group(process, first_signal)
    try:
        process.wait(timeout=KILL_AFTER_S)
        return TIMED_OUT
    except subprocess.TimeoutExpired:
        _signal_group(process, signal.SIGKILL)
        process.wait()
        return KILLED


def _signal_group(process: subprocess.Popen, sent: signal.Signals) -> None:
    try:
        os.killpg(process.pid, sent)
    except ProcessLookupError:  # the group ended between the limit and the signal
        pass


def _substitute(text: str, words: Mapping[str, str]) -> str:
    for word, value in words.items():
        text = text.replace(word, value)
    return text


def _substituted(env: Mapping[str, str], words: Mapping[str, str]) -> dict[str, str]:
    return {name: _substitute(value, words) for name, value in env.items()}


def current_commit() -> str:
    """`git rev-parse HEAD` here, or "unknown" where there is no git checkout."""
    try:
        result = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=False)
    except FileNotFoundError:
        return "unknown"
    return result.stdout.strip() if result.returncode == 0 else "unknown"


def worktree_tree_id(folder: Path | None = None) -> str:
    """The git tree id of the checkout's files as they are in `folder` (default: here), through a scratch index:
    equal to `git rev-parse COMMIT^{tree}` exactly when they are COMMIT's files. "unknown" where git cannot say."""
    with tempfile.TemporaryDirectory() as scratch:
        environment = os.environ | {"GIT_INDEX_FILE": str(Path(scratch) / "index")}
        try:
            for command in (["git", "add", "--all", "--", ":/"], ["git", "write-tree"]):
                result = subprocess.run(
                    command, cwd=folder, env=environment, capture_output=True, text=True, check=False, timeout=120
                )
                if result.returncode != 0:
                    logger.warning("no tree id: %s: %s", " ".join(command), result.stderr.strip()[-300:])
                    return "unknown"
        except (OSError, subprocess.TimeoutExpired) as error:
            logger.warning("no tree id: %s", error)
            return "unknown"
    return result.stdout.strip()


def summary_lines(plan: Plan, results: Sequence[StepResult], out: Path, tail: int = 3) -> list[str]:
    """done.txt's lines, then per step that ran the lines of its log that its `summary` pattern matches
    (else its last `tail` lines), progress-bar redraws split into lines."""
    lines = [result.done_line() for result in results]
    for step, result in zip(plan.steps, results, strict=True):
        if result.returncode is None:
            continue
        log = (out / f"{step.name}.log").read_text(errors="replace").replace("\r", "\n")
        shown = [line for line in log.splitlines() if line.strip()]
        if step.summary is not None:
            shown = [line for line in shown if re.search(step.summary, line)]
        else:
            shown = shown[-tail:]
        lines.append(f"== {step.name}")
        lines.extend(line[:200] for line in shown)
    return lines


# ----------------------------------------------------------------------------- command line


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("plan", type=Path, help="the plan file (TOML, or .json)")
    parser.add_argument(
        "--out",
        type=Path,
        default=Path(os.environ["OUT"]) if os.environ.get("OUT") else None,
        help="where the logs, done.txt, commit.txt, tree.txt and a copy of the plan go (default: $OUT, the device's "
        "output)",
    )
    parser.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help=f"the call's time budget in seconds (default: the plan's budget_s, else {DEFAULT_BUDGET_S:g})",
    )
    parser.add_argument("--commit", help="the commit under test, recorded and given as {commit} (default: git HEAD)")


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the plan, prints the summary; 0 when every step ran and exited 0, else 1; 2 for a bad plan."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    parser = argparse.ArgumentParser(prog="python -m reports.bench.plan", description=__doc__.split("\n\n")[0])
    configure_parser(parser)
    args = parser.parse_args(argv)
    if args.out is None:
        parser.error("give --out DIR (or set OUT)")
    try:
        plan = load_plan(args.plan)
    except (OSError, PlanError) as error:
        print(f"python -m reports.bench.plan: error: {error}", file=sys.stderr)
        return 2
    commit = args.commit or current_commit()
    results = run_plan(plan, args.out, commit, args.budget_s, plan_file=args.plan, tree=worktree_tree_id())
    print("\n".join(summary_lines(plan, results, args.out)))
    return 0 if all(result.returncode == 0 for result in results) else 1


if __name__ == "__main__":
    sys.exit(main())
