"""Torch reference implementations of the fast kernels, and test-input builders.

References compute in float64 from the same (already rounded) inputs the kernels get, so the
only difference left is the kernels' own rounding. They are written for clarity, not speed:
attention gathers each sequence's keys through its block table one token at a time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
ON_GPU = DEVICE.type == "cuda"

# Max abs error allowed, as a fraction of the reference's max abs value.
# fp32 runs with input_precision="ieee" dots on the GPU, so no tf32 loosening is needed.
TOLERANCE = {torch.float32: 1e-4, torch.float16: 3e-3, torch.bfloat16: 2e-2}


def assert_close_scaled(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype, what: str) -> None:
    """Every element written (no NaN left from the poison) and max error within the dtype's tolerance."""
    actual64 = actual.double()
    assert not torch.isnan(actual64).any(), f"{what}: output holds NaN (unwritten element or NaN read)"
    scale = max(expected.abs().max().item(), 1e-3)
    error = (actual64 - expected).abs().max().item()
    assert error <= TOLERANCE[dtype] * scale, f"{what}: max abs error {error:.3g} > {TOLERANCE[dtype]} x scale {scale:.3g}"


def poisoned_like(tensor: torch.Tensor) -> torch.Tensor:
    return torch.full_like(tensor, float("nan"))


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
    spare_blocks: int = 2,
    spare_table_columns: int = 1,
) -> PagedCache:
    """A cache whose block ids are a random permutation, with every slot that no sequence
    owns (spare blocks, the tail of each last block) poisoned with NaN: a kernel that reads
    past a sequence's length turns its output into NaN."""
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
        for index in range(blocks_per_seq[seq]):
            block_id = int(permutation[next_block])
            next_block += 1
            block_tables[seq, index] = block_id
            chunk = slice(index * block_size, min((index + 1) * block_size, seq_len))
            count = chunk.stop - chunk.start
            k_cache[block_id, :count] = key[chunk]
            v_cache[block_id, :count] = value[chunk]
        keys.append(key)
        values.append(value)
    return PagedCache(
        k_cache=k_cache.to(DEVICE),
        v_cache=v_cache.to(DEVICE),
        block_tables=block_tables.to(DEVICE),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE),
        keys=[k.to(DEVICE) for k in keys],
        values=[v.to(DEVICE) for v in values],
    )


# ----------------------------------------------------------------------------- attention


def reference_causal_attention(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float
) -> torch.Tensor:
    """q [q_len, Hq, D] at positions seq_len - q_len .. seq_len - 1 over keys/values [seq_len, Hkv, D]."""
    q_len, num_q_heads, _ = q.shape
    seq_len, num_kv_heads, _ = keys.shape
    group = num_q_heads // num_kv_heads
    k64 = keys.double().repeat_interleave(group, dim=1)  # q head h uses kv head h // group
    v64 = values.double().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.double(), k64) * scale
    query_positions = torch.arange(seq_len - q_len, seq_len, device=q.device)
    visible = torch.arange(seq_len, device=q.device)[None, :] <= query_positions[:, None]
    scores = scores.masked_fill(~visible[None], float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(dim=-1), v64)


# ----------------------------------------------------------------------------- elementwise


def reference_add_rmsnorm(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Returns (normed fp64, new residual in residual's dtype). The norm is of the rounded sum."""
    new_residual = None
    values = x.double()
    if residual is not None:
        new_residual = (x.double() + residual.double()).to(residual.dtype)
        values = new_residual.double()
    inverse_rms = torch.rsqrt(values.pow(2).mean(dim=-1, keepdim=True) + eps)
    return values * inverse_rms * weight.double(), new_residual


def reference_qk_norm_rope(
    x: torch.Tensor, weight: torch.Tensor, cos_sin_cache: torch.Tensor, positions: torch.Tensor, eps: float
) -> torch.Tensor:
    """x [T, H, D] -> per-head RMSNorm * weight, then rotate-half RoPE, in fp64."""
    values = x.double()
    values = values * torch.rsqrt(values.pow(2).mean(dim=-1, keepdim=True) + eps) * weight.double()
    half = x.shape[-1] // 2
    cos = cos_sin_cache[positions, :half].double()[:, None, :]
    sin = cos_sin_cache[positions, half:].double()[:, None, :]
    first, second = values[..., :half], values[..., half:]
    return torch.cat([first * cos - second * sin, second * cos + first * sin], dim=-1)


def build_cos_sin_cache(max_positions: int, head_dim: int, base: float = 10000.0) -> torch.Tensor:
    inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = torch.arange(max_positions, dtype=torch.float64)[:, None] * inv_freq[None, :]
    return torch.cat([angles.cos(), angles.sin()], dim=-1).float().to(DEVICE)


def reference_silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    gate, up = x[:, :half].double(), x[:, half:].double()
    return torch.nn.functional.silu(gate) * up
