"""`twinfer bench kernels`: time each fast-engine Triton kernel beside torch's own version.

Every figure is measured in the same run as its ceiling: the device-to-device copy bandwidth
(bytes read + written of a multi-GB copy) for the memory-bound kernels, and FLOP/s for
prefill attention. Times are medians of `triton.testing.do_bench` (CUDA events, L2 flushed
between repeats). The JSON written by --json holds every measurement, the tuning sweeps
included, so NOTES.md can quote it.

Runs as `python -m reports.kernel_bench --json out.json --commit <sha>` too.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import subprocess
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

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


def _git_commit() -> str | None:
    try:
        return subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True, timeout=10
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def measure_copy_bandwidth(rep_ms: int) -> float:
    """GB/s of a 4 GiB device-to-device copy (2 GiB read + 2 GiB written)."""
    source = torch.empty(2 * 2**30, dtype=torch.uint8, device="cuda").random_()
    target = torch.empty_like(source)
    ms = _time_ms(lambda: target.copy_(source), rep_ms)
    return _gbps(2 * source.numel(), ms)


# ----------------------------------------------------------------------------- paged KV set-up


def _paged_cache(
    seq_lens: list[int], block_size: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random caches with shuffled block ids; returns k_cache, v_cache, block_tables, k_contig, v_contig.

    k_contig/v_contig [num_seqs, num_kv_heads, max_len, head_dim] hold the same keys densely for
    the torch baseline (all seq_lens equal here).
    """
    blocks_per_seq = [math.ceil(n / block_size) for n in seq_lens]
    num_blocks = sum(blocks_per_seq)
    generator = torch.Generator(device="cuda").manual_seed(0)
    k_cache = torch.randn((num_blocks, block_size, num_kv_heads, head_dim), device="cuda", dtype=dtype,
                          generator=generator)
    v_cache = torch.randn_like(k_cache)
    permutation = torch.randperm(num_blocks, device="cuda", generator=generator).to(torch.int32)
    block_tables = permutation.view(len(seq_lens), -1)  # equal lengths: a plain reshape
    # Dense copy for torch: gather each sequence's blocks in table order.
    gathered_k = k_cache[block_tables.long()]  # [S, blocks, block_size, H, D]
    gathered_v = v_cache[block_tables.long()]
    num_seqs, max_len = len(seq_lens), blocks_per_seq[0] * block_size
    k_contig = gathered_k.reshape(num_seqs, max_len, num_kv_heads, head_dim).transpose(1, 2).contiguous()
    v_contig = gathered_v.reshape(num_seqs, max_len, num_kv_heads, head_dim).transpose(1, 2).contiguous()
    return k_cache, v_cache, block_tables.contiguous(), k_contig, v_contig


def _flash_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)


# ----------------------------------------------------------------------------- decode


def bench_decode(copy_gbps: float, rep_ms: int, tune: bool) -> list[Measurement]:
    from fast.kernels.decode_attention import decode_attention

    num_seqs, context, num_q_heads, num_kv_heads, head_dim = 64, 4096, 32, 8, 128
    dtype = torch.bfloat16
    group = num_q_heads // num_kv_heads
    results = []
    for block_size in (16, 256):
        seq_lens_list = [context] * num_seqs
        k_cache, v_cache, block_tables, k_contig, v_contig = _paged_cache(
            seq_lens_list, block_size, num_kv_heads, head_dim, dtype
        )
        seq_lens = torch.tensor(seq_lens_list, dtype=torch.int32, device="cuda")
        q = torch.randn((num_seqs, num_q_heads, head_dim), device="cuda", dtype=dtype)
        scale = 1.0 / math.sqrt(head_dim)
        kv_bytes = 2 * num_seqs * context * num_kv_heads * head_dim * k_cache.element_size()

        # Torch baseline: FA2 (flash backend) on dense K/V. The GQA group becomes the query
        # length (4 queries per KV head, no mask), which is exact for decode and reads each KV
        # head once, like our kernel.
        q_grouped = q.view(num_seqs, num_kv_heads, group, head_dim)
        baseline_out = _flash_sdpa(q_grouped, k_contig, v_contig, causal=False).reshape(num_seqs, num_q_heads, head_dim)
        baseline_ms = _time_ms(lambda: _flash_sdpa(q_grouped, k_contig, v_contig, causal=False), rep_ms)

        configs: list[dict] = [{}]
        if tune:
            configs += [
                {"split_size": 512, "block_n": 64, "num_warps": 4, "num_stages": 3},
                {"split_size": 1024, "block_n": 64, "num_warps": 4, "num_stages": 3},
                {"split_size": 1024, "block_n": 64, "num_warps": 4, "num_stages": 4},
                {"split_size": 1024, "block_n": 32, "num_warps": 4, "num_stages": 4},
                {"split_size": 1024, "block_n": 128, "num_warps": 4, "num_stages": 3},
                {"split_size": 1024, "block_n": 128, "num_warps": 8, "num_stages": 3},
                {"split_size": 2048, "block_n": 64, "num_warps": 4, "num_stages": 3},
                {"split_size": 512, "block_n": 32, "num_warps": 2, "num_stages": 4},
            ]
        for config in configs:
            def call(config: dict = config) -> torch.Tensor:
                return decode_attention(q, k_cache, v_cache, block_tables, seq_lens, scale, context, **config)

            try:
                out = call()
                ms = _time_ms(call, rep_ms)
            except Exception as error:  # a config that fails to compile is recorded, not fatal
                logger.warning("decode config %s failed: %s", config, error)
                results.append(_failed("decode_attention", config, error))
                continue
            gbps = _gbps(kv_bytes, ms)
            results.append(
                Measurement(
                    kernel="decode_attention",
                    shape={"num_seqs": num_seqs, "context": context, "num_q_heads": num_q_heads,
                           "num_kv_heads": num_kv_heads, "head_dim": head_dim, "block_size": block_size},
                    dtype=str(dtype),
                    config=config or {"default": True},
                    time_ms=ms,
                    figure="GB/s (bytes of KV read)",
                    value=gbps,
                    fraction_of_copy=gbps / copy_gbps,
                    baseline="sdpa flash backend, dense K/V, GQA group as query length",
                    baseline_time_ms=baseline_ms,
                    speedup_vs_baseline=baseline_ms / ms,
                    max_abs_error_vs_baseline=(out.float() - baseline_out.float()).abs().max().item(),
                    target=f">= {DECODE_TARGET_FRACTION:.0%} of copy bandwidth",
                    meets_target=gbps / copy_gbps >= DECODE_TARGET_FRACTION,
                )
            )
        del k_cache, v_cache, k_contig, v_contig
        torch.cuda.empty_cache()
    return results


# ----------------------------------------------------------------------------- prefill


def bench_prefill(rep_ms: int, tune: bool) -> list[Measurement]:
    from fast.kernels.prefill_attention import prefill_attention

    num_seqs, seq_len, num_q_heads, num_kv_heads, head_dim, block_size = 4, 4096, 32, 8, 128, 16
    dtype = torch.bfloat16
    seq_lens_list = [seq_len] * num_seqs
    k_cache, v_cache, block_tables, k_contig, v_contig = _paged_cache(
        seq_lens_list, block_size, num_kv_heads, head_dim, dtype
    )
    seq_lens = torch.tensor(seq_lens_list, dtype=torch.int32, device="cuda")
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
                    q_dense, k_contig, v_contig, is_causal=True, enable_gqa=True
                )

        baseline_out = baseline()
        baseline_name += ", enable_gqa"
    except Exception as error:  # the flash backend refuses some GQA set-ups: fall back, and say so
        logger.warning("flash sdpa with enable_gqa failed (%s); expanding K/V", error)
        k_expanded = k_contig.repeat_interleave(num_q_heads // num_kv_heads, dim=1)
        v_expanded = v_contig.repeat_interleave(num_q_heads // num_kv_heads, dim=1)

        def baseline() -> torch.Tensor:
            return _flash_sdpa(q_dense, k_expanded, v_expanded, causal=True)

        baseline_out = baseline()
        baseline_name += ", K/V expanded to all heads"
    baseline_ms = _time_ms(baseline, rep_ms)
    baseline_packed = baseline_out.transpose(1, 2).reshape(num_seqs * seq_len, num_q_heads, head_dim)

    configs: list[dict] = [{}]
    if tune:
        configs += [
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
    results = []
    for config in configs:
        def call(config: dict = config) -> torch.Tensor:
            return prefill_attention(
                q, cu_seqlens_q, seq_lens, block_tables, k_cache, v_cache, scale, seq_len, **config
            )

        try:
            out = call()
            ms = _time_ms(call, rep_ms)
        except Exception as error:
            logger.warning("prefill config %s failed: %s", config, error)
            results.append(_failed("prefill_attention", config, error))
            continue
        tflops = causal_flops / (ms * 1e-3) / 1e12
        results.append(
            Measurement(
                kernel="prefill_attention",
                shape={"num_seqs": num_seqs, "seq_len": seq_len, "num_q_heads": num_q_heads,
                       "num_kv_heads": num_kv_heads, "head_dim": head_dim, "block_size": block_size},
                dtype=str(dtype),
                config=config or {"default": True},
                time_ms=ms,
                figure="TFLOP/s (causal FLOPs)",
                value=tflops,
                baseline=baseline_name,
                baseline_time_ms=baseline_ms,
                speedup_vs_baseline=baseline_ms / ms,
                max_abs_error_vs_baseline=(out.float() - baseline_packed.float()).abs().max().item(),
                target=f">= {PREFILL_TARGET_TFLOPS:.0f} TFLOP/s and no slower than the baseline",
                meets_target=tflops >= PREFILL_TARGET_TFLOPS and ms <= baseline_ms,
            )
        )
    return results


# ----------------------------------------------------------------------------- elementwise


def _elementwise_measurement(
    kernel: str, shape: dict, num_bytes: int, ours: Callable[[], torch.Tensor], theirs: Callable[[], torch.Tensor],
    baseline: str, copy_gbps: float, rep_ms: int, compare: Callable[[], float],
) -> Measurement:
    ms = _time_ms(ours, rep_ms)
    baseline_ms = _time_ms(theirs, rep_ms)
    gbps = _gbps(num_bytes, ms)
    return Measurement(
        kernel=kernel, shape=shape, dtype="torch.bfloat16", config={"default": True}, time_ms=ms,
        figure="GB/s (bytes read + written)", value=gbps, fraction_of_copy=gbps / copy_gbps,
        baseline=baseline, baseline_time_ms=baseline_ms, speedup_vs_baseline=baseline_ms / ms,
        max_abs_error_vs_baseline=compare(),
        target=f">= {ELEMENTWISE_TARGET_FRACTION:.0%} of copy bandwidth",
        meets_target=gbps / copy_gbps >= ELEMENTWISE_TARGET_FRACTION,
    )


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
        summed = x + residual
        values = summed.float()
        return (values * torch.rsqrt(values.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(dtype)

    results.append(_elementwise_measurement(
        "add_rmsnorm", {"tokens": tokens, "hidden": hidden}, 4 * tokens * hidden * element,
        lambda: add_rmsnorm(x, residual, weight, eps), torch_add_rmsnorm, "torch eager (add, fp32 rmsnorm, cast)",
        copy_gbps, rep_ms,
        lambda: (add_rmsnorm(x, residual, weight, eps)[0].float() - torch_add_rmsnorm().float()).abs().max().item(),
    ))

    # --- SiLU * mul: reads [T, 2I]; writes [T, I] with I = 4096.
    gate_up = torch.randn((tokens, 2 * hidden), device="cuda", dtype=dtype)

    def torch_silu_and_mul() -> torch.Tensor:
        return torch.nn.functional.silu(gate_up[:, :hidden]) * gate_up[:, hidden:]

    results.append(_elementwise_measurement(
        "silu_and_mul", {"tokens": tokens, "intermediate": hidden}, 3 * tokens * hidden * element,
        lambda: silu_and_mul(gate_up), torch_silu_and_mul, "torch eager (F.silu(gate) * up)", copy_gbps, rep_ms,
        lambda: (silu_and_mul(gate_up).float() - torch_silu_and_mul().float()).abs().max().item(),
    ))

    # --- q/k norm + RoPE in place on views of a qkv buffer: 32 q heads (= 4096 wide) + 8 k heads.
    num_q_heads, num_kv_heads, head_dim = 32, 8, 128
    qkv = torch.randn((tokens, num_q_heads + 2 * num_kv_heads, head_dim), device="cuda", dtype=dtype)
    q, k = qkv[:, :num_q_heads], qkv[:, num_q_heads : num_q_heads + num_kv_heads]
    q_weight = torch.randn(head_dim, device="cuda", dtype=dtype)
    k_weight = torch.randn(head_dim, device="cuda", dtype=dtype)
    inv_freq = 1.0 / 1e6 ** (torch.arange(0, head_dim, 2, device="cuda", dtype=torch.float32) / head_dim)
    angles = torch.arange(40960, device="cuda", dtype=torch.float32)[:, None] * inv_freq[None, :]
    cos_sin_cache = torch.cat([angles.cos(), angles.sin()], dim=-1).contiguous()
    positions = torch.randint(0, 40960, (tokens,), device="cuda")
    half = head_dim // 2

    def torch_norm_rope(values: torch.Tensor, norm_weight: torch.Tensor) -> torch.Tensor:
        values = values.float()
        values = values * torch.rsqrt(values.pow(2).mean(-1, keepdim=True) + eps) * norm_weight.float()
        cos = cos_sin_cache[positions, :half][:, None, :]
        sin = cos_sin_cache[positions, half:][:, None, :]
        first, second = values[..., :half], values[..., half:]
        return torch.cat([first * cos - second * sin, second * cos + first * sin], dim=-1).to(dtype)

    def torch_qk_norm_rope() -> torch.Tensor:
        q.copy_(torch_norm_rope(q, q_weight))
        k.copy_(torch_norm_rope(k, k_weight))
        return q

    def compare_qk() -> float:
        saved = qkv.clone()
        qk_norm_rope_(q, k, q_weight, k_weight, cos_sin_cache, positions, eps)
        ours = qkv.clone()
        qkv.copy_(saved)
        torch_qk_norm_rope()
        error = (ours.float() - qkv.float()).abs().max().item()
        qkv.copy_(saved)
        return error

    qk_elements = tokens * (num_q_heads + num_kv_heads) * head_dim
    qk_bytes = 2 * qk_elements * element + tokens * head_dim * 4 + tokens * 8  # q,k in+out; cos/sin row; position
    error = compare_qk()
    # Both versions run in place on the same buffer; repeated application keeps values bounded
    # (each step re-normalises), so timing them repeatedly is safe.
    qk_configs: list[dict] = [{}]
    if tune:
        qk_configs += [
            {"heads_per_program": heads, "num_warps": warps}
            for heads, warps in [(4, 1), (4, 2), (8, 4), (16, 2), (16, 4), (32, 4), (32, 8)]
        ]
    for config in qk_configs:
        measurement = _elementwise_measurement(
            "qk_norm_rope", {"tokens": tokens, "num_q_heads": num_q_heads, "num_kv_heads": num_kv_heads,
                             "head_dim": head_dim}, qk_bytes,
            lambda config=config: qk_norm_rope_(q, k, q_weight, k_weight, cos_sin_cache, positions, eps, **config),
            torch_qk_norm_rope, "torch eager (fp32 per-head rmsnorm + rotate-half rope, copied back in place)",
            copy_gbps, rep_ms, lambda: error,
        )
        measurement.config = config or {"default": True}
        results.append(measurement)

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

    def compare_store() -> float:
        store_kv(new_k, new_v, k_cache, v_cache, slots)
        ours = k_cache.view(-1, num_kv_heads, head_dim)[slots]
        return (ours.float() - new_k.float()).abs().max().item()

    for warps in [None] + ([1, 2, 8] if tune else []):
        config = {} if warps is None else {"num_warps": warps}
        measurement = _elementwise_measurement(
            "kv_store", {"tokens": tokens, "num_kv_heads": num_kv_heads, "head_dim": head_dim,
                         "block_size": block_size},
            4 * tokens * num_kv_heads * head_dim * element + tokens * 8,
            lambda config=config: store_kv(new_k, new_v, k_cache, v_cache, slots, **config), torch_store,
            "torch index_put into the cache view", copy_gbps, rep_ms, compare_store,
        )
        measurement.config = config or {"default": True}
        results.append(measurement)
    return results


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
                info.append({
                    "name": getattr(metadata, "name", "?"),
                    "num_warps": getattr(metadata, "num_warps", None),
                    "num_stages": getattr(metadata, "num_stages", None),
                    "shared_bytes": getattr(metadata, "shared", None),
                    "n_regs": getattr(compiled, "n_regs", None),
                    "n_spills": getattr(compiled, "n_spills", None),
                    "ptx_has_wgmma": "wgmma" in ptx,
                    "ptx_has_mma_sync": "mma.sync" in ptx,
                    "ptx_has_cp_async": "cp.async" in ptx,
                })
    except Exception as error:  # internal API: record, never fail the run
        info.append({"error": f"{type(error).__name__}: {error}"})
    return info


def _failed(kernel: str, config: dict, error: Exception) -> Measurement:
    return Measurement(kernel=kernel, shape={}, dtype="", config=config, time_ms=float("nan"), figure="failed",
                       value=float("nan"), notes=[f"{type(error).__name__}: {error}"[:500]])


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
    copy_gbps = measure_copy_bandwidth(args.rep_ms)
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
        "commit": args.commit or _git_commit(),
        "copy_bandwidth_GBps": copy_gbps,
        "copy_bandwidth_note": "4 GiB device-to-device copy, bytes read + written over median time",
        "best": [asdict(m) for m in best],
        "all_measurements": [asdict(m) for m in measurements],
        "compiled": compiled,
    }
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(record, indent=2) + "\n")
    print(f"{record['gpu']}  torch {record['torch']}  triton {record['triton']}  copy {copy_gbps:.0f} GB/s")
    print(f"{'kernel':<18} {'shape':<44} {'config':<48} {'ms':>8} {'figure':>10} {'%copy':>6} {'torch ms':>9} {'x':>5} {'ok':>3}")
    for m in measurements:
        shape = ",".join(f"{v}" for v in m.shape.values())
        config = ",".join(f"{k}={v}" for k, v in m.config.items())
        fraction = f"{m.fraction_of_copy:.0%}" if m.fraction_of_copy is not None else "-"
        base = f"{m.baseline_time_ms:.3f}" if m.baseline_time_ms is not None else "-"
        speed = f"{m.speedup_vs_baseline:.2f}" if m.speedup_vs_baseline is not None else "-"
        print(f"{m.kernel:<18} {shape:<44} {config[:48]:<48} {m.time_ms:8.3f} {m.value:10.1f} {fraction:>6} "
              f"{base:>9} {speed:>5} {'Y' if m.meets_target else 'n':>3}")
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    main_parser = argparse.ArgumentParser(prog="python -m reports.kernel_bench", description=__doc__)
    configure_parser(main_parser)
    sys.exit(run(main_parser.parse_args()))
