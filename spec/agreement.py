"""When two engines agree: the rule differential runs apply, defined once.

A `Trace` is what one engine produced for one prompt: the greedy tokens and, per step, the
log-probabilities of the top tokens. `compare_traces` finds the first diverging position and
the largest log-probability difference on the tokens both report.

Agreement rules:
* fp32: token ids identical, and every top-k log-probability within `logprob_tolerance`.
  `token_logprobs_agree` is the same fp32 rule for one position of a request's reported logprobs.
* bf16/fp16 (`rule="near-tie"`): up to the first divergence tokens are identical; at the
  divergence each side's token must be among the other side's top-k (a near-tie, not a bug).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from spec.request import TokenLogprobs


@dataclass(frozen=True)
class Trace:
    token_ids: tuple[int, ...]
    top_logprobs: tuple[dict[int, float], ...]  # per generated token: token id -> logprob


@dataclass(frozen=True)
class Comparison:
    num_tokens: int
    first_divergence: int | None  # index of the first differing token, None if identical
    max_logprob_error: float  # over positions up to and including the first divergence
    mean_logprob_error: float
    divergence_is_near_tie: bool | None  # only set when tokens diverge
    agree: bool

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def compare_traces(
    candidate: Trace, baseline: Trace, logprob_tolerance: float = 1e-4, rule: str = "exact"
) -> Comparison:
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


def token_logprobs_agree(got: TokenLogprobs, want: TokenLogprobs, tolerance: float = 1e-4) -> bool:
    """fp32's rule at one position: the same token and top ids in order, every logprob within `tolerance`.

    Not bitwise: the same request in another batch shape may round otherwise (a CPU's BLAS threads split
    a matmul by its shape; the H200 host's 16 cores did where the 2-core machine did not)."""
    if got.token_id != want.token_id or abs(got.logprob - want.logprob) > tolerance:
        return False
    if [token for token, _ in got.top] != [token for token, _ in want.top]:
        return False
    return all(abs(a - b) <= tolerance for (_, a), (_, b) in zip(got.top, want.top, strict=True))
