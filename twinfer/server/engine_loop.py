"""The engine thread: the only code that touches the engine, fed through a queue.

HTTP handlers run on the asyncio event loop and never call the engine. They put commands (add these
requests, abort those) on a queue; the engine thread drains the queue between steps, so requests
that arrive while a step runs join the batch at the next one (continuous batching). Each step's
outputs go back to the handlers' `OutputSink`s as `TokenDelta`s (the tokens new since the last
step), with one `call_soon_threadsafe` per step for all the sinks of an event loop.

While the engine has no work the thread blocks on the queue; while it has work it only polls it.
`engine_process.EngineProcess` offers the same interface with the engine in a child process.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from spec.engine import Engine
from spec.engine_config import EngineConfig
from spec.errors import TwinferError
from spec.request import FinishReason, RequestOutput, TokenLogprobs
from spec.sampling_params import SamplingParams
from twinfer.server.metrics import EngineStats, ServerMetrics

logger = logging.getLogger(__name__)

# Refusals of one request (InvalidRequestError, SamplingParamsError, ...); anything else from
# add_request is an engine bug.
REQUEST_ERRORS = (TwinferError, ValueError, TypeError)


class EngineUnavailableError(RuntimeError):
    """The engine is not running (stopped, or it died on an error that is logged)."""


@dataclass(frozen=True)
class EngineRequest:
    request_id: str
    prompt_token_ids: tuple[int, ...]
    params: SamplingParams


class TokenDelta(NamedTuple):
    """What one step added to one request. A NamedTuple: a step makes one per running request, and in
    process mode they cross a pipe, where a tuple pickles several times faster than a dataclass."""

    request_id: str
    token_ids: tuple[int, ...]  # new tokens
    logprobs: tuple[TokenLogprobs, ...]  # their logprobs (empty unless asked for)
    finish_reason: FinishReason | None
    num_prompt_tokens: int
    num_cached_prompt_tokens: int
    prompt_logprobs: tuple[TokenLogprobs | None, ...] | None  # first delta only, when asked for
    is_first: bool
    error: str | None = None  # why the request ended with FinishReason.ERROR (RequestOutput.error)


class DeltaTracker:
    """Turns the engine's cumulative RequestOutputs into TokenDeltas."""

    def __init__(self) -> None:
        self._sent: dict[str, int] = {}

    def delta(self, output: RequestOutput) -> TokenDelta:
        sent = self._sent.get(output.request_id, 0)
        is_first = sent == 0
        if output.finished:
            self._sent.pop(output.request_id, None)
        else:
            self._sent[output.request_id] = len(output.token_ids)
        return TokenDelta(
            request_id=output.request_id,
            token_ids=tuple(output.token_ids[sent:]),
            logprobs=tuple(output.logprobs[sent:]) if output.logprobs else (),
            finish_reason=output.finish_reason,
            num_prompt_tokens=len(output.prompt_token_ids),
            num_cached_prompt_tokens=output.num_cached_prompt_tokens,
            prompt_logprobs=output.prompt_logprobs if is_first else None,
            is_first=is_first,
            error=output.error,
        )

    def forget(self, request_id: str) -> None:
        self._sent.pop(request_id, None)


@dataclass(frozen=True)
class EngineFailure:
    """Delivered to a sink whose requests can no longer finish."""

    error: BaseException


class OutputSink:
    """Where the outputs of one HTTP request's engine requests arrive, on the handler's event loop.

    Items accumulate until the handler takes them: a handler that has fallen behind takes the tokens of
    several steps at once (and sends them as one event)."""

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.loop = loop or asyncio.get_running_loop()
        self._items: list[TokenDelta | EngineFailure] = []
        self._waiter: asyncio.Future[None] | None = None

    def deliver(self, items: list[TokenDelta | EngineFailure]) -> None:
        """Add items (on the sink's event loop) and wake the handler if it waits."""
        self._items += items
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def next_batch(self) -> list[TokenDelta | EngineFailure]:
        """Wait for at least one item, then take all that are already there (a group of tokens)."""
        while not self._items:
            self._waiter = self.loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        items, self._items = self._items, []
        return items


class EngineDriver(Protocol):
    """What the server needs from whatever runs the engine (a thread here, or a child process)."""

    metrics: ServerMetrics

    @property
    def config(self) -> EngineConfig: ...

    @property
    def stats(self) -> EngineStats: ...

    @property
    def alive(self) -> bool: ...

    def start(self) -> None: ...

    def stop(self, timeout: float = 30.0) -> None: ...

    async def submit(self, requests: Sequence[EngineRequest], sink: OutputSink) -> None: ...

    def abort(self, request_ids: Sequence[str]) -> None: ...


class SinkTable:
    """Unfinished request id -> sink, and delivery of a step's deltas grouped by sink."""

    def __init__(self, metrics: ServerMetrics) -> None:
        self.metrics = metrics
        self._sinks: dict[str, OutputSink] = {}

    def register(self, request_ids: Sequence[str], sink: OutputSink) -> None:
        for request_id in request_ids:
            self._sinks[request_id] = sink

    def release(self, request_id: str) -> bool:
        """Forget a request; True if it was unfinished."""
        return self._sinks.pop(request_id, None) is not None

    def dispatch(self, deltas: Sequence[TokenDelta]) -> None:
        by_sink: dict[OutputSink, list[TokenDelta | EngineFailure]] = {}
        prompt_tokens = cached_tokens = 0
        sinks = self._sinks
        for delta in deltas:
            sink = sinks.get(delta.request_id)
            if sink is None:
                continue  # aborted after the step began
            if delta.finish_reason is not None:
                del sinks[delta.request_id]
            if delta.is_first:
                prompt_tokens += delta.num_prompt_tokens
                cached_tokens += delta.num_cached_prompt_tokens
            items = by_sink.get(sink)
            if items is None:
                by_sink[sink] = [delta]
            else:
                items.append(delta)
        if prompt_tokens:
            self.metrics.record_prefill(prompt_tokens, cached_tokens)
        self.metrics.record_step(sum(len(delta.token_ids) for delta in deltas))
        deliver(by_sink)

    def fail_all(self, error: BaseException) -> None:
        sinks = set(self._sinks.values())
        self._sinks.clear()
        deliver({sink: [EngineFailure(error)] for sink in sinks})


def deliver(by_sink: dict[OutputSink, list[TokenDelta | EngineFailure]]) -> None:
    """Hand items to their sinks: one call per event loop for all of its sinks (one wake-up of the loop per
    step, however many streams it serves; a call per sink would also hand the interpreter lock back and
    forth with the loop's thread once per stream)."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[OutputSink, list[TokenDelta | EngineFailure]]]] = {}
    for sink, items in by_sink.items():
        pairs = by_loop.get(sink.loop)
        if pairs is None:
            by_loop[sink.loop] = [(sink, items)]
        else:
            pairs.append((sink, items))
    try:
        running = asyncio.get_running_loop()  # an engine process's outputs are read on the handlers' loop
    except RuntimeError:
        running = None  # the engine thread
    for loop, pairs in by_loop.items():
        if loop is running:
            _deliver_on_loop(pairs)
            continue
        try:
            loop.call_soon_threadsafe(_deliver_on_loop, pairs)
        except RuntimeError:  # the event loop has closed: nobody is listening any more
            logger.debug("dropped outputs for a closed event loop")


def _deliver_on_loop(pairs: list[tuple[OutputSink, list[TokenDelta | EngineFailure]]]) -> None:
    for sink, items in pairs:
        sink.deliver(items)


def engine_stats(engine: Engine, alive: bool) -> EngineStats:
    """What the engine exposes of its state; an engine without a reference-style scheduler reports less."""
    scheduler = getattr(engine, "scheduler", None)
    allocator = getattr(scheduler, "allocator", None)
    waiting = getattr(scheduler, "waiting", None)
    running = getattr(scheduler, "running", None)
    free = getattr(allocator, "num_free_blocks", None)
    return EngineStats(
        num_running=len(running) if running is not None else None,
        num_waiting=len(waiting) if waiting is not None else None,
        kv_blocks_total=engine.config.num_blocks,
        kv_blocks_free=free if isinstance(free, int) else None,
        alive=alive,
    )


@dataclass(frozen=True)
class _Add:
    requests: tuple[EngineRequest, ...]
    sink: OutputSink
    accepted: concurrent.futures.Future


@dataclass(frozen=True)
class _Abort:
    request_ids: tuple[str, ...]


class _Stop:
    pass


class EngineLoop:
    """An engine driven by a thread of this process (see the module docstring)."""

    def __init__(self, engine: Engine, metrics: ServerMetrics | None = None) -> None:
        self.engine: Engine | None = engine
        self._config = engine.config
        self.metrics = metrics or ServerMetrics()
        self._commands: queue.SimpleQueue[_Add | _Abort | _Stop] = queue.SimpleQueue()
        self._sinks = SinkTable(self.metrics)
        self._deltas = DeltaTracker()
        self._thread: threading.Thread | None = None
        self._stats = engine_stats(engine, alive=False)

    # -- any thread --------------------------------------------------------------------------

    @property
    def config(self) -> EngineConfig:
        return self._config

    @property
    def stats(self) -> EngineStats:
        return self._stats

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("the engine loop was already started")
        self._thread = threading.Thread(target=self._run, name="twinfer-engine", daemon=True)
        self._stats = engine_stats(self.engine, alive=True)
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        if self._thread is None:
            return
        self._commands.put(_Stop())
        self._thread.join(timeout)
        if self._thread.is_alive():
            logger.warning("the engine thread did not stop within %.0f s", timeout)
            return
        self._release_engine()

    def _release_engine(self) -> None:
        """Let the stopped engine go: its KV pool is most of the GPU's memory, and route handlers that
        outlive the app (web frameworks cache them) still reach this loop."""
        engine, self.engine = self.engine, None
        shutdown = getattr(engine, "shutdown", None)
        if shutdown is not None:
            shutdown()  # tensor-parallel ranks

    async def submit(self, requests: Sequence[EngineRequest], sink: OutputSink) -> None:
        """Add all of `requests` or none: raises the engine's error (e.g. InvalidRequestError) if one is refused."""
        if not self.alive:
            raise EngineUnavailableError("the engine is not running")
        accepted: concurrent.futures.Future = concurrent.futures.Future()
        self._commands.put(_Add(tuple(requests), sink, accepted))
        await asyncio.wrap_future(accepted)

    def abort(self, request_ids: Sequence[str]) -> None:
        """Abort requests that have not finished (finished or unknown ids are ignored). Never blocks."""
        if request_ids:
            self._commands.put(_Abort(tuple(request_ids)))

    # -- engine thread -----------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while self._handle_commands(block=not self.engine.has_unfinished):
                if self.engine.has_unfinished:
                    self._sinks.dispatch([self._deltas.delta(output) for output in self.engine.step()])
                self._stats = engine_stats(self.engine, alive=True)
        except BaseException as error:  # an engine bug: fail every open request rather than hang them
            logger.exception("the engine thread stopped on an error")
            self._shut(EngineUnavailableError(f"the engine failed: {error!r}"))
        else:
            self._shut(EngineUnavailableError("the server is shutting down"))
        finally:
            self._stats = engine_stats(self.engine, alive=False)

    def _handle_commands(self, block: bool) -> bool:
        """Run queued commands (waiting for one if `block`); False once asked to stop."""
        try:
            command = self._commands.get() if block else self._commands.get_nowait()
        except queue.Empty:
            return True
        while True:
            if isinstance(command, _Stop):
                return False
            if isinstance(command, _Add):
                self._add(command)
            else:
                self._abort(command.request_ids)
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return True

    def _add(self, command: _Add) -> None:
        try:
            added = add_all(self.engine, command.requests)
        except Exception as error:
            command.accepted.set_exception(error)
            if not isinstance(error, REQUEST_ERRORS):
                raise  # not a refusal of this request but an engine bug: stop (see _run)
            return
        self._sinks.register(added, command.sink)
        command.accepted.set_result(None)

    def _abort(self, request_ids: Sequence[str]) -> None:
        aborted = abort_unfinished(self.engine, self._sinks, self._deltas, request_ids)
        if aborted:
            self.metrics.record_aborted(aborted)

    def _shut(self, error: BaseException) -> None:
        self._sinks.fail_all(error)
        while True:  # refuse what is still queued, so no handler waits forever
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return
            if isinstance(command, _Add):
                command.accepted.set_exception(error)


def add_all(engine: Engine, requests: Sequence[EngineRequest]) -> list[str]:
    """Add every request or, if the engine refuses one, none (the ones added are aborted again)."""
    added: list[str] = []
    try:
        for request in requests:
            added.append(engine.add_request(request.prompt_token_ids, request.params, request.request_id))
    except Exception:
        for request_id in added:
            engine.abort(request_id)
        raise
    return added


def abort_unfinished(engine: Engine, sinks: SinkTable, deltas: DeltaTracker, request_ids: Sequence[str]) -> int:
    """Abort the requests still unfinished; how many there were."""
    aborted = 0
    for request_id in request_ids:
        if sinks.release(request_id):
            engine.abort(request_id)
            deltas.forget(request_id)
            aborted += 1
    return aborted
