"""Where a benchmark run's time goes: one extra run of a phase under torch.profiler, summarised.

The summary answers the questions a miss has to answer (issue: performance): how much of the
wall time the GPU was busy (the union of every kernel's interval, so overlapping kernels count
once), which kernels took that time (grouped by name and by kind: matmul, attention, norms, ...),
and how the host split its time per step (the engine's own `step_timings` over the same run).
Kernels launched from CUDA-graph replays are reported by CUPTI like any others.

Two measures per kernel and kind. Kernel time is each kernel's own interval. Under programmatic
dependent launch a kernel starts while the one before it still runs and waits for it on the device,
so kernel times overlap and add up to more than the busy time (at qwen3-0.6b decode-bs1: 1.40 ms of
kernel time in 0.93 ms busy a step, bench/offline_hf_session9/). Busy time gives every busy instant
to the earliest-started kernel running then (the one the others wait for), so a kernel's busy time
is what it adds to the union, and busy times add up to the busy time exactly: the measure to say
what removing a kernel could save at most.

The profiled run is not a timed run: the profiler's own overhead lands on the host side, so its
wall time is recorded beside the summary only to put the GPU-busy figure in proportion. It runs on
the engine that ran the timed runs, so prompts it has seen may come from the prefix cache.
"""

from __future__ import annotations

import re
import statistics
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.profiler import ProfilerActivity, profile

from reports.bench.runners import PhaseRun

# How many kernel names the summary lists, by total device time.
TOP_KERNELS = 30

# Kernel kinds, first match wins: (kind, pattern over the kernel's name, case-insensitive).
KERNEL_KINDS: tuple[tuple[str, str], ...] = (
    # Before the sampling kinds: NCCL's and symmetric memory's kernel names contain "reduce" and "gather".
    ("all-reduce / communication", r"nccl|all_reduce|allreduce|symm_mem"),
    ("attention (decode)", r"_decode_(split|reduce)_kernel"),
    ("matmul (GEMV)", r"_gemv_kernel"),
    ("attention (prefill)", r"_prefill|flash|attention"),
    ("matmul", r"gemm|nvjet|cutlass|sm90_|sm80_|_matmul_kernel|cublas"),
    ("norm", r"rmsnorm"),
    ("rope + qk norm", r"rope"),
    ("kv store", r"kv_store|store_kv"),
    ("silu_and_mul", r"silu"),
    ("sampling and logits (reductions, sort, top-k)", r"reduce|argmax|argmin|sort|topk|scan|softmax|radix|gather"),
    ("elementwise (torch)", r"elementwise|vectorized|unrolled|copy|fill|where|index"),
)
# Host-side calls into torch.distributed (the per-step broadcast of tensor parallelism, collectives
# issued eagerly), as the profiler names them: their host time beside the kernels'.
HOST_COMMUNICATION = r"c10d::|gloo:|nccl:|symm_mem"


@dataclass(frozen=True)
class KernelInterval:
    name: str
    start_us: float
    end_us: float


def profile_run(run: Callable[[], PhaseRun], device: torch.device) -> tuple[PhaseRun, dict[str, object]]:
    """Run `run` under torch.profiler; return its PhaseRun and the summary of where its time went."""
    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities, record_shapes=False, with_stack=False) as profiler:
        phase_run = run()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    kernels, host_calls = [], []
    for event in profiler.events():
        interval = KernelInterval(event.name, event.time_range.start, event.time_range.end)
        if event.device_type == torch.autograd.DeviceType.CUDA:
            kernels.append(interval)
        elif re.search(HOST_COMMUNICATION, event.name):
            host_calls.append(interval)
    summary = summarise(kernels, phase_run)
    summary["host_communication_calls"] = host_call_summary(host_calls)
    return phase_run, summary


def host_call_summary(calls: list[KernelInterval]) -> list[dict[str, object]]:
    """Per name: how many calls, their total and mean host time (nested calls count in each)."""
    by_name = durations_by_name(calls)
    return [
        {"name": name, "calls": len(durations), "total_s": sum(durations) / 1e6, "mean_us": statistics.mean(durations)}
        for name, durations in sorted(by_name.items(), key=lambda item: -sum(item[1]))
    ]


def durations_by_name(intervals: list[KernelInterval]) -> dict[str, list[float]]:
    """Each name's interval lengths in microseconds, in the order the intervals came."""
    by_name: dict[str, list[float]] = defaultdict(list)
    for interval in intervals:
        by_name[interval.name].append(interval.end_us - interval.start_us)
    return by_name


def summarise(kernels: list[KernelInterval], phase_run: PhaseRun) -> dict[str, object]:
    wall_s = phase_run.wall_s
    num_steps = len(phase_run.step_wall_s)
    busy_s = busy_time_us(kernels) / 1e6
    by_name = durations_by_name(kernels)
    busy_by_name = busy_us_by_name(kernels)
    total_kernel_s = sum(sum(durations) for durations in by_name.values()) / 1e6
    by_kind: dict[str, float] = defaultdict(float)
    busy_by_kind: dict[str, float] = defaultdict(float)
    for name, durations in by_name.items():
        by_kind[kernel_kind(name)] += sum(durations) / 1e6
        busy_by_kind[kernel_kind(name)] += busy_by_name[name] / 1e6
    top = sorted(by_name.items(), key=lambda item: -sum(item[1]))[:TOP_KERNELS]
    return {
        "method": "torch.profiler (CPU + CUDA activities) over one extra, untimed run of the phase; "
        "GPU busy = union of kernel intervals; a kernel's busy time = the instants of that union it is the "
        "earliest-started kernel running",
        "wall_s": wall_s,
        "num_steps": num_steps,
        "num_kernels": len(kernels),
        "gpu_busy_s": busy_s,
        "gpu_busy_fraction_of_wall": busy_s / wall_s if wall_s > 0 else None,
        "gpu_idle_s": max(0.0, wall_s - busy_s),
        "kernel_time_s_total": total_kernel_s,
        "gpu_busy_s_per_step": busy_s / num_steps if num_steps else None,
        "engine_step_timings": phase_run.engine_step_timings,
        "kernel_time_s_by_kind": dict(sorted(by_kind.items(), key=lambda item: -item[1])),
        "gpu_busy_s_by_kind": dict(sorted(busy_by_kind.items(), key=lambda item: -item[1])),
        "top_kernels": [
            {
                "name": name,
                "kind": kernel_kind(name),
                "calls": len(durations),
                "total_s": sum(durations) / 1e6,
                "mean_us": sum(durations) / len(durations),
                # A collective's kernel also waits for the slowest rank: median and max tell a steady
                # cost from waits that hit a few calls (the first all-reduce of a step, say).
                "median_us": statistics.median(durations),
                "max_us": max(durations),
                "share_of_kernel_time": (sum(durations) / 1e6) / total_kernel_s if total_kernel_s else None,
                "busy_s": busy_by_name[name] / 1e6,
            }
            for name, durations in top
        ],
    }


def kernel_kind(name: str) -> str:
    for kind, pattern in KERNEL_KINDS:
        if re.search(pattern, name, flags=re.IGNORECASE):
            return kind
    return "other"


def busy_time_us(kernels: list[KernelInterval]) -> float:
    """Length of the union of the kernels' intervals (kernels on several streams may overlap)."""
    return sum(busy_us_by_name(kernels).values())


def busy_us_by_name(kernels: list[KernelInterval]) -> dict[str, float]:
    """Per kernel name, the microseconds of the union of all intervals in which a kernel of that name is the
    earliest-started one running: a kernel adds the part of its interval past every earlier-started one's end.
    a [0, 10], b [5, 12] (started under a, as under PDL), c [8, 9]: a 10, b 2 (10..12), c 0."""
    busy: dict[str, float] = defaultdict(float)
    covered_until = float("-inf")
    for kernel in sorted(kernels, key=lambda k: k.start_us):
        start = max(kernel.start_us, covered_until)
        busy[kernel.name] += max(0.0, kernel.end_us - start)
        covered_until = max(covered_until, kernel.end_us)
    return dict(busy)
