"""Requests, a fake model and the outputs the fake model implies, for the scheduler fuzzer.

The fake model is deterministic: the token it samples for a request at position p depends
only on the request's prompt, p, and the request's script (which may say: emit the
end-of-sequence id at output index k). So what every request must return is known before it
runs (`expected_completion`), whatever the scheduling -- chunking, preemption and recompute
must not change a single token.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from spec.engine_config import EngineConfig
from spec.errors import InvalidRequestError
from spec.request import FinishReason, Request, check_request
from spec.sampling_params import SamplingParams
from spec.scheduling import StepPlan

VOCAB_SIZE = 16
EOS_TOKEN_ID = 15
EOS_TOKEN_IDS = (EOS_TOKEN_ID,)
PROMPT_ALPHABET = range(0, 4)  # few symbols: equal prefixes, hence prefix-cache hits, are common
GENERATED_ALPHABET = range(4, 12)  # what the fake model emits when it does not emit EOS


@dataclass(frozen=True)
class RequestScript:
    """One request as the fuzzer adds it, and how the fake model answers it."""

    request_id: str
    prompt: tuple[int, ...]
    max_tokens: int
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()
    eos_at_output_index: int | None = None  # the fake model emits EOS as this output token
    # The fake model's output repeats with this period (prompt lookup's drafts then agree with it).
    period: int | None = None

    @property
    def params(self) -> SamplingParams:
        return SamplingParams(
            temperature=0.0,
            max_tokens=self.max_tokens,
            ignore_eos=self.ignore_eos,
            stop_token_ids=self.stop_token_ids,
            seed=0,
        )

    @property
    def stop_ids(self) -> frozenset[int]:
        """The tokens that finish the request (spec.request.FinishLimits' rule)."""
        return frozenset(self.stop_token_ids) | (frozenset() if self.ignore_eos else frozenset(EOS_TOKEN_IDS))

    def new_request(self, arrival_index: int) -> Request:
        """A fresh engine-side Request (each implementation gets its own: schedulers mutate them)."""
        return Request(self.request_id, self.prompt, self.params, seed=0, arrival_index=arrival_index)

    def token_at(self, position: int) -> int:
        """The fake model's token for sequence position `position` (the token's index in prompt + output)."""
        if position - len(self.prompt) == self.eos_at_output_index:
            return EOS_TOKEN_ID
        # Depends on the prompt and the position only, as greedy decoding would: equal prompts
        # get equal outputs, so output blocks are shared through the prefix cache too.
        if self.period is not None:
            position = len(self.prompt) + (position - len(self.prompt)) % self.period
        return GENERATED_ALPHABET[hash((self.prompt, position)) % len(GENERATED_ALPHABET)]


def fake_model_step(plan: StepPlan, scripts: dict[str, RequestScript]) -> dict[str, int | tuple[int, ...]]:
    """The fake model over a plan: a sampling chunk's token; a verify chunk's tokens, the model's at
    each of its positions up to the first that differs from the draft or ends the request (the
    acceptance rule in its own words here, not spec.speculative's function)."""
    sampled: dict[str, int | tuple[int, ...]] = {}
    for chunk in plan.chunks:
        if not chunk.samples:
            continue
        script = scripts[chunk.request_id]
        first = chunk.start + chunk.num_tokens - len(chunk.draft_token_ids)  # the position of the first new token
        if not chunk.draft_token_ids:
            sampled[chunk.request_id] = script.token_at(first)
            continue
        # The model's token at each position, while the draft agrees with it and no token ends the request.
        tokens: list[int] = []
        for offset in range(len(chunk.draft_token_ids) + 1):
            tokens.append(script.token_at(first + offset))
            if tokens[-1] in script.stop_ids or offset == len(chunk.draft_token_ids):
                break
            if tokens[-1] != chunk.draft_token_ids[offset]:
                break
        sampled[chunk.request_id] = tuple(tokens)
    return sampled


def expected_completion(script: RequestScript, max_model_len: int) -> tuple[tuple[int, ...], FinishReason]:
    """What the request must return, straight from spec.scheduling's finishing rules."""
    output: list[int] = []
    while True:
        token = script.token_at(len(script.prompt) + len(output))
        output.append(token)
        is_eos = token in EOS_TOKEN_IDS and not script.ignore_eos
        if is_eos or token in script.stop_token_ids:
            return tuple(output), FinishReason.STOP
        if len(output) >= script.max_tokens or len(script.prompt) + len(output) >= max_model_len:
            return tuple(output), FinishReason.LENGTH


def is_servable(script: RequestScript, config: EngineConfig) -> bool:
    """Whether an engine with `config` accepts the request: the one rule, spec.request.check_request."""
    try:
        check_request(script.request_id, script.prompt, script.params, VOCAB_SIZE, config)
    except InvalidRequestError:
        return False
    return True


def workload_step_bound(scripts: Sequence[RequestScript], max_model_len: int) -> int:
    """Steps within which every request must finish once the fuzzer stops adding requests.

    Why it holds: the oldest running request is preempted only by itself, and only when the
    pool cannot hold it alone, which admission's size check rules out. So it gets >= 1 token
    every step and finishes within (its tokens) steps, recompute included; the next one
    starts being oldest at once or after one admission step. Summing over requests bounds
    the whole drain.
    """
    return sum(min(len(s.prompt) + s.max_tokens, max_model_len) + 2 for s in scripts) + 1
