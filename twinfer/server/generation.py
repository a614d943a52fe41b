"""One HTTP request's generation: its engine requests submitted together, their outputs as choice deltas.

`Generation.updates()` yields, for every group of engine outputs that arrived together, the deltas
of the choices they advanced. `close()` aborts whatever has not finished; handlers call it whatever
happens (a client that disconnects, an error, a normal end), so no request outlives its client.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from spec.errors import InvalidRequestError, SamplingParamsError
from twinfer.server.choice import ChoiceDelta, ChoiceSpec, ChoiceState
from twinfer.server.detokenize import TextCodec
from twinfer.server.engine_loop import EngineDriver, EngineFailure, EngineRequest, EngineUnavailableError, OutputSink
from twinfer.server.errors import ApiError
from twinfer.server.metrics import ServerMetrics
from twinfer.server.protocol import Usage

# The error code of a request the engine ended with FinishReason.ERROR (non-finite logits: spec.sampling).
UNSAMPLEABLE_CODE = "unsampleable_logits"


@dataclass
class _Timing:
    arrival: float
    first_token: float | None = None
    last_token: float | None = None


class Generation:
    def __init__(
        self,
        driver: EngineDriver,
        codec: TextCodec,
        metrics: ServerMetrics,
        specs: Sequence[ChoiceSpec],
        arrival: float,
    ) -> None:
        self.driver = driver
        self.metrics = metrics
        self.choices = [ChoiceState(spec, codec) for spec in specs]
        self._by_request = {choice.spec.request_id: choice for choice in self.choices}
        self._timings = {spec.request_id: _Timing(arrival) for spec in specs}
        self._sink: OutputSink | None = None
        self._closed = False
        self._unfinished = len(self.choices)

    @property
    def finished(self) -> bool:
        return self._unfinished == 0

    async def start(self) -> None:
        """Submit every choice's engine request; ApiError if the engine refuses one (then none runs)."""
        self._sink = OutputSink()
        requests = [EngineRequest(c.spec.request_id, c.spec.prompt_token_ids, c.spec.params) for c in self.choices]
        try:
            await self.driver.submit(requests, self._sink)
        except (InvalidRequestError, SamplingParamsError) as error:
            message = str(error)
            param = "max_tokens" if "max_tokens" in message else "prompt"
            raise ApiError(message, param=param) from error
        except EngineUnavailableError as error:
            raise ApiError(str(error), status=503, kind="service_unavailable") from error
        except asyncio.CancelledError:
            self.close()  # the client left while the engine thread was adding the requests
            raise

    async def updates(self) -> AsyncIterator[list[tuple[ChoiceState, ChoiceDelta]]]:
        if self._sink is None:
            raise RuntimeError("Generation.start() must run before updates()")
        sink, by_request = self._sink, self._by_request
        while self._unfinished:
            items = await sink.next_batch()
            now = time.monotonic()
            advanced: dict[str, tuple[ChoiceState, ChoiceDelta]] = {}
            errors: list[str] = []
            for item in items:
                if isinstance(item, EngineFailure):
                    raise ApiError(str(item.error), status=500, kind="server_error") from item.error
                choice = by_request[item.request_id]
                delta = choice.advance(item)
                self._record(choice, delta, now)
                earlier = advanced.get(item.request_id)
                if earlier is not None:  # several steps arrived together: one delta per choice
                    delta = _merged(earlier[1], delta)
                advanced[item.request_id] = (choice, delta)
                if choice.error is not None and delta.finish_reason == "error":
                    errors.append(choice.error)
                    delta.finish_reason = None  # the client learns of it from the error that follows
            yield list(advanced.values())
            if errors:  # the tokens made before it went out above; then OpenAI's error (the stream's last event)
                raise ApiError(errors[0], status=500, kind="server_error", code=UNSAMPLEABLE_CODE)

    async def run_to_end(self) -> None:
        async for _ in self.updates():
            pass

    def usage(self) -> Usage:
        """As OpenAI counts: each prompt once, however many choices (n) it has; every choice's tokens."""
        prompt = sum(choice.prompt_len for choice in self.choices if choice.spec.sample == 0)
        completion = sum(len(choice.token_ids) for choice in self.choices)
        return Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)

    def close(self) -> None:
        """Abort the engine requests of unfinished choices (idempotent, never blocks)."""
        if self._closed:
            return
        self._closed = True
        self.driver.abort([c.spec.request_id for c in self.choices if not c.finished])

    def _record(self, choice: ChoiceState, delta: ChoiceDelta, now: float) -> None:
        timing = self._timings[choice.spec.request_id]
        if delta.token_ids:
            if timing.first_token is None:
                timing.first_token = now
            timing.last_token = now
        if choice.needs_abort:
            choice.needs_abort = False
            self.driver.abort([choice.spec.request_id])
        if delta.finish_reason is not None:
            self._unfinished -= 1
            ttft = None if timing.first_token is None else timing.first_token - timing.arrival
            count = len(choice.token_ids)
            tpot = None
            if count > 1 and timing.first_token is not None and timing.last_token is not None:
                tpot = (timing.last_token - timing.first_token) / (count - 1)
            self.metrics.record_request(delta.finish_reason, ttft, tpot)


def _merged(earlier: ChoiceDelta, later: ChoiceDelta) -> ChoiceDelta:
    return ChoiceDelta(
        text=earlier.text + later.text,
        token_ids=earlier.token_ids + later.token_ids,
        logprobs=earlier.logprobs + later.logprobs,
        finish_reason=later.finish_reason or earlier.finish_reason,
    )
