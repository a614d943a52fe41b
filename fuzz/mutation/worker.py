"""One test run of a module's test selection, with or without a mutant: in a forked child.

Starting pytest afresh costs seconds of imports (torch, hypothesis, triton) per mutant, more than most
mutants take to die. So each worker process imports those once (`preload`, the pool's initializer)
and forks a child per run: the child starts with them loaded, serves the mutated module's source from
memory through an import hook (nothing is written to disk, so no other worker, no `__pycache__` and no
later run can see a mutant) and runs pytest in-process. A child that outlives its time limit is killed
with its whole process group: a mutant that loops forever counts as killed by its timeout.

First-party modules are never imported before the fork, so every child imports them fresh from the
tree, the mutated one from the hook.
"""

from __future__ import annotations

import builtins
import importlib.abc
import importlib.machinery
import importlib.util
import os
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import CodeType

# Imported by every worker before it forks: third-party only (see the module's docstring).
PRELOADED = ("numpy", "torch", "triton", "safetensors", "xxhash", "hypothesis", "pytest", "xdist", "transformers")
HYPOTHESIS_PROFILE = "mutation"
OUTPUT_TAIL_CHARS = 2000
POLL_S = 0.02

KILLED, SURVIVED, TIMEOUT, ERROR = "killed", "survived", "timeout", "error"
# pytest's exit codes: 1 a test failed, 2 interrupted (an error while collecting: the mutant broke an
# import, which the tests noticed); 0 every test passed. 3 (internal error), 4 (usage) and 5 (no test
# collected) say nothing about the mutant.
_OUTCOME_OF_EXIT_CODE = {0: SURVIVED, 1: KILLED, 2: KILLED}


@dataclass(frozen=True)
class SelectionRun:
    outcome: str  # KILLED, SURVIVED, TIMEOUT or ERROR
    seconds: float
    exit_code: int | None  # None: killed at its time limit
    output_tail: str = ""


def preload() -> None:
    """The pool's initializer: the environment the tests expect (root conftest.py sets the same), then
    the heavy third-party imports."""
    os.environ["OPENBLAS_CORETYPE"] = "Sandybridge"  # as conftest.py: before numpy loads OpenBLAS
    os.environ.setdefault("TRITON_INTERPRET", "1")
    os.environ["PYTEST_ADDOPTS"] = ""  # the command's own options only
    for name in PRELOADED:
        try:
            __import__(name)
        except ImportError:
            continue  # a test that needs it fails in the baseline, which names it
    import torch

    torch.set_num_threads(1)
    # The worker is the parent of every child: it must hold no first-party module.
    leaked = [name for name in sys.modules if name.split(".")[0] in ("spec", "reference", "fast", "twinfer")]
    if leaked:
        raise RuntimeError(f"a preloaded library imported first-party modules {leaked}: mutants would not be seen")


def run_tests(
    root: str, tests: tuple[str, ...], module: str | None, source: str | None, timeout_s: float
) -> SelectionRun:
    """Run `tests` (paths or node ids under `root`) with `module` (a path under root) replaced by
    `source`, or unmutated where `module` is None; stop at the first failure."""
    refuse_a_cuda_context()
    with tempfile.TemporaryDirectory(prefix="twinfer-mutant-") as scratch:
        log_path = Path(scratch) / "output.txt"
        started = time.monotonic()
        pid = os.fork()
        if pid == 0:  # the child: never returns
            _child(root, tests, module, source, log_path, Path(scratch))
        exit_code = _wait(pid, timeout_s)
        seconds = time.monotonic() - started
        tail = log_path.read_text(errors="replace")[-OUTPUT_TAIL_CHARS:] if log_path.exists() else ""
    if exit_code is None:
        return SelectionRun(TIMEOUT, seconds, None, tail)
    return SelectionRun(_OUTCOME_OF_EXIT_CODE.get(exit_code, ERROR), seconds, exit_code, tail)


def refuse_a_cuda_context() -> None:
    """A fork of a process that holds a CUDA context aborts (SIGABRT, seen on an H200 in a pytest worker that
    had run GPU tests): the runner needs a process without one, as its plans give it (CUDA_VISIBLE_DEVICES=)."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        raise RuntimeError(
            "the mutation runner forks a child per run, and a fork of a process holding a CUDA context aborts: "
            "run it where CUDA is not initialised (CUDA_VISIBLE_DEVICES= python -m fuzz.mutation ...)"
        )


def _wait(pid: int, timeout_s: float) -> int | None:
    """The child's exit code, or None after killing it (and its process group) at the time limit."""
    deadline = time.monotonic() + timeout_s
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            os.waitpid(pid, 0)
            return None
        time.sleep(POLL_S)


def _child(root: str, tests: tuple[str, ...], module: str | None, source: str | None, log: Path, scratch: Path) -> None:
    exit_code = 3
    try:
        os.setsid()  # its own process group: a timeout kills whatever it started too
        with open(log, "w") as output:
            os.dup2(output.fileno(), 1)
            os.dup2(output.fileno(), 2)
        # Forked inside a pytest run, sys.stdout may be that run's capture file rather than descriptor 1.
        sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
        os.chdir(root)
        os.environ["TWINFER_FUZZ_STATS"] = str(scratch / "fuzz-stats.json")  # not the tree's .fuzz-stats/
        if module is not None and source is not None:
            _serve_mutant(root, module, source)
        exit_code = _pytest(tests)
    except BaseException:  # noqa: BLE001 - whatever happens, the child must exit here, not return into the pool
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(int(exit_code))


def _pytest(tests: tuple[str, ...]) -> int:
    import pytest
    from hypothesis import HealthCheck, Phase, settings

    # The fuzzers' ci sizes, derandomized, without shrinking: a failing example kills the mutant as
    # surely as a shrunk one, in a fraction of the time.
    settings.register_profile(
        HYPOTHESIS_PROFILE,
        max_examples=100,
        stateful_step_count=50,
        derandomize=True,
        database=None,
        deadline=None,
        print_blob=False,
        phases=(Phase.explicit, Phase.reuse, Phase.generate),
        suppress_health_check=list(HealthCheck),
    )
    arguments = ["-x", "-q", "-n", "0", "-p", "no:cacheprovider", f"--hypothesis-profile={HYPOTHESIS_PROFILE}"]
    return int(pytest.main([*arguments, *tests]))


def _serve_mutant(root: str, module: str, source: str) -> None:
    """Make `import <module>` load `source` (the mutant) instead of the file's text."""
    # cosmic-ray's ExceptionReplacer writes `except CosmicRayTestingException:`: a name the mutant must find
    # (an exception nothing raises). Defined here, so a run of saved mutants needs no cosmic-ray.
    builtins.CosmicRayTestingException = type("CosmicRayTestingException", (Exception,), {})  # type: ignore[attr-defined]
    path = Path(root) / module
    parts = Path(module).with_suffix("").parts
    is_package = parts[-1] == "__init__"
    name = ".".join(parts[:-1] if is_package else parts)
    sys.meta_path.insert(0, _MutantFinder(name, str(path), source, is_package))


class _MutantLoader(importlib.machinery.SourceFileLoader):
    """A source loader whose code is the mutant's, compiled afresh (never read from or written to a .pyc)."""

    def __init__(self, name: str, path: str, source: str) -> None:
        super().__init__(name, path)
        self.mutant_source = source

    def get_source(self, fullname: str) -> str:
        return self.mutant_source

    def get_code(self, fullname: str) -> CodeType:
        return compile(self.mutant_source, self.path, "exec", dont_inherit=True)


class _MutantFinder(importlib.abc.MetaPathFinder):
    def __init__(self, name: str, path: str, source: str, is_package: bool) -> None:
        self.name, self.path, self.source, self.is_package = name, path, source, is_package

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> importlib.machinery.ModuleSpec:
        if fullname != self.name:
            return None  # type: ignore[return-value]
        locations = [str(Path(self.path).parent)] if self.is_package else None
        loader = _MutantLoader(fullname, self.path, self.source)
        return importlib.util.spec_from_file_location(
            fullname, self.path, loader=loader, submodule_search_locations=locations
        )
