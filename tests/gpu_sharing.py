"""How the pytest-xdist workers of one run share a GPU: every test holds the GPU shared, and a test marked
`gpu_alone` holds it alone, so that nothing else runs on the device while it does.

Why: the fast engine sizes its KV pool from the device's free memory (`gpu_memory_utilization`), which counts the
other workers' memory too. A test of that sizing computed its allowance as what the device used when it began plus
a margin, and the other workers' engines grew past the margin while its engine was built, three times in whole-suite
runs on one H200 (reports/results/fast_gpu/run_11f7c89/, suite_35d7b83/, suite_and_report/run_7ed58af/). Raising the
margin each time was the wrong depth: while a `gpu_alone` test runs, no other test runs, so what the device uses
cannot grow under it.

Two flock'd files in a directory the workers share (a lock frees itself when its process dies):
- `gpu`: held shared by every running test, exclusively by a `gpu_alone` test;
- `turnstile`: a test about to take `gpu` shared passes through it (takes it exclusively and lets go at once), and
  a `gpu_alone` test holds it while it waits for `gpu`. Once an alone test waits, no new test starts, and the
  running ones end: without it, tests that start one after another on seven workers could keep `gpu` shared
  forever.

Each holder also names itself in `holders/PID` (its test's node id) while it holds the GPU, so that a test that runs
out of memory can say which tests held the device then (`holders`): CUDA's out-of-memory message lists each
process's memory by PID, but not what that process was running.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypeVar

import pytest

if TYPE_CHECKING:
    from spec.engine_config import EngineConfig

GPU_LOCK = "gpu"
TURNSTILE = "turnstile"
HOLDERS = "holders"


class _Marked(Protocol):
    keywords: object  # pytest.Item.keywords: supports `in`


Item = TypeVar("Item", bound=_Marked)


@contextmanager
def _locked(path: Path, operation: int) -> Iterator[None]:
    with open(path, "a") as handle:
        fcntl.flock(handle, operation)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextmanager
def gpu_shared(directory: Path) -> Iterator[None]:
    """Hold the GPU beside other shared holders; wait while a `gpu_alone` test waits for it or holds it."""
    directory.mkdir(parents=True, exist_ok=True)
    with _locked(directory / TURNSTILE, fcntl.LOCK_EX):
        pass
    with _locked(directory / GPU_LOCK, fcntl.LOCK_SH):
        yield


@contextmanager
def gpu_alone(directory: Path) -> Iterator[None]:
    """Hold the GPU alone: no new holder starts once this waits, and this starts when the running ones end."""
    directory.mkdir(parents=True, exist_ok=True)
    with _locked(directory / TURNSTILE, fcntl.LOCK_EX), _locked(directory / GPU_LOCK, fcntl.LOCK_EX):
        yield


@contextmanager
def named_holder(directory: Path, test: str) -> Iterator[None]:
    """`test` written to `holders/PID` (this process's) while the block runs."""
    path = directory / HOLDERS / str(os.getpid())
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(test)
    try:
        yield
    finally:
        path.unlink(missing_ok=True)


def holders(directory: Path) -> str:
    """One line per process holding the GPU now: its PID and its test, in PID order."""
    folder = directory / HOLDERS
    entries = sorted(folder.iterdir(), key=lambda path: int(path.name)) if folder.is_dir() else []
    lines = []
    for path in entries:
        try:
            lines.append(f"{path.name} {path.read_text()}")
        except FileNotFoundError:  # its test ended while this looked
            continue
    return "\n".join(lines)


# The most of the GPU's memory a test holding the GPU shared may let the fast engine size its KV pool from
# (EngineConfig.gpu_memory_utilization with num_blocks None). The default, 0.9, takes what the other workers do not
# hold at that moment: 70 and 80 GiB in whole-suite runs on one H200, which starved other workers' tests
# (reports/results/fast_gpu/suite_and_report/run_4b66ce7_oom/, run_0f2cca6/). A test of small fractions (an
# engine refused for too little memory) stays below it.
SHARED_POOL_UTILIZATION = 0.1


def whole_gpu_pool(num_blocks: int | None, gpu_memory_utilization: float) -> str | None:
    """Why a test holding the GPU shared may not build a pool so, or None where it may."""
    if num_blocks is not None or gpu_memory_utilization <= SHARED_POOL_UTILIZATION:
        return None
    return (
        f"a fast engine sized its KV pool from gpu_memory_utilization {gpu_memory_utilization} of a GPU that other "
        "pytest workers share (it takes what they do not hold, tens of GiB): give the test's engine num_blocks, or "
        "mark the test gpu_alone (tests/gpu_sharing.py)"
    )


def refuse_whole_gpu_pools(patch: pytest.MonkeyPatch) -> None:
    """While `patch` holds, a fast engine that would size its KV pool from most of the GPU (whole_gpu_pool) fails the
    test building it, naming why. conftest.py sets it for every test holding the GPU shared."""
    from fast.model_runner import ModelRunner

    pool_blocks = ModelRunner._pool_blocks

    def checked(self: ModelRunner, requested: EngineConfig, settings: EngineConfig) -> int | None:
        # Only a real runner measures and takes the GPU's memory; a stand-in (tests/fast/test_pool_room.py: the sizing
        # rules on made-up room) holds nothing, and failed here in the whole suite at b9391b4.
        problem = whole_gpu_pool(requested.num_blocks, requested.gpu_memory_utilization)
        if problem is not None and isinstance(self, ModelRunner):
            pytest.fail(problem)
        return pool_blocks(self, requested, settings)

    patch.setattr(ModelRunner, "_pool_blocks", checked)


def gpu_alone_tests_last(items: Sequence[Item]) -> list[Item]:
    """The `gpu_alone` tests moved to the end of the collection. Such a test waits for every running test to end,
    and the other workers wait meanwhile (above). At the start they would wait for the longest tests, the
    `large_gpu` ones, which conftest.large_gpu_tests_first starts at once. At the end most workers have nothing
    left to run."""
    return [item for item in items if "gpu_alone" not in item.keywords] + [
        item for item in items if "gpu_alone" in item.keywords
    ]
