"""Small-batch linear (fast/kernels/gemv.py) against cuBLAS at decode shapes, timed as in a decode graph.

    python -m reports.bench.kernels.gemv --json reports/results/kernels/gemv_bench.json

For each weight shape of Qwen3-0.6B, Qwen3-8B and one rank's share of Qwen3-8B under 2-way tensor
parallelism (qkv, o_proj, gate_up, down) and M in 1, 2, 4, 8, 16 rows (--rows picks fewer), bf16:
torch.nn.functional.linear (cuBLAS) against small_batch_linear with its default configuration and
with each configuration of a small sweep (block_n, block_k, num_warps, num_stages, use_dot), so
per-shape defaults can be set from one run. For the down shapes also the
MLP tail: silu_and_mul + linear (cuBLAS), silu_and_mul + small_batch_linear, and the fused
silu_mul_linear.

How each figure is measured: a CUDA graph holds `calls` back-to-back calls (at least 20), so launch
overhead is what it is inside the engine's decode graph; the graph is replayed after warm-up, each
replay timed with CUDA events, and the median replay time / calls is the time per call. Successive
calls read different copies of the weight, enough copies that one replay touches >= 3 x the L2
(as the 28+ layers of a decode step do), so each call reads its weight from HBM, not L2. GB/s is
weight bytes / time per call (x and out are < 0.5% of the bytes). The device's copy bandwidth is
measured first, as in every benchmark record (reports.bench.device).

Compilation dominates the run: the configurations are compiled first in parallel worker
processes (--workers), which fill Triton's on-disk cache; the timing process then loads them.
Needs CUDA; on a machine without it the command exits with status 2.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from reports.bench.graph_timing import time_in_graph

# (model, layer, N, K): out features, in features.
SHAPES: list[tuple[str, str, int, int]] = [
    ("Qwen3-0.6B", "qkv", 4096, 1024),
    ("Qwen3-0.6B", "o_proj", 1024, 2048),
    ("Qwen3-0.6B", "gate_up", 6144, 1024),
    ("Qwen3-0.6B", "down", 1024, 3072),
    ("Qwen3-8B", "qkv", 6144, 4096),
    ("Qwen3-8B", "o_proj", 4096, 4096),
    ("Qwen3-8B", "gate_up", 24576, 4096),
    ("Qwen3-8B", "down", 4096, 12288),
    # One rank's share of Qwen3-8B under 2-way tensor parallelism (fast.weights.ShardLayout): half the
    # heads in qkv, half the intermediate rows in gate_up, half the input columns of o_proj and down.
    ("Qwen3-8B-TP2", "qkv", 3072, 4096),
    ("Qwen3-8B-TP2", "o_proj", 4096, 2048),
    ("Qwen3-8B-TP2", "gate_up", 12288, 4096),
    ("Qwen3-8B-TP2", "down", 4096, 6144),
]
ROWS = [1, 2, 4, 8, 16]
DTYPE = torch.bfloat16
MIN_CALLS_PER_GRAPH = 20
L2_MULTIPLE = 3  # one replay reads at least this many L2s of distinct weight bytes


def sweep_configs(m: int, level: str, silu_mul: bool = False) -> list[dict]:
    """Configurations tried beside the default ({}). 'quick' is the bench's own list (the
    neighbours of the defaults); 'wide' is the exploration the defaults were chosen from."""
    if level == "none":
        return []
    block_m = 1 << (m - 1).bit_length()
    configs: list[dict] = []
    if silu_mul:
        if m <= 2:
            configs += [_fma(block_n, 1024, warps, 3) for block_n in (2, 4, 8, 16, 32) for warps in (2, 4)]
        configs += [_dot(block_n, 128, 4, 4) for block_n in (16, 32, 64, 128)]
        configs += [_dot(block_n, 256, 4, 4) for block_n in (16, 32, 64)]
    elif level == "quick":
        if m <= 4:
            configs += [_fma(block_n, 1024, 2, 3) for block_n in (1, 2, 4, 8)]
            configs += [_fma(block_n, 1024, 4, 3) for block_n in (2, 4, 8)]
            configs += [_fma(block_n, 512, 2, 3) for block_n in (2, 4)]
        configs += [_dot(block_n, block_k, 4, 4) for block_n in (8, 16, 32, 64) for block_k in (128, 256, 512)]
        configs += [_dot(64, 128, 4, 3), _dot(8, 512, 4, 3), _dot(32, 256, 4, 3)]
    else:
        for block_n in (1, 2, 4, 8, 16, 32):
            for block_k in (256, 512, 1024, 2048):
                for warps, stages in ((4, 1), (4, 2), (4, 3), (4, 4), (2, 3), (8, 3)):
                    configs.append(_fma(block_n, block_k, warps, stages))
        for block_n in (8, 16, 32, 64):
            for block_k in (128, 256, 512):
                for warps, stages in ((4, 2), (4, 3), (4, 4), (8, 3)):
                    configs.append(_dot(block_n, block_k, warps, stages))
    # FMA tiles hold a [block_n, block_m, block_k] fp32 product: keep it to <= 128 values a thread.
    return [c for c in configs if c["use_dot"] or c["block_n"] * block_m * c["block_k"] <= 128 * 32 * c["num_warps"]]


def _fma(block_n: int, block_k: int, warps: int, stages: int) -> dict:
    return {"block_n": block_n, "block_k": block_k, "num_warps": warps, "num_stages": stages, "use_dot": False}


def _dot(block_n: int, block_k: int, warps: int, stages: int) -> dict:
    return {"block_n": block_n, "block_k": block_k, "num_warps": warps, "num_stages": stages, "use_dot": True}


@dataclass
class Result:
    model: str
    layer: str
    n: int
    k: int
    m: int
    variant: str  # cublas | gemv | silu_and_mul+cublas | silu_and_mul+gemv | silu_mul_linear
    config: dict
    us_per_call: float
    weight_GBps: float
    fraction_of_copy: float
    calls_per_graph: int
    weight_copies: int
    samples_us: list[float] = field(default_factory=list)
    max_abs_error: float | None = None  # against x.float() @ w.float().T (gemv variants)
    error: str | None = None


# ----------------------------------------------------------------------------- one weight shape


class Problem:
    """One weight shape: rotating weight copies, and per-M inputs and outputs (all on the GPU)."""

    def __init__(self, n: int, k: int, l2_bytes: int, seed: int = 0) -> None:
        self.n, self.k = n, k
        self.weight_bytes = n * k * DTYPE.itemsize
        self.copies = max(1, math.ceil(L2_MULTIPLE * l2_bytes / self.weight_bytes))
        self.calls = max(MIN_CALLS_PER_GRAPH, self.copies)
        generator = torch.Generator(device="cuda").manual_seed(seed)
        self.weights = (torch.randn((self.copies, n, k), device="cuda", generator=generator) * 0.02).to(DTYPE)
        self.generator = generator

    def weight(self, i: int) -> torch.Tensor:
        return self.weights[i % self.copies]

    def inputs(self, m: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [m, k], gate_up [m, 2k], act [m, k] (silu_and_mul's output buffer) and out [m, n]."""
        x = torch.randn((m, self.k), device="cuda", generator=self.generator).to(DTYPE)
        gate_up = torch.randn((m, 2 * self.k), device="cuda", generator=self.generator).to(DTYPE)
        act = torch.empty((m, self.k), device="cuda", dtype=DTYPE)
        out = torch.empty((m, self.n), device="cuda", dtype=DTYPE)
        return x, gate_up, act, out


def _max_error(actual: torch.Tensor, x: torch.Tensor, weight: torch.Tensor) -> float:
    expected = x.float() @ weight.float().T
    return (actual.float() - expected).abs().max().item()


# ----------------------------------------------------------------------------- parallel compile


def _compile_jobs(jobs: list[tuple[int, int, int, str, dict]]) -> list[str]:
    """Worker process: run each (n, k, m, variant, config) once, so Triton compiles it and writes
    its on-disk cache. Returns an error line for each configuration that failed to build."""
    from fast.kernels.gemv import silu_mul_linear, small_batch_linear

    errors = []
    tensors: dict[tuple[int, int], torch.Tensor] = {}
    for n, k, m, variant, config in jobs:
        if (n, k) not in tensors:
            tensors = {(n, k): torch.zeros((n, k), device="cuda", dtype=DTYPE)}  # one shape held at a time
        weight = tensors[(n, k)]
        try:
            if variant == "silu_mul_linear":
                silu_mul_linear(torch.zeros((m, 2 * k), device="cuda", dtype=DTYPE), weight, **config)
            else:
                small_batch_linear(torch.zeros((m, k), device="cuda", dtype=DTYPE), weight, **config)
        except Exception as error:  # Triton raises many types for a configuration it cannot build
            errors.append(f"{(n, k, m, variant, config)}: {type(error).__name__}: {str(error)[:300]}")
    torch.cuda.synchronize()
    return errors


def _compile_key(n: int, k: int, m: int, variant: str, config: dict) -> tuple:
    """What decides the compiled variant (besides values Triton specialises on: all shapes here are
    multiples of 16), so each is compiled by one worker only."""
    from fast.kernels.gemv import gemv_config

    full = gemv_config(m, n, k, DTYPE, variant == "silu_mul_linear")._replace(**config)
    return (variant, m == 1, full, k % full.block_k == 0)


def precompile(jobs: list[tuple[int, int, int, str, dict]], workers: int) -> list[str]:
    unique: dict[tuple, tuple[int, int, int, str, dict]] = {}
    for job in jobs:
        unique.setdefault(_compile_key(*job), job)
    todo = list(unique.values())
    if workers <= 0:
        return _compile_jobs(todo)
    # Jobs sorted by shape, dealt round-robin: each worker holds one weight shape at a time.
    todo.sort(key=lambda job: (job[0], job[1]))
    shares = [todo[i::workers] for i in range(workers)]
    import multiprocessing

    with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        return [line for errors in pool.map(_compile_jobs, shares) for line in errors]


# ----------------------------------------------------------------------------- the run


def bench_shape(
    model: str, layer: str, n: int, k: int, level: str, copy_gbps: float, l2_bytes: int, rows: list[int]
) -> list[Result]:
    problem = Problem(n, k, l2_bytes)
    results: list[Result] = []
    for m in rows:
        results += bench_rows(model, layer, problem, m, level, copy_gbps)
    problem.weights = torch.empty(0)  # give the copies back before the next shape
    torch.cuda.empty_cache()
    return results


def bench_rows(model: str, layer: str, problem: Problem, m: int, level: str, copy_gbps: float) -> list[Result]:
    """cuBLAS, the default and each swept configuration at one (shape, M); the MLP tail for down."""
    from fast.kernels.gemv import silu_mul_linear, small_batch_linear
    from fast.kernels.silu_and_mul import silu_and_mul

    results: list[Result] = []
    x, gate_up, act, out = problem.inputs(m)

    def record(variant: str, config: dict, call: Callable[[int], object], check=None) -> None:
        try:
            samples = time_in_graph(call, problem.calls)
            error = None
        except Exception as failure:  # a configuration Triton cannot build is recorded, not fatal
            samples, error = [math.nan], f"{type(failure).__name__}: {str(failure)[:300]}"
        us = statistics.median(samples)
        gbps = problem.weight_bytes / (us * 1e-6) / 1e9
        result = Result(
            model=model,
            layer=layer,
            n=problem.n,
            k=problem.k,
            m=m,
            variant=variant,
            config=config,
            us_per_call=us,
            weight_GBps=gbps,
            fraction_of_copy=gbps / copy_gbps,
            calls_per_graph=problem.calls,
            weight_copies=problem.copies,
            samples_us=samples,
            error=error,
        )
        if check is not None and error is None:
            result.max_abs_error = check()
        results.append(result)

    def cublas(i: int) -> None:
        torch.nn.functional.linear(x, problem.weight(i))

    record("cublas", {}, cublas)
    for config in [{}, *sweep_configs(m, level)]:

        def gemv(i: int, config: dict = config) -> None:
            small_batch_linear(x, problem.weight(i), out=out, **config)

        def check_gemv(gemv: Callable[[int], None] = gemv) -> float:
            gemv(0)
            return _max_error(out, x, problem.weight(0))

        record("gemv", config, gemv, check_gemv)
    if layer != "down":
        return results

    act_ref = silu_and_mul(gate_up)

    def unfused_cublas(i: int) -> None:
        torch.nn.functional.linear(silu_and_mul(gate_up, out=act), problem.weight(i))

    def unfused_gemv(i: int) -> None:
        small_batch_linear(silu_and_mul(gate_up, out=act), problem.weight(i), out=out)

    record("silu_and_mul+cublas", {}, unfused_cublas)
    record("silu_and_mul+gemv", {}, unfused_gemv)
    for config in [{}, *sweep_configs(m, level, silu_mul=True)]:

        def fused(i: int, config: dict = config) -> None:
            silu_mul_linear(gate_up, problem.weight(i), out=out, **config)

        def check_fused(fused: Callable[[int], None] = fused) -> float:
            fused(0)
            return _max_error(out, act_ref, problem.weight(0))

        record("silu_mul_linear", config, fused, check_fused)
    return results


def summarise(results: list[Result]) -> list[dict]:
    """One row per (shape, M): cuBLAS, the default gemv, the best gemv configuration, the ratios."""
    rows = []
    order = {shape[:2]: index for index, shape in enumerate(SHAPES)}
    keys = sorted({(r.model, r.layer, r.n, r.k, r.m) for r in results}, key=lambda key: (order[key[:2]], key[4]))
    for model, layer, n, k, m in keys:
        group = [r for r in results if (r.model, r.layer, r.m) == (model, layer, m) and r.error is None]
        cublas = next(r for r in group if r.variant == "cublas")
        default = next(r for r in group if r.variant == "gemv" and not r.config)
        best = min((r for r in group if r.variant == "gemv"), key=lambda r: r.us_per_call)
        row = {
            "model": model,
            "layer": layer,
            "n": n,
            "k": k,
            "m": m,
            "cublas_us": cublas.us_per_call,
            "cublas_GBps": cublas.weight_GBps,
            "gemv_default_us": default.us_per_call,
            "gemv_default_GBps": default.weight_GBps,
            "gemv_default_fraction_of_copy": default.fraction_of_copy,
            "speedup_default_vs_cublas": cublas.us_per_call / default.us_per_call,
            "gemv_best_us": best.us_per_call,
            "gemv_best_GBps": best.weight_GBps,
            "gemv_best_config": best.config or {"default": True},
            "speedup_best_vs_cublas": cublas.us_per_call / best.us_per_call,
            "gemv_default_max_abs_error": default.max_abs_error,
        }
        fused = [r for r in group if r.variant == "silu_mul_linear"]
        if fused:
            unfused = next(r for r in group if r.variant == "silu_and_mul+cublas")
            unfused_gemv = next(r for r in group if r.variant == "silu_and_mul+gemv")
            fused_default = next(r for r in fused if not r.config)
            fused_best = min(fused, key=lambda r: r.us_per_call)
            row |= {
                "silu_and_mul+cublas_us": unfused.us_per_call,
                "silu_and_mul+gemv_us": unfused_gemv.us_per_call,
                "silu_mul_linear_default_us": fused_default.us_per_call,
                "silu_mul_linear_best_us": fused_best.us_per_call,
                "silu_mul_linear_best_config": fused_best.config or {"default": True},
                "speedup_fused_default_vs_silu_and_mul+cublas": unfused.us_per_call / fused_default.us_per_call,
                "silu_mul_linear_default_max_abs_error": fused_default.max_abs_error,
            }
        rows.append(row)
    return rows


def run(args: argparse.Namespace) -> int:
    if not torch.cuda.is_available():
        print("python -m reports.bench.kernels.gemv: needs a CUDA GPU (none found)", file=sys.stderr)
        return 2
    from fast.kernels.gemv import gemv_config
    from reports.bench.device import environment, measure_copy_bandwidth

    started = time.perf_counter()
    device = torch.device("cuda")
    shapes = [s for s in SHAPES if not args.models or s[0] in args.models.split(",")]
    rows = args.rows or ROWS
    jobs = []
    for _, layer, n, k in shapes:
        for m in rows:
            for config in [{}, *sweep_configs(m, args.sweep)]:
                jobs.append((n, k, m, "gemv", config))
            if layer == "down":
                for config in [{}, *sweep_configs(m, args.sweep, silu_mul=True)]:
                    jobs.append((n, k, m, "silu_mul_linear", config))
    compile_errors = precompile(jobs, args.workers)
    compiled_s = time.perf_counter() - started
    print(f"compiled {len(jobs)} jobs in {compiled_s:.1f} s ({len(compile_errors)} failed)", flush=True)

    copy = measure_copy_bandwidth(device)
    l2_bytes = torch.cuda.get_device_properties(device).L2_cache_size
    results: list[Result] = []
    for model, layer, n, k in shapes:
        results += bench_shape(model, layer, n, k, args.sweep, copy.value, l2_bytes, rows)
        print(f"{model} {layer} done at {time.perf_counter() - started:.1f} s", flush=True)
    summary = summarise(results)
    record = {
        "environment": environment(device, args.commit),
        "copy_bandwidth": asdict(copy),
        "l2_bytes": l2_bytes,
        "dtype": str(DTYPE),
        "method": __doc__,
        "sweep": args.sweep,
        "defaults": {
            f"{model} {layer} m={m}": gemv_config(m, n, k, DTYPE)._asdict()
            for model, layer, n, k in shapes
            for m in rows
        },
        "silu_mul_defaults": {
            f"{model} {layer} m={m}": gemv_config(m, n, k, DTYPE, silu_mul=True)._asdict()
            for model, layer, n, k in shapes
            if layer == "down"
            for m in rows
        },
        "summary": summary,
        "compile_errors": compile_errors,
        "results": [asdict(r) for r in results],
        "seconds": {"compile": compiled_s, "total": time.perf_counter() - started},
    }
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(record, indent=1, default=str) + "\n")
    print(f"{record['environment']['gpu']}  copy {copy.value:.0f} GB/s  L2 {l2_bytes / 2**20:.0f} MiB")
    print(
        f"{'shape':<22} {'M':>2} {'cuBLAS us':>9} {'GB/s':>5} {'gemv us':>8} {'GB/s':>5} {'%copy':>5} {'x':>5} "
        f"{'best us':>8} {'x':>5}  best config | down: silu_and_mul+cuBLAS / +gemv -> fused (best) us"
    )
    for row in summary:
        config = row["gemv_best_config"]
        described = ",".join(f"{key[:6]}={value}" for key, value in config.items())
        fused = ""
        if "silu_mul_linear_default_us" in row:
            fused = (
                f"  | {row['silu_and_mul+cublas_us']:.2f} / {row['silu_and_mul+gemv_us']:.2f} -> "
                f"{row['silu_mul_linear_default_us']:.2f} ({row['silu_mul_linear_best_us']:.2f})"
            )
        print(
            f"{row['model'] + ' ' + row['layer']:<22} {row['m']:>2} {row['cublas_us']:9.2f} {row['cublas_GBps']:5.0f} "
            f"{row['gemv_default_us']:8.2f} {row['gemv_default_GBps']:5.0f} "
            f"{row['gemv_default_fraction_of_copy']:5.0%} {row['speedup_default_vs_cublas']:5.2f} "
            f"{row['gemv_best_us']:8.2f} {row['speedup_best_vs_cublas']:5.2f}  {described}{fused}"
        )
    print(f"total {record['seconds']['total']:.1f} s")
    for line in compile_errors[:20]:
        print("compile error:", line)
    return 0


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", type=Path, help="write every measurement and the summary as JSON to this file")
    parser.add_argument("--commit", help="git commit to record (default: `git rev-parse HEAD` if available)")
    parser.add_argument(
        "--sweep",
        choices=("quick", "wide", "none"),
        default="quick",
        help="configurations tried beside the default: quick (~90 s in all on an H200), wide (minutes), none",
    )
    parser.add_argument(
        "--models", help="comma-separated subset of Qwen3-0.6B,Qwen3-8B,Qwen3-8B-TP2 (default: all three)"
    )
    parser.add_argument(
        "--rows",
        type=lambda text: [int(m) for m in text.split(",")],
        help=f"comma-separated row counts M (default: {','.join(map(str, ROWS))})",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=min(16, os.cpu_count() or 1),
        help="processes compiling the configurations before timing (0: compile in this process)",
    )


if __name__ == "__main__":
    main_parser = argparse.ArgumentParser(prog="python -m reports.bench.kernels.gemv", description=__doc__)
    configure_parser(main_parser)
    sys.exit(run(main_parser.parse_args()))
