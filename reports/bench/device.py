"""What a benchmark record says about where it ran: versions, commit, GPU, and the device's own
ceilings (copy bandwidth, bf16 matmul throughput) measured in the same process as the workload.

On CUDA, times come from CUDA events around each call after a warm-up, and the median of
several calls is kept. On the CPU (harness tests only) the same measurements run, smaller, timed
with time.perf_counter, and the record says so.
"""

from __future__ import annotations

import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

import torch

REPOSITORY_ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class CeilingSizes:
    """How large the ceiling measurements are on a device type."""

    copy_bytes: int  # bytes of the copy's source (as many are written)
    matmul_size: int  # m = n = k of the square bf16 matmul
    warmup_calls: int
    timed_calls: int


CUDA_SIZES = CeilingSizes(copy_bytes=2 * 2**30, matmul_size=8192, warmup_calls=5, timed_calls=20)
CPU_SIZES = CeilingSizes(copy_bytes=32 * 2**20, matmul_size=256, warmup_calls=1, timed_calls=5)


@dataclass(frozen=True)
class Ceiling:
    """One measured ceiling: the median over `samples_s`, and how it was measured."""

    value: float
    unit: str
    method: str
    median_s: float
    samples_s: tuple[float, ...]


def time_calls(fn: Callable[[], object], device: torch.device, warmup_calls: int, timed_calls: int) -> list[float]:
    """Seconds per call of `fn`, each call timed alone, after `warmup_calls` untimed ones."""
    for _ in range(warmup_calls):
        fn()
    if device.type == "cuda":
        return _time_with_cuda_events(fn, device, timed_calls)
    samples = []
    for _ in range(timed_calls):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return samples


def _time_with_cuda_events(fn: Callable[[], object], device: torch.device, timed_calls: int) -> list[float]:
    torch.cuda.synchronize(device)
    pairs = []
    for _ in range(timed_calls):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        pairs.append((start, end))
    torch.cuda.synchronize(device)
    return [start.elapsed_time(end) / 1e3 for start, end in pairs]


def measure_copy_bandwidth(device: torch.device) -> Ceiling:
    """Bytes read plus bytes written per second by a device-to-device copy."""
    sizes = _sizes(device)
    samples = _time_copy(device, sizes)
    _release_cached_memory(device)
    median = statistics.median(samples)
    return Ceiling(
        value=2 * sizes.copy_bytes / median / 1e9,
        unit="GB/s (bytes read + written)",
        method=f"copy of {sizes.copy_bytes / 2**30:.3g} GiB on {device.type}, {_timer_name(device)}, "
        f"{sizes.warmup_calls} warm-up calls, median of {sizes.timed_calls}",
        median_s=median,
        samples_s=tuple(samples),
    )


def _time_copy(device: torch.device, sizes: CeilingSizes) -> list[float]:
    source = torch.empty(sizes.copy_bytes, dtype=torch.uint8, device=device).random_()
    target = torch.empty_like(source)
    return time_calls(lambda: target.copy_(source), device, sizes.warmup_calls, sizes.timed_calls)


def measure_matmul_ceiling(device: torch.device) -> Ceiling:
    """TFLOP/s of a square bf16 matmul (2 * n^3 FLOPs per call)."""
    sizes = _sizes(device)
    n = sizes.matmul_size
    samples = _time_matmul(device, sizes)
    _release_cached_memory(device)
    median = statistics.median(samples)
    return Ceiling(
        value=2 * n**3 / median / 1e12,
        unit="TFLOP/s",
        method=f"bf16 matmul {n}x{n}x{n} on {device.type}, {_timer_name(device)}, "
        f"{sizes.warmup_calls} warm-up calls, median of {sizes.timed_calls}",
        median_s=median,
        samples_s=tuple(samples),
    )


def _time_matmul(device: torch.device, sizes: CeilingSizes) -> list[float]:
    n = sizes.matmul_size
    generator = torch.Generator(device=device).manual_seed(0)
    a = torch.randn((n, n), device=device, generator=generator).to(torch.bfloat16)
    b = torch.randn((n, n), device=device, generator=generator).to(torch.bfloat16)
    out = torch.empty((n, n), device=device, dtype=torch.bfloat16)
    return time_calls(lambda: torch.matmul(a, b, out=out), device, sizes.warmup_calls, sizes.timed_calls)


def measure_ceilings(device: torch.device) -> dict[str, object]:
    return {
        "copy_bandwidth": asdict(measure_copy_bandwidth(device)),
        "matmul_bf16": asdict(measure_matmul_ceiling(device)),
    }


def environment(device: torch.device, commit: str | None) -> dict[str, object]:
    """Versions, commit, host and device of this run."""
    import transformers
    import triton

    record: dict[str, object] = {
        "recorded_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": sys.argv,
        "python": platform.python_version(),
        "host": platform.node(),
        "device": str(device),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "transformers": transformers.__version__,
        "cuda": torch.version.cuda,
        "commit": commit or git_commit(),
        "uncommitted_changes": git_has_uncommitted_changes(),
        "gpu": None,
        "gpu_driver": None,
    }
    if device.type == "cuda":
        record["gpu"] = torch.cuda.get_device_name(device)
        record["gpu_driver"] = nvidia_driver_version()
        record["gpu_memory_bytes"] = torch.cuda.get_device_properties(device).total_memory
    return record


def git_commit() -> str | None:
    return _read_command(["git", "-C", str(REPOSITORY_ROOT), "rev-parse", "HEAD"])


def git_has_uncommitted_changes() -> bool | None:
    status = _read_command(["git", "-C", str(REPOSITORY_ROOT), "status", "--porcelain", "--untracked-files=no"])
    return None if status is None else bool(status)


def nvidia_driver_version() -> str | None:
    versions = _read_command(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
    return versions.splitlines()[0] if versions else None  # one line per GPU, all the same driver


def _read_command(command: list[str]) -> str | None:
    """The command's stripped output, or None when it cannot run (no git checkout, no nvidia-smi)."""
    try:
        completed = subprocess.run(command, capture_output=True, text=True, check=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return completed.stdout.strip()


def _sizes(device: torch.device) -> CeilingSizes:
    return CUDA_SIZES if device.type == "cuda" else CPU_SIZES


def _timer_name(device: torch.device) -> str:
    return "CUDA events" if device.type == "cuda" else "time.perf_counter"


def _release_cached_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()


def cuda_bench_record(
    prog: str, description: str | None, run: Callable[[], dict[str, object]], argv: list[str] | None
) -> dict[str, object] | None:
    """The common main of a CUDA-only benchmark module: parse `--json PATH`, refuse without CUDA (None,
    after saying so on stderr), else run it and write its record as JSON to PATH, and return the record."""
    import argparse
    import json

    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--json", type=Path, required=True, help="where to write the results")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print(f"{prog.removeprefix('python -m reports.')} needs a CUDA device", file=sys.stderr)
        return None
    result = run()
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return result
