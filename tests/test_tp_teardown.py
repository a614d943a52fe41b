"""Rank 0's tensor-parallel teardown, without processes: the order of its steps and its bounds.

On two H200s the engine's shutdown hung forever: a CUDA graph that captured an NCCL collective holds a
reference on the communicator until the graph is destroyed, and NCCL's destroy and abort wait for those
references. So rank 0 must destroy its decode graphs before its process groups, and a teardown that
still blocks must give way to an abort instead of hanging the caller. Fakes stand in for the groups and
the step channel and log each call.
"""

from __future__ import annotations

import threading
import time

import pytest

from fast import tp_launch
from fast.tp_launch import TensorParallelRuntime


class FakeGroups:
    def __init__(self, log: list[object], first_destroy_blocks: threading.Event | None = None) -> None:
        self.log = log
        self.first_destroy_blocks = first_destroy_blocks

    def destroy(self) -> None:
        self.log.append("destroy")
        blocker, self.first_destroy_blocks = self.first_destroy_blocks, None
        if blocker is not None:
            blocker.wait()  # a teardown stuck in the communication library

    def abort(self) -> None:
        self.log.append("abort")


class FakeChannel:
    def __init__(self, log: list[object]) -> None:
        self.log = log

    def send_stop(self) -> None:
        self.log.append("stop")


def _runtime(monkeypatch: pytest.MonkeyPatch, log: list[object], groups: FakeGroups) -> TensorParallelRuntime:
    monkeypatch.setattr(tp_launch, "StepChannel", lambda _groups: FakeChannel(log))
    runtime = TensorParallelRuntime(groups, workers=None)  # type: ignore[arg-type]
    runtime.release_before_teardown = lambda synchronize: log.append(("release graphs", synchronize))
    return runtime


def test_graphs_are_destroyed_before_the_process_groups(monkeypatch: pytest.MonkeyPatch) -> None:
    log: list[object] = []
    runtime = _runtime(monkeypatch, log, FakeGroups(log))
    runtime.shutdown()
    assert log == [("release graphs", True), "stop", "destroy"]
    runtime.shutdown()  # idempotent
    assert log == [("release graphs", True), "stop", "destroy"]


def test_a_failed_rank_releases_graphs_without_waiting_for_the_device_and_aborts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    log: list[object] = []
    runtime = _runtime(monkeypatch, log, FakeGroups(log))
    runtime._on_worker_death("tensor-parallel rank 1 (pid 1) was killed by SIGKILL")
    log.clear()  # the watchdog's own abort
    with pytest.raises(tp_launch.TensorParallelError, match="killed by SIGKILL"):
        runtime.check()
    assert log == [("release graphs", False), "abort", "destroy"]


def test_a_teardown_that_blocks_gives_way_to_an_abort(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tp_launch, "STOP_TIMEOUT_S", 0.2)
    log: list[object] = []
    stuck = threading.Event()
    runtime = _runtime(monkeypatch, log, FakeGroups(log, first_destroy_blocks=stuck))
    started = time.monotonic()
    runtime.shutdown()
    elapsed = time.monotonic() - started
    stuck.set()
    assert elapsed < 5.0
    assert log == [("release graphs", True), "stop", "destroy", "abort", "destroy"]
