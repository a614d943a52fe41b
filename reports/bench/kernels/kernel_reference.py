"""Torch reference implementations of the fast kernels, and the paged-cache builder, shared by the
kernel tests (tests/fast/kernels/) and the kernel benchmark (reports/bench/kernels/kernel_bench.py).

The tests call the references in float64 (the default `compute_dtype`) on the same already
rounded inputs the kernels get, so the only difference left is the kernels' own rounding. The
benchmark calls the same functions in float32 and casts back, as torch's eager baseline.
They are written for clarity, not speed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

# ----------------------------------------------------------------------------- paged KV cache


@dataclass
class PagedCache:
    k_cache: torch.Tensor  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor
    block_tables: torch.Tensor  # int32 [num_seqs, max_blocks_per_seq], padded with -1
    seq_lens: torch.Tensor  # int32 [num_seqs]
    keys: list[torch.Tensor]  # per sequence, [seq_len, num_kv_heads, head_dim] as stored
    values: list[torch.Tensor]


def build_paged_cache(
    seq_lens: list[int],
    block_size: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    generator: torch.Generator,
    device: torch.device | str = "cpu",
    spare_blocks: int = 2,
    spare_table_columns: int = 1,
) -> PagedCache:
    """A cache whose block ids are a random permutation, with every slot that no sequence owns
    (spare blocks, the tail of each last block) poisoned with NaN: a kernel that reads past a
    sequence's length turns its output into NaN. Values are drawn on the CPU from `generator`
    (so a seed gives the same cache on every device), then moved to `device`."""
    blocks_per_seq = [math.ceil(n / block_size) for n in seq_lens]
    num_blocks = sum(blocks_per_seq) + spare_blocks
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.full(shape, float("nan"), dtype=dtype)
    v_cache = torch.full(shape, float("nan"), dtype=dtype)
    permutation = torch.randperm(num_blocks, generator=generator)
    max_blocks = max(blocks_per_seq) + spare_table_columns
    block_tables = torch.full((len(seq_lens), max_blocks), -1, dtype=torch.int32)
    keys, values = [], []
    next_block = 0
    for seq, seq_len in enumerate(seq_lens):
        key = torch.randn((seq_len, num_kv_heads, head_dim), generator=generator).to(dtype)
        value = torch.randn((seq_len, num_kv_heads, head_dim), generator=generator).to(dtype)
        block_ids = permutation[next_block : next_block + blocks_per_seq[seq]]
        next_block += blocks_per_seq[seq]
        block_tables[seq, : len(block_ids)] = block_ids.to(torch.int32)
        positions = torch.arange(seq_len)
        token_blocks, token_offsets = block_ids[positions // block_size], positions % block_size
        k_cache[token_blocks, token_offsets] = key
        v_cache[token_blocks, token_offsets] = value
        keys.append(key)
        values.append(value)
    return PagedCache(
        k_cache=k_cache.to(device),
        v_cache=v_cache.to(device),
        block_tables=block_tables.to(device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        keys=[k.to(device) for k in keys],
        values=[v.to(device) for v in values],
    )


# ----------------------------------------------------------------------------- attention


def reference_causal_attention(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float, compute_dtype: torch.dtype = torch.float64
) -> torch.Tensor:
    """q [q_len, Hq, D] at positions seq_len - q_len .. seq_len - 1 over keys/values [seq_len, Hkv, D]."""
    q_len, num_q_heads, _ = q.shape
    seq_len, num_kv_heads, _ = keys.shape
    group = num_q_heads // num_kv_heads
    k_wide = keys.to(compute_dtype).repeat_interleave(group, dim=1)  # q head h uses kv head h // group
    v_wide = values.to(compute_dtype).repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.to(compute_dtype), k_wide) * scale
    query_positions = torch.arange(seq_len - q_len, seq_len, device=q.device)
    visible = torch.arange(seq_len, device=q.device)[None, :] <= query_positions[:, None]
    scores = scores.masked_fill(~visible[None], float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(dim=-1), v_wide)


# ----------------------------------------------------------------------------- elementwise


def reference_add_rmsnorm(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor,
    eps: float,
    compute_dtype: torch.dtype = torch.float64,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Returns (normed in compute_dtype, new residual in residual's dtype). The norm is of the rounded sum."""
    new_residual = None
    values = x.to(compute_dtype)
    if residual is not None:
        new_residual = (values + residual.to(compute_dtype)).to(residual.dtype)
        values = new_residual.to(compute_dtype)
    inverse_rms = torch.rsqrt(values.pow(2).mean(dim=-1, keepdim=True) + eps)
    return values * inverse_rms * weight.to(compute_dtype), new_residual


def reference_qk_norm_rope(
    x: torch.Tensor,
    weight: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    positions: torch.Tensor,
    eps: float,
    compute_dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    """x [T, H, D] -> per-head RMSNorm * weight, then rotate-half RoPE, in compute_dtype."""
    values = x.to(compute_dtype)
    values = values * torch.rsqrt(values.pow(2).mean(dim=-1, keepdim=True) + eps) * weight.to(compute_dtype)
    half = x.shape[-1] // 2
    cos = cos_sin_cache[positions, :half].to(compute_dtype)[:, None, :]
    sin = cos_sin_cache[positions, half:].to(compute_dtype)[:, None, :]
    first, second = values[..., :half], values[..., half:]
    return torch.cat([first * cos - second * sin, second * cos + first * sin], dim=-1)


def build_cos_sin_cache(
    max_positions: int, head_dim: int, base: float = 10000.0, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """[max_positions, head_dim] float32: cos of every rotary angle in the first half, sin in the second."""
    inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = torch.arange(max_positions, dtype=torch.float64)[:, None] * inv_freq[None, :]
    return torch.cat([angles.cos(), angles.sin()], dim=-1).float().to(device)


def reference_silu_and_mul(x: torch.Tensor, compute_dtype: torch.dtype = torch.float64) -> torch.Tensor:
    half = x.shape[-1] // 2
    gate, up = x[:, :half].to(compute_dtype), x[:, half:].to(compute_dtype)
    return torch.nn.functional.silu(gate) * up
