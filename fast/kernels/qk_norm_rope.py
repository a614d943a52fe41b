"""Qwen3's per-head q/k RMSNorm fused with rotate-half RoPE, IN PLACE on q and k.

    q [num_tokens, num_q_heads, head_dim], k [num_tokens, num_kv_heads, head_dim]
    q_weight, k_weight [head_dim]; cos_sin_cache fp32 [max_positions, head_dim] with
    cos in [:, :head_dim//2] and sin in [:, head_dim//2:]; positions int64 [num_tokens].

For each head vector x (head_dim values):
    y  = x / sqrt(mean(x^2) + eps) * weight                  (per-head RMSNorm)
    y1, y2 = y[:half], y[half:]                              (rotate-half pairs j and j+half)
    out[:half] = y1 * cos - y2 * sin ;  out[half:] = y2 * cos + y1 * sin
all in fp32, stored back into q / k in their dtype. In place because q and k are usually
views into the fused qkv projection output, and writing back there avoids an extra buffer;
q and k may therefore be strided views (only the last dim must be dense).

`qk_norm_rope_store_kv_` also writes each token's new k (as stored back into k) and its v into the
paged KV cache at its slot, as fast.kernels.kv_store.store_kv would after this kernel: the programs
that rotate a token's k heads store them and copy the same heads of v, which saves the store's own
launch (one kernel a layer, about 1.3 us of a batch-1 decode step's layer on an H200).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from fast.kernels._checks import (
    FLOAT_DTYPES,
    check_contiguous,
    check_last_dim_contiguous,
    check_same_device,
    check_same_dtype,
    check_shape,
    check_tensor,
)
from fast.kernels.kv_store import check_store_kv_args
from fast.kernels.pdl import wait_then_release


@triton.jit
def _norm_rope_heads(
    x_ptr,
    weight_ptr,
    token,
    token_stride,
    head_stride,
    head_start,
    num_heads,
    cos,
    sin,
    eps,
    cache_ptr,
    slot,
    HALF_DIM: tl.constexpr,
    HEADS_PER_PROGRAM: tl.constexpr,
    APPLY_NORM: tl.constexpr,
    STORE: tl.constexpr,
):
    # Tile [HEADS_PER_PROGRAM, HALF_DIM] for each half: head_dim=128, 8 heads from head 16 ->
    # two 8x64 tiles; element (h, j) of the first half is x[token, 16 + h, j], of the second
    # half x[token, 16 + h, j + 64]. Heads past num_heads are masked. STORE: the result also goes
    # to cache_ptr's row `slot` (skipped for slot < 0, a padding token), see _store_cache_heads.
    heads = head_start + tl.arange(0, HEADS_PER_PROGRAM)
    dims = tl.arange(0, HALF_DIM)
    mask = (heads < num_heads)[:, None]
    first_offsets = token * token_stride + heads[:, None] * head_stride + dims[None, :]
    second_offsets = first_offsets + HALF_DIM
    first = tl.load(x_ptr + first_offsets, mask=mask, other=0.0).to(tl.float32)
    second = tl.load(x_ptr + second_offsets, mask=mask, other=0.0).to(tl.float32)

    if APPLY_NORM:
        # RMS over the whole head (both halves): mean over 2 * HALF_DIM values per head.
        mean_square = (tl.sum(first * first, axis=1) + tl.sum(second * second, axis=1)) / (2 * HALF_DIM)
        inverse_rms = (1.0 / tl.sqrt(mean_square + eps))[:, None]
        first = first * inverse_rms * tl.load(weight_ptr + dims).to(tl.float32)[None, :]
        second = second * inverse_rms * tl.load(weight_ptr + HALF_DIM + dims).to(tl.float32)[None, :]

    rotated_first = first * cos[None, :] - second * sin[None, :]
    rotated_second = second * cos[None, :] + first * sin[None, :]
    out_dtype = x_ptr.dtype.element_ty
    rounded_first, rounded_second = rotated_first.to(out_dtype), rotated_second.to(out_dtype)
    tl.store(x_ptr + first_offsets, rounded_first, mask=mask)
    tl.store(x_ptr + second_offsets, rounded_second, mask=mask)
    if STORE:
        cache_first = _cache_offsets(slot, heads, num_heads, 2 * HALF_DIM) + dims[None, :]
        cache_mask = _stored_heads_mask(slot, heads, num_heads)
        cache_dtype = cache_ptr.dtype.element_ty
        tl.store(cache_ptr + cache_first, rounded_first.to(cache_dtype), mask=cache_mask)
        tl.store(cache_ptr + cache_first + HALF_DIM, rounded_second.to(cache_dtype), mask=cache_mask)


@triton.jit
def _cache_offsets(slot, heads, num_heads, HEAD_DIM: tl.constexpr):
    # [HEADS, 1] offsets of each head's row start in a contiguous [num_blocks, block_size, num_heads,
    # HEAD_DIM] cache: slot 37, 8 heads x 128 dims -> head h at 37 * 1024 + h * 128 (int64: a large
    # cache passes 2**31 elements).
    return slot.to(tl.int64) * (num_heads * HEAD_DIM) + heads[:, None] * HEAD_DIM


@triton.jit
def _stored_heads_mask(slot, heads, num_heads):
    # [HEADS, 1]: the heads that exist, none for a padding token (slot -1). (A scalar `slot >= 0` and-ed
    # into the head mask is rejected by Triton's interpreter as a store mask; this form is not.)
    return (heads < tl.where(slot >= 0, num_heads, 0))[:, None]


@triton.jit
def _copy_heads_to_cache(
    v_ptr,
    token,
    token_stride,
    head_stride,
    head_start,
    num_heads,
    cache_ptr,
    slot,
    HEAD_DIM: tl.constexpr,
    HEADS_PER_PROGRAM: tl.constexpr,
):
    # v[token, head_start:head_start + HEADS_PER_PROGRAM, :] -> cache row `slot`, as store_kv copies it.
    heads = head_start + tl.arange(0, HEADS_PER_PROGRAM)
    dims = tl.arange(0, HEAD_DIM)
    mask = _stored_heads_mask(slot, heads, num_heads)
    rows = tl.load(v_ptr + token * token_stride + heads[:, None] * head_stride + dims[None, :], mask=mask)
    cache = _cache_offsets(slot, heads, num_heads, HEAD_DIM) + dims[None, :]
    tl.store(cache_ptr + cache, rows.to(cache_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _qk_norm_rope_kernel(
    q_ptr,
    k_ptr,
    q_weight_ptr,
    k_weight_ptr,
    cos_sin_ptr,
    positions_ptr,
    q_token_stride,
    q_head_stride,
    k_token_stride,
    k_head_stride,
    num_q_heads,
    num_kv_heads,
    num_q_programs,
    eps,
    v_ptr,
    v_token_stride,
    v_head_stride,
    k_cache_ptr,
    v_cache_ptr,
    slots_ptr,
    HALF_DIM: tl.constexpr,
    HEADS_PER_PROGRAM: tl.constexpr,
    APPLY_NORM: tl.constexpr,
    STORE_KV: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    wait_then_release(USE_PDL)  # first: see fast/kernels/pdl.py
    # Grid (num_tokens, num_q_programs + num_kv_programs): 32 q heads, 8 kv heads, 8 heads per
    # program -> head blocks 0..3 are q heads 0-7, 8-15, 16-23, 24-31 and block 4 is k heads 0-7.
    # Equal-sized programs keep the SMs evenly loaded; q and k share one launch. With STORE_KV the
    # k programs also write their heads of k and v to the caches (v, caches and slots unread otherwise).
    token = tl.program_id(0).to(tl.int64)
    head_block = tl.program_id(1)
    position = tl.load(positions_ptr + token)
    # cos_sin_cache row of `position`: [cos_0 .. cos_{half-1}, sin_0 .. sin_{half-1}].
    dims = tl.arange(0, HALF_DIM)
    cos = tl.load(cos_sin_ptr + position * (2 * HALF_DIM) + dims)
    sin = tl.load(cos_sin_ptr + position * (2 * HALF_DIM) + HALF_DIM + dims)
    if head_block < num_q_programs:
        _norm_rope_heads(
            q_ptr,
            q_weight_ptr,
            token,
            q_token_stride,
            q_head_stride,
            head_block * HEADS_PER_PROGRAM,
            num_q_heads,
            cos,
            sin,
            eps,
            q_ptr,
            0,
            HALF_DIM,
            HEADS_PER_PROGRAM,
            APPLY_NORM,
            False,
        )
    else:
        slot = tl.load(slots_ptr + token) if STORE_KV else -1
        head_start = (head_block - num_q_programs) * HEADS_PER_PROGRAM
        _norm_rope_heads(
            k_ptr,
            k_weight_ptr,
            token,
            k_token_stride,
            k_head_stride,
            head_start,
            num_kv_heads,
            cos,
            sin,
            eps,
            k_cache_ptr,
            slot,
            HALF_DIM,
            HEADS_PER_PROGRAM,
            APPLY_NORM,
            STORE_KV,
        )
        if STORE_KV:
            _copy_heads_to_cache(
                v_ptr,
                token,
                v_token_stride,
                v_head_stride,
                head_start,
                num_kv_heads,
                v_cache_ptr,
                slot,
                2 * HALF_DIM,
                HEADS_PER_PROGRAM,
            )


def qk_norm_rope_(
    q: torch.Tensor,
    k: torch.Tensor,
    q_weight: torch.Tensor | None,
    k_weight: torch.Tensor | None,
    cos_sin_cache: torch.Tensor,
    positions: torch.Tensor,
    eps: float,
    *,
    heads_per_program: int = 8,
    num_warps: int = 2,
    pdl: bool = False,
) -> None:
    """Apply per-head RMSNorm then rotate-half RoPE to q and k, in place (trailing underscore).

    With q_weight and k_weight both None the norm is skipped (RoPE only: Llama and Qwen2,
    see `rope_`). heads_per_program (a power of two) and num_warps are tuning knobs; the
    defaults were measured best on an H200 (see fast/kernels/NOTES.md).

    Positions are not range-checked against cos_sin_cache (that would need a device sync):
    the caller guarantees 0 <= position < max_positions.
    """
    _norm_rope(q, k, q_weight, k_weight, cos_sin_cache, positions, eps, None, (heads_per_program, num_warps, pdl))


def qk_norm_rope_store_kv_(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_weight: torch.Tensor | None,
    k_weight: torch.Tensor | None,
    cos_sin_cache: torch.Tensor,
    positions: torch.Tensor,
    eps: float,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    heads_per_program: int = 8,
    num_warps: int = 2,
    pdl: bool = False,
) -> None:
    """`qk_norm_rope_`, then `store_kv(k, v, k_cache, v_cache, slot_mapping)`, in one kernel: the same
    values in q, k and the caches (the cached k is the k stored back, rounded once). Arguments as those
    two functions take them; padding tokens (slot < 0) are rotated but not stored."""
    cache = (v, k_cache, v_cache, slot_mapping)
    _norm_rope(q, k, q_weight, k_weight, cos_sin_cache, positions, eps, cache, (heads_per_program, num_warps, pdl))


def _norm_rope(
    q: torch.Tensor,
    k: torch.Tensor,
    q_weight: torch.Tensor | None,
    k_weight: torch.Tensor | None,
    cos_sin_cache: torch.Tensor,
    positions: torch.Tensor,
    eps: float,
    cache: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None,
    launch: tuple[int, int, bool],
) -> None:
    """Check the arguments (TypeError/ValueError naming a bad one), then launch. cache: (v, k_cache,
    v_cache, slot_mapping) to store k and v too, or None; launch: (heads_per_program, num_warps, pdl)."""
    heads_per_program, num_warps, pdl = launch
    check_tensor("q", q, ndim=3, dtypes=FLOAT_DTYPES)
    check_tensor("k", k, ndim=3, dtypes=FLOAT_DTYPES)
    apply_norm = _check_norm_weights(q, q_weight, k_weight)
    check_tensor("cos_sin_cache", cos_sin_cache, ndim=2, dtypes=(torch.float32,))
    check_tensor("positions", positions, ndim=1, dtypes=(torch.int64,))
    num_tokens, _, head_dim = q.shape
    check_shape("k", k, (num_tokens, None, head_dim))
    check_shape("cos_sin_cache", cos_sin_cache, (None, head_dim))
    check_shape("positions", positions, (num_tokens,))
    check_same_dtype("q", q, k=k)
    check_same_device("q", q, k=k, cos_sin_cache=cos_sin_cache, positions=positions)
    check_last_dim_contiguous("q", q)
    check_last_dim_contiguous("k", k)
    for name, tensor in (("cos_sin_cache", cos_sin_cache), ("positions", positions)):
        check_contiguous(name, tensor)
    if head_dim < 2 or head_dim & (head_dim - 1):
        raise ValueError(f"head_dim must be a power of two >= 2, got {head_dim}")
    if not isinstance(eps, float) or eps <= 0:
        raise ValueError(f"eps must be a positive float, got {eps!r}")
    if heads_per_program < 1 or heads_per_program & (heads_per_program - 1):
        raise ValueError(f"heads_per_program must be a power of two, got {heads_per_program}")
    if cache is not None:
        check_store_kv_args(k, *cache)
    num_q_heads, num_kv_heads = q.shape[1], k.shape[1]
    if num_tokens == 0:
        return
    # Pointers the kernel never reads (no norm, no store) are passed as q: valid, and of no consequence.
    q_weight_arg = q_weight if q_weight is not None else q
    k_weight_arg = k_weight if k_weight is not None else q
    v, k_cache, v_cache, slots = cache if cache is not None else (q, q, q, positions)
    num_q_programs = triton.cdiv(num_q_heads, heads_per_program)
    num_kv_programs = triton.cdiv(num_kv_heads, heads_per_program)
    _qk_norm_rope_kernel[(num_tokens, num_q_programs + num_kv_programs)](
        q,
        k,
        q_weight_arg,
        k_weight_arg,
        cos_sin_cache,
        positions,
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        num_q_heads,
        num_kv_heads,
        num_q_programs,
        eps,
        v,
        v.stride(0),
        v.stride(1),
        k_cache,
        v_cache,
        slots,
        HALF_DIM=head_dim // 2,
        HEADS_PER_PROGRAM=heads_per_program,
        APPLY_NORM=apply_norm,
        STORE_KV=cache is not None,
        USE_PDL=pdl,
        launch_pdl=pdl,
        num_warps=num_warps,
    )


def rope_(q: torch.Tensor, k: torch.Tensor, cos_sin_cache: torch.Tensor, positions: torch.Tensor) -> None:
    """Rotate-half RoPE on q and k in place, without the per-head norm (Llama, Qwen2)."""
    qk_norm_rope_(q, k, None, None, cos_sin_cache, positions, 1e-6)


def _check_norm_weights(q: torch.Tensor, q_weight: torch.Tensor | None, k_weight: torch.Tensor | None) -> bool:
    """Whether the norm applies: both weights given ([head_dim] each, on q's device) or neither."""
    if q_weight is None and k_weight is None:
        return False
    if q_weight is None or k_weight is None:
        raise ValueError("q_weight and k_weight must both be given (norm + RoPE) or both be None (RoPE only)")
    for name, weight in (("q_weight", q_weight), ("k_weight", k_weight)):
        check_tensor(name, weight, ndim=1, dtypes=FLOAT_DTYPES)
        check_shape(name, weight, (q.shape[2],))
        check_contiguous(name, weight)
    check_same_device("q", q, q_weight=q_weight, k_weight=k_weight)
    return True
