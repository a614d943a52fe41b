"""tests/gpu_sharing.py: a `gpu_alone` holder excludes every shared holder, waits for the running ones, and keeps new
ones out while it waits. Threads stand in for pytest-xdist workers: each opens the lock files itself, and flock
locks belong to the open file, so they exclude each other as processes would."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

import pytest
import torch

from tests.gpu_sharing import (
    SHARED_POOL_UTILIZATION,
    gpu_alone,
    gpu_alone_tests_last,
    gpu_shared,
    holders,
    named_holder,
    refuse_whole_gpu_pools,
    whole_gpu_pool,
)


def _holder(name: str, hold: AbstractContextManager[None], events: list[str], release: threading.Event) -> Callable:
    def run() -> None:
        with hold:
            events.append(f"{name} in")
            release.wait(timeout=10)
            events.append(f"{name} out")

    return run


def _start(run: Callable[[], None]) -> threading.Thread:
    thread = threading.Thread(target=run)
    thread.start()
    return thread


def _wait_for(events: list[str], event: str) -> None:
    deadline = time.monotonic() + 10
    while event not in events:
        assert time.monotonic() < deadline, f"{event!r} never happened: {events}"
        time.sleep(0.01)


def test_shared_holders_run_together(tmp_path: Path) -> None:
    events: list[str] = []
    release = threading.Event()
    first = _start(_holder("first", gpu_shared(tmp_path), events, release))
    second = _start(_holder("second", gpu_shared(tmp_path), events, release))
    _wait_for(events, "first in")
    _wait_for(events, "second in")
    release.set()
    first.join(), second.join()


def test_an_alone_holder_waits_for_the_running_ones_and_keeps_new_ones_out(tmp_path: Path) -> None:
    """running holds the GPU shared; alone asks for it, then late asks to share it. alone starts only after
    running ends, and late only after alone ends, though late could share the GPU with running."""
    events: list[str] = []
    release_running, release_alone, release_late = threading.Event(), threading.Event(), threading.Event()
    running = _start(_holder("running", gpu_shared(tmp_path), events, release_running))
    _wait_for(events, "running in")
    alone = _start(_holder("alone", gpu_alone(tmp_path), events, release_alone))
    time.sleep(0.2)  # alone now waits for the GPU, holding the turnstile
    late = _start(_holder("late", gpu_shared(tmp_path), events, release_late))
    time.sleep(0.2)
    assert events == ["running in"]  # neither alone nor late has started
    release_running.set()
    _wait_for(events, "alone in")
    time.sleep(0.2)
    assert events == ["running in", "running out", "alone in"]  # late still waits
    release_alone.set()
    _wait_for(events, "late in")
    release_late.set()
    for thread in (running, alone, late):
        thread.join()
    assert events == ["running in", "running out", "alone in", "alone out", "late in", "late out"]


class _Item:
    def __init__(self, name: str, *markers: str) -> None:
        self.name, self.keywords = name, {name, *markers}


def test_the_alone_tests_go_last_and_the_others_keep_their_order() -> None:
    items = [_Item("a"), _Item("sizing", "gpu_alone"), _Item("b", "large_gpu"), _Item("c"), _Item("d", "gpu_alone")]
    assert [item.name for item in gpu_alone_tests_last(items)] == ["a", "b", "c", "sizing", "d"]


def test_holders_name_each_process_test_while_it_holds(tmp_path: Path) -> None:
    assert holders(tmp_path) == ""
    with gpu_shared(tmp_path), named_holder(tmp_path, "tests/a.py::test_one"):
        assert holders(tmp_path) == f"{os.getpid()} tests/a.py::test_one"
    assert holders(tmp_path) == ""


def test_a_shared_holder_may_not_size_a_pool_from_most_of_the_gpu() -> None:
    assert whole_gpu_pool(64, 0.9) is None  # an explicit pool
    assert whole_gpu_pool(None, 0.05) is None  # a small fraction (the engine's too-little-memory errors)
    assert whole_gpu_pool(None, SHARED_POOL_UTILIZATION) is None
    problem = whole_gpu_pool(None, 0.9)
    assert problem is not None and "gpu_memory_utilization 0.9" in problem and "num_blocks" in problem


def test_an_engine_sizing_its_pool_from_most_of_the_gpu_fails_its_test(tiny_weights) -> None:
    """refuse_whole_gpu_pools as conftest sets it for a test holding the GPU shared: the runner's pool sizing is
    checked before it runs (on the CPU, where it would size nothing, the check is the same)."""
    from fast.model_runner import ModelRunner, PoolRoom
    from spec.engine_config import EngineConfig
    from tests.engines import FAST_DEVICE
    from tests.fast.test_pool_room import pool_blocks, stand_in_runner

    config, state_dict = tiny_weights
    with pytest.MonkeyPatch.context() as patch:
        refuse_whole_gpu_pools(patch)
        with pytest.raises(pytest.fail.Exception, match="gpu_memory_utilization 0.9 of a GPU that other"):
            ModelRunner(config, state_dict, EngineConfig(), torch.float32, torch.device(FAST_DEVICE))
        runner = ModelRunner(config, state_dict, EngineConfig(num_blocks=16), torch.float32, torch.device(FAST_DEVICE))
        assert runner.config.num_blocks == 16
        # A stand-in runner (the pool sizing rules on made-up room, tests/fast/test_pool_room.py) takes no memory.
        assert pool_blocks(stand_in_runner({True: PoolRoom(40, 100)}, []), EngineConfig(max_model_len=64)) == 40
