"""Test-side helpers of the kernel tests: the device they run on, tolerances, poisoned outputs, and
the shared builders of reports.bench.kernels.kernel_reference bound to that device.

The torch reference implementations themselves live in reports/bench/kernels/kernel_reference.py, which the
kernel benchmark uses too.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial

import torch

from reports.bench.kernels import kernel_reference

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
ON_GPU = DEVICE.type == "cuda"

# Max abs error allowed, as a fraction of the reference's max abs value.
# fp32 runs with input_precision="ieee" dots on the GPU, so no tf32 loosening is needed.
TOLERANCE = {torch.float32: 1e-4, torch.float16: 3e-3, torch.bfloat16: 2e-2}

build_paged_cache = partial(kernel_reference.build_paged_cache, device=DEVICE)
build_cos_sin_cache = partial(kernel_reference.build_cos_sin_cache, device=DEVICE)


def assert_close_scaled(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype, what: str) -> None:
    """Every element written (no NaN left from the poison) and max error within the dtype's tolerance."""
    actual64 = actual.double()
    assert not torch.isnan(actual64).any(), f"{what}: output holds NaN (unwritten element or NaN read)"
    scale = max(expected.abs().max().item(), 1e-3)
    error = (actual64 - expected).abs().max().item()
    assert error <= TOLERANCE[dtype] * scale, (
        f"{what}: max abs error {error:.3g} > {TOLERANCE[dtype]} x scale {scale:.3g}"
    )


def poisoned_like(tensor: torch.Tensor) -> torch.Tensor:
    return torch.full_like(tensor, float("nan"))


def gpu_bf16_random(shape: tuple[int, ...], generator: torch.Generator, scale: float = 1.0) -> torch.Tensor:
    """Normal values times `scale` on CUDA, rounded to bf16 (the GPU tests' weights and activations)."""
    return (torch.randn(shape, device="cuda", generator=generator) * scale).to(torch.bfloat16)


def wall_clock_us(call: Callable[[int], object], calls: int) -> list[float]:
    """A benchmark's timer on the CPU (reports.bench.graph_timing.time_in_graph's signature): one sample, the mean
    wall-clock microseconds of call(0) .. call(calls - 1)."""
    started = time.perf_counter()
    for i in range(calls):
        call(i)
    return [(time.perf_counter() - started) * 1e6 / calls]
