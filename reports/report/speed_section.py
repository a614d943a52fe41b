"""The speed section: the standard workloads of shared/benchmarks.md, run through `reports.bench`
(twinfer beside transformers in the same process), or read from bench JSON records made earlier.

Every figure shown comes from a bench record: the measured value, its run-to-run spread where the
workload ran several times, and the fraction of the physical limit that the record computed from
the copy bandwidth and matmul ceiling measured in the same process.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from reports.report.records import Series, SpeedPlot, SpeedRow, SpeedSection, SpeedTable, Status

logger = logging.getLogger(__name__)

STANDARD_WORKLOADS = ("decode-bs1", "decode-sweep", "prefix-shared", "long-context", "offline-256")
QUICK_WORKLOADS = ("decode-bs1",)
ENGINE_LABELS = {"hf": "transformers", "fast": "twinfer fast", "reference": "twinfer reference"}


@dataclass(frozen=True)
class Metric:
    key: str  # in a bench phase's "metrics"
    title: str
    unit: str
    scale: float  # shown value = value * scale
    better: str


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


@dataclass(frozen=True)
class SpeedOptions:
    device: torch.device
    workloads: tuple[str, ...]
    shape: str = "qwen3-0.6b"
    engine: str | None = None  # None: the registry's default for the device
    dtype: torch.dtype = torch.bfloat16
    scale: float = 1.0  # < 1 only for harness tests: the record then says it is not the standard workload
    repeats: int = 3
    bench_json: tuple[Path, ...] = ()  # records made earlier: shown instead of running anything
    allow_cpu: bool = False  # harness tests only: the standard workloads are measured on a GPU


def speed_section(options: SpeedOptions) -> SpeedSection:
    if options.bench_json:
        records, problems = _load_records(options.bench_json)
    elif options.device.type != "cuda" and not options.allow_cpu:
        return SpeedSection(Status.NOT_RUN, "not run: no CUDA device (the standard workloads are measured on a GPU)")
    else:
        records, problems = _run_workloads(options)
    return speed_from_records(records, problems)


def _load_records(paths: Sequence[Path]) -> tuple[list[dict[str, Any]], list[str]]:
    records, problems = [], []
    for path in paths:
        try:
            record = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as error:
            problems.append(f"{path}: unreadable bench record: {error}")
            continue
        if record.get("record") != "twinfer bench":
            problems.append(f"{path}: not a `twinfer bench` record")
            continue
        records.append(record)
    return records, problems


def _run_workloads(options: SpeedOptions) -> tuple[list[dict[str, Any]], list[str]]:
    try:
        from reports import bench
        from reports.bench_workloads import build_workload
        from reports.model_shapes import SHAPES
        from twinfer.registry import default_engine_name
    except ImportError as error:
        return [], [f"reports/bench.py is not available: {error}"]
    engine = options.engine or default_engine_name(options.device)
    records, problems = [], []
    for name in options.workloads:
        try:
            settings = bench.BenchSettings(
                workload=build_workload(name, options.scale),
                shape=SHAPES[options.shape],
                engine=engine,
                baseline=bench.HF,
                dtype=options.dtype,
                device=options.device,
                repeats=options.repeats,
                weight_seed=0,
            )
            records.append(bench.run_benchmark(settings))
        except Exception as error:  # a workload that cannot run is reported, the others still run
            logger.exception("bench workload %s failed", name)
            problems.append(f"{name}: {type(error).__name__}: {error}")
    return records, problems


def speed_from_records(records: Sequence[dict[str, Any]], problems: Sequence[str] = ()) -> SpeedSection:
    """Tables, plots and environment from bench records; `problems` are workloads that did not run."""
    if not records:
        reason = "; ".join(problems) or "no workload was selected"
        return SpeedSection(Status.NOT_RUN, f"not run: {reason}")
    tables = [table for record in records for table in _tables(record)]
    plots = [plot for plot in (_throughput_plot(records), _tpot_context_plot(records), _fraction_plot(records)) if plot]
    names = ", ".join(record["workload"]["name"] for record in records)
    detail = f"workloads {names} on the {records[0]['shape']['name']} shape (random weights), {records[0]['dtype']}"
    if problems:
        detail += "; not run: " + "; ".join(problems)
    failed = any(table.status is Status.FAILED for table in tables)
    return SpeedSection(
        status=Status.FAILED if failed else Status.PASSED,
        detail=detail,
        tables=tuple(tables),
        plots=tuple(plots),
        environment=_environment(records[0]),
    )


def _tables(record: dict[str, Any]) -> list[SpeedTable]:
    workload = record["workload"]
    labels = [phase["label"] for phase in workload["phases"]]
    metrics = WORKLOAD_METRICS.get(workload["name"], (OUTPUT_RATE, TPOT))
    notes = [] if workload["standard_workload"] else [workload["scale_note"]]
    status, comparison_note = _prefix_caching_verdict(record)
    tables = []
    for label in labels:
        name = workload["name"] if len(labels) == 1 else f"{workload['name']} {label}"
        for metric in metrics:
            rows = tuple(row for result in record["results"] if (row := _row(result, label, metric)) is not None)
            if rows:
                note = "; ".join(
                    [*notes, *_phase_notes(record, label), *([comparison_note] if comparison_note else [])]
                )
                tables.append(SpeedTable(name, metric.title, metric.unit, metric.better, rows, note, status))
    return tables


def _row(result: dict[str, Any], label: str, metric: Metric) -> SpeedRow | None:
    phase = next((p for p in result["phases"] if p["phase"] == label), None)
    if phase is None or phase["metrics"].get(metric.key) is None:
        return None
    metrics = phase["metrics"]
    spread = None
    if metric is TPOT:
        per_run = [value for value in metrics.get("tpot_s_per_run") or [] if value is not None]
        spread = (max(per_run) - min(per_run)) * metric.scale if len(per_run) > 1 else None
    return SpeedRow(
        ENGINE_LABELS.get(result["engine"], result["engine"]),
        metrics[metric.key] * metric.scale,
        spread,
        _fraction_of_limit(metrics.get("floors") or {}, metric),
    )


def _fraction_of_limit(floors: dict[str, Any], metric: Metric) -> float | None:
    if metric is OUTPUT_RATE:
        return floors.get("fraction_of_output_ceiling")
    if metric is TPOT:
        ratio = floors.get("tpot_over_decode_step_floor")
        return 1 / ratio if ratio else None
    return floors.get("prefill_fraction_of_matmul_ceiling")


def _phase_notes(record: dict[str, Any], label: str) -> list[str]:
    notes = []
    for result in record["results"]:
        phase = next((p for p in result["phases"] if p["phase"] == label), None)
        if phase is None:
            continue
        metrics = phase["metrics"]
        if metrics.get("prompt_tokens_computed") is not None and metrics.get("prompt_tokens_served_from_cache"):
            engine = ENGINE_LABELS.get(result["engine"], result["engine"])
            computed, served = metrics["prompt_tokens_computed"], metrics["prompt_tokens_served_from_cache"]
            notes.append(f"{engine}: {computed:,} prompt tokens computed, {served:,} served from the prefix cache")
    return notes


def _prefix_caching_verdict(record: dict[str, Any]) -> tuple[Status, str]:
    for result in record["results"]:
        comparison = result.get("comparisons")
        if comparison:
            identical = comparison["outputs_identical"]
            note = (
                f"outputs with prefix caching on and off {'identical' if identical else 'DIFFER'} "
                f"({comparison['num_requests_identical']} of {comparison['num_requests']} requests)"
            )
            return (Status.PASSED if identical else Status.FAILED), note
    return Status.PASSED, ""


def _phase_records(records: Sequence[dict[str, Any]], workload: str):
    """(engine, phase record from the workload, phase metrics) for every phase of `workload`."""
    for record in records:
        if record["workload"]["name"] != workload:
            continue
        shapes = {phase["label"]: phase for phase in record["workload"]["phases"]}
        for result in record["results"]:
            for phase in result["phases"]:
                yield result["engine"], shapes[phase["phase"]], phase["metrics"]


def _throughput_plot(records: Sequence[dict[str, Any]]) -> SpeedPlot | None:
    points: dict[str, list[tuple[float, float]]] = {}
    for engine, phase, metrics in _phase_records(records, "decode-sweep"):
        if metrics.get("tpot_s"):
            points.setdefault(engine, []).append((phase["num_requests"], phase["num_requests"] / metrics["tpot_s"]))
    return _plot(
        "throughput-vs-batch",
        "decode-sweep: decode throughput vs batch size",
        "batch size",
        "decode tokens/s (batch / TPOT)",
        points,
        log_x=True,
    )


def _tpot_context_plot(records: Sequence[dict[str, Any]]) -> SpeedPlot | None:
    points: dict[str, list[tuple[float, float]]] = {}
    for workload in ("decode-bs1", "decode-sweep", "long-context"):
        for engine, phase, metrics in _phase_records(records, workload):
            if not metrics.get("tpot_s"):
                continue
            requests = phase["num_requests"]
            context = (phase["num_prompt_tokens"] + phase["num_output_tokens"] / 2) / requests
            points.setdefault(f"{engine}, batch {requests}", []).append((context, metrics["tpot_s"] * 1e3))
    # A batch size measured at one context length only is a point, not a curve: left to the tables.
    points = {label: values for label, values in points.items() if len(values) > 1}
    return _plot(
        "tpot-vs-context",
        "time per output token vs context length",
        "mean context length during decode (tokens)",
        "TPOT (ms)",
        points,
        log_x=True,
    )


def _fraction_plot(records: Sequence[dict[str, Any]]) -> SpeedPlot | None:
    points: dict[str, list[tuple[float, float]]] = {}
    for engine, phase, metrics in _phase_records(records, "decode-sweep"):
        ratio = (metrics.get("floors") or {}).get("tpot_over_decode_step_floor")
        if ratio:
            points.setdefault(engine, []).append((phase["num_requests"], 1 / ratio))
    return _plot(
        "fraction-of-floor",
        "decode-sweep: fraction of the bandwidth floor",
        "batch size",
        "decode step floor / TPOT",
        points,
        log_x=True,
    )


def _plot(
    plot_id: str, title: str, x_label: str, y_label: str, points: dict[str, list[tuple[float, float]]], log_x: bool
) -> SpeedPlot | None:
    if not points:
        return None
    series = []
    for label, values in sorted(points.items()):
        values.sort()
        engine, _, rest = label.partition(",")
        shown = ENGINE_LABELS.get(engine, engine) + ("," + rest if rest else "")
        series.append(Series(shown, tuple(float(x) for x, _ in values), tuple(float(y) for _, y in values)))
    return SpeedPlot(plot_id, title, x_label, y_label, tuple(series), log_x)


def _environment(record: dict[str, Any]) -> dict[str, str]:
    environment = record["environment"]
    ceilings = record["ceilings"]
    shape = record["shape"]
    shown = {
        "gpu": environment.get("gpu") or environment.get("device"),
        "gpu driver": environment.get("gpu_driver"),
        "cuda": environment.get("cuda"),
        "torch": environment.get("torch"),
        "triton": environment.get("triton"),
        "transformers": environment.get("transformers"),
        "bench commit": environment.get("commit"),
        "copy bandwidth": f"{ceilings['copy_bandwidth']['value']:.4g} {ceilings['copy_bandwidth']['unit']}",
        "bf16 matmul ceiling": f"{ceilings['matmul_bf16']['value']:.4g} {ceilings['matmul_bf16']['unit']}",
        "model shape": f"{shape['name']} ({shape.get('num_parameters', '?')} parameters, random weights)",
        "dtype": record["dtype"],
    }
    return {key: "none" if value is None else str(value) for key, value in shown.items()}
