"""The memory target of the fast engine, measured: how much of its budget the KV pool gets, whether
the process stays inside `gpu_memory_utilization`, and whether repeated offline-256 runs leak.

    python -m reports.serving.memory_check --shape qwen3-0.6b --dtype bfloat16 --runs 10 --json memory.json   # GPU

One process builds the engine once (random weights, like `twinfer bench`; the pool sized from free
memory: num_blocks None; offline-256's settings max_num_seqs 256, max_num_batched_tokens 8192,
max_model_len 2048 unless given), runs one warm-up request, then the offline-256 workload `--runs`
times on that engine. Every figure comes from the device and PyTorch's allocator, never from the
engine's own sizing arithmetic (fast/model_runner.py):

- total: `torch.cuda.mem_get_info`'s total; limit = gpu_memory_utilization x total.
- pool bytes: numel x element_size of the engine's K and V pool tensors (padding block included).
- process peak while serving: `max_memory_reserved` since the peak was reset after the build, plus
  the largest memory outside PyTorch's allocator (total - free - reserved: the CUDA context, loaded
  kernels, other processes) seen at a quiet moment (after a synchronize and gc).
- allowed for KV = limit - (process peak - pool bytes); the pool's fraction of it (target >= 0.85).
- overshoot: the larger of the build's and the serving's allocator peak, plus the outside memory,
  against the limit; and, independently, the device's free memory sampled from a background thread
  while serving (catches memory outside the allocator that comes and goes within a step).
- leak: free memory, memory_allocated and memory_reserved after each run (after a synchronize and
  gc); run 1 and run N must end with the same free memory and memory_allocated.
- after each run the engine holds no unfinished request and its allocator has every block free.

Runs after the first find their prompts in the prefix cache (the pool holds the whole workload), so
their tokens/s are not offline-256 throughput figures; `twinfer bench offline-256` is.

On a device without CUDA there are no memory figures: the loop still runs (a harness check) and the
record says the memory figures are unavailable; nothing is estimated in their place.
"""

from __future__ import annotations

import argparse
import gc
import logging
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Protocol

import torch

from reports.bench.device import environment
from reports.bench.harness import build_random_engine, json_saver
from reports.bench.runners import PhaseRun, run_on_engine, warm_up_engine
from reports.bench.shapes import SHAPES, ModelShape
from reports.bench.workloads import Phase, Workload, build_workload
from spec.checkpoint import parse_dtype
from spec.engine import Engine
from spec.engine_config import EngineConfig
from spec.errors import ConfigError, TwinferError
from twinfer.engine_options import add_engine_arguments, given_engine_settings
from twinfer.registry import ENGINE_NAMES, default_engine_name, engine_class, engine_entry, resolve_device

logger = logging.getLogger(__name__)

WORKLOAD = "offline-256"
TARGET_POOL_FRACTION = 0.85
# The settings offline-256 is benchmarked with (reports/results/bench/COMMAND.txt); flags override them.
OFFLINE_256_ENGINE_SETTINGS: Mapping[str, object] = MappingProxyType(
    {"max_num_seqs": 256, "max_num_batched_tokens": 8192, "max_model_len": 2048}
)
DEFAULT_RUNS = 10
# Often enough to see a transient of a few steps, rarely enough that the sampling thread's share of
# the GIL does not change the engine's host loop measurably.
DEFAULT_SAMPLE_INTERVAL_S = 0.02
UNAVAILABLE = "unavailable: {device} has no CUDA memory counters; nothing is estimated in their place"


# ----------------------------------------------------------------------------- raw memory figures


@dataclass(frozen=True)
class MemorySnapshot:
    """The device's and the allocator's figures at one quiet moment (bytes)."""

    total_bytes: int
    free_bytes: int
    allocated_bytes: int
    reserved_bytes: int
    peak_allocated_bytes: int  # since the last reset_peak
    peak_reserved_bytes: int

    @property
    def outside_allocator_bytes(self) -> int:
        """Device memory in use that PyTorch's allocator does not hold: the CUDA context, loaded
        kernels, graph executables, other processes."""
        return self.total_bytes - self.free_bytes - self.reserved_bytes

    def record(self) -> dict[str, int]:
        return {**asdict(self), "outside_allocator_bytes": self.outside_allocator_bytes}


class MemoryProbe(Protocol):
    """Where the memory figures come from: CUDA on a GPU, a fake in the tests."""

    def snapshot(self) -> MemorySnapshot:
        """The figures at a quiet moment: after the device finished its work and gc ran."""
        ...

    def reset_peak(self) -> None:
        """Start the allocator's peak counters anew from what is held now."""
        ...

    def free_bytes(self) -> int:
        """The device's free memory now, without waiting for its work; callable from another thread."""
        ...


class CudaMemoryProbe:
    def __init__(self, device: torch.device) -> None:
        self.device = device

    def snapshot(self) -> MemorySnapshot:
        torch.cuda.synchronize(self.device)
        gc.collect()  # a tensor dropped in a reference cycle is still allocated until collected
        free, total = torch.cuda.mem_get_info(self.device)
        return MemorySnapshot(
            total_bytes=total,
            free_bytes=free,
            allocated_bytes=torch.cuda.memory_allocated(self.device),
            reserved_bytes=torch.cuda.memory_reserved(self.device),
            peak_allocated_bytes=torch.cuda.max_memory_allocated(self.device),
            peak_reserved_bytes=torch.cuda.max_memory_reserved(self.device),
        )

    def reset_peak(self) -> None:
        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)

    def free_bytes(self) -> int:
        return torch.cuda.mem_get_info(self.device)[0]


def probe_for(device: torch.device) -> MemoryProbe | None:
    """The CUDA probe on a GPU; None elsewhere (no memory figures exist there)."""
    return CudaMemoryProbe(device) if device.type == "cuda" else None


class FreeMemorySampler:
    """The device's free memory, read every `interval_s` by a background thread while in use.

    The allocator's counters miss memory taken outside PyTorch, and quiet-moment snapshots miss
    what comes and goes within a step; the device's own free figure misses neither. It must not
    run while CUDA graphs are captured (a CUDA call from another thread can invalidate a capture),
    so it is used only after the engine is built.
    """

    def __init__(self, read_free: Callable[[], int], interval_s: float) -> None:
        if interval_s <= 0:
            raise ConfigError(f"the sampling interval must be positive, got {interval_s}")
        self.read_free = read_free
        self.interval_s = interval_s
        self.min_free_bytes: int | None = None
        self.num_samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="free-memory-sampler", daemon=True)
        self._error: BaseException | None = None

    def __enter__(self) -> FreeMemorySampler:
        self._sample()  # at least one sample however short the use
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()
        if kind is not None:
            return  # the error in flight is the one to see
        self._sample()
        if self._error is not None:
            raise RuntimeError("the free-memory sampling thread failed") from self._error

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self._sample()
            except Exception as error:  # reported by __exit__, not lost in the thread
                self._error = error
                return

    def _sample(self) -> None:
        free = self.read_free()
        self.min_free_bytes = free if self.min_free_bytes is None else min(self.min_free_bytes, free)
        self.num_samples += 1


@contextmanager
def sampling(read_free: Callable[[], int] | None, interval_s: float | None) -> Iterator[FreeMemorySampler | None]:
    """A running FreeMemorySampler, or None when there is nothing to read or sampling is off."""
    if read_free is None or not interval_s:
        yield None
        return
    with FreeMemorySampler(read_free, interval_s) as sampler:
        yield sampler


# ----------------------------------------------------------------------------- arithmetic


@dataclass(frozen=True)
class PoolBudget:
    """What gpu_memory_utilization allows the KV pool, from measured figures (bytes)."""

    total_bytes: int
    gpu_memory_utilization: float
    pool_bytes: int
    peak_reserved_bytes: int  # the allocator's peak while serving (the pool included)
    outside_allocator_bytes: int  # the largest seen at a quiet moment while serving

    @property
    def limit_bytes(self) -> float:
        return self.gpu_memory_utilization * self.total_bytes

    @property
    def process_peak_bytes(self) -> int:
        return self.peak_reserved_bytes + self.outside_allocator_bytes

    @property
    def non_pool_peak_bytes(self) -> int:
        """Weights, activations, graph pools, buffers, the context: the peak of everything but the pool."""
        return self.process_peak_bytes - self.pool_bytes

    @property
    def allowed_for_kv_bytes(self) -> float:
        return self.limit_bytes - self.non_pool_peak_bytes

    @property
    def pool_fraction(self) -> float | None:
        """The pool over what it was allowed; above 1 exactly when the serving peak overshoots the limit."""
        allowed = self.allowed_for_kv_bytes
        return self.pool_bytes / allowed if allowed > 0 else None

    def record(self) -> dict[str, object]:
        return {
            **asdict(self),
            "limit_bytes": self.limit_bytes,
            "process_peak_bytes": self.process_peak_bytes,
            "non_pool_peak_bytes": self.non_pool_peak_bytes,
            "allowed_for_kv_bytes": self.allowed_for_kv_bytes,
            "pool_fraction": self.pool_fraction,
            "target_pool_fraction": TARGET_POOL_FRACTION,
        }


def meets_pool_target(budget: PoolBudget, target: float = TARGET_POOL_FRACTION) -> bool:
    fraction = budget.pool_fraction
    return fraction is not None and fraction >= target


def within_limit(peak_bytes: float, limit_bytes: float) -> bool:
    return peak_bytes <= limit_bytes


@dataclass(frozen=True)
class LeakCheck:
    """Run N's end against run 1's end (deltas are last - first, in bytes)."""

    first_run: int
    last_run: int
    free_delta_bytes: int
    allocated_delta_bytes: int
    reserved_delta_bytes: int
    outside_allocator_delta_bytes: int

    @property
    def no_leak(self) -> bool:
        return self.free_delta_bytes == 0 and self.allocated_delta_bytes == 0

    @property
    def explanation(self) -> str:
        """Where a change of free memory went: free = total - reserved - outside, so its delta is the
        sum of the other two with the sign turned."""
        if self.no_leak:
            return f"free memory and memory_allocated identical after run {self.first_run} and run {self.last_run}"
        parts = []
        if self.allocated_delta_bytes:
            parts.append(f"memory_allocated changed by {self.allocated_delta_bytes} B: tensors outlive the runs")
        if self.reserved_delta_bytes:
            parts.append(
                f"memory_reserved changed by {self.reserved_delta_bytes} B: the caching allocator holds more or "
                "fewer segments (cached, not necessarily live tensors; the process's footprint moved all the same)"
            )
        if self.outside_allocator_delta_bytes:
            parts.append(
                f"memory outside PyTorch's allocator changed by {self.outside_allocator_delta_bytes} B "
                "(CUDA context, kernels loaded late, graph executables, or another process on the device)"
            )
        return f"free memory changed by {self.free_delta_bytes} B: " + "; ".join(parts)

    def record(self) -> dict[str, object]:
        return {**asdict(self), "no_leak": self.no_leak, "explanation": self.explanation}


def leak_check(first: MemorySnapshot, last: MemorySnapshot, first_run: int, last_run: int) -> LeakCheck:
    return LeakCheck(
        first_run=first_run,
        last_run=last_run,
        free_delta_bytes=last.free_bytes - first.free_bytes,
        allocated_delta_bytes=last.allocated_bytes - first.allocated_bytes,
        reserved_delta_bytes=last.reserved_bytes - first.reserved_bytes,
        outside_allocator_delta_bytes=last.outside_allocator_bytes - first.outside_allocator_bytes,
    )


def combined_verdict(required: Sequence[bool | None], optional: Sequence[bool | None] = ()) -> bool | None:
    """False if any check failed; None if a required one was not measured; else True."""
    measured = [*required, *(value for value in optional if value is not None)]
    if any(value is False for value in measured):
        return False
    if any(value is None for value in required):
        return None
    return True


# ----------------------------------------------------------------------------- the engine's state


def kv_pool_tensors(engine: Engine) -> dict[str, torch.Tensor]:
    """The engine's K and V pools: the fast engine's `runner.cache` (fast.kv_cache.KVCache), the
    reference engine's `cache` (reference.kv_cache.PagedKVCache); both keep `keys` and `values`."""
    cache = getattr(engine, "runner", engine).cache
    return {"keys": cache.keys, "values": cache.values}


def tensor_bytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def pool_record(engine: Engine) -> dict[str, object]:
    tensors = kv_pool_tensors(engine)
    return {
        "bytes": sum(tensor_bytes(tensor) for tensor in tensors.values()),
        "allocator_blocks": engine.config.num_blocks,
        "block_size": engine.config.block_size,
        "tensors": {
            name: {
                "shape": list(tensor.shape),
                "dtype": str(tensor.dtype).removeprefix("torch."),
                "device": str(tensor.device),
                "bytes": tensor_bytes(tensor),
            }
            for name, tensor in tensors.items()
        },
    }


@dataclass(frozen=True)
class IdleState:
    """What an engine holds once a run finished: it should be nothing."""

    has_unfinished: bool
    num_free_blocks: int
    num_blocks: int

    @property
    def empty(self) -> bool:
        return not self.has_unfinished and self.num_free_blocks == self.num_blocks

    def record(self) -> dict[str, object]:
        return {**asdict(self), "empty": self.empty}


def idle_state(engine: Engine) -> IdleState:
    """Both engines' schedulers keep their block allocator as `scheduler.allocator`, with
    `num_free_blocks` (blocks in the free queue, prefix-cached ones included) and `num_blocks`."""
    allocator = engine.scheduler.allocator
    return IdleState(engine.has_unfinished, allocator.num_free_blocks, allocator.num_blocks)


# ----------------------------------------------------------------------------- the check


@dataclass(frozen=True)
class MemoryCheckSettings:
    shape: ModelShape
    dtype: torch.dtype
    device: torch.device
    engine: str
    engine_config: EngineConfig
    engine_settings_given: Mapping[str, object]
    runs: int = DEFAULT_RUNS
    scale: float = 1.0
    weight_seed: int = 0
    sample_interval_s: float | None = DEFAULT_SAMPLE_INTERVAL_S  # None or 0: no sampling thread
    progress: bool = True
    commit: str | None = None

    def record(self) -> dict[str, object]:
        return {
            "engine": self.engine,
            "runs": self.runs,
            "scale": self.scale,
            "weight_seed": self.weight_seed,
            "engine_settings_given": dict(self.engine_settings_given),
            "engine_config_requested": asdict(self.engine_config),
            "sample_interval_s": self.sample_interval_s,
        }


@dataclass(frozen=True)
class RunFigures:
    index: int  # 1-based
    wall_s: float
    output_tokens: int
    prompt_tokens_served_from_cache: int | None
    memory: MemorySnapshot | None
    idle: IdleState

    def record(self) -> dict[str, object]:
        return {
            "run": self.index,
            "wall_s": self.wall_s,
            "output_tokens": self.output_tokens,
            "output_tokens_per_s": self.output_tokens / self.wall_s,
            "prompt_tokens_served_from_cache": self.prompt_tokens_served_from_cache,
            "memory": None if self.memory is None else self.memory.record(),
            "engine_after_run": self.idle.record(),
        }


def build_engine(settings: MemoryCheckSettings) -> Engine:
    """The engine over random weights drawn on the device, as `twinfer bench` builds it."""
    return build_random_engine(
        settings.engine, settings.shape, settings.engine_config, settings.dtype, settings.device, settings.weight_seed
    )


def measure_run(engine: Engine, phase: Phase, index: int, probe: MemoryProbe | None, progress: bool) -> RunFigures:
    run: PhaseRun = run_on_engine(engine, phase, progress)
    cached = [request.num_cached_prompt_tokens for request in run.requests]
    return RunFigures(
        index=index,
        wall_s=run.wall_s,
        output_tokens=run.num_output_tokens,
        prompt_tokens_served_from_cache=None if any(c is None for c in cached) else sum(cached),
        memory=None if probe is None else probe.snapshot(),
        idle=idle_state(engine),
    )


def run_memory_check(
    settings: MemoryCheckSettings,
    probe: MemoryProbe | None,
    save: Callable[[dict[str, object]], None] = lambda record: None,
) -> dict[str, object]:
    """The record of the check; `save` receives it after the build and after every run (marked
    incomplete until the end), so the figures of a long check survive a failure part-way."""
    workload = build_workload(WORKLOAD, settings.scale)
    (phase,) = workload.phases
    if probe is not None:
        probe.reset_peak()
    at_start = None if probe is None else probe.snapshot()
    logger.info("building the %s engine on %s", settings.engine, settings.device)
    engine = build_engine(settings)
    # The build's peak counts from the reset above, or from a later one inside the engine: the fast
    # engine resets the counters itself while sizing its pool, before the pool exists, so either
    # way it covers every moment the pool existed during the build.
    after_build = None if probe is None else probe.snapshot()
    record = _header(settings, workload, engine, probe, at_start, after_build)
    save(record)
    if probe is not None:
        probe.reset_peak()  # the serving phase's peak starts here
    runs: list[RunFigures] = []
    with sampling(None if probe is None else probe.free_bytes, settings.sample_interval_s) as sampler:
        warm_up_engine(engine)
        for index in range(1, settings.runs + 1):
            runs.append(measure_run(engine, phase, index, probe, settings.progress))
            record["runs"] = [run.record() for run in runs]
            logger.info(
                "run %d of %d: %.1f output tokens/s", index, settings.runs, record["runs"][-1]["output_tokens_per_s"]
            )
            save(record)
    record.update(_results(record["pool"]["bytes"], engine, after_build, runs, sampler))
    record["complete"] = True
    save(record)
    return record


def _header(
    settings: MemoryCheckSettings,
    workload: Workload,
    engine: Engine,
    probe: MemoryProbe | None,
    at_start: MemorySnapshot | None,
    after_build: MemorySnapshot | None,
) -> dict[str, object]:
    sized_from_memory = (
        engine_entry(settings.engine).sizes_kv_pool_from_gpu_memory
        and settings.device.type == "cuda"
        and settings.engine_config.num_blocks is None
    )
    return {
        "record": "twinfer memory check",
        "complete": False,
        "workload": workload.record(),
        "shape": settings.shape.record(),
        "dtype": str(settings.dtype).removeprefix("torch."),
        "environment": environment(settings.device, settings.commit),
        "settings": settings.record(),
        "engine_config": asdict(engine.config),
        "pool_sized_from_gpu_memory": sized_from_memory,
        "memory_figures": "cuda" if probe is not None else UNAVAILABLE.format(device=settings.device),
        "pool": pool_record(engine),
        "memory_at_start": None if at_start is None else at_start.record(),
        "memory_after_build": None if after_build is None else after_build.record(),
        "runs": [],
    }


def _results(
    pool_bytes: int,
    engine: Engine,
    after_build: MemorySnapshot | None,
    runs: list[RunFigures],
    sampler: FreeMemorySampler | None,
) -> dict[str, object]:
    """Budget, overshoot, leak and idle checks from the figures measured, with their verdicts."""
    engine_empty = all(run.idle.empty for run in runs)
    snapshots = [run.memory for run in runs if run.memory is not None]
    if after_build is None or not snapshots:
        return {
            "kv_budget": None,
            "peaks": None,
            "leak": None,
            "verdicts": _verdicts(None, None, None, None, engine_empty),
        }
    budget = PoolBudget(
        total_bytes=after_build.total_bytes,
        gpu_memory_utilization=engine.config.gpu_memory_utilization,
        pool_bytes=pool_bytes,
        peak_reserved_bytes=max(s.peak_reserved_bytes for s in snapshots),
        outside_allocator_bytes=max(s.outside_allocator_bytes for s in [after_build, *snapshots]),
    )
    peaks = _peaks(budget, after_build, sampler)
    leak = leak_check(snapshots[0], snapshots[-1], runs[0].index, runs[-1].index) if len(runs) > 1 else None
    return {
        "kv_budget": budget.record(),
        "peaks": peaks,
        "leak": None if leak is None else leak.record(),
        "verdicts": _verdicts(
            meets_pool_target(budget),
            peaks["process_peak_within_limit"],
            peaks["sampled_device_peak_within_limit"],
            None if leak is None else leak.no_leak,
            engine_empty,
        ),
    }


def _peaks(budget: PoolBudget, after_build: MemorySnapshot, sampler: FreeMemorySampler | None) -> dict[str, object]:
    """The process's peak over the build (with the pool) and serving, and the device's sampled one."""
    peak_reserved = max(after_build.peak_reserved_bytes, budget.peak_reserved_bytes)
    process_peak = peak_reserved + budget.outside_allocator_bytes
    sampled = None
    if sampler is not None and sampler.min_free_bytes is not None:
        sampled = budget.total_bytes - sampler.min_free_bytes
    return {
        "limit_bytes": budget.limit_bytes,
        "build_peak_reserved_bytes": after_build.peak_reserved_bytes,
        "serving_peak_reserved_bytes": budget.peak_reserved_bytes,
        "outside_allocator_bytes_max": budget.outside_allocator_bytes,
        "process_peak_bytes": process_peak,
        "process_peak_within_limit": within_limit(process_peak, budget.limit_bytes),
        "sampled_device_peak_used_bytes": sampled,
        "sampled_num_samples": None if sampler is None else sampler.num_samples,
        "sampled_device_peak_within_limit": None if sampled is None else within_limit(sampled, budget.limit_bytes),
        "note": "process peak: allocator peak (build and serving) + memory outside the allocator at quiet moments; "
        "sampled: total - the least free memory read every sample_interval_s while serving (whole device)",
    }


def _verdicts(
    pool: bool | None, peak: bool | None, sampled: bool | None, no_leak: bool | None, engine_empty: bool
) -> dict[str, object]:
    return {
        "pool_fraction_meets_target": pool,
        "process_peak_within_limit": peak,
        "sampled_device_peak_within_limit": sampled,
        "no_leak": no_leak,
        "engine_empty_after_every_run": engine_empty,
        # The sampled peak counts where it was measured (off with --sample-interval-ms 0).
        "passed": combined_verdict([pool, peak, no_leak, engine_empty], [sampled]),
    }


# ----------------------------------------------------------------------------- summary


def summary_text(record: dict[str, object]) -> str:
    env, settings = record["environment"], record["settings"]
    verdicts = record["verdicts"]
    lines = [
        f"memory check: {WORKLOAD} x{settings['runs']}"
        f"{'' if record['workload']['standard_workload'] else ' (SCALED: not the standard workload)'} on "
        f"{record['shape']['name']} {record['dtype']}, {settings['engine']} engine, {env['gpu'] or env['device']}, "
        f"commit {env['commit']}",
    ]
    budget = record["kv_budget"]
    if budget is None:
        lines.append(f"memory figures {record['memory_figures']}")
    else:
        lines += _budget_lines(record, budget)
    lines.append(f"engine empty after every run: {_verdict(verdicts['engine_empty_after_every_run'])}")
    lines.append(f"{'run':>4} {'out tok/s':>10} {'cached prompt':>14} {'free GiB':>10} {'allocated GiB':>14}")
    for run in record["runs"]:
        memory = run["memory"] or {}
        lines.append(
            f"{run['run']:>4} {run['output_tokens_per_s']:>10.1f} {_text(run['prompt_tokens_served_from_cache']):>14} "
            f"{_gib(memory.get('free_bytes')):>10} {_gib(memory.get('allocated_bytes')):>14}"
        )
    lines.append(f"passed: {_verdict(verdicts['passed'])}")
    return "\n".join(lines)


def _budget_lines(record: dict[str, object], budget: dict[str, object]) -> list[str]:
    peaks, leak, verdicts = record["peaks"], record["leak"], record["verdicts"]
    fraction = budget["pool_fraction"]
    lines = [
        f"KV pool {_gib(budget['pool_bytes'])} GiB ({record['pool']['allocator_blocks']} blocks); allowed for KV "
        f"{_gib(budget['allowed_for_kv_bytes'])} GiB = {budget['gpu_memory_utilization']} x "
        f"{_gib(budget['total_bytes'])} GiB - {_gib(budget['non_pool_peak_bytes'])} GiB non-pool peak: "
        f"{'-' if fraction is None else f'{fraction:.1%}'} (target >= {TARGET_POOL_FRACTION:.0%}): "
        f"{_verdict(verdicts['pool_fraction_meets_target'])}",
        f"process peak {_gib(peaks['process_peak_bytes'])} GiB, limit {_gib(peaks['limit_bytes'])} GiB: "
        f"{_verdict(verdicts['process_peak_within_limit'])}; sampled device peak "
        f"{_gib(peaks['sampled_device_peak_used_bytes'])} GiB: "
        f"{_verdict(verdicts['sampled_device_peak_within_limit'])}",
    ]
    if leak is None:
        lines.append("leak: not checked (needs at least 2 runs)")
    else:
        lines.append(f"leak: {leak['explanation']}: {_verdict(verdicts['no_leak'])}")
    return lines


def _gib(value: float | None) -> str:
    return "-" if value is None else f"{value / 2**30:.3f}"


def _text(value: object) -> str:
    return "-" if value is None else str(value)


def _verdict(value: bool | None) -> str:
    return {True: "PASS", False: "FAIL", None: "NOT MEASURED"}[value]


# ----------------------------------------------------------------------------- command line


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--shape", default="qwen3-0.6b", choices=sorted(SHAPES), help="model shape (random weights)")
    parser.add_argument(
        "--dtype", default="bfloat16", choices=["float32", "float16", "bfloat16"], help="dtype (default bfloat16)"
    )
    parser.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    parser.add_argument(
        "--engine", default=None, choices=ENGINE_NAMES, help="engine (default: fast on CUDA, reference on the CPU)"
    )
    parser.add_argument("--runs", type=int, default=DEFAULT_RUNS, help=f"offline-256 runs (default {DEFAULT_RUNS})")
    parser.add_argument(
        "--scale",
        type=float,
        default=1.0,
        help="shrink every count and length of offline-256 by this factor, for harness tests (default 1)",
    )
    parser.add_argument("--weight-seed", type=int, default=0, help="seed of the random weights (default 0)")
    parser.add_argument(
        "--sample-interval-ms",
        type=float,
        default=DEFAULT_SAMPLE_INTERVAL_S * 1e3,
        help="read the device's free memory this often while serving (default %(default)s; 0: off)",
    )
    parser.add_argument("--json", type=Path, help="write the record as JSON to this file")
    parser.add_argument("--commit", help="git commit to record (default: `git rev-parse HEAD`)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    add_engine_arguments(parser)
    parser.epilog = "engine settings not given default to offline-256's: " + ", ".join(
        f"{name} {value}" for name, value in OFFLINE_256_ENGINE_SETTINGS.items()
    )


def settings_from_args(args: argparse.Namespace) -> MemoryCheckSettings:
    device = resolve_device(args.device)
    engine = args.engine if args.engine is not None else default_engine_name(device)
    if args.runs < 1:
        raise ConfigError(f"--runs must be at least 1, got {args.runs}")
    if args.sample_interval_ms < 0:
        raise ConfigError(f"--sample-interval-ms must be at least 0, got {args.sample_interval_ms}")
    given = given_engine_settings(args)
    config = EngineConfig(**(dict(OFFLINE_256_ENGINE_SETTINGS) | given))
    if config.tensor_parallel_size != 1:
        raise ConfigError("the memory check measures one process on one GPU: --tensor-parallel-size must be 1")
    engine_class(engine, device)  # fails now, before anything is built, if it cannot run here
    build_workload(WORKLOAD, args.scale)  # rejects a bad --scale now
    return MemoryCheckSettings(
        shape=SHAPES[args.shape],
        dtype=parse_dtype(args.dtype),
        device=device,
        engine=engine,
        engine_config=config,
        engine_settings_given=given,
        runs=args.runs,
        scale=args.scale,
        weight_seed=args.weight_seed,
        sample_interval_s=args.sample_interval_ms / 1e3 or None,
        progress=not args.no_progress,
        commit=args.commit,
    )


def run(args: argparse.Namespace) -> int:
    """0 when every check measured passed, 1 when one failed."""
    settings = settings_from_args(args)
    record = run_memory_check(settings, probe_for(settings.device), json_saver(args.json))
    print(summary_text(record))
    return 1 if record["verdicts"]["passed"] is False else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m reports.serving.memory_check", description=__doc__.split("\n\n")[0]
    )
    configure_parser(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return run(args)
    except TwinferError as error:
        print(f"python -m reports.serving.memory_check: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
