"""The speed section's plots as data (drawn by reports.report.plots): decode-sweep's time per output
token, decode throughput and fraction of the bandwidth floor against batch size, and time per output
token against context length. Every point is a figure of a bench record.

A line is one engine of one record; where several records are plotted together, each line's label
names its record (its settings, then its shape, commit or file where those tell it apart).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from reports.report.bench_records import BenchRecord, record_labels
from reports.report.records import Series, SpeedPlot
from reports.report.speed_metrics import engine_label

SWEEP_Y_LABELS = {
    "tpot-vs-batch": "TPOT (ms, log scale)",
    "throughput-vs-batch": "decode tokens/s (batch / TPOT)",
    "fraction-of-floor": "decode step floor / TPOT",
}
Point = Callable[[dict[str, Any], dict[str, Any]], tuple[float, float] | None]  # (phase shape, metrics) -> (x, y)


def speed_plots(records: Sequence[BenchRecord]) -> list[SpeedPlot]:
    sweeps = [record for record in records if record.workload == "decode-sweep"]
    plots = [
        # Log scale: transformers sits 10-40x above twinfer, whose line a linear axis would flatten.
        _sweep_plot(sweeps, "tpot-vs-batch", "decode-sweep: time per output token vs batch size", _tpot, log_y=True),
        _sweep_plot(sweeps, "throughput-vs-batch", "decode-sweep: decode throughput vs batch size", _throughput),
        _sweep_plot(sweeps, "fraction-of-floor", "decode-sweep: fraction of the bandwidth floor", _floor_fraction),
        _tpot_context_plot(records),
    ]
    return [plot for plot in plots if plot is not None]


def _tpot(phase: dict[str, Any], metrics: dict[str, Any]) -> tuple[float, float] | None:
    return (phase["num_requests"], metrics["tpot_s"] * 1e3) if metrics.get("tpot_s") else None


def _throughput(phase: dict[str, Any], metrics: dict[str, Any]) -> tuple[float, float] | None:
    return (phase["num_requests"], phase["num_requests"] / metrics["tpot_s"]) if metrics.get("tpot_s") else None


def _floor_fraction(phase: dict[str, Any], metrics: dict[str, Any]) -> tuple[float, float] | None:
    ratio = (metrics.get("floors") or {}).get("tpot_over_decode_step_floor")
    return (phase["num_requests"], 1 / ratio) if ratio else None


def _sweep_plot(
    records: Sequence[BenchRecord], plot_id: str, title: str, point: Point, log_y: bool = False
) -> SpeedPlot | None:
    labels = record_labels(records)
    lines: dict[str, list[tuple[float, float]]] = {}
    for record, label in zip(records, labels, strict=True):
        for engine, phase, metrics in _phases(record):
            if (xy := point(phase, metrics)) is not None:
                name = engine_label(engine) + (f", {label}" if len(records) > 1 else "")
                lines.setdefault(name, []).append(xy)
    return _plot(plot_id, title, "batch size", SWEEP_Y_LABELS[plot_id], lines, log_y)


def _tpot_context_plot(records: Sequence[BenchRecord]) -> SpeedPlot | None:
    """TPOT against the mean context during decode, one line per engine, settings, shape and batch
    size; decode-bs1, decode-sweep and long-context measure it at different context lengths."""
    chosen = [r for r in records if r.workload in ("decode-bs1", "decode-sweep", "long-context")]
    settings = {record.settings_label for record in chosen}
    shapes = {record.shape for record in chosen}
    lines: dict[str, list[tuple[float, float]]] = {}
    for record in chosen:
        for engine, phase, metrics in _phases(record):
            if not metrics.get("tpot_s"):
                continue
            requests = phase["num_requests"]
            context = (phase["num_prompt_tokens"] + phase["num_output_tokens"] / 2) / requests
            name = ", ".join(
                [
                    engine_label(engine),
                    f"batch {requests}",
                    *([record.settings_label] if len(settings) > 1 else []),
                    *([record.shape] if len(shapes) > 1 else []),
                ]
            )
            lines.setdefault(name, []).append((context, metrics["tpot_s"] * 1e3))
    # A line measured at one context length only is a point, not a curve: left to the tables.
    lines = {name: points for name, points in lines.items() if len({x for x, _ in points}) > 1}
    return _plot(
        "tpot-vs-context",
        "time per output token vs context length",
        "mean context length during decode (tokens)",
        "TPOT (ms)",
        lines,
    )


def _phases(record: BenchRecord) -> Iterator[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(engine, the workload's phase, that engine's metrics) for every phase every engine ran."""
    shapes = {phase["label"]: phase for phase in record.data["workload"]["phases"]}
    for result in record.data["results"]:
        for phase in result["phases"]:
            yield result["engine"], shapes[phase["phase"]], phase["metrics"]


def _plot(
    plot_id: str,
    title: str,
    x_label: str,
    y_label: str,
    lines: dict[str, list[tuple[float, float]]],
    log_y: bool = False,
) -> SpeedPlot | None:
    if not lines:
        return None
    series = tuple(
        Series(label, tuple(float(x) for x, _ in sorted(points)), tuple(float(y) for _, y in sorted(points)))
        for label, points in lines.items()
    )
    return SpeedPlot(plot_id, title, x_label, y_label, series, log_x=True, log_y=log_y)
