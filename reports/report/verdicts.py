"""Turn two engines' outputs into a correctness cell: the verdict, the figures behind it, and the
details of every disagreement.

Free-running cells use the project's agreement rule (`spec.agreement.compare_traces`): fp32 exact
(identical tokens, top-k log-probabilities within the tolerance), bf16/fp16 near-tie.
Teacher-forced cells compare every position on the same prefix: in fp32 the top-1 token must be the
same everywhere and the log-probabilities within the tolerance; in bf16/fp16 the top-1 must be the
same wherever transformers' fp32 margin between its top two tokens exceeds TOP1_MARGIN.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from reports.report.records import Cell, Disagreement, ErrorDistribution, Status, TokenChoice
from reports.report.traces import FreeRunning, TeacherForced
from spec.agreement import Trace, compare_traces

FP32_LOGPROB_TOLERANCE = 1e-4
TOP1_MARGIN = 0.25  # fp32 nats; below it a bf16/fp16 top-1 flip is a near-tie, not a bug
MAX_LISTED_DISAGREEMENTS = 5  # per cell; the count of all of them is kept
CONTEXT_TOKENS_BEFORE = 16
CONTEXT_TOKENS_AFTER = 8
HISTOGRAM_LOG10_EDGES = tuple(x / 2 for x in range(-18, 3))  # 1e-9 .. 10, half-decade bins

Decode = Callable[[Sequence[int]], str]


@dataclass(frozen=True)
class CellKey:
    candidate: str
    baseline: str
    dtype: str
    feature: str
    mode: str

    @property
    def pair(self) -> str:
        return f"{self.candidate}-{self.baseline}"

    @property
    def id(self) -> str:
        return f"{self.pair}/{self.dtype}/{self.feature}/{self.mode}"

    @property
    def exact(self) -> bool:
        return self.dtype == "float32"


def not_run_cell(key: CellKey, reason: str) -> Cell:
    return Cell(**_key_fields(key), status=Status.NOT_RUN, detail=f"not run: {reason}")


def failed_cell(key: CellKey, reason: str) -> Cell:
    return Cell(**_key_fields(key), status=Status.FAILED, detail=reason)


def free_running_cell(
    key: CellKey,
    candidate: FreeRunning,
    baseline: FreeRunning,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    decode: Decode,
    evidence: str,
    seconds: float,
) -> Cell:
    rule = "exact" if key.exact else "near-tie"
    disagreements: list[Disagreement] = []
    identical: list[int] = []
    max_errors: list[float] = []
    mean_errors: list[float] = []
    for index, (prompt, mine, theirs) in enumerate(zip(prompts, candidate.traces, baseline.traces, strict=True)):
        comparison = compare_traces(mine, theirs, FP32_LOGPROB_TOLERANCE, rule)
        identical.append(comparison.num_tokens if comparison.first_divergence is None else comparison.first_divergence)
        max_errors.append(comparison.max_logprob_error)
        mean_errors.append(comparison.mean_logprob_error)
        if comparison.first_divergence is not None and comparison.first_divergence < comparison.num_tokens:
            disagreements.append(
                _token_divergence(index, prompt, mine, theirs, comparison.first_divergence, comparison.agree, decode)
            )
        elif not comparison.agree:
            disagreements.append(_worst_logprob_position(index, prompt, mine, theirs, decode))
    failed = [d for d in disagreements if not d.allowed]
    rule_text = (
        f"identical tokens and top-{_top_k(baseline.traces)} log-probabilities within {FP32_LOGPROB_TOLERANCE:g}"
        if key.exact
        else "identical tokens up to a divergence, which must be a near-tie (each token in the other's top-k)"
    )
    outcome = f"{len(failed)} of {len(prompts)} prompts disagree" if failed else f"all {len(prompts)} prompts agree"
    return Cell(
        **_key_fields(key),
        status=Status.FAILED if failed else Status.PASSED,
        detail=f"{outcome} ({rule_text})",
        rule=rule,
        feature_evidence=evidence,
        num_prompts=len(prompts),
        num_positions=sum(len(t.token_ids) for t in candidate.traces),
        max_logprob_error=max(max_errors, default=0.0),
        mean_logprob_error=sum(mean_errors) / len(mean_errors) if mean_errors else 0.0,
        identical_prefix_lengths=tuple(identical),
        max_new_tokens=max_new_tokens,
        num_disagreements=len(disagreements),
        disagreements=tuple(disagreements[:MAX_LISTED_DISAGREEMENTS]),
        seconds=round(seconds, 3),
    )


def teacher_forced_cell(
    key: CellKey,
    candidate: TeacherForced,
    baseline: TeacherForced,
    fp32_margins: Sequence[Sequence[float]],
    decode: Decode,
    evidence: str,
    seconds: float,
) -> Cell:
    own_errors: list[float] = []
    max_error = 0.0
    checked = 0
    disagreements: list[Disagreement] = []
    worst: tuple[float, int, int] | None = None  # (error, sequence index, position)
    for index, (sequence, mine, theirs, margins) in enumerate(
        zip(candidate.sequences, candidate.positions, baseline.positions, fp32_margins, strict=True)
    ):
        for offset, (entry, other, margin) in enumerate(zip(mine, theirs, margins, strict=True)):
            position = offset + 1
            token = sequence[position]
            own_errors.append(abs(entry[token] - other[token]))
            error = max(abs(entry[t] - other[t]) for t in entry.keys() & other.keys())
            max_error = max(max_error, error)
            if worst is None or error > worst[0]:
                worst = (error, index, position)
            must_agree = key.exact or margin > TOP1_MARGIN
            checked += must_agree
            if _top1(entry) != _top1(other):
                disagreements.append(
                    _teacher_forced_disagreement(
                        index, sequence, position, entry, other, "top1", not must_agree, decode
                    )
                )
    if key.exact and max_error > FP32_LOGPROB_TOLERANCE and worst is not None:
        error, index, position = worst
        offset = position - 1
        sequence = candidate.sequences[index]
        disagreements.append(
            _teacher_forced_disagreement(
                index,
                sequence,
                position,
                candidate.positions[index][offset],
                baseline.positions[index][offset],
                "logprob",
                False,
                decode,
            )
        )
    failed = [d for d in disagreements if not d.allowed]
    if key.exact:
        rule, rule_text = "exact", f"same top-1 at every position, log-probabilities within {FP32_LOGPROB_TOLERANCE:g}"
    else:
        rule = "top1-above-margin"
        covered = f"{checked} of {len(own_errors)} positions"
        rule_text = f"same top-1 wherever the fp32 top-2 margin exceeds {TOP1_MARGIN} ({covered})"
    outcome = f"{len(failed)} disagreements" if failed else f"all {len(own_errors)} positions agree"
    return Cell(
        **_key_fields(key),
        status=Status.FAILED if failed else Status.PASSED,
        detail=f"{outcome} ({rule_text})",
        rule=rule,
        feature_evidence=evidence,
        num_prompts=len(candidate.sequences),
        num_positions=len(own_errors),
        max_logprob_error=max_error,
        mean_logprob_error=sum(own_errors) / len(own_errors) if own_errors else 0.0,
        top1_checked_positions=checked,
        error_distribution=error_distribution(own_errors),
        num_disagreements=len(disagreements),
        disagreements=tuple(disagreements[:MAX_LISTED_DISAGREEMENTS]),
        seconds=round(seconds, 3),
    )


def error_distribution(errors: Sequence[float]) -> ErrorDistribution:
    ordered = sorted(errors)
    edges = HISTOGRAM_LOG10_EDGES
    counts = [0] * (len(edges) - 1)
    zeros = 0
    for error in ordered:
        if error <= 0.0:
            zeros += 1
            continue
        exponent = min(max(math.log10(error), edges[0]), edges[-1])
        bin_index = min(int((exponent - edges[0]) / (edges[1] - edges[0])), len(counts) - 1)
        counts[bin_index] += 1
    return ErrorDistribution(
        count=len(ordered),
        zeros=zeros,
        mean=sum(ordered) / len(ordered) if ordered else 0.0,
        p50=_quantile(ordered, 0.5),
        p90=_quantile(ordered, 0.9),
        p99=_quantile(ordered, 0.99),
        max=ordered[-1] if ordered else 0.0,
        log10_edges=edges,
        counts=tuple(counts),
    )


def _quantile(ordered: Sequence[float], q: float) -> float:
    """Nearest-rank quantile (a value that occurred), 0 for no values."""
    if not ordered:
        return 0.0
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def _key_fields(key: CellKey) -> dict[str, str]:
    return {
        "id": key.id,
        "pair": key.pair,
        "candidate": key.candidate,
        "baseline": key.baseline,
        "dtype": key.dtype,
        "feature": key.feature,
        "mode": key.mode,
    }


def _top_k(traces: Sequence[Trace]) -> int:
    return max((len(top) for trace in traces for top in trace.top_logprobs), default=0)


def _top1(entry: dict[int, float]) -> int:
    return min(entry, key=lambda token: (-entry[token], token))  # ties to the lowest id, as greedy does


def _choices(entry: dict[int, float], decode: Decode) -> tuple[TokenChoice, ...]:
    ordered = sorted(entry.items(), key=lambda item: (-item[1], item[0]))
    return tuple(TokenChoice(token, decode([token]), logprob) for token, logprob in ordered)


def _choice(token: int, entry: dict[int, float], decode: Decode) -> TokenChoice:
    return TokenChoice(token, decode([token]), entry.get(token))


def _token_divergence(
    index: int, prompt: Sequence[int], mine: Trace, theirs: Trace, position: int, allowed: bool, decode: Decode
) -> Disagreement:
    mine_top, theirs_top = mine.top_logprobs[position], theirs.top_logprobs[position]
    context = [*prompt, *mine.token_ids[:position]]
    return Disagreement(
        prompt_index=index,
        position=position,
        kind="token",
        allowed=allowed,
        candidate=_choice(mine.token_ids[position], mine_top, decode),
        baseline=_choice(theirs.token_ids[position], theirs_top, decode),
        candidate_top=_choices(mine_top, decode),
        baseline_top=_choices(theirs_top, decode),
        text_before=decode(context[-CONTEXT_TOKENS_BEFORE:]),
        candidate_text_after=decode(mine.token_ids[position : position + CONTEXT_TOKENS_AFTER]),
        baseline_text_after=decode(theirs.token_ids[position : position + CONTEXT_TOKENS_AFTER]),
    )


def _worst_logprob_position(
    index: int, prompt: Sequence[int], mine: Trace, theirs: Trace, decode: Decode
) -> Disagreement:
    """Tokens are identical but a log-probability is off by more than the tolerance: show the worst position."""
    errors = [
        max((abs(a[t] - b[t]) for t in a.keys() & b.keys()), default=0.0)
        for a, b in zip(mine.top_logprobs, theirs.top_logprobs, strict=False)
    ]
    position = max(range(len(errors)), key=errors.__getitem__)
    token = mine.token_ids[position]
    mine_top, theirs_top = mine.top_logprobs[position], theirs.top_logprobs[position]
    after = decode(mine.token_ids[position : position + CONTEXT_TOKENS_AFTER])
    return Disagreement(
        prompt_index=index,
        position=position,
        kind="logprob",
        allowed=False,
        candidate=_choice(token, mine_top, decode),
        baseline=_choice(theirs.token_ids[position], theirs_top, decode),
        candidate_top=_choices(mine_top, decode),
        baseline_top=_choices(theirs_top, decode),
        text_before=decode([*prompt, *mine.token_ids[:position]][-CONTEXT_TOKENS_BEFORE:]),
        candidate_text_after=after,
        baseline_text_after=after,
        logprob_error=errors[position],
    )


def _teacher_forced_disagreement(
    index: int,
    sequence: Sequence[int],
    position: int,
    mine: dict[int, float],
    theirs: dict[int, float],
    kind: str,
    allowed: bool,
    decode: Decode,
) -> Disagreement:
    token = sequence[position]
    after = decode(sequence[position : position + CONTEXT_TOKENS_AFTER])
    return Disagreement(
        prompt_index=index,
        position=position,
        kind=kind,
        allowed=allowed,
        candidate=_choice(_top1(mine), mine, decode),
        baseline=_choice(_top1(theirs), theirs, decode),
        candidate_top=_choices(mine, decode),
        baseline_top=_choices(theirs, decode),
        text_before=decode(sequence[max(0, position - CONTEXT_TOKENS_BEFORE) : position]),
        candidate_text_after=after,
        baseline_text_after=after,
        logprob_error=max(abs(mine[t] - theirs[t]) for t in mine.keys() & theirs.keys() | {token}),
    )
