"""The LM head with its greedy argmax (fast/kernels/lm_head_argmax.py) against the path it replaces, timed as in
a decode graph.

    python -m reports.bench.kernels.lm_head_argmax --json reports/results/kernels/lm_head_argmax/bench.json

At the vocabulary heads of Qwen3-0.6B (151936 x 1024) and Qwen3-8B (151936 x 4096), bf16, M = 1, 2, 4, 8, 16
rows, each variant per call:
    cublas+cast+max   torch's linear (cuBLAS, bf16 logits), .float(), torch.max(dim=-1): the engine's head and
                      the sampler's greedy pass before lm_head_argmax
    cublas            torch's linear alone (bf16 out), for reference
    gemv              fast.kernels.gemv.small_batch_linear alone (bf16 out), for reference: the same tile loop
    lm_head_argmax    the fused kernel: fp32 logits, each row's max and argmax, one launch
with microseconds per call, weight GB/s, and the ratio to the bandwidth floor: the head weight's bytes at the
device's copy bandwidth (reports.bench.device, measured in the same process; x and the logits are at most 3% of
the weight's bytes at M = 16). Each record also says whether lm_head_argmax's (max, argmax) equal torch.max over
its own logits (they must), how many rows' argmax differ from the cuBLAS path's (a near tie may round
differently), and its logits' largest error against x.float() @ w.float().T.

How: reports.bench.graph_timing.time_in_graph: a CUDA graph of back-to-back calls (at least MIN_CALLS), replayed
after warm-up and timed with CUDA events, the median replay / calls per call. Successive calls read different
copies of the weight, at least two and enough that one replay touches >= 3 x the L2, so every call reads its
weight from HBM. Needs CUDA; without it the command exits with status 2.
"""

from __future__ import annotations

import math
import statistics
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

from fast.kernels.gemv import small_batch_linear
from fast.kernels.lm_head_argmax import LmHeadResult, LmHeadWorkspace, lm_head_argmax, lm_head_workspace
from reports.bench.device import cuda_bench_record, environment, measure_copy_bandwidth
from reports.bench.graph_timing import time_in_graph

# (model, vocabulary rows N, hidden size K).
HEADS: list[tuple[str, int, int]] = [("Qwen3-0.6B", 151936, 1024), ("Qwen3-8B", 151936, 4096)]
ROWS = (1, 2, 4, 8, 16)
DTYPE = torch.bfloat16
MIN_CALLS = 20
L2_MULTIPLE = 3  # one replay reads at least this many L2s of distinct weight bytes
VARIANTS = ("cublas+cast+max", "cublas", "gemv", "lm_head_argmax")

# timer(call, calls) -> samples of microseconds per call (time_in_graph on a GPU; a wall clock in the CPU test).
Timer = Callable[[Callable[[int], object], int], list[float]]


@dataclass
class Timing:
    model: str
    n: int
    k: int
    m: int
    variant: str
    us_per_call: float
    weight_GBps: float
    floor_us: float  # the weight's bytes at the copy bandwidth
    over_floor: float  # us_per_call / floor_us
    calls_per_graph: int
    weight_copies: int
    samples_us: list[float]


@dataclass
class Check:
    """lm_head_argmax against torch at one (head, M), on the first weight copy."""

    model: str
    m: int
    max_equals_torch_max: bool  # (max, argmax) bit for bit torch.max over its own logits
    argmax_rows_differing_from_cublas: int
    logits_max_abs_error: float  # against x.float() @ w.float().T


def bench_head(
    model: str, n: int, k: int, rows: tuple[int, ...], copy_gbps: float, l2_bytes: int, dtype: torch.dtype,
    device: torch.device, timer: Timer,
) -> tuple[list[Timing], list[Check]]:  # fmt: skip
    """Every variant at every M on one head; its weight copies are released before returning."""
    weight_bytes = n * k * dtype.itemsize
    copies = max(2, math.ceil(L2_MULTIPLE * l2_bytes / weight_bytes))
    calls = max(MIN_CALLS, copies)
    generator = torch.Generator(device=device).manual_seed(n + k)
    weights = (torch.randn((copies, n, k), device=device, generator=generator) * 0.02).to(dtype)
    workspace = lm_head_workspace(max(rows), n, k, dtype, device)
    floor_us = weight_bytes / (copy_gbps * 1e9) * 1e6
    timings: list[Timing] = []
    checks: list[Check] = []
    for m in rows:
        x = torch.randn((m, k), device=device, generator=generator).to(dtype)
        outputs = LmHeadResult(
            torch.empty((m, n), device=device, dtype=torch.float32),
            torch.empty(m, device=device, dtype=torch.float32),
            torch.empty(m, device=device, dtype=torch.int64),
        )
        calls_of = _variant_calls(x, weights, workspace, outputs)
        for variant in VARIANTS:
            samples = timer(calls_of[variant], calls)
            us = statistics.median(samples)
            timings.append(
                Timing(model, n, k, m, variant, us, weight_bytes / (us * 1e-6) / 1e9, floor_us, us / floor_us, calls,
                       copies, samples)
            )  # fmt: skip
        checks.append(_check(model, x, weights[0], calls_of, outputs))
    del weights
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return timings, checks


def _variant_calls(
    x: torch.Tensor, weights: torch.Tensor, workspace: LmHeadWorkspace, outputs: LmHeadResult
) -> dict[str, Callable[[int], object]]:
    """call(i) of each variant on weight copy i mod copies (outputs given where the variant takes them)."""
    copies = weights.shape[0]
    bf16_out = torch.empty(outputs.logits.shape, device=x.device, dtype=x.dtype)

    def cublas_cast_max(i: int) -> object:
        return torch.max(torch.nn.functional.linear(x, weights[i % copies]).float(), dim=-1)

    def cublas(i: int) -> object:
        return torch.nn.functional.linear(x, weights[i % copies])

    def gemv(i: int) -> object:
        return small_batch_linear(x, weights[i % copies], out=bf16_out)

    def fused(i: int) -> object:
        logits, row_max, row_argmax = outputs
        return lm_head_argmax(
            x, weights[i % copies], workspace=workspace, logits_out=logits, row_max_out=row_max,
            row_argmax_out=row_argmax,
        )  # fmt: skip

    return {"cublas+cast+max": cublas_cast_max, "cublas": cublas, "gemv": gemv, "lm_head_argmax": fused}


def _check(
    model: str, x: torch.Tensor, weight: torch.Tensor, calls_of: dict[str, Callable[[int], object]],
    outputs: LmHeadResult,
) -> Check:  # fmt: skip
    """lm_head_argmax on copy 0 against torch.max of its own logits, the cuBLAS path's argmax and an fp32 product."""
    calls_of["lm_head_argmax"](0)
    _, cublas_index = calls_of["cublas+cast+max"](0)
    logits, row_max, row_argmax = outputs
    expected_max, expected_index = torch.max(logits, dim=-1)
    same = torch.equal(row_argmax, expected_index) and torch.equal(row_max.nan_to_num(), expected_max.nan_to_num())
    error = (logits - x.float() @ weight.float().T).abs().max().item()
    return Check(model, x.shape[0], same, int((cublas_index != row_argmax).sum().item()), error)


def summarise(timings: list[Timing]) -> list[dict[str, object]]:
    """One row per (head, M): each variant's microseconds and ratio to the floor, and the fused kernel's speed-up
    over the path it replaces."""
    rows = []
    for key in dict.fromkeys((t.model, t.m) for t in timings):
        group = {t.variant: t for t in timings if (t.model, t.m) == key}
        row: dict[str, object] = {"model": key[0], "m": key[1], "floor_us": group["lm_head_argmax"].floor_us}
        for variant, timing in group.items():
            row[f"{variant}_us"] = timing.us_per_call
            row[f"{variant}_over_floor"] = timing.over_floor
        row["speedup_vs_cublas+cast+max"] = group["cublas+cast+max"].us_per_call / group["lm_head_argmax"].us_per_call
        rows.append(row)
    return rows


def run() -> dict[str, object]:
    device = torch.device("cuda")
    copy = measure_copy_bandwidth(device)
    l2_bytes = torch.cuda.get_device_properties(device).L2_cache_size
    timings: list[Timing] = []
    checks: list[Check] = []
    for model, n, k in HEADS:
        head_timings, head_checks = bench_head(model, n, k, ROWS, copy.value, l2_bytes, DTYPE, device, time_in_graph)
        timings += head_timings
        checks += head_checks
    return {
        "environment": environment(device, None),
        "copy_bandwidth": asdict(copy),
        "l2_bytes": l2_bytes,
        "dtype": str(DTYPE),
        "method": __doc__,
        "summary": summarise(timings),
        "checks": [asdict(check) for check in checks],
        "timings": [asdict(timing) for timing in timings],
    }


def main(argv: list[str] | None = None) -> int:
    record = cuda_bench_record("python -m reports.bench.kernels.lm_head_argmax", __doc__, run, argv)
    if record is None:
        return 2
    print(f"{record['environment']['gpu']}  copy {record['copy_bandwidth']['value']:.0f} GB/s")
    print(f"{'head':<11} {'M':>2} {'floor':>6} " + " ".join(f"{variant:>16}" for variant in VARIANTS) + "  speed-up")
    for row in record["summary"]:
        cells = " ".join(f"{row[f'{v}_us']:9.1f} ({row[f'{v}_over_floor']:4.2f})" for v in VARIANTS)
        print(
            f"{row['model']:<11} {row['m']:>2} {row['floor_us']:6.1f} {cells}  {row['speedup_vs_cublas+cast+max']:.3f}"
        )
    failed = [check for check in record["checks"] if not check["max_equals_torch_max"]]
    for check in failed:
        print(f"lm_head_argmax's max/argmax differ from torch.max at {check['model']} M={check['m']}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
