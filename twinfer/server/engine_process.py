"""The engine in a child process: the `EngineLoop` interface, without sharing an interpreter lock.

With the engine on a thread, the engine's Python work (scheduling, preparing inputs, sampling
bookkeeping) and the HTTP side's (one event per client per step) take turns on one interpreter
lock; at hundreds of streaming clients the HTTP side can slow the engine down. Here the engine runs
in a process of its own (started with "spawn", so CUDA is initialised only there) and talks to the
server through two pipes, one each way, carrying pickled messages behind an 8-byte length:

    server -> child: ("add", batch, requests) | ("abort", ids) | ("stop",)
    child -> server: ("ready", config, stats) | ("added", batch, error or None) | ("step", deltas, stats)
                     | ("aborted", ids, stats) | ("stats", stats) | ("failed", message)

The child sends each step's `TokenDelta`s (only the new tokens), so a message stays small however
long the outputs grow. In the server both pipes are non-blocking and served by the event loop the
driver was started on (`loop.add_reader` / `add_writer`): a step's outputs are read, registered and
dispatched to the sinks there, and commands are written there, without blocking the loop. The
server side has no thread of its own, so nothing in it competes with the handlers for the
interpreter lock (a reader thread would take the lock at every read and wait for the loop to hand it
back; at hundreds of streams that wait, not the work, set the pace).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import multiprocessing
import os
import pickle
import select
import signal
import time
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
HEADER_BYTES = 8  # a message's length, big-endian, before its pickle
READ_BYTES = 1 << 20

EngineFactory = Callable[[], Engine]  # must pickle: a module-level function, or functools.partial of one


def frame(message: tuple) -> bytes:
    payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return len(payload).to_bytes(HEADER_BYTES, "big") + payload


class FrameReader:
    """Messages out of a byte stream that arrives in arbitrary pieces."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[tuple]:
        buffer = self._buffer
        buffer += data
        messages = []
        start = 0
        while len(buffer) - start >= HEADER_BYTES:
            size = int.from_bytes(buffer[start : start + HEADER_BYTES], "big")
            end = start + HEADER_BYTES + size
            if len(buffer) < end:
                break
            messages.append(pickle.loads(buffer[start + HEADER_BYTES : end]))
            start = end
        if start:
            del buffer[:start]
        return messages


def write_all(fd: int, data: bytes) -> None:
    """Write all of `data` to a blocking file descriptor."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


class EngineProcess:
    """An engine built by `engine_factory` in a child process (see the module docstring).

    `start`, `submit` and `stop` run on the event loop that serves the handlers (the app's lifespan
    and handlers do); `abort` may be called from any thread."""

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
        self._pending: dict[int, tuple[asyncio.Future, tuple[str, ...], OutputSink]] = {}
        self._batches = itertools.count()
        self._config: EngineConfig | None = None
        self._stats = EngineStats(alive=False)
        self._failed = False
        self._closed = False
        self._process: multiprocessing.process.BaseProcess | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._frames = FrameReader()
        self._unsent = bytearray()  # commands the command pipe could not take yet
        self._writer_waiting = False  # the loop watches the command pipe for room

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
        """Start the child and wait until its engine is built (blocking the calling event loop meanwhile)."""
        if self._process is not None:
            raise RuntimeError("the engine process was already started")
        try:
            self._loop = asyncio.get_running_loop()
        except RuntimeError:
            raise RuntimeError("EngineProcess.start() must run on the event loop that serves the handlers") from None
        context = multiprocessing.get_context("spawn")
        commands_out, commands_in = context.Pipe(duplex=False)  # (receiving end, sending end)
        outputs_out, outputs_in = context.Pipe(duplex=False)
        self._process = context.Process(
            target=_child_main, args=(self.engine_factory, commands_out, outputs_in), name="twinfer-engine", daemon=True
        )
        self._process.start()
        commands_out.close()
        outputs_in.close()
        self._commands, self._outputs = commands_in, outputs_out  # keep the Connections: they own the fds
        message = self._wait_for_ready(outputs_out.fileno())
        if message[0] != "ready":
            self._process.join(timeout=10)
            self._close_pipes()
            raise EngineUnavailableError(f"the engine process could not build its engine: {message[1]}")
        _, self._config, self._stats = message
        os.set_blocking(self._outputs.fileno(), False)
        os.set_blocking(self._commands.fileno(), False)
        self._loop.add_reader(self._outputs.fileno(), self._on_readable)

    def _wait_for_ready(self, fd: int) -> tuple:
        reader = FrameReader()
        while True:
            readable, _, _ = select.select([fd], [], [], self.start_timeout_s)
            if not readable:
                self._process.kill()
                self._close_pipes()
                raise EngineUnavailableError(f"the engine process did not start within {self.start_timeout_s:.0f} s")
            data = os.read(fd, READ_BYTES)
            if not data:
                self._process.join(timeout=10)
                self._close_pipes()
                raise EngineUnavailableError("the engine process exited while building its engine (see its log)")
            messages = reader.feed(data)
            if messages:
                return messages[0]

    def stop(self, timeout: float = 30.0) -> None:
        """Ask the child to stop and wait for it (reading its last outputs meanwhile, so that it never
        blocks on a full pipe); kill it after `timeout`. Open requests fail."""
        if self._process is None:
            return
        deadline = time.monotonic() + timeout
        self._unsent += frame(("stop",))
        while not self._closed and time.monotonic() < deadline:  # until the child closes its end
            waiting_to_write = [self._commands.fileno()] if self._unsent else []
            select.select([self._outputs.fileno()], waiting_to_write, [], 0.1)
            if self._unsent:
                self._flush()
            self._on_readable()
        self._process.join(max(0.0, deadline - time.monotonic()))
        if self._process.is_alive():
            logger.warning("the engine process did not stop within %.0f s; killing it", timeout)
            self._process.kill()
            self._process.join(timeout)
        self._fail(EngineUnavailableError("the server is shutting down"))

    async def submit(self, requests: Sequence[EngineRequest], sink: OutputSink) -> None:
        """Add all of `requests` or none: raises the engine's error (e.g. InvalidRequestError) if one is refused."""
        if not self.alive:
            raise EngineUnavailableError("the engine is not running")
        batch = next(self._batches)
        accepted = self._loop.create_future()
        self._pending[batch] = (accepted, tuple(r.request_id for r in requests), sink)
        self._send(("add", batch, tuple(requests)))
        await accepted

    def abort(self, request_ids: Sequence[str]) -> None:
        if not request_ids:
            return
        message = ("abort", tuple(request_ids))
        if self._on_loop():
            self._send(message)
            return
        try:
            self._loop.call_soon_threadsafe(self._send, message)
        except RuntimeError:  # the event loop has closed: so has the engine process
            logger.debug("dropped an abort for a closed event loop")

    # -- on the event loop ---------------------------------------------------------------------

    def _on_loop(self) -> bool:
        try:
            return asyncio.get_running_loop() is self._loop
        except RuntimeError:
            return False

    def _send(self, message: tuple) -> None:
        if self._closed or self._failed:
            return
        queued = bool(self._unsent)
        self._unsent += frame(message)
        if not queued:
            self._flush()

    def _flush(self) -> None:
        if self._closed:
            return
        try:
            written = os.write(self._commands.fileno(), self._unsent)
        except BlockingIOError:
            written = 0
        except OSError:  # the child has gone; reading its pipe reports it
            written = len(self._unsent)
        del self._unsent[:written]
        if bool(self._unsent) != self._writer_waiting:
            self._writer_waiting = bool(self._unsent)
            if self._writer_waiting:
                self._loop.add_writer(self._commands.fileno(), self._flush)
            else:
                self._loop.remove_writer(self._commands.fileno())

    def _on_readable(self) -> None:
        if self._closed:
            return
        fd = self._outputs.fileno()
        while True:
            try:
                data = os.read(fd, READ_BYTES)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                self._fail(EngineUnavailableError("the engine process has stopped"))
                return
            for message in self._frames.feed(data):
                self._handle(message)
                if self._closed:
                    return
            if len(data) < READ_BYTES:
                return

    def _handle(self, message: tuple) -> None:
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
            self._fail(EngineUnavailableError(f"the engine failed: {message[1]}"))

    def _added(self, batch: int, error: BaseException | None) -> None:
        accepted, request_ids, sink = self._pending.pop(batch)
        if error is not None:
            if not accepted.done():
                accepted.set_exception(error)
            return
        self._sinks.register(request_ids, sink)  # before any step of these requests is read
        if accepted.done():  # the handler was cancelled (its client left while they were added)
            self.abort(request_ids)
        else:
            accepted.set_result(None)

    def _fail(self, error: BaseException) -> None:
        """The child is gone (or going): fail every open request and waiting submission, once."""
        if self._closed:
            return
        self._failed = True
        self._stats = EngineStats(alive=False)
        self._loop.remove_reader(self._outputs.fileno())
        self._loop.remove_writer(self._commands.fileno())
        self._close_pipes()
        self._sinks.fail_all(error)
        for accepted, _, _ in self._pending.values():
            if not accepted.done():
                accepted.set_exception(error)
        self._pending.clear()

    def _close_pipes(self) -> None:
        self._closed = True
        self._unsent.clear()
        for connection in (getattr(self, "_commands", None), getattr(self, "_outputs", None)):
            if connection is not None:
                connection.close()


# -- the child process --------------------------------------------------------------------------


def _child_main(engine_factory: EngineFactory, commands, outputs) -> None:  # multiprocessing Connections
    # Ctrl-C reaches the whole process group: the server stops the child in order ("stop", or the end of
    # the command pipe when the server has gone) rather than the child dying mid-step.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    commands_fd, outputs_fd = commands.fileno(), outputs.fileno()
    try:
        engine = engine_factory()
    except BaseException as error:
        write_all(outputs_fd, frame(("failed", f"{type(error).__name__}: {error}")))
        return
    write_all(outputs_fd, frame(("ready", engine.config, engine_stats(engine, alive=True))))
    try:
        _ChildLoop(engine, commands_fd, outputs_fd).run()
    except BrokenPipeError:
        logger.info("the server has gone; the engine process stops")
    except BaseException as error:  # an engine bug: tell the server, which fails the open requests
        logger.exception("the engine process stopped on an error")
        try:
            write_all(outputs_fd, frame(("failed", f"{type(error).__name__}: {error}")))
        except OSError:
            pass  # the server has gone too


class _ChildLoop:
    def __init__(self, engine: Engine, commands_fd: int, outputs_fd: int) -> None:
        self.engine = engine
        self.commands_fd = commands_fd
        self.outputs_fd = outputs_fd
        self.frames = FrameReader()
        self.live: set[str] = set()
        self.deltas = DeltaTracker()

    def run(self) -> None:
        while True:
            # Every command that has arrived (waiting for one while there is no work) before the next step.
            for message in self._receive(block=not self.engine.has_unfinished):
                if not self._handle(message):
                    return
            if self.engine.has_unfinished:
                deltas = [self.deltas.delta(output) for output in self.engine.step()]
                self.live.difference_update(d.request_id for d in deltas if d.finish_reason is not None)
                self._send(("step", deltas, engine_stats(self.engine, alive=True)))

    def _receive(self, block: bool) -> list[tuple]:
        messages: list[tuple] = []
        while True:
            readable, _, _ = select.select([self.commands_fd], [], [], None if block and not messages else 0)
            if not readable:
                return messages
            data = os.read(self.commands_fd, READ_BYTES)
            if not data:  # the server has gone: stop
                return [*messages, ("stop",)]
            messages += self.frames.feed(data)

    def _send(self, message: tuple) -> None:
        write_all(self.outputs_fd, frame(message))

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
            self._send(("aborted", aborted, engine_stats(self.engine, alive=True)))
        return True

    def _add(self, batch: int, requests: Sequence[EngineRequest]) -> None:
        try:
            added = add_all(self.engine, requests)
        except REQUEST_ERRORS as error:
            self._send(("added", batch, _picklable(error)))
            return
        self.live.update(added)
        self._send(("added", batch, None))


def _picklable(error: BaseException) -> BaseException:
    """The error itself when it survives pickling (the spec's errors do), else an InvalidRequestError saying it."""
    try:
        pickle.loads(pickle.dumps(error))
        return error
    except Exception:
        return InvalidRequestError(str(error))
