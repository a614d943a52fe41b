"""Rank 0's side of tensor parallelism: start the other ranks, watch them, and bring them all down.

    runner, runtime = start_tensor_parallel(model_config, weights, engine_config, dtype, device)

On one host the engine spawns ranks 1..N-1 (torch.multiprocessing, "spawn"; rank r on cuda:r, or
on the CPU with gloo). Under torchrun (RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT in the
environment) every rank already runs the same script: rank 0 returns from here and drives the
engine, the other ranks serve inside this call and their process ends when rank 0 shuts down.

Faults. A size that does not split the model is a ConfigError before any process starts. A
spawned rank that raises reports its traceback and exits; one that is killed just exits. Rank 0
notices either way: a watchdog thread waits on the workers' process sentinels, and on a GPU it
aborts the NCCL communicators so that a stream waiting for the dead peer returns; on the CPU the
dead peer's gloo sockets close and the pending collective fails at once. The next step (or the
current one) then raises TensorParallelError naming the rank and its error, and every remaining
worker is stopped. `shutdown` sends stop, waits STOP_TIMEOUT_S, then terminates and kills what is
left, and destroys the process groups; the engine calls it from shutdown(), its context manager,
garbage collection and interpreter exit. Workers also exit when rank 0's process dies.
"""

from __future__ import annotations

import logging
import multiprocessing.connection
import os
import queue
import signal
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from fast.model_runner import ModelRunner
from fast.parallel import ProcessGroups, StepChannel, TensorParallelError, init_process_groups
from fast.sharded_loading import StateDictWeights, WeightSource
from fast.tp_worker import FAILED, STARTED, WorkerReport, WorkerSpec, serve_rank, spawned_worker_main
from fast.weights import check_tensor_parallel_size
from spec.engine_config import EngineConfig
from spec.errors import ConfigError, TwinferError
from spec.model_config import ModelConfig

logger = logging.getLogger(__name__)

STARTUP_TIMEOUT_S = 300.0  # for spawned workers to import torch and report in
STOP_TIMEOUT_S = 30.0  # for workers to leave after stop, before they are terminated
FAILURE_GRACE_S = 5.0  # for a failing worker's exit or report to arrive after rank 0 saw an error
WATCH_INTERVAL_S = 0.2
TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class TorchrunRank:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int  # processes on this host

    @property
    def spans_hosts(self) -> bool:
        return self.local_world_size != self.world_size


def torchrun_rank() -> TorchrunRank | None:
    """This process's rank when started by torchrun (or anything that sets its variables)."""
    if not all(name in os.environ for name in TORCHRUN_VARIABLES):
        return None
    world_size = int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", os.environ["RANK"]))
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    return TorchrunRank(int(os.environ["RANK"]), world_size, local_rank, local_world_size)


def start_tensor_parallel(
    model_config: ModelConfig,
    weights: Mapping[str, torch.Tensor] | WeightSource,
    engine_config: EngineConfig,
    dtype: torch.dtype,
    device: torch.device,
    allow_one_shot: bool = True,
) -> tuple[ModelRunner, TensorParallelRuntime]:
    """Rank 0's runner and the running ranks. Under torchrun, ranks > 0 serve here and never return."""
    size = engine_config.tensor_parallel_size
    check_tensor_parallel_size(model_config, size)
    torchrun = torchrun_rank()
    if torchrun is not None and torchrun.world_size != size:
        raise ConfigError(f"tensor_parallel_size is {size} but torchrun started {torchrun.world_size} processes")
    if torchrun is not None and device.type == "cuda":
        device = torch.device("cuda", torchrun.local_rank)
    if torchrun is not None and torchrun.spans_hosts:
        allow_one_shot = False  # symmetric memory reaches the GPUs of one host only
    elif torchrun is None:
        _check_devices(device, size)
    spec = WorkerSpec(
        model_config,
        StateDictWeights(weights) if isinstance(weights, Mapping) else weights,
        engine_config,
        dtype,
        str(device),
        "env://" if torchrun is not None else f"tcp://127.0.0.1:{_free_port()}",
        torch.get_num_threads(),
        allow_one_shot,
    )
    if torchrun is not None and torchrun.rank != 0:
        serve_rank(torchrun.rank, device, spec)
        raise SystemExit(0)
    if torchrun is None:
        device = spec.device_for(0)  # "cuda" becomes cuda:0: NCCL wants an explicit index
    runtime = TensorParallelRuntime.start(spec, device, launched=torchrun is None)
    try:
        runner = ModelRunner(model_config, spec.weights, engine_config, dtype, device, runtime.groups, allow_one_shot)
    except BaseException as error:
        if isinstance(error, TwinferError) or not isinstance(error, Exception):
            # Rank 0's own configuration or checkpoint error (raised as a single process raises it), or an interrupt.
            runtime.abandon()
            raise
        raise runtime.failure(error) from error
    runtime.release_before_teardown = runner.release_graphs
    return runner, runtime


def _check_devices(device: torch.device, size: int) -> None:
    if device.type != "cuda":
        return
    first = device.index or 0
    if torch.cuda.device_count() < first + size:
        raise ConfigError(
            f"tensor_parallel_size {size} needs GPUs cuda:{first}..cuda:{first + size - 1}; "
            f"{torch.cuda.device_count()} are visible"
        )


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class TensorParallelRuntime:
    """The process groups of rank 0, the worker processes it spawned (none under torchrun), their
    watchdog, and the way down."""

    def __init__(self, groups: ProcessGroups, workers: WorkerProcesses | None) -> None:
        self.groups = groups
        self.workers = workers
        self.launch = "spawn" if workers is not None else "torchrun"
        self._failure: str | None = None  # set by the watchdog thread
        # Rank 0's runner's release_graphs: called before the groups are torn down (DecodeGraphs.release).
        self.release_before_teardown: Callable[[bool], None] | None = None
        self._broken = False
        self._closed = False
        if workers is not None:
            workers.watch(self._on_worker_death)

    @classmethod
    def start(cls, spec: WorkerSpec, device: torch.device, launched: bool) -> TensorParallelRuntime:
        workers = WorkerProcesses(spec) if launched else None
        try:
            if workers is not None:
                workers.wait_started(STARTUP_TIMEOUT_S)
            groups = init_process_groups(0, spec.world_size, device, spec.init_method)
        except BaseException as error:
            if workers is None:
                raise
            detail = workers.failure_detail(FAILURE_GRACE_S)
            workers.stop(0.0)
            if detail is not None and isinstance(error, Exception):
                raise TensorParallelError(detail) from error
            raise
        return cls(groups, workers)

    def _on_worker_death(self, detail: str) -> None:
        self._failure = detail
        self.groups.abort()  # a GPU stream waiting for the dead peer returns; gloo needs nothing

    def check(self) -> None:
        """Raise if a rank has failed or the engine was shut down."""
        if self._failure is not None:
            self._broken = True
            message = self._failure
            self.shutdown()
            raise TensorParallelError(message)
        if self._closed:
            raise TensorParallelError("the tensor-parallel engine has been shut down")

    def failure(self, error: Exception) -> TensorParallelError:
        """The error to raise for `error`, seen on rank 0 during a step or start-up: the failed
        worker's story when one failed, else rank 0's own. Stops every rank."""
        detail = self._failure
        if detail is None and self.workers is not None:
            detail = self.workers.failure_detail(FAILURE_GRACE_S)
        self.abandon()
        if detail is not None:
            return TensorParallelError(detail)
        return TensorParallelError(f"a tensor-parallel step failed on rank 0: {type(error).__name__}: {error}")

    def abandon(self) -> None:
        """Stop every rank without the orderly stop message (the groups may be mid-collective)."""
        self._broken = True
        self.shutdown()

    def shutdown(self) -> None:
        """End every rank (idempotent): stop, then terminate and kill what is left; destroy the groups."""
        if self._closed:
            return
        self._closed = True
        if self.workers is not None:
            self.workers.stopping.set()  # deaths from here on are expected
        healthy = self._failure is None and not self._broken
        self._release_graphs(synchronize=healthy)
        if healthy:
            try:
                StepChannel(self.groups).send_stop()
            except Exception:
                logger.warning("could not send stop to the tensor-parallel ranks", exc_info=True)
                healthy = False
        if healthy:
            # On stop every other rank destroys its groups at once. NCCL's communicator teardown can wait
            # for its peers (torch shuts communicators down in a fixed order for that reason), so rank 0
            # destroys its own now, beside them, rather than after they have exited. Bounded: a teardown
            # that still waits (on two H200s it waited forever while captured graphs pinned the
            # communicator, see DecodeGraphs.release) falls back to an abort.
            healthy = _finished_within(self.groups.destroy, STOP_TIMEOUT_S, "destroying the process groups")
        if self.workers is not None:
            self.workers.stop(STOP_TIMEOUT_S if healthy else 0.0)
        if not healthy and _finished_within(self.groups.abort, STOP_TIMEOUT_S, "aborting the process groups"):
            self.groups.destroy()
        logger.info("tensor-parallel ranks stopped (%s)", "cleanly" if healthy else "after an abort")

    def _release_graphs(self, synchronize: bool) -> None:
        release, self.release_before_teardown = self.release_before_teardown, None
        if release is None:
            return
        try:
            release(synchronize)
        except Exception:  # a failed device: the abort below still ends the ranks
            logger.warning("could not release rank 0's CUDA graphs", exc_info=True)

    def describe(self) -> dict[str, object]:
        return {"launch": self.launch}


class WorkerProcesses:
    """Ranks 1..N-1 as spawned processes, with a queue on which each reports start-up or failure."""

    def __init__(self, spec: WorkerSpec) -> None:
        context = torch.multiprocessing.get_context("spawn")
        self.reports = context.Queue()
        self.stopping = threading.Event()
        self.processes = [
            context.Process(
                target=spawned_worker_main,
                args=(rank, spec, self.reports),
                name=f"twinfer-tp-rank-{rank}",
                daemon=True,
            )
            for rank in range(1, spec.world_size)
        ]
        self._failures: dict[int, str] = {}
        for process in self.processes:
            process.start()

    @property
    def pids(self) -> list[int]:
        return [process.pid for process in self.processes if process.pid is not None]

    def wait_started(self, timeout_s: float) -> None:
        """Until every worker has reported in; TensorParallelError if one dies first or time runs out."""
        waiting = set(range(1, len(self.processes) + 1))
        deadline = time.monotonic() + timeout_s
        while waiting:
            self._drain(waiting, block_s=WATCH_INTERVAL_S)
            detail = self._dead_detail()
            if detail is not None:
                raise TensorParallelError(detail)
            if time.monotonic() > deadline:
                raise TensorParallelError(f"tensor-parallel ranks {sorted(waiting)} did not start in {timeout_s:.0f} s")

    def _drain(self, waiting: set[int] | None = None, block_s: float = 0.0) -> None:
        while True:
            try:
                report: WorkerReport = self.reports.get(timeout=block_s) if block_s else self.reports.get_nowait()
            except queue.Empty:
                return
            block_s = 0.0
            if report.kind == STARTED and waiting is not None:
                waiting.discard(report.rank)
            elif report.kind == FAILED:
                self._failures[report.rank] = report.detail

    def _dead_detail(self) -> str | None:
        """Why a worker is gone, if one is: its reported traceback, else its exit code or signal."""
        self._drain()
        for rank, process in enumerate(self.processes, start=1):
            if process.exitcode is None:
                continue
            if rank not in self._failures:
                self._drain(block_s=0.5)  # a failure report may still be in flight
            if rank in self._failures:
                return f"tensor-parallel rank {rank} (pid {process.pid}) failed:\n{self._failures[rank]}"
            return f"tensor-parallel rank {rank} (pid {process.pid}) {_exit_description(process.exitcode)}"
        return None

    def failure_detail(self, grace_s: float) -> str | None:
        """A failed worker's story, waiting up to grace_s for one to exit; None if all stay alive."""
        deadline = time.monotonic() + grace_s
        while True:
            detail = self._dead_detail()
            if detail is not None or time.monotonic() > deadline:
                return detail
            multiprocessing.connection.wait([p.sentinel for p in self.processes], timeout=WATCH_INTERVAL_S)

    def watch(self, on_death) -> None:  # on_death: Callable[[str], None]
        """A daemon thread that calls on_death(detail) once, when a worker exits unasked."""

        def run() -> None:
            sentinels = [process.sentinel for process in self.processes]
            while not self.stopping.is_set():
                if multiprocessing.connection.wait(sentinels, timeout=WATCH_INTERVAL_S) and not self.stopping.is_set():
                    detail = self._dead_detail()
                    if detail is not None:
                        logger.error("%s", detail)
                        on_death(detail)
                        return

        threading.Thread(target=run, name="twinfer-tp-watchdog", daemon=True).start()

    def stop(self, grace_s: float) -> None:
        """Wait up to grace_s for the workers to leave; then terminate, then kill, what is left."""
        self.stopping.set()
        deadline = time.monotonic() + grace_s
        for process in self.processes:
            process.join(max(0.0, deadline - time.monotonic()))
        for ending in (lambda p: p.terminate(), lambda p: p.kill()):
            alive = [process for process in self.processes if process.is_alive()]
            for process in alive:
                ending(process)
            for process in alive:
                process.join(5.0)
        self.reports.close()
        self.reports.cancel_join_thread()


def _finished_within(action, timeout_s: float, what: str) -> bool:  # action: Callable[[], None]
    """Run action in a daemon thread; False (logged) if it raised or is still running after timeout_s,
    so that a teardown blocked in a communication library cannot hang the caller."""
    failed: list[BaseException] = []

    def run() -> None:
        try:
            action()
        except BaseException as error:  # reported below; the caller falls back to an abort
            failed.append(error)

    thread = threading.Thread(target=run, name="twinfer-tp-teardown", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        logger.warning("%s did not finish in %.0f s; aborting instead", what, timeout_s)
        return False
    if failed:
        logger.warning("%s failed: %s", what, failed[0])
        return False
    return True


def _exit_description(exitcode: int) -> str:
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        return f"was killed by {name}"
    return f"exited with code {exitcode}"
