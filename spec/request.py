"""The request lifecycle and the outputs both engines return.

    add_request --> WAITING --admit--> RUNNING --finish--> FINISHED(stop | length | abort)
                      ^                   |
                      +----preempt--------+   (blocks freed, tokens recomputed later)

A WAITING request may also be aborted. Preemption puts the request at the front of the waiting
queue; on readmission it recomputes its prompt and the tokens it has generated so far (served
from the prefix cache where its full blocks survived).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field

from spec.engine_config import EngineConfig
from spec.errors import InvalidRequestError
from spec.sampling_params import SamplingParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class FinishReason(enum.Enum):
    STOP = "stop"  # an end-of-sequence or stop token was generated
    LENGTH = "length"  # max_tokens reached, or the sequence reached max_model_len
    ABORT = "abort"  # the caller aborted the request


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

    @property
    def all_token_ids(self) -> list[int]:
        return [*self.prompt_token_ids, *self.output_token_ids]

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

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

    def finish(self, reason: FinishReason) -> None:
        if self.status is RequestStatus.FINISHED:
            raise LifecycleError(f"request {self.request_id!r} finished twice")
        self.status = RequestStatus.FINISHED
        self.finish_reason = reason

    def _require(self, status: RequestStatus, transition: str) -> None:
        if self.status is not status:
            raise LifecycleError(
                f"cannot {transition} request {self.request_id!r}: it is {self.status.value}, not {status.value}"
            )

    def output(self, text: str | None = None) -> RequestOutput:
        return RequestOutput(
            request_id=self.request_id,
            prompt_token_ids=self.prompt_token_ids,
            token_ids=tuple(self.output_token_ids),
            finish_reason=self.finish_reason,
            num_cached_prompt_tokens=self.num_cached_prompt_tokens,
            logprobs=tuple(self.output_logprobs) if self.params.logprobs > 0 else None,
            text=text,
        )


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
        raise InvalidRequestError(f"request {request_id!r}: token ids outside the vocabulary [0, {vocab_size}): {bad[:5]}")
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
