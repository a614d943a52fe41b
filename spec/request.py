"""The request lifecycle and the outputs both engines return.

    add_request --> WAITING --admit--> RUNNING --finish--> FINISHED(stop | length | abort | error)
                      ^                   |
                      +----preempt--------+   (blocks freed, tokens recomputed later)

A WAITING request may also be aborted. Preemption puts the request at the front of the waiting
queue; on readmission it recomputes its prompt and the tokens it has generated so far (served
from the prefix cache where its full blocks survived).

ERROR: the row that would sample the request's next token was unsampleable (spec.sampling: its
logits hold a NaN or +inf, or no finite value). That position yields no token: the request finishes
with the tokens it already has, its `error` names the cause and the output position ("the model
produced non-finite logits (NaN) at output position 7"), and no logprobs are reported for the
position. The step's other requests are unaffected. The engine applies the step to the scheduler as
if the token were still pending (PENDING_TOKEN: computed counts advance, full blocks of the chunk's
own tokens are registered in the prefix cache, since they are the K/V any recomputation of those
tokens would produce), then finishes the request with ERROR and drops the placeholder
(`Request.fail_pending_token`). A request that the placeholder finished by length ends with ERROR
instead. In a verify chunk (spec.speculative) an unsampleable position j stops acceptance there: the
tokens before it are kept (if every draft token before it agreed; otherwise j is past the first
rejection and changes nothing), and the request ends with ERROR at output position outputs + j.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from spec.engine_config import EngineConfig
from spec.errors import InvalidRequestError
from spec.sampling import UNSAMPLEABLE_CAUSES, is_unsampleable_code
from spec.sampling_params import SamplingParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class FinishReason(enum.Enum):
    STOP = "stop"  # an end-of-sequence or stop token was generated
    LENGTH = "length"  # max_tokens reached, or the sequence reached max_model_len
    ABORT = "abort"  # the caller aborted the request
    ERROR = "error"  # the model's logits at the next position were unsampleable: RequestOutput.error says why


# An output token whose value is not known yet (Request.resolve_pending_token): never a vocabulary id,
# so no stop id matches it.
PENDING_TOKEN = -1


class LifecycleError(RuntimeError):
    """An engine tried a transition the lifecycle does not allow (an engine bug)."""


@dataclass(frozen=True)
class TokenLogprobs:
    """Log-probability of a generated token and the top alternatives, from the raw fp32 logits."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()  # (token id, logprob), most likely first


@dataclass(frozen=True)
class RequestOutput:
    """What a finished (or in-progress) request returns to the caller."""

    request_id: str
    prompt_token_ids: tuple[int, ...]
    token_ids: tuple[int, ...]
    finish_reason: FinishReason | None
    num_cached_prompt_tokens: int  # prompt tokens served from the prefix cache at first admission
    logprobs: tuple[TokenLogprobs, ...] | None = None  # set when SamplingParams.logprobs was asked for
    text: str | None = None
    # Set when SamplingParams.prompt_logprobs was asked for: one entry per prompt token, None for
    # the first (nothing predicts it); entry i is prompt token i's logprob given tokens [0, i).
    prompt_logprobs: tuple[TokenLogprobs | None, ...] | None = None
    error: str | None = None  # why a request finished with ERROR; None otherwise

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(eq=False)
class Request:
    """Engine-side state of one request. Engines change it only through the methods below."""

    request_id: str
    prompt_token_ids: tuple[int, ...]
    params: SamplingParams
    seed: int
    arrival_index: int
    status: RequestStatus = RequestStatus.WAITING
    output_token_ids: list[int] = field(default_factory=list)
    output_logprobs: list[TokenLogprobs] = field(default_factory=list)
    num_computed_tokens: int = 0
    num_cached_prompt_tokens: int = 0
    num_preemptions: int = 0
    finish_reason: FinishReason | None = None
    was_admitted: bool = False
    # Entry i: prompt token i's logprobs (None for i == 0 or not yet computed). Filled on the
    # request's first computation of each position; a recomputation after preemption keeps them.
    prompt_logprobs: list[TokenLogprobs | None] = field(default_factory=list)
    error: str | None = None  # set with FinishReason.ERROR (fail_pending_token)

    @property
    def all_token_ids(self) -> list[int]:
        return [*self.prompt_token_ids, *self.output_token_ids]

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    def token_span(self, start: int, num_tokens: int) -> list[int]:
        """Tokens [start, start + num_tokens) of prompt-then-output, without joining the whole sequence."""
        prompt_len = len(self.prompt_token_ids)
        end = start + num_tokens
        if start >= prompt_len:
            return self.output_token_ids[start - prompt_len : end - prompt_len]
        if end <= prompt_len:
            return list(self.prompt_token_ids[start:end])
        return [*self.prompt_token_ids[start:], *self.output_token_ids[: end - prompt_len]]

    @property
    def num_uncomputed_tokens(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    def admit(self, num_cached_tokens: int) -> None:
        """WAITING -> RUNNING, with `num_cached_tokens` served from the prefix cache."""
        self._require(RequestStatus.WAITING, "admit")
        if not self.was_admitted:
            self.num_cached_prompt_tokens = num_cached_tokens
        self.was_admitted = True
        self.status = RequestStatus.RUNNING
        self.num_computed_tokens = num_cached_tokens

    def preempt(self) -> None:
        """RUNNING -> WAITING; everything computed is dropped and will be recomputed."""
        self._require(RequestStatus.RUNNING, "preempt")
        self.status = RequestStatus.WAITING
        self.num_computed_tokens = 0
        self.num_preemptions += 1

    def advance_computed(self, num_tokens: int) -> None:
        """A scheduled chunk of `num_tokens` tokens now has K/V in the cache."""
        self._require(RequestStatus.RUNNING, "advance")
        if num_tokens < 1 or self.num_computed_tokens + num_tokens > self.num_tokens:
            raise LifecycleError(
                f"request {self.request_id!r}: cannot compute {num_tokens} more tokens "
                f"({self.num_computed_tokens} of {self.num_tokens} computed)"
            )
        self.num_computed_tokens += num_tokens

    def append_token(self, token_id: int) -> None:
        """A token was sampled for this request."""
        self._require(RequestStatus.RUNNING, "append a token to")
        self.output_token_ids.append(token_id)

    def resolve_pending_token(self, token_id: int) -> None:
        """The value of a token appended as PENDING_TOKEN: an engine that schedules the next step
        before the device's sampled token reaches the host appends the placeholder, then this."""
        if not self.output_token_ids or self.output_token_ids[-1] != PENDING_TOKEN:
            raise LifecycleError(f"request {self.request_id!r}: no pending token to resolve")
        self.output_token_ids[-1] = token_id

    def append_logprobs(self, logprobs: TokenLogprobs) -> None:
        """The log-probabilities of the token just appended (when SamplingParams.logprobs asks for them)."""
        if len(self.output_logprobs) >= len(self.output_token_ids):
            raise LifecycleError(f"request {self.request_id!r}: more logprobs than output tokens")
        self.output_logprobs.append(logprobs)

    def record_prompt_logprobs(self, position: int, logprobs: TokenLogprobs) -> None:
        """Logprobs of prompt token `position` (>= 1); the first computation of a position wins."""
        if not 1 <= position < len(self.prompt_token_ids):
            raise LifecycleError(f"request {self.request_id!r}: no prompt position {position} to score")
        if not self.prompt_logprobs:
            self.prompt_logprobs = [None] * len(self.prompt_token_ids)
        if self.prompt_logprobs[position] is None:
            self.prompt_logprobs[position] = logprobs

    def finish(self, reason: FinishReason) -> None:
        if self.status is RequestStatus.FINISHED:
            raise LifecycleError(f"request {self.request_id!r} finished twice")
        self.status = RequestStatus.FINISHED
        self.finish_reason = reason

    def fail_pending_token(self, code: int) -> None:
        """The newest output, still PENDING_TOKEN, came from an unsampleable row whose cause is `code`
        (spec.sampling.UNSAMPLEABLE_*): the placeholder is dropped and the request, which its scheduler has
        finished (with ERROR, or by length on the placeholder), ends with ERROR and says why."""
        self._require(RequestStatus.FINISHED, "fail")
        if not self.output_token_ids or self.output_token_ids[-1] != PENDING_TOKEN:
            raise LifecycleError(f"request {self.request_id!r}: no pending token to fail")
        self.output_token_ids.pop()
        self.finish_reason = FinishReason.ERROR
        self.error = unsampleable_error(code, len(self.output_token_ids))

    def _require(self, status: RequestStatus, transition: str) -> None:
        if self.status is not status:
            raise LifecycleError(
                f"cannot {transition} request {self.request_id!r}: it is {self.status.value}, not {status.value}"
            )

    def output(self, text: str | None = None) -> RequestOutput:
        # In field order, by position: engines build one output per running request every step, and
        # passing eight keywords cost a third of the build.
        return RequestOutput(
            self.request_id,
            self.prompt_token_ids,
            tuple(self.output_token_ids),  # token_ids
            self.finish_reason,
            self.num_cached_prompt_tokens,
            tuple(self.output_logprobs) if self.params.logprobs > 0 else None,  # logprobs
            text,
            self._prompt_logprobs_output(),
            self.error,
        )

    def _prompt_logprobs_output(self) -> tuple[TokenLogprobs | None, ...] | None:
        if self.params.prompt_logprobs is None:
            return None
        if not self.prompt_logprobs:
            return (None,) * len(self.prompt_token_ids)
        return tuple(self.prompt_logprobs)


def unsampleable_error(code: int, output_position: int) -> str:
    """The message of a request that ended with ERROR: the cause (spec.sampling.UNSAMPLEABLE_CAUSES) and where."""
    if not is_unsampleable_code(code):
        raise ValueError(f"{code} is not an unsampleable row's code")
    return f"the model produced non-finite logits ({UNSAMPLEABLE_CAUSES[code]}) at output position {output_position}"


def prompt_logprob_positions(request: Request, start: int, num_tokens: int) -> range:
    """Positions p of the chunk [start, start + num_tokens) whose logits score prompt token p + 1.

    Empty unless the request asks for prompt logprobs. The logits at position p predict token p + 1,
    so a chunk scores the prompt tokens p + 1 for p < len(prompt) - 1.
    """
    if request.params.prompt_logprobs is None:
        return range(0)
    return range(start, min(start + num_tokens, len(request.prompt_token_ids) - 1))


class FinishLimits(NamedTuple):
    """When a request is finished, as data fixed for its whole life (an engine may keep it per request).

    STOP: a stop token, i.e. an end-of-sequence id unless ignore_eos, or one of stop_token_ids.
    LENGTH: max_tokens outputs, or max_model_len tokens in all (prompt + outputs).
    """

    stop_token_ids: frozenset[int]
    max_outputs: int  # min(max_tokens, max_model_len - prompt length): LENGTH at this many outputs

    @classmethod
    def of(
        cls, params: SamplingParams, num_prompt_tokens: int, eos_token_ids: frozenset[int], max_model_len: int
    ) -> FinishLimits:
        stop = (frozenset() if params.ignore_eos else frozenset(eos_token_ids)) | frozenset(params.stop_token_ids)
        return cls(stop, min(params.max_tokens, max_model_len - num_prompt_tokens))

    @property
    def by_length_only(self) -> bool:
        """No token value can finish the request: only its length can (so a scheduler may plan its
        next step before its newest token is known)."""
        return not self.stop_token_ids

    def reason(self, token: int, num_outputs: int) -> FinishReason | None:
        """Why a request whose newest output is `token`, its num_outputs-th, is finished, or None."""
        if token in self.stop_token_ids:
            return FinishReason.STOP
        if num_outputs >= self.max_outputs:
            return FinishReason.LENGTH
        return None


def finish_reason(request: Request, eos_token_ids: frozenset[int], max_model_len: int) -> FinishReason | None:
    """Why a request that just got a token is finished, or None (the rules: FinishLimits)."""
    limits = FinishLimits.of(request.params, len(request.prompt_token_ids), eos_token_ids, max_model_len)
    return limits.reason(request.output_token_ids[-1], len(request.output_token_ids))


def check_request(
    request_id: str, prompt_token_ids: Sequence[int], params: SamplingParams, vocab_size: int, config: EngineConfig
) -> tuple[int, ...]:
    """The prompt as a tuple if the request can ever be served; otherwise InvalidRequestError naming why.

    Refused: text instead of token ids, an empty prompt, ids outside [0, vocab_size), a prompt
    that leaves no room to generate within max_model_len, and a request whose cached tokens,
    min(prompt + max_tokens, max_model_len) - 1, need more blocks than the whole pool.
    """
    if isinstance(prompt_token_ids, (str, bytes)):
        raise InvalidRequestError(f"request {request_id!r}: the engine takes token ids; tokenize text first (LLM does)")
    prompt = tuple(prompt_token_ids)
    if not prompt:
        raise InvalidRequestError(f"request {request_id!r}: the prompt is empty")
    bad = [t for t in prompt if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab_size]
    if bad:
        raise InvalidRequestError(
            f"request {request_id!r}: token ids outside the vocabulary [0, {vocab_size}): {bad[:5]}"
        )
    max_model_len = config.model_len
    if len(prompt) >= max_model_len:
        raise InvalidRequestError(
            f"request {request_id!r}: prompt of {len(prompt)} tokens leaves no room to generate within "
            f"max_model_len {max_model_len}"
        )
    tokens_to_cache = min(len(prompt) + params.max_tokens, max_model_len) - 1
    blocks_needed = config.blocks_for_tokens(tokens_to_cache)
    if blocks_needed > config.num_blocks:
        raise InvalidRequestError(
            f"request {request_id!r}: needs {blocks_needed} KV blocks ({tokens_to_cache} tokens) but the pool "
            f"has only {config.num_blocks}; raise num_blocks or lower max_tokens"
        )
    return prompt
