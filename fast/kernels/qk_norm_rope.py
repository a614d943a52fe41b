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
from fast.kernels.rows_per_program import rows_per_program


@triton.jit
def _norm_rope_heads(
    x_ptr,
    weight_ptr,
    tokens,
    token_stride,
    head_stride,
    heads,
    num_heads,
    token_ok,
    cos,
    sin,
    eps,
    cache_ptr,
    slots,
    HALF_DIM: tl.constexpr,
    APPLY_NORM: tl.constexpr,
    STORE: tl.constexpr,
):
    # Tile [ROWS, HALF_DIM] for each half, a row per (token, head): tokens, heads, token_ok, slots are
    # [ROWS]; cos, sin [ROWS, HALF_DIM]. head_dim=128, 8 heads from head 16, one token -> two 8x64 tiles;
    # element (r, j) of the first half is x[tokens[r], heads[r], j], of the second half x[..., j + 64].
    # Rows of heads past num_heads, or of tokens past the last, are masked. STORE: the result also goes to
    # cache_ptr's row slots[r] (skipped for a slot < 0, a padding token), see _stored_heads_mask.
    dims = tl.arange(0, HALF_DIM)
    mask = ((heads < num_heads) & token_ok)[:, None]
    first_offsets = tokens[:, None] * token_stride + heads[:, None] * head_stride + dims[None, :]
    second_offsets = first_offsets + HALF_DIM
    first = tl.load(x_ptr + first_offsets, mask=mask, other=0.0).to(tl.float32)
    second = tl.load(x_ptr + second_offsets, mask=mask, other=0.0).to(tl.float32)

    if APPLY_NORM:
        # RMS over the whole head (both halves): mean over 2 * HALF_DIM values per head.
        mean_square = (tl.sum(first * first, axis=1) + tl.sum(second * second, axis=1)) / (2 * HALF_DIM)
        inverse_rms = (1.0 / tl.sqrt(mean_square + eps))[:, None]
        first = first * inverse_rms * tl.load(weight_ptr + dims).to(tl.float32)[None, :]
        second = second * inverse_rms * tl.load(weight_ptr + HALF_DIM + dims).to(tl.float32)[None, :]

    rotated_first = first * cos - second * sin
    rotated_second = second * cos + first * sin
    out_dtype = x_ptr.dtype.element_ty
    rounded_first, rounded_second = rotated_first.to(out_dtype), rotated_second.to(out_dtype)
    tl.store(x_ptr + first_offsets, rounded_first, mask=mask)
    tl.store(x_ptr + second_offsets, rounded_second, mask=mask)
    if STORE:
        cache_first = _cache_offsets(slots, heads, num_heads, 2 * HALF_DIM) + dims[None, :]
        cache_mask = _stored_heads_mask(slots, heads, num_heads)
        cache_dtype = cache_ptr.dtype.element_ty
        tl.store(cache_ptr + cache_first, rounded_first.to(cache_dtype), mask=cache_mask)
        tl.store(cache_ptr + cache_first + HALF_DIM, rounded_second.to(cache_dtype), mask=cache_mask)


@triton.jit
def _cache_offsets(slots, heads, num_heads, HEAD_DIM: tl.constexpr):
    # [ROWS, 1] offsets of each row's head start in a contiguous [num_blocks, block_size, num_heads,
    # HEAD_DIM] cache: slot 37, head h of 8 heads x 128 dims -> 37 * 1024 + h * 128 (int64: a large
    # cache passes 2**31 elements).
    return slots[:, None].to(tl.int64) * (num_heads * HEAD_DIM) + heads[:, None] * HEAD_DIM


@triton.jit
def _stored_heads_mask(slots, heads, num_heads):
    # [ROWS, 1]: the rows whose head exists and whose token is stored (not a padding token, slot -1; not
    # a row past the last token, loaded as slot -1).
    return (heads < tl.where(slots >= 0, num_heads, 0))[:, None]


@triton.jit
def _copy_heads_to_cache(
    v_ptr,
    tokens,
    token_stride,
    head_stride,
    heads,
    num_heads,
    cache_ptr,
    slots,
    HEAD_DIM: tl.constexpr,
):
    # v[tokens[r], heads[r], :] -> cache row slots[r], for each row r, as store_kv copies them.
    dims = tl.arange(0, HEAD_DIM)
    mask = _stored_heads_mask(slots, heads, num_heads)
    rows = tl.load(v_ptr + tokens[:, None] * token_stride + heads[:, None] * head_stride + dims[None, :], mask=mask)
    cache = _cache_offsets(slots, heads, num_heads, HEAD_DIM) + dims[None, :]
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
    num_tokens,
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
    TOKENS_PER_PROGRAM: tl.constexpr,
    APPLY_NORM: tl.constexpr,
    STORE_KV: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    wait_then_release(USE_PDL)  # first: see fast/kernels/pdl.py
    # Grid (cdiv(num_tokens, TOKENS_PER_PROGRAM), num_q_programs + num_kv_programs): 32 q heads, 8 kv
    # heads, 8 heads per program -> head blocks 0..3 are q heads 0-7, 8-15, 16-23, 24-31 and block 4 is
    # k heads 0-7. Equal-sized programs keep the SMs evenly loaded; q and k share one launch. With
    # STORE_KV the k programs also write their heads of k and v to the caches (v, caches and slots unread
    # otherwise). A program's rows are (token, head) pairs, token-major: TOKENS_PER_PROGRAM is 1 on a GPU
    # (a token's heads per program) and larger in Triton's interpreter, where a program's cost goes by
    # its operations, not its size (see qk_norm_rope_).
    rows = tl.arange(0, TOKENS_PER_PROGRAM * HEADS_PER_PROGRAM)
    tokens = tl.program_id(0).to(tl.int64) * TOKENS_PER_PROGRAM + rows // HEADS_PER_PROGRAM
    token_ok = tokens < num_tokens
    head_block = tl.program_id(1)
    positions = tl.load(positions_ptr + tokens, mask=token_ok, other=0)
    # cos_sin_cache row of each row's position: [cos_0 .. cos_{half-1}, sin_0 .. sin_{half-1}].
    dims = tl.arange(0, HALF_DIM)
    cos = tl.load(cos_sin_ptr + positions[:, None] * (2 * HALF_DIM) + dims[None, :])
    sin = tl.load(cos_sin_ptr + positions[:, None] * (2 * HALF_DIM) + HALF_DIM + dims[None, :])
    if head_block < num_q_programs:
        heads = head_block * HEADS_PER_PROGRAM + rows % HEADS_PER_PROGRAM
        _norm_rope_heads(
            q_ptr,
            q_weight_ptr,
            tokens,
            q_token_stride,
            q_head_stride,
            heads,
            num_q_heads,
            token_ok,
            cos,
            sin,
            eps,
            q_ptr,
            tokens,
            HALF_DIM,
            APPLY_NORM,
            False,
        )
    else:
        slots = tl.load(slots_ptr + tokens, mask=token_ok, other=-1) if STORE_KV else tokens
        heads = (head_block - num_q_programs) * HEADS_PER_PROGRAM + rows % HEADS_PER_PROGRAM
        _norm_rope_heads(
            k_ptr,
            k_weight_ptr,
            tokens,
            k_token_stride,
            k_head_stride,
            heads,
            num_kv_heads,
            token_ok,
            cos,
            sin,
            eps,
            k_cache_ptr,
            slots,
            HALF_DIM,
            APPLY_NORM,
            STORE_KV,
        )
        if STORE_KV:
            _copy_heads_to_cache(
                v_ptr,
                tokens,
                v_token_stride,
                v_head_stride,
                heads,
                num_kv_heads,
                v_cache_ptr,
                slots,
                2 * HALF_DIM,
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
    tokens_per_program: int | None = None,
    num_warps: int = 2,
    pdl: bool = False,
) -> None:
    """Apply per-head RMSNorm then rotate-half RoPE to q and k, in place (trailing underscore).

    With q_weight and k_weight both None the norm is skipped (RoPE only: Llama and Qwen2,
    see `rope_`). heads_per_program, tokens_per_program (powers of two) and num_warps are tuning
    knobs; the defaults were measured best on an H200 (see fast/kernels/NOTES.md). tokens_per_program
    defaults to 1 on a GPU and to more on the CPU (fast/kernels/rows_per_program.py).

    Positions are not range-checked against cos_sin_cache (that would need a device sync):
    the caller guarantees 0 <= position < max_positions.
    """
    launch = (heads_per_program, tokens_per_program, num_warps, pdl)
    _norm_rope(q, k, q_weight, k_weight, cos_sin_cache, positions, eps, None, launch)


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
    tokens_per_program: int | None = None,
    num_warps: int = 2,
    pdl: bool = False,
) -> None:
    """`qk_norm_rope_`, then `store_kv(k, v, k_cache, v_cache, slot_mapping)`, in one kernel: the same
    values in q, k and the caches (the cached k is the k stored back, rounded once). Arguments as those
    two functions take them; padding tokens (slot < 0) are rotated but not stored."""
    cache = (v, k_cache, v_cache, slot_mapping)
    launch = (heads_per_program, tokens_per_program, num_warps, pdl)
    _norm_rope(q, k, q_weight, k_weight, cos_sin_cache, positions, eps, cache, launch)


def _norm_rope(
    q: torch.Tensor,
    k: torch.Tensor,
    q_weight: torch.Tensor | None,
    k_weight: torch.Tensor | None,
    cos_sin_cache: torch.Tensor,
    positions: torch.Tensor,
    eps: float,
    cache: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None,
    launch: tuple[int, int | None, int, bool],
) -> None:
    """Check the arguments (TypeError/ValueError naming a bad one), then launch. cache: (v, k_cache,
    v_cache, slot_mapping) to store k and v too, or None; launch: (heads_per_program, tokens_per_program,
    num_warps, pdl)."""
    heads_per_program, tokens_per_program, num_warps, pdl = launch
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
    tokens_per_program = rows_per_program("tokens_per_program", tokens_per_program, q)
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
    _qk_norm_rope_kernel[(triton.cdiv(num_tokens, tokens_per_program), num_q_programs + num_kv_programs)](
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
        num_tokens,
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
        TOKENS_PER_PROGRAM=tokens_per_program,
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
