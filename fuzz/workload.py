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

    @property
    def params(self) -> SamplingParams:
        return SamplingParams(
            temperature=0.0,
            max_tokens=self.max_tokens,
            ignore_eos=self.ignore_eos,
            stop_token_ids=self.stop_token_ids,
            seed=0,
        )

    def new_request(self, arrival_index: int) -> Request:
        """A fresh engine-side Request (each implementation gets its own: schedulers mutate them)."""
        return Request(self.request_id, self.prompt, self.params, seed=0, arrival_index=arrival_index)

    def token_at(self, position: int) -> int:
        """The fake model's token for sequence position `position` (the token's index in prompt + output)."""
        if position - len(self.prompt) == self.eos_at_output_index:
            return EOS_TOKEN_ID
        # Depends on the prompt and the position only, as greedy decoding would: equal prompts
        # get equal outputs, so output blocks are shared through the prefix cache too.
        return GENERATED_ALPHABET[hash((self.prompt, position)) % len(GENERATED_ALPHABET)]


def fake_model(sampling_positions: dict[str, int], scripts: dict[str, RequestScript]) -> dict[str, int]:
    """Tokens for the chunks that sample: request id -> position of the token to produce."""
    return {request_id: scripts[request_id].token_at(position) for request_id, position in sampling_positions.items()}


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
