"""`twinfer bench kernels`: time each fast-engine Triton kernel beside torch's own version.

Every figure is measured in the same run as its ceiling: the device-to-device copy bandwidth
(bytes read + written of a multi-GB copy) for the memory-bound kernels, and FLOP/s for
prefill attention. Kernel times are medians of `triton.testing.do_bench` (CUDA events, L2
flushed between repeats); the copy bandwidth comes from reports.bench.device, as in the
workload benchmarks. Torch's baselines are torch's flash attention for the attention kernels
and, for the elementwise ones, the kernel tests' references (reports.bench.kernels.kernel_reference) run in
float32. The JSON written by --json holds every measurement, the tuning sweeps
included, so NOTES.md can quote it.

Runs as `python -m reports.bench.kernels.kernel_bench --json out.json --commit <sha>` too.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from reports.bench.device import git_commit, measure_copy_bandwidth
from reports.bench.kernels.kernel_reference import (
    PagedCache,
    build_cos_sin_cache,
    build_paged_cache,
    reference_add_rmsnorm,
    reference_qk_norm_rope,
    reference_silu_and_mul,
)

logger = logging.getLogger(__name__)

# Targets from issue 4.
DECODE_TARGET_FRACTION = 0.70
PREFILL_TARGET_TFLOPS = 300.0
ELEMENTWISE_TARGET_FRACTION = 0.80


@dataclass
class Measurement:
    kernel: str
    shape: dict
    dtype: str
    config: dict
    time_ms: float
    figure: str  # "GB/s" or "TFLOP/s"
    value: float  # achieved bandwidth (GB/s) or TFLOP/s
    fraction_of_copy: float | None = None
    baseline: str | None = None
    baseline_time_ms: float | None = None
    speedup_vs_baseline: float | None = None  # baseline time / our time
    max_abs_error_vs_baseline: float | None = None
    target: str | None = None
    meets_target: bool | None = None
    notes: list[str] = field(default_factory=list)


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", type=Path, help="write all measurements as JSON to this file")
    parser.add_argument("--commit", help="git commit to record (default: `git rev-parse HEAD` if available)")
    parser.add_argument(
        "--only",
        default="copy,decode,prefill,elementwise",
        help="comma-separated subset of copy,decode,prefill,elementwise (default: all)",
    )
    parser.add_argument("--no-tune", action="store_true", help="time only the default configuration of each kernel")
    parser.add_argument("--rep-ms", type=int, default=200, help="do_bench repetition time per measurement (ms)")
    parser.set_defaults(handler=run)


# ----------------------------------------------------------------------------- timing helpers


def _time_ms(fn: Callable[[], object], rep_ms: int) -> float:
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=25, rep=rep_ms, return_mode="median"))


def _gbps(num_bytes: float, ms: float) -> float:
    return num_bytes / (ms * 1e-3) / 1e9


def sweep(
    kernel: str,
    configs: list[dict],
    call: Callable[..., torch.Tensor],
    describe: Callable[[torch.Tensor, float], Measurement],
    rep_ms: int,
) -> list[Measurement]:
    """Time `call(**config)` for each configuration ({} is the kernel's default) and describe each
    result; a configuration that fails to compile or run is recorded as failed, not fatal."""
    results = []
    for config in configs:
        try:
            out = call(**config)
            ms = _time_ms(lambda config=config: call(**config), rep_ms)
        except Exception as error:  # Triton raises many types for a configuration it cannot build
            logger.warning("%s config %s failed: %s", kernel, config, error)
            results.append(_failed(kernel, config, error))
            continue
        measurement = describe(out, ms)
        measurement.config = config or {"default": True}
        results.append(measurement)
    return results


# ----------------------------------------------------------------------------- paged KV set-up


def _paged_cache_with_dense_copy(
    seq_lens: list[int], block_size: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype
) -> tuple[PagedCache, torch.Tensor, torch.Tensor]:
    """The tests' paged cache (shuffled block ids; no spare blocks or table columns here), plus
    the same keys and values dense, [num_seqs, num_kv_heads, seq_len, head_dim], for torch's
    flash attention (all seq_lens equal)."""
    generator = torch.Generator().manual_seed(0)
    cache = build_paged_cache(
        seq_lens, block_size, num_kv_heads, head_dim, dtype, generator, "cuda", spare_blocks=0, spare_table_columns=0
    )
    k_dense = torch.stack(cache.keys).transpose(1, 2).contiguous()
    v_dense = torch.stack(cache.values).transpose(1, 2).contiguous()
    cache.keys, cache.values = [], []  # the dense copies replace them; free the memory
    return cache, k_dense, v_dense


def _flash_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)


# ----------------------------------------------------------------------------- decode

DECODE_TUNING_CONFIGS = [
    {"split_size": 512, "block_n": 64, "num_warps": 4, "num_stages": 3},
    {"split_size": 1024, "block_n": 64, "num_warps": 4, "num_stages": 3},
    {"split_size": 1024, "block_n": 64, "num_warps": 4, "num_stages": 4},
    {"split_size": 1024, "block_n": 32, "num_warps": 4, "num_stages": 4},
    {"split_size": 1024, "block_n": 128, "num_warps": 4, "num_stages": 3},
    {"split_size": 1024, "block_n": 128, "num_warps": 8, "num_stages": 3},
    {"split_size": 2048, "block_n": 64, "num_warps": 4, "num_stages": 3},
    {"split_size": 512, "block_n": 32, "num_warps": 2, "num_stages": 4},
]


def bench_decode(copy_gbps: float, rep_ms: int, tune: bool) -> list[Measurement]:
    configs = [{}] + (DECODE_TUNING_CONFIGS if tune else [])
    results = []
    for block_size in (16, 256):
        results += _bench_decode_at(block_size, configs, copy_gbps, rep_ms)
        torch.cuda.empty_cache()  # this block size's caches are gone; give the memory back
    return results


def _bench_decode_at(block_size: int, configs: list[dict], copy_gbps: float, rep_ms: int) -> list[Measurement]:
    from fast.kernels.decode_attention import decode_attention

    num_seqs, context, num_q_heads, num_kv_heads, head_dim = 64, 4096, 32, 8, 128
    dtype = torch.bfloat16
    group = num_q_heads // num_kv_heads
    scale = 1.0 / math.sqrt(head_dim)
    cache, k_dense, v_dense = _paged_cache_with_dense_copy(
        [context] * num_seqs, block_size, num_kv_heads, head_dim, dtype
    )
    q = torch.randn((num_seqs, num_q_heads, head_dim), device="cuda", dtype=dtype)
    kv_bytes = 2 * num_seqs * context * num_kv_heads * head_dim * cache.k_cache.element_size()

    # Torch baseline: FA2 (flash backend) on dense K/V. The GQA group becomes the query
    # length (4 queries per KV head, no mask), which is exact for decode and reads each KV
    # head once, like our kernel.
    q_grouped = q.view(num_seqs, num_kv_heads, group, head_dim)
    baseline_out = _flash_sdpa(q_grouped, k_dense, v_dense, causal=False).reshape(num_seqs, num_q_heads, head_dim)
    baseline_ms = _time_ms(lambda: _flash_sdpa(q_grouped, k_dense, v_dense, causal=False), rep_ms)

    def call(**config: int) -> torch.Tensor:
        return decode_attention(
            q, cache.k_cache, cache.v_cache, cache.block_tables, cache.seq_lens, scale, context, **config
        )

    def describe(out: torch.Tensor, ms: float) -> Measurement:
        gbps = _gbps(kv_bytes, ms)
        return Measurement(
            kernel="decode_attention",
            shape={
                "num_seqs": num_seqs,
                "context": context,
                "num_q_heads": num_q_heads,
                "num_kv_heads": num_kv_heads,
                "head_dim": head_dim,
                "block_size": block_size,
            },
            dtype=str(dtype),
            config={},
            time_ms=ms,
            figure="GB/s (bytes of KV read)",
            value=gbps,
            fraction_of_copy=gbps / copy_gbps,
            baseline="sdpa flash backend, dense K/V, GQA group as query length",
            baseline_time_ms=baseline_ms,
            speedup_vs_baseline=baseline_ms / ms,
            max_abs_error_vs_baseline=_max_error(out, baseline_out),
            target=f">= {DECODE_TARGET_FRACTION:.0%} of copy bandwidth",
            meets_target=gbps / copy_gbps >= DECODE_TARGET_FRACTION,
        )

    return sweep("decode_attention", configs, call, describe, rep_ms)


# ----------------------------------------------------------------------------- prefill

PREFILL_TUNING_CONFIGS = [
    {"block_m": 128, "block_n": 32, "num_warps": 4, "num_stages": 4},
    {"block_m": 128, "block_n": 32, "num_warps": 4, "num_stages": 3},
    {"block_m": 128, "block_n": 32, "num_warps": 4, "num_stages": 5},
    {"block_m": 128, "block_n": 32, "num_warps": 8, "num_stages": 4},
    {"block_m": 128, "block_n": 64, "num_warps": 4, "num_stages": 4},
    {"block_m": 128, "block_n": 64, "num_warps": 8, "num_stages": 3},
    {"block_m": 128, "block_n": 128, "num_warps": 8, "num_stages": 3},
    {"block_m": 64, "block_n": 32, "num_warps": 4, "num_stages": 4},
    {"block_m": 64, "block_n": 64, "num_warps": 4, "num_stages": 3},
]


def bench_prefill(rep_ms: int, tune: bool) -> list[Measurement]:
    from fast.kernels.prefill_attention import prefill_attention

    num_seqs, seq_len, num_q_heads, num_kv_heads, head_dim, block_size = 4, 4096, 32, 8, 128, 16
    dtype = torch.bfloat16
    cache, k_dense, v_dense = _paged_cache_with_dense_copy(
        [seq_len] * num_seqs, block_size, num_kv_heads, head_dim, dtype
    )
    cu_seqlens_q = torch.arange(0, (num_seqs + 1) * seq_len, seq_len, dtype=torch.int32, device="cuda")
    q = torch.randn((num_seqs * seq_len, num_q_heads, head_dim), device="cuda", dtype=dtype)
    scale = 1.0 / math.sqrt(head_dim)
    causal_flops = 4 * seq_len * seq_len / 2 * head_dim * num_q_heads * num_seqs

    # Torch baseline: FA2 on dense [S, H, L, D] tensors, causal, GQA through enable_gqa when the
    # flash backend takes it, else K/V expanded to all query heads (more bytes, same FLOPs).
    q_dense = q.view(num_seqs, seq_len, num_q_heads, head_dim).transpose(1, 2).contiguous()
    baseline_name = "sdpa flash backend, dense K/V, causal"
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        def baseline() -> torch.Tensor:
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                return torch.nn.functional.scaled_dot_product_attention(
                    q_dense, k_dense, v_dense, is_causal=True, enable_gqa=True
                )

        baseline_out = baseline()
        baseline_name += ", enable_gqa"
    except Exception as error:  # the flash backend refuses some GQA set-ups: fall back, and say so
        logger.warning("flash sdpa with enable_gqa failed (%s); expanding K/V", error)
        k_expanded = k_dense.repeat_interleave(num_q_heads // num_kv_heads, dim=1)
        v_expanded = v_dense.repeat_interleave(num_q_heads // num_kv_heads, dim=1)

        def baseline() -> torch.Tensor:
            return _flash_sdpa(q_dense, k_expanded, v_expanded, causal=True)

        baseline_out = baseline()
        baseline_name += ", K/V expanded to all heads"
    baseline_ms = _time_ms(baseline, rep_ms)
    baseline_packed = baseline_out.transpose(1, 2).reshape(num_seqs * seq_len, num_q_heads, head_dim)

    def call(**config: int) -> torch.Tensor:
        return prefill_attention(
            q, cu_seqlens_q, cache.seq_lens, cache.block_tables, cache.k_cache, cache.v_cache, scale, seq_len, **config
        )

    def describe(out: torch.Tensor, ms: float) -> Measurement:
        tflops = causal_flops / (ms * 1e-3) / 1e12
        return Measurement(
            kernel="prefill_attention",
            shape={
                "num_seqs": num_seqs,
                "seq_len": seq_len,
                "num_q_heads": num_q_heads,
                "num_kv_heads": num_kv_heads,
                "head_dim": head_dim,
                "block_size": block_size,
            },
            dtype=str(dtype),
            config={},
            time_ms=ms,
            figure="TFLOP/s (causal FLOPs)",
            value=tflops,
            baseline=baseline_name,
            baseline_time_ms=baseline_ms,
            speedup_vs_baseline=baseline_ms / ms,
            max_abs_error_vs_baseline=_max_error(out, baseline_packed),
            target=f">= {PREFILL_TARGET_TFLOPS:.0f} TFLOP/s and no slower than the baseline",
            meets_target=tflops >= PREFILL_TARGET_TFLOPS and ms <= baseline_ms,
        )

    return sweep("prefill_attention", [{}] + (PREFILL_TUNING_CONFIGS if tune else []), call, describe, rep_ms)


# ----------------------------------------------------------------------------- elementwise

# Torch's baseline for the fused elementwise kernels: the tests' references run in float32 and
# cast back to the input dtype, in eager mode.
EAGER_REFERENCE = "torch eager: reports.bench.kernels.kernel_reference in float32, cast back"


def _bandwidth_describer(
    kernel: str,
    shape: dict,
    num_bytes: int,
    baseline_ms: float,
    copy_gbps: float,
    error: Callable[[torch.Tensor], float],
) -> Callable[[torch.Tensor, float], Measurement]:
    """How a memory-bound kernel's result is reported: bandwidth against the copy, time against
    the eager baseline, and the largest difference from it."""

    def describe(out: torch.Tensor, ms: float) -> Measurement:
        gbps = _gbps(num_bytes, ms)
        return Measurement(
            kernel=kernel,
            shape=shape,
            dtype="torch.bfloat16",
            config={},
            time_ms=ms,
            figure="GB/s (bytes read + written)",
            value=gbps,
            fraction_of_copy=gbps / copy_gbps,
            baseline=EAGER_REFERENCE,
            baseline_time_ms=baseline_ms,
            speedup_vs_baseline=baseline_ms / ms,
            max_abs_error_vs_baseline=error(out),
            target=f">= {ELEMENTWISE_TARGET_FRACTION:.0%} of copy bandwidth",
            meets_target=gbps / copy_gbps >= ELEMENTWISE_TARGET_FRACTION,
        )

    return describe


def bench_elementwise(copy_gbps: float, rep_ms: int, tune: bool) -> list[Measurement]:
    from fast.kernels.add_rmsnorm import add_rmsnorm
    from fast.kernels.kv_store import store_kv
    from fast.kernels.qk_norm_rope import qk_norm_rope_
    from fast.kernels.silu_and_mul import silu_and_mul

    tokens, hidden, dtype, eps = 8192, 4096, torch.bfloat16, 1e-6
    element = 2
    results = []

    # --- add + RMSNorm: reads x, residual; writes out, new residual.
    x = torch.randn((tokens, hidden), device="cuda", dtype=dtype)
    residual = torch.randn_like(x)
    weight = torch.randn(hidden, device="cuda", dtype=dtype)

    def torch_add_rmsnorm() -> torch.Tensor:
        return reference_add_rmsnorm(x, residual, weight, eps, torch.float32)[0].to(dtype)

    expected_norm = torch_add_rmsnorm()
    results += sweep(
        "add_rmsnorm",
        [{}],
        lambda: add_rmsnorm(x, residual, weight, eps)[0],
        _bandwidth_describer(
            "add_rmsnorm",
            {"tokens": tokens, "hidden": hidden},
            4 * tokens * hidden * element,
            _time_ms(torch_add_rmsnorm, rep_ms),
            copy_gbps,
            lambda out: _max_error(out, expected_norm),
        ),
        rep_ms,
    )

    # --- SiLU * mul: reads [T, 2I]; writes [T, I] with I = 4096.
    gate_up = torch.randn((tokens, 2 * hidden), device="cuda", dtype=dtype)

    def torch_silu_and_mul() -> torch.Tensor:
        return reference_silu_and_mul(gate_up, torch.float32).to(dtype)

    expected_silu = torch_silu_and_mul()
    results += sweep(
        "silu_and_mul",
        [{}],
        lambda: silu_and_mul(gate_up),
        _bandwidth_describer(
            "silu_and_mul",
            {"tokens": tokens, "intermediate": hidden},
            3 * tokens * hidden * element,
            _time_ms(torch_silu_and_mul, rep_ms),
            copy_gbps,
            lambda out: _max_error(out, expected_silu),
        ),
        rep_ms,
    )

    # --- q/k norm + RoPE in place on views of a qkv buffer: 32 q heads (= 4096 wide) + 8 k heads.
    num_q_heads, num_kv_heads, head_dim = 32, 8, 128
    qkv = torch.randn((tokens, num_q_heads + 2 * num_kv_heads, head_dim), device="cuda", dtype=dtype)
    q, k = qkv[:, :num_q_heads], qkv[:, num_q_heads : num_q_heads + num_kv_heads]
    q_weight = torch.randn(head_dim, device="cuda", dtype=dtype)
    k_weight = torch.randn(head_dim, device="cuda", dtype=dtype)
    cos_sin_cache = build_cos_sin_cache(40960, head_dim, base=1e6, device="cuda")
    positions = torch.randint(0, 40960, (tokens,), device="cuda")

    def torch_qk_norm_rope() -> torch.Tensor:
        q.copy_(reference_qk_norm_rope(q, q_weight, cos_sin_cache, positions, eps, torch.float32))
        k.copy_(reference_qk_norm_rope(k, k_weight, cos_sin_cache, positions, eps, torch.float32))
        return q

    def qk_error() -> float:
        saved = qkv.clone()
        qk_norm_rope_(q, k, q_weight, k_weight, cos_sin_cache, positions, eps)
        ours = qkv.clone()
        qkv.copy_(saved)
        torch_qk_norm_rope()
        error = _max_error(ours, qkv)
        qkv.copy_(saved)
        return error

    qk_elements = tokens * (num_q_heads + num_kv_heads) * head_dim
    qk_bytes = 2 * qk_elements * element + tokens * head_dim * 4 + tokens * 8  # q,k in+out; cos/sin row; position
    error = qk_error()  # of the default configuration, before timing changes the buffer
    # Both versions run in place on the same buffer; repeated application keeps values bounded
    # (each step re-normalises), so timing them repeatedly is safe.
    qk_configs: list[dict] = [{}]
    if tune:
        qk_configs += [
            {"heads_per_program": heads, "num_warps": warps}
            for heads, warps in [(4, 1), (4, 2), (8, 4), (16, 2), (16, 4), (32, 4), (32, 8)]
        ]
    results += sweep(
        "qk_norm_rope",
        qk_configs,
        lambda **config: qk_norm_rope_(q, k, q_weight, k_weight, cos_sin_cache, positions, eps, **config),
        _bandwidth_describer(
            "qk_norm_rope",
            {"tokens": tokens, "num_q_heads": num_q_heads, "num_kv_heads": num_kv_heads, "head_dim": head_dim},
            qk_bytes,
            _time_ms(torch_qk_norm_rope, rep_ms),
            copy_gbps,
            lambda out: error,
        ),
        rep_ms,
    )

    # --- KV store: 8192 tokens x 8 heads x 128 into a cache of 16-token blocks at shuffled slots.
    block_size = 16
    new_k = torch.randn((tokens, num_kv_heads, head_dim), device="cuda", dtype=dtype)
    new_v = torch.randn_like(new_k)
    num_blocks = 2 * tokens // block_size
    k_cache = torch.zeros((num_blocks, block_size, num_kv_heads, head_dim), device="cuda", dtype=dtype)
    v_cache = torch.zeros_like(k_cache)
    slots = torch.randperm(num_blocks * block_size, device="cuda")[:tokens]

    def torch_store() -> torch.Tensor:
        k_cache.view(-1, num_kv_heads, head_dim)[slots] = new_k
        v_cache.view(-1, num_kv_heads, head_dim)[slots] = new_v
        return k_cache

    def store_error(_: torch.Tensor) -> float:
        k_cache.zero_()
        store_kv(new_k, new_v, k_cache, v_cache, slots)
        return _max_error(k_cache.view(-1, num_kv_heads, head_dim)[slots], new_k)

    results += sweep(
        "kv_store",
        [{}] + ([{"num_warps": warps} for warps in (1, 2, 8)] if tune else []),
        lambda **config: store_kv(new_k, new_v, k_cache, v_cache, slots, **config),
        _bandwidth_describer(
            "kv_store",
            {"tokens": tokens, "num_kv_heads": num_kv_heads, "head_dim": head_dim, "block_size": block_size},
            4 * tokens * num_kv_heads * head_dim * element + tokens * 8,
            _time_ms(torch_store, rep_ms),
            copy_gbps,
            store_error,
        ),
        rep_ms,
    )
    return results


def _max_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return (actual.float() - expected.float()).abs().max().item()


def compiled_kernel_info(jit_function: object) -> list[dict]:
    """Registers, spills, shared memory and whether the PTX holds wgmma, for each compiled variant.

    Reads Triton's per-device kernel cache, an internal structure: anything unexpected is
    recorded as an error string rather than failing the benchmark.
    """
    info = []
    try:
        for device_cache in jit_function.device_caches.values():  # type: ignore[attr-defined]
            for compiled in device_cache[0].values():
                ptx = compiled.asm.get("ptx", "")
                metadata = compiled.metadata
                info.append(
                    {
                        "name": getattr(metadata, "name", "?"),
                        "num_warps": getattr(metadata, "num_warps", None),
                        "num_stages": getattr(metadata, "num_stages", None),
                        "shared_bytes": getattr(metadata, "shared", None),
                        "n_regs": getattr(compiled, "n_regs", None),
                        "n_spills": getattr(compiled, "n_spills", None),
                        "ptx_has_wgmma": "wgmma" in ptx,
                        "ptx_has_mma_sync": "mma.sync" in ptx,
                        "ptx_has_cp_async": "cp.async" in ptx,
                    }
                )
    except Exception as error:  # internal API: record, never fail the run
        info.append({"error": f"{type(error).__name__}: {error}"})
    return info


def _failed(kernel: str, config: dict, error: Exception) -> Measurement:
    return Measurement(
        kernel=kernel,
        shape={},
        dtype="",
        config=config,
        time_ms=float("nan"),
        figure="failed",
        value=float("nan"),
        notes=[f"{type(error).__name__}: {error}"[:500]],
    )


# ----------------------------------------------------------------------------- entry point


def _best(measurements: list[Measurement], kernel: str) -> list[Measurement]:
    """The fastest successful measurement of `kernel` for each distinct shape."""
    groups: dict[str, list[Measurement]] = {}
    for m in measurements:
        if m.kernel == kernel and not math.isnan(m.time_ms):
            groups.setdefault(json.dumps(m.shape, sort_keys=True), []).append(m)
    return [min(group, key=lambda m: m.time_ms) for group in groups.values()]


def run(args: argparse.Namespace) -> int:
    import triton

    if not torch.cuda.is_available():
        print("twinfer bench kernels: needs a CUDA GPU", file=sys.stderr)
        return 2
    parts = {part.strip() for part in args.only.split(",") if part.strip()}
    tune = not args.no_tune
    torch.manual_seed(0)
    copy = measure_copy_bandwidth(torch.device("cuda"))
    copy_gbps = copy.value
    logger.info("copy bandwidth %.0f GB/s", copy_gbps)
    measurements: list[Measurement] = []
    if "decode" in parts:
        measurements += bench_decode(copy_gbps, args.rep_ms, tune)
    if "prefill" in parts:
        measurements += bench_prefill(args.rep_ms, tune)
    if "elementwise" in parts:
        measurements += bench_elementwise(copy_gbps, args.rep_ms, tune)

    best = []
    for kernel in ("decode_attention", "prefill_attention", "add_rmsnorm", "silu_and_mul", "qk_norm_rope", "kv_store"):
        best += _best(measurements, kernel)
    from fast.kernels import decode_attention as decode_module
    from fast.kernels import prefill_attention as prefill_module

    compiled = {
        "prefill_attention": compiled_kernel_info(prefill_module._prefill_attention_kernel),
        "decode_split": compiled_kernel_info(decode_module._decode_split_kernel),
    }
    record = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
        "commit": args.commit or git_commit(),
        "copy_bandwidth_GBps": copy_gbps,
        "copy_bandwidth_note": copy.method,
        "best": [asdict(m) for m in best],
        "all_measurements": [asdict(m) for m in measurements],
        "compiled": compiled,
    }
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(record, indent=2) + "\n")
    print(f"{record['gpu']}  torch {record['torch']}  triton {record['triton']}  copy {copy_gbps:.0f} GB/s")
    print(
        f"{'kernel':<18} {'shape':<44} {'config':<48} {'ms':>8} {'figure':>10} {'%copy':>6} {'torch ms':>9} "
        f"{'x':>5} {'ok':>3}"
    )
    for m in measurements:
        shape = ",".join(f"{v}" for v in m.shape.values())
        config = ",".join(f"{k}={v}" for k, v in m.config.items())
        fraction = f"{m.fraction_of_copy:.0%}" if m.fraction_of_copy is not None else "-"
        base = f"{m.baseline_time_ms:.3f}" if m.baseline_time_ms is not None else "-"
        speed = f"{m.speedup_vs_baseline:.2f}" if m.speedup_vs_baseline is not None else "-"
        print(
            f"{m.kernel:<18} {shape:<44} {config[:48]:<48} {m.time_ms:8.3f} {m.value:10.1f} {fraction:>6} "
            f"{base:>9} {speed:>5} {'Y' if m.meets_target else 'n':>3}"
        )
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    main_parser = argparse.ArgumentParser(prog="python -m reports.bench.kernels.kernel_bench", description=__doc__)
    configure_parser(main_parser)
    sys.exit(run(main_parser.parse_args()))
