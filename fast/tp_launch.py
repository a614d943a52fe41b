"""Rank 0's side of tensor parallelism: start the other ranks, watch them, and bring them all down.

    runner, runtime = start_tensor_parallel(model_config, weights, engine_config, dtype, device)

On one host the engine starts ranks 1..N-1 as Python processes of their own, `python -P -m
fast.tp_worker_process` (rank r on cuda:r, or on the CPU with gloo), and sends each its WorkerSpec
over a private socket pair: a checkpoint as its path, tensors in memory as shared memory. No
worker imports the user's main module, so the engine starts from any main: a script, a script on
standard input, `python -c`, a notebook. Under torchrun (RANK, WORLD_SIZE, MASTER_ADDR and
MASTER_PORT in the environment) every rank already runs the same script: rank 0 returns from here
and drives the engine, the other ranks serve inside this call and their process ends when rank 0
shuts down.

Faults. A size that does not split the model is a ConfigError before any process starts, and so is
a spec that a fresh process could not rebuild (weights held by a class defined in the main
program). A worker that raises, from its first line on, reports its traceback and exits; one that is
killed just exits. Rank 0 notices either way: a watchdog thread waits on the workers' sockets (a
report, or end of file when the process exits) and their exit codes, and on a GPU it aborts the
NCCL communicators so that a stream waiting for the dead peer returns; on the CPU the dead peer's
gloo sockets close and the pending collective fails at once. The next step (or the current one)
then raises TensorParallelError naming the rank and its error, and every remaining worker is
stopped. `shutdown` sends stop, waits STOP_TIMEOUT_S, then terminates and kills what is left, and
destroys the process groups; the engine calls it from shutdown(), its context manager, garbage
collection and interpreter exit. Workers also exit when rank 0's process dies (their end of the
socket pair reads end of file).
"""

from __future__ import annotations

import io
import logging
import multiprocessing
import multiprocessing.connection
import multiprocessing.spawn
import os
import pickle
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from multiprocessing.reduction import ForkingPickler
from pathlib import Path

import torch
import torch.multiprocessing  # registers the tensor reductions on ForkingPickler, which pickle_for_worker uses

from fast.model_runner import ModelRunner
from fast.parallel import ProcessGroups, StepChannel, TensorParallelError, init_process_groups
from fast.sharded_loading import StateDictWeights, WeightSource
from fast.tp_worker import WorkerSpec, serve_rank
from fast.tp_worker_process import FAILED, STARTED
from fast.tp_worker_process import MODULE as WORKER_MODULE
from fast.weights import check_tensor_parallel_size
from spec.engine_config import EngineConfig
from spec.errors import ConfigError, TwinferError
from spec.model_config import ModelConfig

logger = logging.getLogger(__name__)

STARTUP_TIMEOUT_S = 300.0  # for the worker processes to import torch and report in
STOP_TIMEOUT_S = 30.0  # for workers to leave after stop, before they are terminated
FAILURE_GRACE_S = 5.0  # for a failing worker's exit or report to arrive after rank 0 saw an error
KILL_TIMEOUT_S = 5.0  # for a terminated worker to exit, before it is killed
WATCH_INTERVAL_S = 0.2
TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
CODE_ROOT = Path(__file__).resolve().parent.parent  # the directory that holds this package


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
    """The process groups of rank 0, the worker processes it started (none under torchrun), their
    watchdog, and the way down."""

    def __init__(self, groups: ProcessGroups, workers: WorkerProcesses | None) -> None:
        self.groups = groups
        self.workers = workers
        self.launch = "processes" if workers is not None else "torchrun"
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
    """Ranks 1..N-1 as processes of their own (`python -P -m fast.tp_worker_process`, whose docstring
    describes the conversation), each joined to rank 0 by a socket pair on which it reports start-up
    or failure."""

    def __init__(self, spec: WorkerSpec) -> None:
        # One pickle per worker: a shared tensor's file descriptor can be collected only once. Pickled
        # before any process starts, so that what cannot be sent fails here, in rank 0.
        payloads = {rank: pickle_for_worker(spec) for rank in range(1, spec.world_size)}
        self.stopping = threading.Event()
        self._reading = threading.Lock()  # the watchdog and the caller's thread both read reports
        self._watchdog: threading.Thread | None = None
        self.workers: list[WorkerProcess] = []
        try:
            for rank, payload in payloads.items():
                self.workers.append(WorkerProcess.start(rank, payload))
        except BaseException:
            self.stop(0.0)
            raise

    @property
    def pids(self) -> list[int]:
        return [worker.process.pid for worker in self.workers]

    def wait_started(self, timeout_s: float) -> None:
        """Until every worker has reported in; TensorParallelError if one dies first or time runs out."""
        deadline = time.monotonic() + timeout_s
        while True:
            detail = self._dead_detail()
            if detail is not None:
                raise TensorParallelError(detail)
            waiting = [worker.rank for worker in self.workers if not worker.started]
            if not waiting:
                return
            if time.monotonic() > deadline:
                raise TensorParallelError(f"tensor-parallel ranks {waiting} did not start in {timeout_s:.0f} s")
            self._wait_for_news(WATCH_INTERVAL_S)

    def _wait_for_news(self, timeout_s: float) -> None:
        """Until a worker reports, or its end of the socket closes (it is exiting), or timeout_s."""
        connections = [worker.connection for worker in self.workers if not worker.reports_ended]
        if connections:
            multiprocessing.connection.wait(connections, timeout_s)
        else:
            time.sleep(timeout_s)

    def _dead_detail(self) -> str | None:
        """Why a worker is gone, if one is: its reported traceback, else its exit code or signal."""
        with self._reading:
            for worker in self.workers:
                worker.read_reports()
            for worker in self.workers:
                detail = worker.exit_detail()
                if detail is not None:
                    return detail
        return None

    def failure_detail(self, grace_s: float) -> str | None:
        """A failed worker's story, waiting up to grace_s for one to exit; None if all stay alive."""
        deadline = time.monotonic() + grace_s
        while True:
            detail = self._dead_detail()
            if detail is not None or time.monotonic() > deadline:
                return detail
            self._wait_for_news(WATCH_INTERVAL_S)

    def watch(self, on_death) -> None:  # on_death: Callable[[str], None]
        """A daemon thread that calls on_death(detail) once, when a worker exits unasked."""

        def run() -> None:
            while not self.stopping.is_set():
                self._wait_for_news(WATCH_INTERVAL_S)
                detail = None if self.stopping.is_set() else self._dead_detail()
                if detail is not None:
                    logger.error("%s", detail)
                    on_death(detail)
                    return

        self._watchdog = threading.Thread(target=run, name="twinfer-tp-watchdog", daemon=True)
        self._watchdog.start()

    def stop(self, grace_s: float) -> None:
        """Wait up to grace_s for the workers to leave; then terminate, then kill, what is left."""
        self.stopping.set()
        deadline = time.monotonic() + grace_s
        for worker in self.workers:
            _wait_for_exit(worker.process, max(0.0, deadline - time.monotonic()))
        for ending in (subprocess.Popen.terminate, subprocess.Popen.kill):
            alive = [worker.process for worker in self.workers if worker.process.poll() is None]
            for process in alive:
                ending(process)
            for process in alive:
                _wait_for_exit(process, KILL_TIMEOUT_S)
        if self._watchdog is not None:
            self._watchdog.join(5 * WATCH_INTERVAL_S)
            if self._watchdog.is_alive():  # inside on_death: it may still wait on the sockets
                return
        for worker in self.workers:
            worker.connection.close()


class WorkerProcess:
    """One rank's process as rank 0 sees it: the process, rank 0's end of their socket pair, and
    what the worker has reported on it."""

    def __init__(self, rank: int, process: subprocess.Popen, connection: multiprocessing.connection.Connection) -> None:
        self.rank = rank
        self.process = process
        self.connection = connection
        self.started = False
        self.failure: str | None = None  # the traceback it reported
        self.reports_ended = False  # its end of the socket is closed: it has exited, or is exiting

    @classmethod
    def start(cls, rank: int, payload: bytes) -> WorkerProcess:
        ours, theirs = multiprocessing.Pipe(duplex=True)  # a socket pair
        command = worker_command(rank, theirs.fileno())
        try:
            process = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, env=worker_environment(), pass_fds=(theirs.fileno(),)
            )
        except OSError as error:
            ours.close()
            raise TensorParallelError(
                f"could not start tensor-parallel rank {rank} as `{shlex.join(command)}`: {error}"
            ) from error
        finally:
            theirs.close()
        worker = cls(rank, process, ours)
        # A thread of its own: the worker reads only once Python has started, and a large spec could
        # fill the socket's buffer before then; rank 0 meanwhile watches for the worker's death.
        threading.Thread(target=worker._send, args=(payload,), name=f"twinfer-tp-send-{rank}", daemon=True).start()
        return worker

    def _send(self, payload: bytes) -> None:
        try:
            self.connection.send((bytes(multiprocessing.current_process().authkey), list(sys.path)))
            self.connection.send_bytes(payload)
        except (OSError, ValueError):  # it died before reading (its exit is reported), or rank 0 stopped it
            logger.debug("could not send the spec to tensor-parallel rank %d", self.rank, exc_info=True)

    def read_reports(self) -> None:
        """Take in what the worker has reported so far, without waiting."""
        while not self.reports_ended:
            try:
                if not self.connection.poll():
                    return
                kind, detail = self.connection.recv()
            except (EOFError, OSError):
                self.reports_ended = True
                return
            if kind == STARTED:
                self.started = True
            elif kind == FAILED:
                self.failure = detail

    def exit_detail(self) -> str | None:
        """Why the worker is gone, if it is (read_reports first: all it sent before exiting is there)."""
        exitcode = self.process.poll()
        if exitcode is None:
            return None
        name = f"tensor-parallel rank {self.rank} (pid {self.process.pid})"
        if self.failure is not None:
            return f"{name} failed:\n{self.failure}"
        if not self.started:  # it could not even report a traceback: its standard error is all there is
            return (
                f"{name} {_exit_description(exitcode)} before it reported in; what it printed on standard "
                f"error says why (it ran `{shlex.join(self.process.args)}`)"
            )
        return f"{name} {_exit_description(exitcode)}"


def worker_command(rank: int, fd: int) -> list[str]:
    """The command line of rank `rank`'s process. The interpreter is multiprocessing's: sys.executable,
    unless an embedding application named another with multiprocessing.set_executable."""
    executable = multiprocessing.spawn.get_executable()
    if not executable:
        raise ConfigError(
            "tensor parallelism starts a Python process per rank, but this interpreter does not know its "
            "executable (sys.executable is empty: an embedded Python); name one with "
            "multiprocessing.set_executable(path), or start the ranks with torchrun"
        )
    return [os.fsdecode(executable), "-P", "-m", WORKER_MODULE, "--rank", str(rank), "--fd", str(fd)]


def worker_environment() -> dict[str, str]:
    """Rank 0's environment, with the directory of rank 0's copy of this package first on PYTHONPATH,
    so that the worker imports the same code (a checkout run from its root, say, not an installed copy)."""
    paths = [str(CODE_ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return os.environ | {"PYTHONPATH": os.pathsep.join(paths)}


class _WorkerPickler(ForkingPickler):
    """torch.multiprocessing's reductions (tensors as shared memory), refusing what a fresh process
    cannot import."""

    def reducer_override(self, obj: object) -> object:
        if isinstance(obj, type | types.FunctionType) and obj.__module__ == "__main__":
            raise ConfigError(
                f"tensor parallelism sends the model's weights and settings to a fresh Python process per "
                f"rank, which cannot import {obj.__qualname__!r}: it is defined in the main program (a "
                "script, standard input or a notebook). Define it in a module, or pass a plain dict of "
                "tensors or a checkpoint path"
            )
        return NotImplemented


def pickle_for_worker(spec: WorkerSpec) -> bytes:
    """The spec as one worker process receives it (its tensors shared, not copied)."""
    buffer = io.BytesIO()
    try:
        _WorkerPickler(buffer, pickle.HIGHEST_PROTOCOL).dump(spec)
    except (pickle.PicklingError, TypeError, AttributeError) as error:
        raise ConfigError(f"cannot send the tensor-parallel spec to the worker processes: {error}") from error
    return buffer.getvalue()


def _wait_for_exit(process: subprocess.Popen, timeout_s: float) -> None:
    try:
        process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        pass


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
