"""The agreement rule of differential runs (spec.agreement) on hand-made traces."""

from __future__ import annotations

import dataclasses

import pytest

from spec.agreement import Trace, compare_traces, token_logprobs_agree
from spec.request import TokenLogprobs


def trace(tokens: list[int], tops: list[dict[int, float]]) -> Trace:
    return Trace(tuple(tokens), tuple(tops))


BASE = trace([1, 2, 3], [{1: -0.1, 2: -2.0}, {2: -0.2, 5: -1.9}, {3: -0.3, 4: -1.5}])


def test_identical_traces_agree() -> None:
    comparison = compare_traces(BASE, BASE)
    assert comparison.agree and comparison.first_divergence is None and comparison.max_logprob_error == 0.0


def test_logprob_error_over_tolerance_disagrees_in_fp32() -> None:
    shifted = trace([1, 2, 3], [{1: -0.1, 2: -2.0}, {2: -0.2002, 5: -1.9}, {3: -0.3, 4: -1.5}])
    comparison = compare_traces(shifted, BASE, logprob_tolerance=1e-4)
    assert not comparison.agree and comparison.first_divergence is None
    assert comparison.max_logprob_error == pytest.approx(2e-4)


def test_divergence_at_a_near_tie_passes_only_the_near_tie_rule() -> None:
    other = trace([1, 5, 9], [{1: -0.1, 2: -2.0}, {5: -0.2, 2: -0.21}, {9: -0.1}])
    exact, near = compare_traces(other, BASE), compare_traces(other, BASE, rule="near-tie")
    assert exact.first_divergence == near.first_divergence == 1
    assert not exact.agree and near.agree and near.divergence_is_near_tie


def test_divergence_outside_top_k_fails_both_rules() -> None:
    other = trace([1, 7, 3], [{1: -0.1, 2: -2.0}, {7: -0.2, 8: -1.0}, {3: -0.3}])
    assert not compare_traces(other, BASE, rule="near-tie").agree


def test_shorter_trace_diverges_at_its_end() -> None:
    assert compare_traces(trace([1, 2], list(BASE.top_logprobs[:2])), BASE).first_divergence == 2


def test_unknown_rule_is_named() -> None:
    with pytest.raises(ValueError, match="unknown agreement rule 'loose'"):
        compare_traces(BASE, BASE, rule="loose")


def test_errors_cover_the_diverging_position_and_none_after_it() -> None:
    """Up to and including the first divergence, on the tokens both sides report: position 1's
    shared tokens count (errors 0.05 and 1.7), position 2's (7.5) do not."""
    other = trace([1, 5, 3], [{1: -0.1, 2: -2.0}, {5: -0.2, 2: -0.25}, {3: -0.3, 4: -9.0}])
    comparison = compare_traces(other, BASE)
    assert comparison.first_divergence == 1 and comparison.num_tokens == 3
    assert comparison.max_logprob_error == pytest.approx(1.7)
    assert comparison.mean_logprob_error == pytest.approx((0.0 + 0.0 + 0.05 + 1.7) / 4)


def test_nothing_compared_means_no_error() -> None:
    empty = trace([], [])
    comparison = compare_traces(empty, empty)
    assert comparison.agree and comparison.max_logprob_error == 0.0 and comparison.mean_logprob_error == 0.0


def test_an_error_equal_to_the_tolerance_agrees() -> None:
    """0.25 apart exactly (both binary fractions): the fp32 rule's bound is inclusive."""
    base, other = trace([1], [{1: -0.5}]), trace([1], [{1: -0.25}])
    assert compare_traces(other, base, logprob_tolerance=0.25).agree
    assert not compare_traces(other, base, logprob_tolerance=0.125).agree


def test_the_default_tolerance_is_1e_4() -> None:
    base = trace([1], [{1: -1.0}])
    assert compare_traces(trace([1], [{1: -1.00005}]), base).agree
    assert not compare_traces(trace([1], [{1: -1.0002}]), base).agree


def test_a_near_tie_needs_each_token_in_the_other_sides_top() -> None:
    """The candidate's 5 is in the baseline's top, but the baseline's 2 is not in the candidate's."""
    other = trace([1, 5, 3], [{1: -0.1, 2: -2.0}, {5: -0.2, 8: -1.0}, {3: -0.3}])
    comparison = compare_traces(other, BASE, rule="near-tie")
    assert comparison.divergence_is_near_tie is False and not comparison.agree


def test_traces_and_comparisons_are_immutable() -> None:
    comparison = compare_traces(BASE, BASE)
    with pytest.raises(dataclasses.FrozenInstanceError):
        comparison.agree = False  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        BASE.token_ids = ()  # type: ignore[misc]


POSITION = TokenLogprobs(token_id=3, logprob=-0.5, top=((3, -0.5), (7, -1.25)))


@pytest.mark.parametrize(
    "other, agree",
    [
        (POSITION, True),
        (TokenLogprobs(3, -0.5 + 1e-4, ((3, -0.5 + 1e-4), (7, -1.25 - 1e-4))), True),  # the tolerance is inclusive
        (TokenLogprobs(3, -0.5 + 2e-4, ((3, -0.5), (7, -1.25))), False),  # the token's own logprob
        (TokenLogprobs(3, -0.5, ((3, -0.5), (7, -1.25 + 2e-4))), False),  # a top value
        (TokenLogprobs(4, -0.5, ((3, -0.5), (7, -1.25))), False),  # another token
        (TokenLogprobs(3, -0.5, ((7, -0.5), (3, -1.25))), False),  # top ids in another order
        (TokenLogprobs(3, -0.5, ((3, -0.5), (8, -1.25))), False),  # another top id
    ],
)
def test_token_logprobs_agree_is_fp32s_rule_at_one_position(other: TokenLogprobs, agree: bool) -> None:
    assert token_logprobs_agree(other, POSITION) is agree
    assert token_logprobs_agree(POSITION, other) is agree


def test_token_logprobs_agree_takes_a_tolerance() -> None:
    loose = TokenLogprobs(3, -0.49, ((3, -0.49), (7, -1.26)))
    assert not token_logprobs_agree(loose, POSITION)
    assert token_logprobs_agree(loose, POSITION, tolerance=0.02)


def test_token_logprobs_agree_holds_values_exactly_at_the_tolerance() -> None:
    """Exactly representable: a difference of 0.25 is at a tolerance of 0.25, not past it."""
    at = TokenLogprobs(3, -0.25, ((3, -0.25), (7, -1.0)))
    assert token_logprobs_agree(at, POSITION, tolerance=0.25)  # the token's own logprob -0.5 -> -0.25
    top_at = TokenLogprobs(3, -0.5, ((3, -0.5), (7, -1.5)))
    assert token_logprobs_agree(top_at, POSITION, tolerance=0.25)  # a top value -1.25 -> -1.5
    assert not token_logprobs_agree(top_at, POSITION, tolerance=0.125)
