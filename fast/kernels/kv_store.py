"""KV-store kernel: scatter the new tokens' K and V rows into the paged KV cache.

Layout (one layer):
    k, v               [num_tokens, num_kv_heads, head_dim]   rows may be strided
    k_cache, v_cache   [num_blocks, block_size, num_kv_heads, head_dim]   contiguous
    slot_mapping       int64 [num_tokens]; slot = block_id * block_size + offset_in_block,
                       -1 marks a padding token whose K/V must not be written.

Because the cache is contiguous, a slot addresses one dense row of
num_kv_heads * head_dim elements: slot s starts at element s * num_kv_heads * head_dim.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from fast.kernels._checks import (
    FLOAT_DTYPES,
    check_contiguous,
    check_same_device,
    check_same_dtype,
    check_shape,
    check_tensor,
)


@triton.jit
def _kv_store_kernel(
    k_ptr,
    v_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_mapping_ptr,
    k_token_stride,
    k_head_stride,
    v_token_stride,
    v_head_stride,
    num_kv_heads,
    HEAD_DIM: tl.constexpr,
    BLOCK_HEADS: tl.constexpr,
):
    # One program per token: it copies all of the token's heads (e.g. 8 heads x 128 dims
    # = 1024 elements) for both K and V.
    token = tl.program_id(0)
    slot = tl.load(slot_mapping_ptr + token)
    if slot < 0:
        # Padding token (slot -1): nothing to write.
        return

    heads = tl.arange(0, BLOCK_HEADS)  # padded to a power of two, masked below
    dims = tl.arange(0, HEAD_DIM)
    head_mask = (heads < num_kv_heads)[:, None]

    # Source rows: token t, head h starts at t * token_stride + h * head_stride.
    k_offsets = token.to(tl.int64) * k_token_stride + heads[:, None] * k_head_stride + dims[None, :]
    v_offsets = token.to(tl.int64) * v_token_stride + heads[:, None] * v_head_stride + dims[None, :]
    # Destination: slot 37 with 8 heads x 128 dims starts at element 37 * 1024; int64 because
    # a large cache (e.g. 100k blocks x 16 x 1024) passes 2**31 elements.
    cache_offsets = slot.to(tl.int64) * (num_kv_heads * HEAD_DIM) + heads[:, None] * HEAD_DIM + dims[None, :]

    k_rows = tl.load(k_ptr + k_offsets, mask=head_mask)
    v_rows = tl.load(v_ptr + v_offsets, mask=head_mask)
    tl.store(k_cache_ptr + cache_offsets, k_rows.to(k_cache_ptr.dtype.element_ty), mask=head_mask)
    tl.store(v_cache_ptr + cache_offsets, v_rows.to(v_cache_ptr.dtype.element_ty), mask=head_mask)


def store_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    num_warps: int = 4,
) -> None:
    """Write k and v ([num_tokens, num_kv_heads, head_dim]) into the caches at slot_mapping.

    In place on k_cache and v_cache. Tokens whose slot is negative are skipped. The rows
    of k and v may be strided (views into a fused qkv output) but the last dim must be dense.
    Slots are not range-checked (that would need a device sync): the caller guarantees
    0 <= slot < num_blocks * block_size for every non-padding token. num_warps is a tuning knob.
    """
    check_store_kv_args(k, v, k_cache, v_cache, slot_mapping)
    num_tokens, num_kv_heads, head_dim = k.shape
    if num_tokens == 0:
        return

    _kv_store_kernel[(num_tokens,)](
        k,
        v,
        k_cache,
        v_cache,
        slot_mapping,
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        num_kv_heads,
        HEAD_DIM=head_dim,
        BLOCK_HEADS=triton.next_power_of_2(num_kv_heads),
        num_warps=num_warps,
    )


def check_store_kv_args(
    k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """store_kv's argument checks (also those of fast.kernels.qk_norm_rope.qk_norm_rope_store_kv_)."""
    check_tensor("k", k, ndim=3, dtypes=FLOAT_DTYPES)
    check_tensor("v", v, ndim=3, dtypes=FLOAT_DTYPES)
    check_tensor("k_cache", k_cache, ndim=4, dtypes=FLOAT_DTYPES)
    check_tensor("v_cache", v_cache, ndim=4, dtypes=FLOAT_DTYPES)
    check_tensor("slot_mapping", slot_mapping, ndim=1, dtypes=(torch.int64,))
    num_tokens, num_kv_heads, head_dim = k.shape
    check_shape("v", v, (num_tokens, num_kv_heads, head_dim))
    check_shape("k_cache", k_cache, (None, None, num_kv_heads, head_dim))
    check_shape("v_cache", v_cache, tuple(k_cache.shape))
    check_shape("slot_mapping", slot_mapping, (num_tokens,))
    check_same_dtype("k", k, v=v)
    check_same_dtype("k_cache", k_cache, v_cache=v_cache)
    check_same_device("k", k, v=v, k_cache=k_cache, v_cache=v_cache, slot_mapping=slot_mapping)
    check_contiguous("k_cache", k_cache)
    check_contiguous("v_cache", v_cache)
    check_contiguous("slot_mapping", slot_mapping)
    for name, tensor in (("k", k), ("v", v)):
        if tensor.stride(2) != 1:
            raise ValueError(f"{name} must have stride 1 in its last dimension, got strides {tensor.stride()}")
    if head_dim & (head_dim - 1):
        raise ValueError(f"head_dim must be a power of two, got {head_dim}")
