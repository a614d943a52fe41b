"""Differential runs: traces from transformers and from twinfer's engines, compared by spec.agreement."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import torch

from spec.agreement import Trace


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
        tops.append(
            dict(zip(top.indices.tolist(), top.values.tolist(), strict=True))
            | {next_token: float(logprobs[next_token])}
        )
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
class PairComparison:
    """One engine's traces against another's, prompt by prompt."""

    candidate: str
    baseline: str
    prompts: list[dict[str, object]] = field(default_factory=list)

    @property
    def all_agree(self) -> bool:
        return all(bool(p["agree"]) for p in self.prompts)

    def to_dict(self) -> dict[str, object]:
        return {**asdict(self), "all_agree": self.all_agree}


@dataclass
class DiffRecord:
    """The JSON record of a `twinfer diff` run: every pair of the engines named, compared."""

    engines: list[str]
    model: str
    dtype: str
    max_new_tokens: int
    top_k: int
    comparisons: list[PairComparison] = field(default_factory=list)
    # Per OpenAI endpoint: how its traces were rebuilt (notes, alternatives not mapped to token ids),
    # and its teacher-forced check (where the server supports echo with prompt logprobs).
    endpoints: dict[str, dict[str, object]] = field(default_factory=dict)
    teacher_forced: dict[str, dict[str, object]] = field(default_factory=dict)

    @property
    def all_agree(self) -> bool:
        forced = (check for check in self.teacher_forced.values() if check.get("supported"))
        return all(comparison.all_agree for comparison in self.comparisons) and all(
            bool(check.get("all_agree")) for check in forced
        )

    def to_dict(self) -> dict[str, object]:
        return {
            "engines": self.engines,
            "model": self.model,
            "dtype": self.dtype,
            "max_new_tokens": self.max_new_tokens,
            "top_k": self.top_k,
            "comparisons": [comparison.to_dict() for comparison in self.comparisons],
            "endpoints": self.endpoints,
            "teacher_forced": self.teacher_forced,
            "all_agree": self.all_agree,
        }
