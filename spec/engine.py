"""The engine protocol both engines satisfy: what `twinfer.LLM`, the CLI, the fuzzers and the
server drive. Token ids in, `RequestOutput`s out; text lives above this layer."""

from __future__ import annotations

import itertools
import secrets
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import NamedTuple, Protocol, runtime_checkable

import torch

from spec.engine_config import EngineConfig
from spec.errors import InvalidRequestError
from spec.invariants import InvariantMonitor, SchedulerSnapshot
from spec.model_config import ModelConfig
from spec.request import PENDING_TOKEN, Request, RequestOutput, TokenLogprobs, check_request
from spec.sampling import top_logprobs
from spec.sampling_params import MAX_SEED, SamplingParams
from spec.scheduling import StepPlan
from spec.speculative import accepted_tokens


@runtime_checkable
class Engine(Protocol):
    """add_request / step / abort / generate; `has_unfinished` says whether `step` has work.

    Every engine is also built by `from_pretrained(model, engine_config, dtype, device)`.
    """

    model_config: ModelConfig
    config: EngineConfig  # resolved: max_model_len is set

    @property
    def has_unfinished(self) -> bool: ...

    def add_request(
        self, prompt_token_ids: Sequence[int], params: SamplingParams | None = None, request_id: str | None = None
    ) -> str: ...

    def step(self) -> list[RequestOutput]: ...

    def abort(self, request_id: str) -> RequestOutput: ...

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[RequestOutput]: ...


class EngineFactory(Protocol):
    def from_pretrained(
        self,
        model: str | Path,
        engine_config: EngineConfig | None = None,
        dtype: str | torch.dtype = "auto",
        device: torch.device | str | None = None,
    ) -> Engine: ...


class SampledToken(NamedTuple):
    """What one step produced for one request: its new token and, when asked for, its logprobs.

    A NamedTuple (immutable, like a frozen dataclass, but about twice as fast to build): an engine
    makes one per running request every step."""

    token_id: int  # or, from an unsampleable row, its spec.sampling.UNSAMPLEABLE_* code (the request fails there)
    logprobs: TokenLogprobs | None
    # A verify chunk (speculative decoding) appends several tokens: the ones after token_id, in order.
    more: tuple[SampledToken, ...] = ()

    @property
    def token_ids(self) -> tuple[int, ...]:
        """Every token this step appends for the request."""
        return (self.token_id, *(token.token_id for token in self.more))

    @property
    def last_token_id(self) -> int:
        """The last token (only the last can be an unsampleable row's code: acceptance stops at one)."""
        return self.more[-1].token_id if self.more else self.token_id

    def pending_form(self) -> int | tuple[int, ...]:
        """What the scheduler applies for a result whose last token is a code: PENDING_TOKEN in its place."""
        if not self.more:
            return PENDING_TOKEN
        return (*self.token_ids[:-1], PENDING_TOKEN)


class ScheduledEngine(ABC):
    """The request bookkeeping both engines share; an engine supplies `execute(plan)`.

    add_request validates through spec.request.check_request and draws a seed for unseeded
    requests; step schedules, executes, and applies the results through the scheduler; abort
    finishes a request wherever it is. Subclasses set model_config, config (resolved),
    scheduler and monitor before use (`_init_requests`).
    """

    model_config: ModelConfig
    config: EngineConfig
    scheduler: SchedulerLike
    monitor: InvariantMonitor | None

    def _init_requests(self) -> None:
        self.monitor = InvariantMonitor() if self.config.check_invariants else None
        self._requests: dict[str, Request] = {}
        self._arrivals = itertools.count()
        self._auto_ids = itertools.count()

    @abstractmethod
    def execute(self, plan: StepPlan) -> dict[str, SampledToken]:
        """Run the model over the plan's chunks; the token sampled for each chunk that samples.
        Prompt logprobs of the chunks' positions are recorded on their requests here."""

    # -- requests ----------------------------------------------------------------------------

    @property
    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished

    def request(self, request_id: str) -> Request:
        """The engine-side state of an unfinished request (KeyError if there is none)."""
        return self._requests[request_id]

    def add_request(
        self, prompt_token_ids: Sequence[int], params: SamplingParams | None = None, request_id: str | None = None
    ) -> str:
        """Queue a request; raises InvalidRequestError (and changes nothing) if it can never be served."""
        params = params if params is not None else SamplingParams()
        if not isinstance(params, SamplingParams):
            raise InvalidRequestError(f"params must be a SamplingParams, got {type(params).__name__}")
        request_id = request_id if request_id is not None else f"request-{next(self._auto_ids)}"
        if request_id in self._requests:
            raise InvalidRequestError(f"request id {request_id!r} is already in use")
        prompt = check_request(request_id, prompt_token_ids, params, self.model_config.vocab_size, self.config)
        seed = params.seed if params.seed is not None else secrets.randbelow(MAX_SEED + 1)
        request = Request(request_id, prompt, params, seed, next(self._arrivals))
        self._requests[request_id] = request
        self.scheduler.add(request)
        return request_id

    def abort(self, request_id: str) -> RequestOutput:
        request = self._requests.pop(request_id, None)
        if request is None:
            raise KeyError(f"no unfinished request {request_id!r}")
        self.scheduler.abort(request)
        if self.monitor is not None:
            self.monitor.finished([request_id])
        return request.output()

    # -- stepping ----------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """Run one scheduling step; outputs of the requests that got a token (finished or not)."""
        plan = self.scheduler.schedule()
        self._check_invariants()
        if plan.is_empty:
            return []
        return self._run_plan(plan)

    def _run_plan(self, plan: StepPlan) -> list[RequestOutput]:
        """Execute a scheduled plan, apply its tokens through the scheduler, conclude the step."""
        sampled = self.execute(plan)
        if self.config.speculative is None:
            tokens: dict[str, int | tuple[int, ...]] = {request_id: s.token_id for request_id, s in sampled.items()}
        else:  # a verify chunk's tokens as a tuple
            tokens = {request_id: s.token_ids if s.more else s.token_id for request_id, s in sampled.items()}
        failed = self._unsampleable(sampled)
        for request_id in failed:  # applied as a pending token, then failed (spec.request: ERROR)
            tokens[request_id] = sampled[request_id].pending_form()
        finished = self.scheduler.update(plan, tokens)
        finished.extend(self._fail(failed, sampled))
        return self._conclude(sampled, finished)

    def _unsampleable(self, sampled: Mapping[str, SampledToken]) -> list[str]:
        """The requests whose result ends in an unsampleable row's code (only the last token can be one; token
        ids are never negative)."""
        return [
            request_id for request_id, s in sampled.items() if s.token_id < 0 or (s.more and s.more[-1].token_id < 0)
        ]

    def _fail(self, failed: Sequence[str], sampled: Mapping[str, SampledToken]) -> list[Request]:
        """Finish each failed request (its pending placeholder applied by the scheduler) with ERROR; the ones
        the scheduler had not finished already (by length on the placeholder), to conclude as finished."""
        newly_finished: list[Request] = []
        for request_id in failed:
            request = self._requests[request_id]
            if request.finish_reason is None:
                self.scheduler.fail(request)
                newly_finished.append(request)
            request.fail_pending_token(sampled[request_id].last_token_id)
        return newly_finished

    def _conclude(self, sampled: dict[str, SampledToken], finished: list[Request]) -> list[RequestOutput]:
        """After a step's update: logprobs appended, finished requests dropped; the stepped requests' outputs.
        An unsampleable row's result has no logprobs (its position yields no token)."""
        stepped: list[Request] = []
        for request_id, token in sampled.items():
            request = self._requests[request_id]
            stepped.append(request)
            if token.logprobs is not None:
                request.append_logprobs(token.logprobs)
                for following in token.more:
                    if following.logprobs is not None:
                        request.append_logprobs(following.logprobs)
        for request in finished:
            del self._requests[request.request_id]
        if self.monitor is not None:
            self.monitor.finished(r.request_id for r in finished)
        self._check_invariants()
        return [request.output() for request in stepped]

    def _check_invariants(self) -> None:
        if self.monitor is not None:
            self.monitor.observe(self.scheduler.snapshot())
            if not self.scheduler.has_unfinished:
                self.monitor.check_all_finished()

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        """Run prompts (token-id lists) to completion; outputs in prompt order."""
        params_list = broadcast_params(params, len(prompts))
        request_ids = [self.add_request(prompt, p) for prompt, p in zip(prompts, params_list, strict=True)]
        wanted = set(request_ids)
        finished: dict[str, RequestOutput] = {}
        while len(finished) < len(wanted) and self.has_unfinished:
            for output in self.step():
                if output.finished and output.request_id in wanted:
                    finished[output.request_id] = output
        return [finished[request_id] for request_id in request_ids]


class SchedulerLike(Protocol):
    """What ScheduledEngine needs of a scheduler (both engines' schedulers have it)."""

    @property
    def has_unfinished(self) -> bool: ...
    def add(self, request: Request) -> None: ...
    def schedule(self) -> StepPlan: ...
    def update(self, plan: StepPlan, sampled: Mapping[str, int | Sequence[int]]) -> list[Request]: ...
    def abort(self, request: Request) -> None: ...
    def fail(self, request: Request) -> None: ...  # finish with ERROR, wherever it is (as abort)
    def snapshot(self) -> SchedulerSnapshot: ...


def broadcast_params(params: SamplingParams | Sequence[SamplingParams] | None, count: int) -> list[SamplingParams]:
    """One SamplingParams per prompt: the default, one shared, or a list of exactly `count`."""
    if params is None:
        return [SamplingParams()] * count
    if isinstance(params, SamplingParams):
        return [params] * count
    params_list = list(params)
    if len(params_list) != count:
        raise InvalidRequestError(f"{len(params_list)} sampling params for {count} prompts")
    return params_list


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def token_logprobs(logits: torch.Tensor, tokens: Sequence[int], counts: Sequence[int]) -> list[TokenLogprobs | None]:
    """Row i: the logprob of tokens[i] and its top counts[i] alternatives, from log_softmax of fp32 logits [B, V];
    None where tokens[i] is an unsampleable row's code (that position reports no logprobs).

    Used by both engines for sampled tokens (counts from SamplingParams.logprobs) and for scored prompt
    positions (SamplingParams.prompt_logprobs)."""
    chosen_ids = torch.tensor(list(tokens), dtype=torch.int64, device=logits.device)
    chosen, top_ids, top_values = top_logprobs(logits, chosen_ids, max(counts, default=0))
    chosen_list, ids_list, values_list = chosen.tolist(), top_ids.tolist(), top_values.tolist()
    return [
        None
        if token < 0
        else TokenLogprobs(
            token, chosen_list[row], tuple(zip(ids_list[row][:count], values_list[row][:count], strict=True))
        )
        for row, (token, count) in enumerate(zip(tokens, counts, strict=True))
    ]


def verified_token(
    draft: Sequence[int],
    sampled: Sequence[int],
    entries: Sequence[TokenLogprobs | None],
    stop_token_ids: frozenset[int],
) -> SampledToken:
    """A verify chunk's result: the tokens spec.speculative.accepted_tokens keeps of the ones sampled at
    its positions, each with its position's logprobs entry (None where none were asked for)."""
    tokens = accepted_tokens(draft, sampled, stop_token_ids)
    following = tuple(SampledToken(token, entries[index]) for index, token in enumerate(tokens) if index)
    return SampledToken(tokens[0], entries[0], following)


def sampling_positions(requests: Sequence[Request]) -> list[int]:
    """Each sampling row's output position: a request's row at len(its outputs); a verify chunk's rows are
    consecutive rows of one request, the j-th at len(outputs) + j."""
    positions: list[int] = []
    for index, request in enumerate(requests):
        follows = index > 0 and requests[index - 1] is request
        positions.append(positions[-1] + 1 if follows else len(request.output_token_ids))
    return positions


def step_results(
    plan: StepPlan,
    requests: Sequence[Request],
    tokens: Sequence[int],
    entries: Sequence[TokenLogprobs | None],
    stop_token_ids: Callable[[Request], frozenset[int]],
) -> dict[str, SampledToken]:
    """One result per request of a step's sampling rows (requests[i] sampled tokens[i], with logprobs
    entries[i] or None): a plain chunk's one row, a verify chunk's consecutive rows as `verified_token` keeps
    them (stop_token_ids(request): where the request would end, asked only for verify chunks)."""
    drafts = {chunk.request_id: chunk.draft_token_ids for chunk in plan.chunks if chunk.draft_token_ids}
    results: dict[str, SampledToken] = {}
    row = 0
    while row < len(requests):
        request = requests[row]
        draft = drafts.get(request.request_id, ())
        if draft:
            end = row + 1 + len(draft)
            stop = stop_token_ids(request)
            results[request.request_id] = verified_token(draft, tokens[row:end], entries[row:end], stop)
        else:
            end = row + 1
            results[request.request_id] = SampledToken(tokens[row], entries[row])
        row = end
    return results
