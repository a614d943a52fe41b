"""Sampling parameters of one request, validated once at construction."""

from __future__ import annotations

import math
from dataclasses import dataclass

from spec.errors import SamplingParamsError

MAX_SEED = 2**63 - 1
MAX_LOGPROBS = 20


@dataclass(frozen=True)
class SamplingParams:
    """How one request's tokens are chosen and when it stops.

    temperature: 0 means greedy (argmax, ties to the lowest token id); otherwise > 0.
    top_k: keep the k most likely tokens; 0 or -1 disables.
    top_p: keep the smallest head of the distribution whose mass reaches top_p; 1 disables.
    min_p: keep tokens at least min_p times as likely as the most likely one; 0 disables.
    max_tokens: how many tokens to generate at most (>= 1).
    ignore_eos: keep generating through the model's end-of-sequence tokens.
    stop_token_ids: extra token ids that end the request (the stop token is kept in the output).
    seed: makes sampling reproducible; None draws a seed when the request is added.
    logprobs: how many top log-probabilities to return per generated token (0 to 20); 0 returns
        none. From 1 up, each token's entry also holds the chosen token's own log-probability.
    prompt_logprobs: None (off) or how many top log-probabilities to return for every prompt
        position after the first (0 to 20), besides the prompt token's own. A request that asks
        for them gets no prefix-cache hit: every prompt position is recomputed (spec.scheduling).
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    max_tokens: int = 16
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None
    logprobs: int = 0
    prompt_logprobs: int | None = None

    def __post_init__(self) -> None:
        _check_real("temperature", self.temperature)
        if self.temperature < 0:
            raise SamplingParamsError(f"temperature must be >= 0 (0 means greedy), got {self.temperature}")
        _check_int("top_k", self.top_k)
        if self.top_k < -1:
            raise SamplingParamsError(f"top_k must be -1 or 0 (disabled) or a positive count, got {self.top_k}")
        _check_real("top_p", self.top_p)
        if not 0.0 < self.top_p <= 1.0:
            raise SamplingParamsError(f"top_p must be in (0, 1], got {self.top_p}")
        _check_real("min_p", self.min_p)
        if not 0.0 <= self.min_p <= 1.0:
            raise SamplingParamsError(f"min_p must be in [0, 1], got {self.min_p}")
        _check_int("max_tokens", self.max_tokens)
        if self.max_tokens < 1:
            raise SamplingParamsError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if not isinstance(self.ignore_eos, bool):
            raise SamplingParamsError(f"ignore_eos must be a bool, got {self.ignore_eos!r}")
        if isinstance(self.stop_token_ids, (str, bytes)) or not hasattr(self.stop_token_ids, "__iter__"):
            raise SamplingParamsError(f"stop_token_ids must be a sequence of ints, got {self.stop_token_ids!r}")
        stop_ids = tuple(self.stop_token_ids)
        for token_id in stop_ids:
            _check_int("stop_token_ids entry", token_id)
            if token_id < 0:
                raise SamplingParamsError(f"stop_token_ids entries must be >= 0, got {token_id}")
        object.__setattr__(self, "stop_token_ids", stop_ids)
        if self.seed is not None:
            _check_int("seed", self.seed)
            if not 0 <= self.seed <= MAX_SEED:
                raise SamplingParamsError(f"seed must be in [0, 2**63 - 1], got {self.seed}")
        _check_int("logprobs", self.logprobs)
        if not 0 <= self.logprobs <= MAX_LOGPROBS:
            raise SamplingParamsError(f"logprobs must be in [0, {MAX_LOGPROBS}], got {self.logprobs}")
        if self.prompt_logprobs is not None:
            _check_int("prompt_logprobs", self.prompt_logprobs)
            if not 0 <= self.prompt_logprobs <= MAX_LOGPROBS:
                raise SamplingParamsError(
                    f"prompt_logprobs must be None or in [0, {MAX_LOGPROBS}], got {self.prompt_logprobs}"
                )

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def top_k_enabled(self) -> bool:
        return self.top_k > 0


def _check_real(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise SamplingParamsError(f"{name} must be a finite number, got {value!r}")


def _check_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise SamplingParamsError(f"{name} must be an integer, got {value!r}")
