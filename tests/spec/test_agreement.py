"""The agreement rule of differential runs (spec.agreement) on hand-made traces."""

from __future__ import annotations

import pytest

from spec.agreement import Trace, compare_traces


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
