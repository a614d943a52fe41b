"""Helpers of the GPU differential tests: prompts, the fp32 agreement rule at the 0.6B shape (where
distributions are nearly flat), and measurement records written under $TWINFER_RESULTS_DIR."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

from spec.agreement import Trace, compare_traces

NEAR_TIE_FP32 = 1e-3  # fp32 divergences are excused only where the top-two gap is below this


def record(name: str, data: dict[str, object]) -> None:
    """Write a measurement as JSON under $TWINFER_RESULTS_DIR when it is set (a GPU run commits them)."""
    directory = os.environ.get("TWINFER_RESULTS_DIR")
    if directory:
        Path(directory).mkdir(parents=True, exist_ok=True)
        (Path(directory) / f"{name}.json").write_text(json.dumps(data, indent=2, default=str))


def prompts_of(lengths: list[int], seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(10000) for _ in range(n)] for n in lengths]


def top_gap(trace: Trace, position: int) -> float:
    values = sorted(trace.top_logprobs[position].values(), reverse=True)
    return values[0] - values[1]


def compare_fp32(candidate: Trace, baseline: Trace) -> dict[str, object]:
    """Exact agreement, except a divergence at a position whose baseline top-two gap is < NEAR_TIE_FP32."""
    comparison = compare_traces(candidate, baseline, logprob_tolerance=1e-4)
    gap = None
    if comparison.first_divergence is not None:
        gap = top_gap(baseline, comparison.first_divergence)
        assert gap < NEAR_TIE_FP32, f"fp32 divergence at a gap of {gap}: {comparison}"
    else:
        assert comparison.agree, comparison
    return {
        "first_divergence": comparison.first_divergence,
        "gap_at_divergence": gap,
        "max_logprob_error": comparison.max_logprob_error,
    }
