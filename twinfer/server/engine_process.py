"""The engine in a child process: the `EngineLoop` interface, without sharing an interpreter lock.

With the engine on a thread, the engine's Python work (scheduling, preparing inputs, sampling
bookkeeping) and the HTTP side's (one event per client per step) take turns on one interpreter
lock; at hundreds of streaming clients the HTTP side can slow the engine down. Here the engine runs
in a process of its own (started with "spawn", so CUDA is initialised only there) and talks to the
server through a pipe:

    server -> child: ("add", batch, requests) | ("abort", ids) | ("stop",)
    child -> server: ("ready", config, stats) | ("added", batch, error or None) | ("step", deltas, stats)
                     | ("aborted", ids, stats) | ("stats", stats) | ("failed", message)

The child sends each step's `TokenDelta`s (only the new tokens), so a message stays small however
long the outputs grow. In the server, a writer thread sends (the event loop never blocks on the
pipe) and a reader thread receives, registers and dispatches; only the reader touches the sink table.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import logging
import multiprocessing
import queue
import threading
from collections.abc import Callable, Sequence

from spec.engine import Engine
from spec.engine_config import EngineConfig
from spec.errors import InvalidRequestError
from twinfer.server.engine_loop import (
    REQUEST_ERRORS,
    DeltaTracker,
    EngineRequest,
    EngineUnavailableError,
    OutputSink,
    SinkTable,
    add_all,
    engine_stats,
)
from twinfer.server.metrics import EngineStats, ServerMetrics

logger = logging.getLogger(__name__)

DEFAULT_START_TIMEOUT_S = 1800.0  # building a large engine (weights, KV pool, CUDA graphs) takes a while

EngineFactory = Callable[[], Engine]  # must pickle: a module-level function, or functools.partial of one


class EngineProcess:
    """An engine built by `engine_factory` in a child process (see the module docstring)."""

    def __init__(
        self,
        engine_factory: EngineFactory,
        metrics: ServerMetrics | None = None,
        start_timeout_s: float = DEFAULT_START_TIMEOUT_S,
    ) -> None:
        self.engine_factory = engine_factory
        self.metrics = metrics or ServerMetrics()
        self.start_timeout_s = start_timeout_s
        self._sinks = SinkTable(self.metrics)
        self._pending: dict[int, tuple[concurrent.futures.Future, tuple[str, ...], OutputSink]] = {}
        self._batches = itertools.count()
        self._outbox: queue.SimpleQueue[tuple | None] = queue.SimpleQueue()
        self._config: EngineConfig | None = None
        self._stats = EngineStats(alive=False)
        self._failed = False
        self._process: multiprocessing.process.BaseProcess | None = None
        self._threads: list[threading.Thread] = []

    @property
    def config(self) -> EngineConfig:
        if self._config is None:
            raise EngineUnavailableError("the engine process has not started")
        return self._config

    @property
    def stats(self) -> EngineStats:
        return self._stats

    @property
    def alive(self) -> bool:
        return self._process is not None and self._process.is_alive() and not self._failed

    def start(self) -> None:
        if self._process is not None:
            raise RuntimeError("the engine process was already started")
        context = multiprocessing.get_context("spawn")
        self._connection, child_end = context.Pipe()
        self._process = context.Process(
            target=_child_main, args=(self.engine_factory, child_end), name="twinfer-engine", daemon=True
        )
        self._process.start()
        child_end.close()
        if not self._connection.poll(self.start_timeout_s):
            self._process.kill()
            raise EngineUnavailableError(f"the engine process did not start within {self.start_timeout_s:.0f} s")
        message = self._connection.recv()
        if message[0] != "ready":
            self._process.join(timeout=10)
            raise EngineUnavailableError(f"the engine process could not build its engine: {message[1]}")
        _, self._config, self._stats = message
        self._threads = [
            threading.Thread(target=self._read, name="twinfer-engine-reader", daemon=True),
            threading.Thread(target=self._write, name="twinfer-engine-writer", daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        if self._process is None:
            return
        self._outbox.put(("stop",))
        self._process.join(timeout)
        if self._process.is_alive():
            logger.warning("the engine process did not stop within %.0f s; killing it", timeout)
            self._process.kill()
            self._process.join(timeout)
        self._outbox.put(None)  # ends the writer
        for thread in self._threads:
            thread.join(timeout)

    async def submit(self, requests: Sequence[EngineRequest], sink: OutputSink) -> None:
        """Add all of `requests` or none: raises the engine's error (e.g. InvalidRequestError) if one is refused."""
        if not self.alive:
            raise EngineUnavailableError("the engine is not running")
        batch = next(self._batches)
        accepted: concurrent.futures.Future = concurrent.futures.Future()
        self._pending[batch] = (accepted, tuple(r.request_id for r in requests), sink)
        self._outbox.put(("add", batch, tuple(requests)))
        await asyncio.wrap_future(accepted)

    def abort(self, request_ids: Sequence[str]) -> None:
        if request_ids:
            self._outbox.put(("abort", tuple(request_ids)))

    # -- server-side threads -----------------------------------------------------------------

    def _write(self) -> None:
        while (message := self._outbox.get()) is not None:
            try:
                self._connection.send(message)
            except (OSError, ValueError):  # the child has gone; the reader reports it
                return

    def _read(self) -> None:
        error: BaseException = EngineUnavailableError("the engine process has stopped")
        try:
            while True:
                message = self._connection.recv()
                kind = message[0]
                if kind == "step":
                    self._sinks.dispatch(message[1])
                    self._stats = message[2]
                elif kind == "added":
                    self._added(message[1], message[2])
                elif kind == "aborted":
                    released = sum(self._sinks.release(request_id) for request_id in message[1])
                    if released:
                        self.metrics.record_aborted(released)
                    self._stats = message[2]
                elif kind == "stats":
                    self._stats = message[1]
                elif kind == "failed":
                    logger.error("the engine process failed: %s", message[1])
                    error = EngineUnavailableError(f"the engine failed: {message[1]}")
                    break
        except (EOFError, OSError):
            pass
        self._failed = True
        self._stats = EngineStats(alive=False)
        self._sinks.fail_all(error)
        for accepted, _, _ in self._pending.values():
            if not accepted.done():
                accepted.set_exception(error)
        self._pending.clear()

    def _added(self, batch: int, error: BaseException | None) -> None:
        accepted, request_ids, sink = self._pending.pop(batch)
        if error is not None:
            accepted.set_exception(error)
            return
        self._sinks.register(request_ids, sink)  # before any step of these requests is read
        accepted.set_result(None)


# -- the child process --------------------------------------------------------------------------


def _child_main(engine_factory: EngineFactory, connection) -> None:  # connection: multiprocessing Connection
    try:
        engine = engine_factory()
    except BaseException as error:
        connection.send(("failed", f"{type(error).__name__}: {error}"))
        return
    connection.send(("ready", engine.config, engine_stats(engine, alive=True)))
    try:
        _ChildLoop(engine, connection).run()
    except BaseException as error:  # an engine bug: tell the server, which fails the open requests
        logger.exception("the engine process stopped on an error")
        connection.send(("failed", f"{type(error).__name__}: {error}"))


class _ChildLoop:
    def __init__(self, engine: Engine, connection) -> None:
        self.engine = engine
        self.connection = connection
        self.live: set[str] = set()
        self.deltas = DeltaTracker()

    def run(self) -> None:
        while True:
            if not self.engine.has_unfinished:
                if not self._handle(self.connection.recv()):
                    return
            while self.connection.poll():
                if not self._handle(self.connection.recv()):
                    return
            if self.engine.has_unfinished:
                deltas = [self.deltas.delta(output) for output in self.engine.step()]
                self.live.difference_update(d.request_id for d in deltas if d.finish_reason is not None)
                self.connection.send(("step", deltas, engine_stats(self.engine, alive=True)))

    def _handle(self, message: tuple) -> bool:
        kind = message[0]
        if kind == "stop":
            return False
        if kind == "add":
            self._add(message[1], message[2])
        elif kind == "abort":
            aborted = [request_id for request_id in message[1] if request_id in self.live]
            for request_id in aborted:
                self.engine.abort(request_id)
                self.deltas.forget(request_id)
                self.live.discard(request_id)
            self.connection.send(("aborted", aborted, engine_stats(self.engine, alive=True)))
        return True

    def _add(self, batch: int, requests: Sequence[EngineRequest]) -> None:
        try:
            added = add_all(self.engine, requests)
        except REQUEST_ERRORS as error:
            self.connection.send(("added", batch, _picklable(error)))
            return
        self.live.update(added)
        self.connection.send(("added", batch, None))


def _picklable(error: BaseException) -> BaseException:
    """The error itself when it survives pickling (the spec's errors do), else an InvalidRequestError saying it."""
    try:
        import pickle

        pickle.loads(pickle.dumps(error))
        return error
    except Exception:
        return InvalidRequestError(str(error))
