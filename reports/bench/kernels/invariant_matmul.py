"""Batch-invariant matmul (fast/kernels/matmul.py) tile configurations: bitwise invariance and speed
beside cuBLAS, at the Qwen3 projection shapes, on one CUDA GPU.

    python -m reports.bench.kernels.invariant_matmul --json reports/results/kernels/invariant_matmul_bench.json
    python -m reports.bench.kernels.invariant_matmul --json out.json --shapes qwen3-0.6b,qwen3-8b \\
        --configs default,previous

Shapes (bf16, out = x [M, K] @ W [N, K]^T): per model the fused qkv, o_proj, the fused gate_up, down
and the LM head, from reports.bench.shapes (Qwen3-0.6B: 4096x1024, 1024x2048, 6144x1024, 1024x3072,
151936x1024). Configurations: CANDIDATES below; `default` is matmul_tiles' choice per shape (and
invariant_linear's automatic choice of launch path), `previous` the tiles of the kernel before the
64-row tiles (16-row tiles, no program groups); `fused` forces the fused path at every M, `split`
the split-K path at M <= FORCED_SPLIT_MAX_ROWS (timed there only; above it the automatic path runs,
so the invariance check compares split prefixes with a fused full result), `unchunked` one chunk
over all of K (the kernel before the split-K: fused, no chunk flushes; another summation order); `chunk256` and
`chunk128` more, smaller chunks (at one row more programs on the GPU; another summation order too).

For each shape and configuration:
- Invariance: x is 8192 random rows; the result of all of x, then of each prefix x[:M] for M in
  CHECK_PREFIXES and of the slices CHECK_SLICES (rows from the middle), each must equal the same
  rows of the full result bit for bit (torch.equal). cuBLAS (torch.nn.functional.linear) is checked
  the same way, as a reference: it picks its kernel from M, so it is expected to fail somewhere,
  which shows the check can fail.
- Error: max |out - x.float() @ W.float()^T| over the first ERROR_ROWS rows, over the reference's
  max |value| (a wrong tile or mask shows up here, not as an invariance failure).
- Time at M in TIMED_ROWS: a CUDA graph holds `calls` back-to-back calls, replayed WARMUP_REPLAYS
  times, then TIMED_REPLAYS times, each replay between two CUDA events; the median replay / calls
  is the time per call. Successive calls read different copies of the weight, enough copies that
  one replay reads >= L2_MULTIPLE x the L2 in weights (Qwen3-0.6B's weights are a few MB: without
  the copies a small-M call would read its weight from L2, as no engine step does). cuBLAS at
  M=8192 is the bf16 matmul ceiling the kernel is measured against (no separate ceiling is run).
Summary: per configuration, whether every shape passed, and per model the time of all the
projections of a forward pass over M rows (each layer's four, times the number of layers) and of
the LM head, each over cuBLAS's; per shape and M, the fastest configuration that passed. Reading
it: offline-256 is mostly decode (143k prompt tokens, then 134k output tokens in about 1,000 steps
of at most 256 rows), so its matmuls are the M <= 256 columns; M = 2048 and 8192 are prefill
chunks (long-context, prefix-shared); decode-bs1 is M = 1.

Needs CUDA; on a machine without it the command exits with status 2. Sized to stay under ~90 s on
an H200 with both models (compiling the ~10 distinct kernels of CANDIDATES, seconds each, is most of it);
--configs and --shapes run a subset.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from reports.bench.graph_timing import time_in_graph as graph_time_in_graph
from reports.bench.shapes import SHAPES as MODEL_SHAPES
from reports.bench.shapes import ModelShape

DTYPE = torch.bfloat16
CHECK_ROWS = 8192
CHECK_PREFIXES = (1, 3, 16, 64, 255, 256, 1000, 8192)
CHECK_SLICES = ((500, 501), (4001, 4101))
ERROR_ROWS = 256
TIMED_ROWS = (1, 8, 64, 128, 256, 2048, 8192)
L2_MULTIPLE = 3
MIN_CALLS = {"small": 20, "large": 3}  # per graph, for M <= 256 and above
WARMUP_REPLAYS = 2
TIMED_REPLAYS = 5
DEFAULT_MODELS = ("qwen3-0.6b",)
# A forced split allocates an fp32 workspace [num_chunks, M, N]: at 8192 rows up to 80 GB (the Qwen3-8B
# LM head), so the `split` variant forces it at decode sizes only.
FORCED_SPLIT_MAX_ROWS = 256

# Name -> overrides of invariant_linear's tile arguments ({}: matmul_tiles' defaults per shape), and
# `split` (its launch path: True only up to FORCED_SPLIT_MAX_ROWS rows).
CANDIDATES: dict[str, dict[str, int | bool]] = {
    "default": {},
    "fused": {"split": False},
    "split": {"split": True},
    "unchunked": {"chunk_k": 1 << 20},  # a multiple of every block_k: one chunk for every weight
    # More, smaller chunks (the default is 4 BLOCK_K steps: 256 or 512): more programs at one row, more fp32 parts
    # to write and sum; multiples of every default block_k (64, 128). Another summation order: new bits for every M.
    "chunk256": {"chunk_k": 256},
    "chunk128": {"chunk_k": 128},
    "previous": {"block_m": 16, "block_n": 64, "block_k": 128, "num_warps": 4, "num_stages": 3, "group_m": 0},
    "default_g0": {"group_m": 0},
    "m64n128k64": {"block_m": 64, "block_n": 128, "block_k": 64, "num_warps": 4, "num_stages": 4, "group_m": 8},
    "m64n64k128": {"block_m": 64, "block_n": 64, "block_k": 128, "num_warps": 4, "num_stages": 4, "group_m": 8},
    "m64n64k64": {"block_m": 64, "block_n": 64, "block_k": 64, "num_warps": 4, "num_stages": 4, "group_m": 8},
    "m64n32k128": {"block_m": 64, "block_n": 32, "block_k": 128, "num_warps": 4, "num_stages": 4, "group_m": 8},
    "m128n64k64": {"block_m": 128, "block_n": 64, "block_k": 64, "num_warps": 4, "num_stages": 4, "group_m": 8},
    "m128n128k64w8": {"block_m": 128, "block_n": 128, "block_k": 64, "num_warps": 8, "num_stages": 3, "group_m": 8},
    "m128n256k64w8": {"block_m": 128, "block_n": 256, "block_k": 64, "num_warps": 8, "num_stages": 3, "group_m": 8},
}
CUBLAS = "cublas"


@dataclass(frozen=True)
class Projection:
    """One weight shape of a model, and how many times a forward pass runs it."""

    model: str
    layer: str
    n: int
    k: int
    per_forward: int  # the number of layers for a projection, 1 for the LM head

    @property
    def label(self) -> str:
        return f"{self.model} {self.layer} {self.n}x{self.k}"


def projections(shape: ModelShape) -> list[Projection]:
    """The fused qkv, o_proj, fused gate_up, down and LM head weights of a Qwen3 shape."""
    q_width = shape.num_attention_heads * shape.head_dim
    kv_width = shape.num_key_value_heads * shape.head_dim
    layers = shape.num_hidden_layers
    return [
        Projection(shape.name, "qkv", q_width + 2 * kv_width, shape.hidden_size, layers),
        Projection(shape.name, "o_proj", shape.hidden_size, q_width, layers),
        Projection(shape.name, "gate_up", 2 * shape.intermediate_size, shape.hidden_size, layers),
        Projection(shape.name, "down", shape.hidden_size, shape.intermediate_size, layers),
        Projection(shape.name, "lm_head", shape.vocab_size, shape.hidden_size, 1),
    ]


@dataclass
class Timing:
    variant: str  # a CANDIDATES name or "cublas"
    m: int
    us_per_call: float
    tflops: float
    weight_GBps: float
    calls_per_graph: int
    samples_us: list[float]


@dataclass
class ShapeResult:
    projection: Projection
    weight_copies: int
    configs: dict[str, dict] = field(default_factory=dict)  # variant -> effective MatmulConfig
    invariance: dict[str, dict] = field(default_factory=dict)  # variant -> check_invariance's record
    relative_error: dict[str, float] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)  # variant -> why it could not run
    timings: list[Timing] = field(default_factory=list)


# ----------------------------------------------------------------------------- checks


def check_invariance(
    linear: Callable[[torch.Tensor], torch.Tensor],
    x: torch.Tensor,
    prefixes: Sequence[int] | None = None,
    slices: Sequence[tuple[int, int]] | None = None,
) -> dict[str, object]:
    """Whether linear(x[a:b]) equals linear(x)[a:b] bit for bit, for each prefix length and slice
    (default: CHECK_PREFIXES and CHECK_SLICES).

    Prefixes and slices past x's rows are left out. Returns {"passed": bool, "cases": {case: bool}}.
    """
    prefixes = CHECK_PREFIXES if prefixes is None else prefixes
    slices = CHECK_SLICES if slices is None else slices
    full = linear(x)
    cases: dict[str, bool] = {}
    rows = x.shape[0]
    for m in prefixes:
        if m <= rows:
            cases[f"x[:{m}]"] = torch.equal(linear(x[:m]), full[:m])
    for start, stop in slices:
        if stop <= rows:
            cases[f"x[{start}:{stop}]"] = torch.equal(linear(x[start:stop]), full[start:stop])
    return {"passed": all(cases.values()), "cases": cases}


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """max |actual - expected| / max |expected| (expected in fp32 or wider)."""
    scale = max(expected.abs().max().item(), 1e-30)
    return (actual.float() - expected).abs().max().item() / scale


# ----------------------------------------------------------------------------- timing


def time_in_graph(call: Callable[[int], object], calls: int) -> list[float]:
    """Microseconds per call, from calls captured in one CUDA graph (reports.bench.graph_timing.time_in_graph),
    with this benchmark's shorter replay counts."""
    return graph_time_in_graph(call, calls, WARMUP_REPLAYS, TIMED_REPLAYS)


def weight_copies(weight_bytes: int, l2_bytes: int) -> int:
    """How many copies of a weight one replay must cycle through to read L2_MULTIPLE L2s of them."""
    return max(1, math.ceil(L2_MULTIPLE * l2_bytes / weight_bytes))


def calls_per_graph(m: int, copies: int) -> int:
    return max(copies, MIN_CALLS["small"] if m <= 256 else MIN_CALLS["large"])


def make_timing(variant: str, m: int, projection: Projection, calls: int, samples: list[float]) -> Timing:
    us = statistics.median(samples)
    return Timing(
        variant=variant,
        m=m,
        us_per_call=us,
        tflops=2 * m * projection.n * projection.k / (us * 1e-6) / 1e12,
        weight_GBps=projection.n * projection.k * DTYPE.itemsize / (us * 1e-6) / 1e9,
        calls_per_graph=calls,
        samples_us=samples,
    )


# ----------------------------------------------------------------------------- one shape


Timer = Callable[[Callable[[int], object], int], list[float]]  # (call, calls) -> us per call, per sample


def bench_projection(
    projection: Projection,
    variants: dict[str, dict[str, int | bool]],
    l2_bytes: int,
    device: torch.device,
    timer: Timer = time_in_graph,
) -> ShapeResult:
    """Invariance, error and timings of every variant (and cuBLAS) at one weight shape.

    `device` and `timer` exist for the CPU smoke test of this module; the CLI runs CUDA graphs.
    """
    from fast.kernels.matmul import invariant_linear, matmul_config

    generator = torch.Generator(device=device).manual_seed(0)
    n, k = projection.n, projection.k
    copies = weight_copies(n * k * DTYPE.itemsize, l2_bytes)
    weights = (torch.randn((copies, n, k), device=device, generator=generator) * 0.02).to(DTYPE)
    x = torch.randn((CHECK_ROWS, k), device=device, generator=generator).to(DTYPE)
    expected = x[:ERROR_ROWS].float() @ weights[0].float().T
    result = ShapeResult(projection, copies)

    def cublas(rows: torch.Tensor, i: int = 0) -> torch.Tensor:
        return torch.nn.functional.linear(rows, weights[i % copies])

    result.invariance[CUBLAS] = check_invariance(cublas, x)
    result.relative_error[CUBLAS] = relative_error(cublas(x[:ERROR_ROWS]), expected)
    result.timings += time_variant(CUBLAS, projection, x, copies, lambda rows, out, i: cublas(rows, i), timer)
    for name, overrides in variants.items():
        tiles = {key: value for key, value in overrides.items() if key != "split"}
        forced = overrides.get("split")

        def kernel(
            rows: torch.Tensor,
            out: torch.Tensor | None = None,
            i: int = 0,
            tiles: dict = tiles,
            forced: bool | None = forced,
        ) -> torch.Tensor:
            split = launch_path(forced, rows.shape[0])
            return invariant_linear(rows, weights[i % copies], out=out, split=split, **tiles)

        try:
            result.configs[name] = matmul_config(n, k, DTYPE, **tiles)._asdict()
            result.invariance[name] = check_invariance(kernel, x)
            result.relative_error[name] = relative_error(kernel(x[:ERROR_ROWS]), expected)
            max_rows = FORCED_SPLIT_MAX_ROWS if forced else None
            result.timings += time_variant(name, projection, x, copies, kernel, timer, max_rows)
        except Exception as failure:  # a configuration Triton cannot build (shared memory, ...) is recorded
            result.errors[name] = f"{type(failure).__name__}: {str(failure)[:300]}"
    return result


def launch_path(forced: bool | None, rows: int) -> bool | None:
    """invariant_linear's `split` for a variant's call on `rows` rows: a forced split only up to
    FORCED_SPLIT_MAX_ROWS (its workspace), the automatic choice above; a forced fused path always."""
    return None if forced and rows > FORCED_SPLIT_MAX_ROWS else forced


def time_variant(
    variant: str,
    projection: Projection,
    x: torch.Tensor,
    copies: int,
    linear: Callable[[torch.Tensor, torch.Tensor | None, int], object],
    timer: Timer,
    max_rows: int | None = None,
) -> list[Timing]:
    """Time linear(x[:m], out, i) at each M in TIMED_ROWS up to max_rows (i: which weight copy; out:
    a reused output buffer, which cuBLAS ignores)."""
    if max(TIMED_ROWS) > x.shape[0]:
        raise ValueError(f"x has {x.shape[0]} rows; timing needs {max(TIMED_ROWS)}")
    timings = []
    for m in TIMED_ROWS:
        if max_rows is not None and m > max_rows:
            continue
        rows = x[:m]
        out = torch.empty((m, projection.n), device=x.device, dtype=DTYPE)
        calls = calls_per_graph(m, copies)
        samples = timer(lambda i, rows=rows, out=out: linear(rows, out, i), calls)
        timings.append(make_timing(variant, m, projection, calls, samples))
        del out
    return timings


# ----------------------------------------------------------------------------- summary


def time_of(result: ShapeResult, variant: str, m: int) -> float | None:
    return next((t.us_per_call for t in result.timings if t.variant == variant and t.m == m), None)


def forward_totals(results: list[ShapeResult], variant: str) -> dict[str, dict[str, float | None]]:
    """Per model and M: the projections of a forward pass (per_forward x time, summed over the
    four layer shapes) and the LM head, each as time over cuBLAS's."""
    totals: dict[str, dict[str, float | None]] = {}
    for model in dict.fromkeys(r.projection.model for r in results):
        group = [r for r in results if r.projection.model == model]
        row: dict[str, float | None] = {}
        for m in TIMED_ROWS:
            for part, members in (
                ("layers", [r for r in group if r.projection.layer != "lm_head"]),
                ("lm_head", [r for r in group if r.projection.layer == "lm_head"]),
            ):
                row[f"{part}_m{m}"] = _ratio_of_sums(members, variant, m)
        totals[model] = row
    return totals


def _ratio_of_sums(members: list[ShapeResult], variant: str, m: int) -> float | None:
    ours = [time_of(r, variant, m) for r in members]
    theirs = [time_of(r, CUBLAS, m) for r in members]
    if not members or None in ours or None in theirs:
        return None
    weights = [r.projection.per_forward for r in members]
    return sum(w * t for w, t in zip(weights, ours, strict=True)) / sum(
        w * t for w, t in zip(weights, theirs, strict=True)
    )


def summarise(results: list[ShapeResult], variants: Sequence[str]) -> dict[str, dict]:
    """Per configuration: invariant at every shape, errors, worst relative error, forward totals."""
    summary = {}
    for variant in [*variants, CUBLAS]:
        checked = [r.invariance[variant]["passed"] for r in results if variant in r.invariance]
        summary[variant] = {
            "invariant_every_shape": bool(checked) and all(checked) and len(checked) == len(results),
            "failed_shapes": [r.projection.label for r in results if variant in r.errors],
            "max_relative_error": max(
                (r.relative_error[variant] for r in results if variant in r.relative_error), default=None
            ),
            "time_over_cublas": forward_totals(results, variant) if variant != CUBLAS else None,
        }
    return summary


def fastest_by_shape(results: list[ShapeResult], variants: Sequence[str]) -> dict[str, dict[int, str | None]]:
    """Per shape and M, the fastest of `variants` that passed the invariance check there."""
    fastest: dict[str, dict[int, str | None]] = {}
    for result in results:
        passed = [v for v in variants if result.invariance.get(v, {}).get("passed")]
        row: dict[int, str | None] = {}
        for m in TIMED_ROWS:
            timed = [(time_of(result, v, m), v) for v in passed if time_of(result, v, m) is not None]
            row[m] = min(timed)[1] if timed else None
        fastest[result.projection.label] = row
    return fastest


def print_report(record: dict, results: list[ShapeResult], variants: Sequence[str]) -> None:
    environment = record["environment"]
    print(
        f"{environment['gpu']}  torch {environment['torch']}  triton {environment['triton']}  "
        f"L2 {record['l2_bytes'] / 2**20:.0f} MiB  {record['sm_count']} SMs"
    )
    print("time / cuBLAS per shape and M (cuBLAS in us and TFLOP/s); '-' = did not run")
    header = f"{'shape':<32}{'M':>5} {'cuBLAS':>8} {'TF/s':>5} |" + "".join(f" {v[:11]:>11}" for v in variants)
    print(header)
    for result in results:
        for m in TIMED_ROWS:
            base = time_of(result, CUBLAS, m)
            tflops = next(t.tflops for t in result.timings if t.variant == CUBLAS and t.m == m)
            cells = []
            for variant in variants:
                ours = time_of(result, variant, m)
                cells.append(f" {ours / base:11.2f}" if ours is not None and base else f" {'-':>11}")
            print(f"{result.projection.label:<32}{m:>5} {base:8.1f} {tflops:5.0f} |" + "".join(cells))
    print("\nforward pass over M rows, time / cuBLAS: every layer's projections (and the LM head, M <= 256)")
    for variant, entry in record["summary"].items():
        status = "yes" if entry["invariant_every_shape"] else "NO"
        failed = f"  failed: {', '.join(entry['failed_shapes'])}" if entry["failed_shapes"] else ""
        print(f"{variant:<15} invariant={status}{failed}")
        for model, row in (entry["time_over_cublas"] or {}).items():
            layers = " ".join(_cell(m, row[f"layers_m{m}"]) for m in TIMED_ROWS)
            head = " ".join(_cell(m, row[f"lm_head_m{m}"]) for m in TIMED_ROWS if m <= 256)
            print(f"    {model:<11} layers {layers} | lm_head {head}")
    print(f"total {record['seconds']:.1f} s")


def _cell(m: int, ratio: float | None) -> str:
    return f"M{m}=" + ("-" if ratio is None else f"{ratio:.2f}")


# ----------------------------------------------------------------------------- the run


def run(args: argparse.Namespace) -> int:
    if not torch.cuda.is_available():
        print("python -m reports.bench.kernels.invariant_matmul: needs a CUDA GPU (none found)", file=sys.stderr)
        return 2
    from reports.bench.device import environment

    started = time.perf_counter()
    device = torch.device("cuda")
    properties = torch.cuda.get_device_properties(device)
    variants = {name: CANDIDATES[name] for name in args.configs.split(",")}
    shapes = [p for model in args.shapes.split(",") for p in projections(MODEL_SHAPES[model])]
    results = []
    for projection in shapes:
        results.append(bench_projection(projection, variants, properties.L2_cache_size, device))
        torch.cuda.empty_cache()  # the shape's weights and inputs, before the next shape's
        print(f"{projection.label} done at {time.perf_counter() - started:.1f} s", flush=True)
    record = {
        "environment": environment(device, args.commit),
        "l2_bytes": properties.L2_cache_size,
        "sm_count": properties.multi_processor_count,
        "dtype": str(DTYPE),
        "method": __doc__,
        "candidates": variants,
        "summary": summarise(results, list(variants)),
        "fastest_invariant_variant": fastest_by_shape(results, list(variants)),
        "shapes": [_shape_record(r) for r in results],
        "seconds": time.perf_counter() - started,
    }
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(record, indent=1, default=str) + "\n")
    print_report(record, results, list(variants))
    return 0


def _shape_record(result: ShapeResult) -> dict:
    record = asdict(result)
    record["projection"] = asdict(result.projection)
    return record


def _known(choices: Sequence[str], what: str) -> Callable[[str], str]:
    def parse(value: str) -> str:
        unknown = [name for name in value.split(",") if name not in choices]
        if unknown:
            raise argparse.ArgumentTypeError(f"unknown {what} {', '.join(unknown)}; choose from {', '.join(choices)}")
        return value

    return parse


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", type=Path, help="write every measurement and the summary as JSON to this file")
    parser.add_argument("--commit", help="git commit to record (default: `git rev-parse HEAD` if available)")
    parser.add_argument(
        "--shapes",
        type=_known([name for name in MODEL_SHAPES if name != "tiny"], "shape"),
        default=",".join(DEFAULT_MODELS),
        help="comma-separated models whose projection shapes to run (default: qwen3-0.6b; qwen3-8b adds its own)",
    )
    parser.add_argument(
        "--configs",
        type=_known(list(CANDIDATES), "config"),
        default=",".join(CANDIDATES),
        help=f"comma-separated subset of {', '.join(CANDIDATES)} (default: all)",
    )


if __name__ == "__main__":
    main_parser = argparse.ArgumentParser(prog="python -m reports.bench.kernels.invariant_matmul", description=__doc__)
    configure_parser(main_parser)
    sys.exit(run(main_parser.parse_args()))
