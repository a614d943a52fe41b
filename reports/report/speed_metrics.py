"""The figures the speed section reads from a bench phase's metrics, and how it shows them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

STANDARD_WORKLOADS = ("decode-bs1", "decode-sweep", "prefix-shared", "long-context", "offline-256")
# The order the page shows workloads in: the headline throughput first.
SHOWN_ORDER = ("offline-256", "decode-bs1", "decode-sweep", "prefix-shared", "long-context")
ENGINE_LABELS = {"hf": "transformers", "fast": "twinfer fast", "reference": "twinfer reference"}


@dataclass(frozen=True)
class Metric:
    key: str  # in a bench phase's "metrics"
    title: str
    unit: str
    scale: float  # shown value = value * scale
    better: str  # "higher" or "lower"

    def __post_init__(self) -> None:
        if self.better not in ("higher", "lower"):
            raise ValueError(f"better must be 'higher' or 'lower', got {self.better!r}")


OUTPUT_RATE = Metric("output_tokens_per_s", "output tokens/s", "tokens/s", 1.0, "higher")
TPOT = Metric("tpot_s", "time per output token", "ms", 1e3, "lower")
PREFILL_RATE = Metric("prefill_tokens_per_s", "prefill tokens/s", "tokens/s", 1.0, "higher")
WORKLOAD_METRICS = {
    "offline-256": (OUTPUT_RATE,),
    "decode-bs1": (TPOT,),
    "decode-sweep": (TPOT, OUTPUT_RATE),
    "prefix-shared": (OUTPUT_RATE,),
    "long-context": (PREFILL_RATE, TPOT),
}


def workload_metrics(workload: str) -> tuple[Metric, ...]:
    return WORKLOAD_METRICS.get(workload, (OUTPUT_RATE, TPOT))


def engine_label(engine: str) -> str:
    return ENGINE_LABELS.get(engine, engine)


def shown_value(metrics: dict[str, Any], metric: Metric) -> float | None:
    value = metrics.get(metric.key)
    return None if value is None else value * metric.scale


def times_faster(value: float, baseline: float, metric: Metric) -> float:
    """How many times faster `value` is than `baseline` (both in the metric's unit, both positive)."""
    return value / baseline if metric.better == "higher" else baseline / value


def percent_worse(on: float, off: float, metric: Metric) -> float:
    """How much worse `on` is than `off`, in percent of `off`: time per token added, or tokens/s lost."""
    return (on - off) / off * 100 if metric.better == "lower" else (off - on) / off * 100
