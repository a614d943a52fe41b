"""Rank 0's handling of the tensor-parallel ranks, without a model: the order of its teardown and its
bounds, and the worker processes' start-up, failure and end.

On two H200s the engine's shutdown hung forever: a CUDA graph that captured an NCCL collective holds a
reference on the communicator until the graph is destroyed, and NCCL's destroy and abort wait for those
references. So rank 0 must destroy its decode graphs before its process groups, and a teardown that
still blocks must give way to an abort instead of hanging the caller. Fakes stand in for the groups and
the step channel and log each call.

The worker processes are real (`python -P -m fast.tp_worker_process`, or a stand-in command) but are
sent a payload that runs no model, so that they start in a fraction of a second without importing torch:
what fails while rebuilding its spec reports its rank and error, a process that dies before it reports
in says where its error went, a worker leaves when rank 0's end of its socket closes (as when rank 0
dies), and one that will not leave is terminated, then killed.
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from fast import tp_launch
from fast.parallel import TensorParallelError
from fast.tp_launch import TensorParallelRuntime, WorkerProcesses
from fast.tp_worker_process import STARTED


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


# ----------------------------------------------------------------------------- worker processes


class RunsInTheWorker:
    """A payload that, rebuilt by a worker in place of its spec, runs `code` there."""

    def __init__(self, code: str) -> None:
        self.code = code

    def __reduce__(self) -> tuple[object, ...]:
        return (exec, (self.code,))


def _workers(monkeypatch: pytest.MonkeyPatch, payload: bytes, command: list[str] | None = None) -> WorkerProcesses:
    """Rank 1 of 2, sent `payload` instead of a pickled spec; run as `command` when given."""
    monkeypatch.setattr(tp_launch, "pickle_for_worker", lambda spec: payload)
    if command is not None:
        monkeypatch.setattr(tp_launch, "worker_command", lambda rank, fd: command)
    return WorkerProcesses(SimpleNamespace(world_size=2))  # type: ignore[arg-type]


def _assert_reaped(pids: list[int]) -> None:
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)  # a zombie would still be found


def test_a_worker_that_cannot_rebuild_its_spec_reports_its_rank_and_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """The real worker module, sent a pickle naming a module it cannot import (as a class that only rank 0
    can import would): rank 0 raises with the worker's rank, pid and traceback."""
    workers = _workers(monkeypatch, b"cno_module_of_twinfer\nweights\n.")
    try:
        with pytest.raises(TensorParallelError, match=r"(?s)rank 1 \(pid \d+\) failed:.*No module named 'no_module_"):
            workers.wait_started(60.0)
    finally:
        workers.stop(0.0)
    _assert_reaped(workers.pids)


def test_a_worker_that_exits_before_it_reports_in_says_where_its_error_is(monkeypatch: pytest.MonkeyPatch) -> None:
    workers = _workers(monkeypatch, b"", [sys.executable, "-c", "raise SystemExit(3)"])
    try:
        with pytest.raises(TensorParallelError) as raised:
            workers.wait_started(60.0)
    finally:
        workers.stop(0.0)
    message = str(raised.value)
    assert "rank 1 (pid" in message and "exited with code 3 before it reported in" in message, message
    assert "raise SystemExit(3)" in message and "standard error" in message, message


def test_a_worker_leaves_when_rank_0s_end_of_its_socket_closes(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """As when rank 0's process dies, however: the worker is busy (here in a sleep, as in a step) and
    still leaves at once, with code 1."""
    marker = tmp_path / "rebuilding"
    payload = pickle.dumps(RunsInTheWorker(f"open({str(marker)!r}, 'w').close(); import time; time.sleep(120)"))
    workers = _workers(monkeypatch, payload)
    worker = workers.workers[0]
    try:
        deadline = time.monotonic() + 60
        while not marker.exists():  # the worker has its spec and is busy
            assert worker.process.poll() is None and time.monotonic() < deadline, "the worker never got its spec"
            time.sleep(0.05)
        worker.connection.close()
        assert worker.process.wait(30) == 1
    finally:
        workers.stop(0.0)


def test_stop_terminates_then_kills_a_worker_that_does_not_leave(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tp_launch, "KILL_TIMEOUT_S", 0.5)
    stubborn = (
        "import signal, sys, time; from multiprocessing.connection import Connection; "
        "signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        f"Connection(int(sys.argv[1])).send(({STARTED!r}, '')); time.sleep(120)"
    )
    monkeypatch.setattr(tp_launch, "pickle_for_worker", lambda spec: b"")
    monkeypatch.setattr(tp_launch, "worker_command", lambda rank, fd: [sys.executable, "-c", stubborn, str(fd)])
    workers = WorkerProcesses(SimpleNamespace(world_size=2))  # type: ignore[arg-type]
    try:
        workers.wait_started(60.0)  # it ignores SIGTERM from here on
    finally:
        started = time.monotonic()
        workers.stop(0.0)
    assert workers.workers[0].process.returncode == -signal.SIGKILL
    assert time.monotonic() - started < 10
    _assert_reaped(workers.pids)
