"""Differential comparison of engines, token by token, against Hugging Face transformers.

A `Trace` is what one engine produced for one prompt: the greedy tokens and, per step, the
log-probabilities of the top tokens. `compare_traces` finds the first diverging position and
the largest log-probability difference on the tokens both report.

Agreement rules:
* fp32: token ids identical, and every top-k log-probability within `logprob_tolerance`.
* bf16/fp16 (`rule="near-tie"`): up to the first divergence tokens are identical; at the
  divergence each side's token must be among the other side's top-k (a near-tie, not a bug).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import torch


@dataclass(frozen=True)
class Trace:
    token_ids: tuple[int, ...]
    top_logprobs: tuple[dict[int, float], ...]  # per generated token: token id -> logprob


@dataclass(frozen=True)
class Comparison:
    num_tokens: int
    first_divergence: int | None  # index of the first differing token, None if identical
    max_logprob_error: float  # over positions before the first divergence
    mean_logprob_error: float
    divergence_is_near_tie: bool | None  # only set when tokens diverge
    agree: bool

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def compare_traces(candidate: Trace, baseline: Trace, logprob_tolerance: float = 1e-4, rule: str = "exact") -> Comparison:
    """Compare a candidate trace with a baseline one (see module docstring for the rules)."""
    if rule not in ("exact", "near-tie"):
        raise ValueError(f"unknown agreement rule {rule!r}: use 'exact' or 'near-tie'")
    length = min(len(candidate.token_ids), len(baseline.token_ids))
    first_divergence = next((i for i in range(length) if candidate.token_ids[i] != baseline.token_ids[i]), None)
    if first_divergence is None and len(candidate.token_ids) != len(baseline.token_ids):
        first_divergence = length
    compared_until = length if first_divergence is None else first_divergence + 1
    errors: list[float] = []
    for position in range(min(compared_until, len(candidate.top_logprobs), len(baseline.top_logprobs))):
        mine, theirs = candidate.top_logprobs[position], baseline.top_logprobs[position]
        errors.extend(abs(mine[t] - theirs[t]) for t in mine.keys() & theirs.keys())
    max_error = max(errors, default=0.0)
    mean_error = sum(errors) / len(errors) if errors else 0.0
    near_tie = None
    if first_divergence is not None and first_divergence < length:
        mine, theirs = candidate.top_logprobs[first_divergence], baseline.top_logprobs[first_divergence]
        near_tie = candidate.token_ids[first_divergence] in theirs and baseline.token_ids[first_divergence] in mine
    if rule == "exact":
        agree = first_divergence is None and max_error <= logprob_tolerance
    else:
        agree = first_divergence is None or bool(near_tie)
    return Comparison(
        num_tokens=length,
        first_divergence=first_divergence,
        max_logprob_error=max_error,
        mean_logprob_error=mean_error,
        divergence_is_near_tie=near_tie,
        agree=agree,
    )


@torch.inference_mode()
def hf_greedy_trace(hf_model: torch.nn.Module, prompt: Sequence[int], max_new_tokens: int, top_k: int) -> Trace:
    """Greedy decoding with a transformers causal LM and its own KV cache (no logits processors,
    so end-of-sequence tokens are generated like any other: the `ignore_eos` behaviour)."""
    device = next(hf_model.parameters()).device
    input_ids = torch.tensor([list(prompt)], dtype=torch.int64, device=device)
    output = hf_model(input_ids=input_ids, use_cache=True)
    tokens: list[int] = []
    tops: list[dict[int, float]] = []
    for _ in range(max_new_tokens):
        logits = output.logits[0, -1].to(torch.float32)
        logprobs = torch.log_softmax(logits, dim=-1)
        next_token = int(torch.argmax(logits))
        top = torch.topk(logprobs, k=top_k)
        tops.append(dict(zip(top.indices.tolist(), top.values.tolist())) | {next_token: float(logprobs[next_token])})
        tokens.append(next_token)
        if len(tokens) == max_new_tokens:
            break
        with warnings.catch_warnings():
            # transformers >= 5.24 renames past_key_values to cache; the H200 image has 5.17.
            warnings.simplefilter("ignore", FutureWarning)
            output = hf_model(
                input_ids=torch.tensor([[next_token]], device=device),
                past_key_values=output.past_key_values,
                use_cache=True,
            )
    return Trace(tuple(tokens), tuple(tops))


def trace_from_output(output) -> Trace:  # output: spec.request.RequestOutput
    """A Trace from an engine's RequestOutput that was generated with logprobs > 0."""
    if output.logprobs is None:
        raise ValueError(f"request {output.request_id!r} was generated without logprobs")
    tops = tuple(dict(entry.top) | {entry.token_id: entry.logprob} for entry in output.logprobs)
    return Trace(tuple(output.token_ids), tops)


@dataclass
class DiffRecord:
    """The JSON record of a `twinfer diff` run."""

    engines: list[str]
    model: str
    dtype: str
    max_new_tokens: int
    top_k: int
    prompts: list[dict[str, object]] = field(default_factory=list)

    @property
    def all_agree(self) -> bool:
        return all(bool(p["agree"]) for p in self.prompts)

    def to_dict(self) -> dict[str, object]:
        return {**asdict(self), "all_agree": self.all_agree}

