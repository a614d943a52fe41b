"""What each engine produces for a prompt set, in the two modes the matrix compares.

Free-running: greedy generation with top-k log-probabilities (a `spec.agreement.Trace` per prompt).
Teacher-forced: a fixed token sequence run as the prompt with `SamplingParams(prompt_logprobs=k)`;
per position p >= 1, the log-probabilities of the top tokens and of the sequence's own token p
given tokens [0, p), so two engines are compared on the same prefix at every position.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from reports.diff.differential import hf_greedy_trace, trace_from_output
from spec.agreement import Trace
from spec.engine import Engine
from spec.sampling_params import SamplingParams

# Per position p >= 1 of a sequence: token id -> logprob (the top-k and the sequence's own token).
PositionLogprobs = tuple[dict[int, float], ...]


class PromptLogprobsMissing(Exception):
    """The engine returned no prompt log-probabilities (it does not implement them yet)."""


@dataclass(frozen=True)
class FreeRunning:
    traces: tuple[Trace, ...]
    cached_prompt_tokens: int  # in the compared pass


@dataclass(frozen=True)
class TeacherForced:
    sequences: tuple[tuple[int, ...], ...]
    positions: tuple[PositionLogprobs, ...]  # per sequence
    cached_prompt_tokens: int = 0


def engine_free_running(
    engine: Engine, prompts: Sequence[Sequence[int]], max_new_tokens: int, top_k: int, warm_passes: int
) -> FreeRunning:
    params = SamplingParams(temperature=0.0, max_tokens=max_new_tokens, ignore_eos=True, logprobs=top_k)
    for _ in range(warm_passes):
        engine.generate(prompts, params)
    outputs = engine.generate(prompts, params)
    return FreeRunning(tuple(trace_from_output(o) for o in outputs), sum(o.num_cached_prompt_tokens for o in outputs))


def hf_free_running(
    model: torch.nn.Module, prompts: Sequence[Sequence[int]], max_new_tokens: int, top_k: int
) -> FreeRunning:
    return FreeRunning(tuple(hf_greedy_trace(model, p, max_new_tokens, top_k) for p in prompts), 0)


def engine_teacher_forced(engine: Engine, sequences: Sequence[Sequence[int]], top_k: int) -> TeacherForced:
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True, prompt_logprobs=top_k)
    outputs = engine.generate(sequences, params)
    positions = []
    for sequence, output in zip(sequences, outputs, strict=True):
        entries = output.prompt_logprobs
        if entries is None or len(entries) != len(sequence) or any(e is None for e in entries[1:]):
            raise PromptLogprobsMissing(
                "the engine returned no prompt log-probabilities (SamplingParams.prompt_logprobs)"
            )
        positions.append(tuple(dict(e.top) | {e.token_id: e.logprob} for e in entries[1:]))
    cached = sum(o.num_cached_prompt_tokens for o in outputs)
    return TeacherForced(tuple(tuple(s) for s in sequences), tuple(positions), cached)


@torch.inference_mode()
def hf_teacher_forced(model: torch.nn.Module, sequences: Sequence[Sequence[int]], top_k: int) -> TeacherForced:
    device = next(model.parameters()).device
    positions = []
    for sequence in sequences:
        logits = model(input_ids=torch.tensor([list(sequence)], device=device)).logits[0, :-1].to(torch.float32)
        logprobs = torch.log_softmax(logits, dim=-1)
        top = torch.topk(logprobs, k=top_k)
        own = logprobs.gather(1, torch.tensor(sequence[1:], device=device).unsqueeze(1)).squeeze(1)
        positions.append(
            tuple(
                dict(zip(ids, values, strict=True)) | {token: value}
                for ids, values, token, value in zip(
                    top.indices.tolist(), top.values.tolist(), sequence[1:], own.tolist(), strict=True
                )
            )
        )
    return TeacherForced(tuple(tuple(s) for s in sequences), tuple(positions))


def teacher_sequences(prompts: Sequence[Sequence[int]], fp32_traces: Sequence[Trace]) -> tuple[tuple[int, ...], ...]:
    """Each prompt followed by transformers' fp32 greedy continuation: the sequences every engine is
    teacher-forced on, the same in every dtype."""
    return tuple((*prompt, *trace.token_ids) for prompt, trace in zip(prompts, fp32_traces, strict=True))


def top_two_margins(positions: PositionLogprobs) -> tuple[float, ...]:
    """Per position, the log-probability gap between the two most likely tokens."""
    margins = []
    for entry in positions:
        best = sorted(entry.values(), reverse=True)
        margins.append(best[0] - best[1] if len(best) > 1 else float("inf"))
    return tuple(margins)
