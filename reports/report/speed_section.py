"""The speed section: the standard workloads of shared/benchmarks.md, run through `reports.bench.harness`
(twinfer beside transformers in the same process), or read from bench JSON records made earlier.

Every figure shown comes from a bench record: the measured value, its run-to-run spread where the
workload ran several times, how many times faster than transformers in the same record, and the
fraction of the physical limit that the record computed from the copy bandwidth and matmul ceiling
measured in the same process. Records of one workload and shape share a table, one row per engine
and record, each record labelled with its engine settings (the defaults first); two records that
differ only in batch-invariant mode also give that mode's cost.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from reports.report.bench_records import (
    HF,
    BenchRecord,
    defaults_first,
    load_records,
    record_labels,
    short_commit,
)
from reports.report.records import SpeedRow, SpeedSection, SpeedTable, Status
from reports.report.setting_costs import setting_costs
from reports.report.speed_metrics import (
    SHOWN_ORDER,
    STANDARD_WORKLOADS,
    TPOT,
    Metric,
    engine_label,
    shown_value,
    times_faster,
    workload_metrics,
)
from reports.report.speed_series import speed_plots

logger = logging.getLogger(__name__)

QUICK_WORKLOADS = ("decode-bs1",)


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
        records, problems = load_records(options.bench_json)
    elif options.device.type != "cuda" and not options.allow_cpu:
        return SpeedSection(Status.NOT_RUN, "not run: no CUDA device (the standard workloads are measured on a GPU)")
    else:
        made, problems = _run_workloads(options)
        records = [BenchRecord(record) for record in made]
    return speed_from_records(records, problems)


def _run_workloads(options: SpeedOptions) -> tuple[list[dict[str, Any]], list[str]]:
    try:
        from reports.bench import harness as bench
        from reports.bench.shapes import SHAPES
        from reports.bench.workloads import build_workload
        from twinfer.registry import default_engine_name
    except ImportError as error:
        return [], [f"reports/bench/harness.py is not available: {error}"]
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


def speed_from_records(records: Sequence[BenchRecord], problems: Sequence[str] = ()) -> SpeedSection:
    """Tables, plots, costs and environment from bench records; `problems` are workloads or files
    that gave no record."""
    if not records:
        reason = "; ".join(problems) or "no workload was selected"
        return SpeedSection(Status.NOT_RUN, f"not run: {reason}")
    tables = [table for group in _groups(records) for table in _tables(group)]
    failed = any(table.status is Status.FAILED for table in tables)
    return SpeedSection(
        status=Status.FAILED if failed else Status.PASSED,
        detail=_detail(records, problems),
        tables=tuple(tables),
        plots=tuple(speed_plots(records)),
        environment=_environment(records),
        costs=tuple(setting_costs(records)),
    )


def _groups(records: Sequence[BenchRecord]) -> list[list[BenchRecord]]:
    """The records of each (workload, shape), workloads in the page's order, the defaults first."""
    keys = list(dict.fromkeys((record.workload, record.shape) for record in records))
    keys.sort(key=lambda key: SHOWN_ORDER.index(key[0]) if key[0] in SHOWN_ORDER else len(SHOWN_ORDER))
    return [defaults_first([r for r in records if (r.workload, r.shape) == key]) for key in keys]


def _tables(group: list[BenchRecord]) -> list[SpeedTable]:
    """One table per metric of the workload: a row per phase, record and engine."""
    workload = group[0].workload
    labels = record_labels(group)
    phases = list(dict.fromkeys(p["label"] for record in group for p in record.data["workload"]["phases"]))
    notes = _notes(group, labels)
    status = Status.FAILED if any(_prefix_caching_differs(record) for record in group) else Status.PASSED
    tables = []
    for metric in workload_metrics(workload):
        rows = tuple(
            row
            for phase in phases
            for record, label in zip(group, labels, strict=True)
            for row in _rows(record, label, phase, metric, show_phase=len(phases) > 1)
        )
        if rows:
            tables.append(
                SpeedTable(
                    workload=workload,
                    metric=metric.title,
                    unit=metric.unit,
                    better=metric.better,
                    rows=rows,
                    note="; ".join(notes),
                    status=status,
                    shape=group[0].shape,
                )
            )
    return tables


def _rows(record: BenchRecord, label: str, phase: str, metric: Metric, show_phase: bool) -> list[SpeedRow]:
    """The record's row of each engine that measured `metric` in `phase`, twinfer before transformers."""
    by_engine = {
        result["engine"]: entry["metrics"]
        for result in record.data["results"]
        for entry in result["phases"]
        if entry["phase"] == phase and shown_value(entry["metrics"], metric) is not None
    }
    baseline = shown_value(by_engine[HF], metric) if HF in by_engine else None
    rows = []
    for engine, metrics in by_engine.items():
        value = shown_value(metrics, metric)
        compared = engine != HF and baseline and value > 0
        rows.append(
            SpeedRow(
                engine=engine_label(engine),
                value=value,
                spread=_spread(metrics, metric),
                fraction_of_limit=_fraction_of_limit(metrics.get("floors") or {}, metric),
                settings=label if engine != HF else label + _transformers_note(record),
                phase=phase if show_phase else None,
                times_baseline=times_faster(value, baseline, metric) if compared else None,
                commit=record.commit,
                gpu=record.gpu,
                record=record.source or None,
            )
        )
    return rows


def _transformers_note(record: BenchRecord) -> str:
    """What transformers ran with beyond its defaults (`twinfer bench --hf-prompt-lookup`): the record's label
    names twinfer's flags, which its transformers row shares."""
    result = next((result for result in record.data["results"] if result["engine"] == HF), {})
    lookup = (result.get("transformers_settings") or {}).get("prompt_lookup_num_tokens")
    return f" · transformers: prompt lookup, prompt_lookup_num_tokens {lookup}" if lookup else ""


def _spread(metrics: dict[str, Any], metric: Metric) -> float | None:
    if metric is not TPOT:
        return None  # throughput comes from one run (the first, with a cold prefix cache)
    per_run = [value for value in metrics.get("tpot_s_per_run") or [] if value is not None]
    return (max(per_run) - min(per_run)) * metric.scale if len(per_run) > 1 else None


def _fraction_of_limit(floors: dict[str, Any], metric: Metric) -> float | None:
    if metric.key == "output_tokens_per_s":
        return floors.get("fraction_of_output_ceiling")
    if metric is TPOT:
        ratio = floors.get("tpot_over_decode_step_floor")
        return 1 / ratio if ratio else None
    return floors.get("prefill_fraction_of_matmul_ceiling")


def _notes(group: list[BenchRecord], labels: list[str]) -> list[str]:
    """What a reader needs beside the figures: a scaled-down workload, prefix-cache hits, and whether
    outputs with prefix caching on and off were identical; each named by its record where several share the table."""
    notes = []
    for record, label in zip(group, labels, strict=True):
        own = [
            *([record.data["workload"]["scale_note"]] if not record.data["workload"]["standard_workload"] else []),
            *_cache_notes(record),
            *_prefix_caching_notes(record),
        ]
        notes.extend(f"{label}: {note}" if len(group) > 1 else note for note in own)
    return notes


def _cache_notes(record: BenchRecord) -> list[str]:
    notes = []
    for result in record.data["results"]:
        for entry in result["phases"]:
            metrics = entry["metrics"]
            if metrics.get("prompt_tokens_computed") is not None and metrics.get("prompt_tokens_served_from_cache"):
                computed, served = metrics["prompt_tokens_computed"], metrics["prompt_tokens_served_from_cache"]
                notes.append(
                    f"{engine_label(result['engine'])} {entry['phase']}: {computed:,} prompt tokens computed, "
                    f"{served:,} served from the prefix cache"
                )
    return notes


def _prefix_caching_notes(record: BenchRecord) -> list[str]:
    notes = []
    for result in record.data["results"]:
        comparison = result.get("comparisons")
        if comparison:
            identical = comparison["outputs_identical"]
            notes.append(
                f"outputs with prefix caching on and off {'identical' if identical else 'DIFFER'} "
                f"({comparison['num_requests_identical']} of {comparison['num_requests']} requests)"
            )
    return notes


def _prefix_caching_differs(record: BenchRecord) -> bool:
    return any(
        result.get("comparisons") and not result["comparisons"]["outputs_identical"]
        for result in record.data["results"]
    )


def _detail(records: Sequence[BenchRecord], problems: Sequence[str]) -> str:
    counts: dict[str, int] = {}
    for record in records:
        counts[record.workload] = counts.get(record.workload, 0) + 1
    workloads = ", ".join(f"{name} ({count} records)" if count > 1 else name for name, count in counts.items())
    shapes = ", ".join(dict.fromkeys(_model_words(record) for record in records))
    dtypes = ", ".join(dict.fromkeys(record.data["dtype"] for record in records))
    commits = ", ".join(dict.fromkeys(short_commit(record.commit) for record in records))
    gpus = ", ".join(dict.fromkeys(str(record.gpu) for record in records))
    detail = f"{workloads} on {shapes}, {dtypes}; commit {commits}; {gpus}"
    missing = [name for name in STANDARD_WORKLOADS if name not in counts]
    if missing:
        detail += "; not measured: " + ", ".join(missing)
    if problems:
        detail += "; not read or not run: " + "; ".join(problems)
    return detail


def _model_words(record: BenchRecord) -> str:
    """The shape with random weights, or the checkpoint a record ran (`twinfer bench --model`)."""
    checkpoint = record.data.get("model")
    return f"{record.shape} (random weights)" if checkpoint is None else f"{record.shape} (checkpoint {checkpoint})"


def _environment(records: Sequence[BenchRecord]) -> dict[str, str]:
    """Where the records were measured; a value that differs between records lists each distinct one."""
    shown: dict[str, list[str]] = {}
    for record in records:
        for key, value in _record_environment(record).items():
            values = shown.setdefault(key, [])
            if value not in values:
                values.append(value)
    return {key: ", ".join(values) for key, values in shown.items()}


def _record_environment(record: BenchRecord) -> dict[str, str]:
    environment = record.data["environment"]
    ceilings = record.data["ceilings"]
    shape = record.data["shape"]
    shown = {
        "gpu": record.gpu,
        "gpu driver": environment.get("gpu_driver"),
        "cuda": environment.get("cuda"),
        "torch": environment.get("torch"),
        "triton": environment.get("triton"),
        "transformers": environment.get("transformers"),
        "bench commit": record.commit,
        "copy bandwidth": f"{ceilings['copy_bandwidth']['value']:.4g} {ceilings['copy_bandwidth']['unit']}",
        "bf16 matmul ceiling": f"{ceilings['matmul_bf16']['value']:.4g} {ceilings['matmul_bf16']['unit']}",
        "model shape": f"{_model_words(record)}, {shape.get('num_parameters', '?')} parameters",
        "dtype": record.data["dtype"],
    }
    return {key: "none" if value is None else str(value) for key, value in shown.items()}
