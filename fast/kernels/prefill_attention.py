"""Paged causal attention for prefill and mixed batches (queries shorter than keys allowed).

Layout:
    q                  [num_tokens, num_q_heads, head_dim]: the new tokens of all sequences,
                       packed; sequence s owns rows cu_seqlens_q[s] .. cu_seqlens_q[s+1]-1
    cu_seqlens_q       int32 [num_seqs + 1]
    seq_lens           int32 [num_seqs]: keys of sequence s INCLUDING its new tokens (their K/V
                       are already in the cache)
    block_tables       int32 [num_seqs, max_blocks_per_seq]; entries past a sequence's blocks are never read
    k_cache, v_cache   [num_blocks, block_size, num_kv_heads, head_dim]   contiguous
    out                [num_tokens, num_q_heads, head_dim] in q's dtype

Query i of sequence s (q_len = cu_seqlens_q[s+1] - cu_seqlens_q[s]) sits at position
context + i with context = seq_lens[s] - q_len, and sees keys 0 .. context + i. That makes
prefix-cache hits and chunked prefill exact: e.g. seq_len 100, q_len 3 -> queries at 97, 98, 99.

Grid (num_q_heads, num_m_blocks, num_seqs): one program = BLOCK_M queries of one head of one
sequence. Heads vary fastest, so the heads of a GQA group run side by side and share their
K/V tiles through L2. Query blocks are visited last-first, so the longest programs (most keys
under the diagonal) start first and the short ones fill the tail.

Packed GQA rows (PACK_GQA, batch-invariant mode): grid (num_kv_heads, num_m_blocks, num_seqs), and
a program's BLOCK_M rows are (token, head) pairs of the query heads that share one KV head:
row r = token r // group_size, head kv_head * group_size + r % group_size. With group_size 2 and
BLOCK_M 16, a program holds 8 tokens x 2 heads; a decode step's program holds 1 token x 2 heads
(2 live rows of 16, against 1 of BLOCK_M unpacked), and each K/V tile is read once per KV head.

Key tiles are visited in two loops: tiles fully under the causal diagonal need no mask; only
the few tiles that cross the diagonal are masked. Tiles entirely above the diagonal are never
visited (the loop stops at the last key any query of the block can see).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from fast.kernels._checks import (
    check_contiguous,
    check_paged_attention_inputs,
    check_positive_int,
    check_power_of_two,
    check_same_device,
    check_shape,
    check_tensor,
    output_like,
)
from fast.kernels.pdl import wait_then_release

_LOG2_E = 1.4426950408889634  # exp(x) = exp2(x * log2(e)); the kernels use exp2


@triton.jit
def _attend_tile(
    q,
    acc,
    row_max,
    row_sum,
    tile_start,
    query_positions,
    key_end,
    block_table_row,
    k_cache_ptr,
    v_cache_ptr,
    slot_stride,
    head_offset,
    scale_log2,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    MASKED: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """One online-softmax step over keys tile_start .. tile_start + BLOCK_N - 1."""
    keys = tile_start + tl.arange(0, BLOCK_N)
    dims = tl.arange(0, HEAD_DIM)
    # Page lookup per key: block_size=16, key 37 -> table entry 2, offset 5.
    if MASKED:
        key_valid = keys < key_end
        block_ids = tl.load(block_table_row + keys // BLOCK_SIZE, mask=key_valid, other=0)
    else:
        block_ids = tl.load(block_table_row + keys // BLOCK_SIZE)
    slots = block_ids.to(tl.int64) * BLOCK_SIZE + keys % BLOCK_SIZE
    kv_offsets = slots[:, None] * slot_stride + head_offset + dims[None, :]
    if MASKED:
        k = tl.load(k_cache_ptr + kv_offsets, mask=key_valid[:, None], other=0.0)
        v = tl.load(v_cache_ptr + kv_offsets, mask=key_valid[:, None], other=0.0)
    else:
        k = tl.load(k_cache_ptr + kv_offsets)
        v = tl.load(v_cache_ptr + kv_offsets)

    # scores [BLOCK_M, BLOCK_N] = q [BLOCK_M, D] @ k^T [D, BLOCK_N], in base-2 units.
    scores = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale_log2
    if MASKED:
        # Causal: query at position p sees keys <= p. Keys past the sequence end are
        # always above some query's diagonal too, since the last query sits at seq_len - 1.
        visible = keys[None, :] <= query_positions[:, None]
        scores = tl.where(visible, scores, float("-inf"))
    new_max = tl.maximum(row_max, tl.max(scores, axis=1))
    # A fully masked row (a padding query past q_len) keeps max -inf: subtract 0 instead so
    # exp2 gives 0, not NaN.
    safe_max = tl.where(new_max == float("-inf"), 0.0, new_max)
    correction = tl.exp2(row_max - safe_max)
    probs = tl.exp2(scores - safe_max[:, None])
    row_sum = row_sum * correction + tl.sum(probs, axis=1)
    acc = acc * correction[:, None] + tl.dot(probs.to(v.dtype), v, input_precision=DOT_PRECISION)
    return acc, new_max, row_sum


@triton.jit
def _prefill_attention_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    out_ptr,
    cu_seqlens_q_ptr,
    seq_lens_ptr,
    block_tables_ptr,
    q_token_stride,
    q_head_stride,
    out_token_stride,
    out_head_stride,
    block_table_stride,
    num_kv_heads,
    group_size,
    num_m_blocks,
    scale_log2,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    ALWAYS_MASK: tl.constexpr,
    PACK_GQA: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    wait_then_release(USE_PDL)  # first: see fast/kernels/pdl.py
    m_block = num_m_blocks - 1 - tl.program_id(1)  # heavy (late) query blocks first
    seq = tl.program_id(2)
    lanes = tl.arange(0, BLOCK_M)
    if PACK_GQA:
        # Lane r: token r // group_size of the block, head r % group_size of the KV head's group;
        # group_size 3, BLOCK_M 16 -> 5 tokens in lanes 0..14, lane 15 idle.
        kv_head = tl.program_id(0)
        tokens_per_block = BLOCK_M // group_size
        lane_token = lanes // group_size
        lane_head = kv_head * group_size + lanes % group_size
        lane_valid = lane_token < tokens_per_block
    else:
        q_head = tl.program_id(0)
        kv_head = q_head // group_size
        tokens_per_block = BLOCK_M
        lane_token = lanes
        lane_head = tl.full([BLOCK_M], 0, dtype=tl.int32) + q_head
        lane_valid = lanes < BLOCK_M

    q_start = tl.load(cu_seqlens_q_ptr + seq)
    q_len = tl.load(cu_seqlens_q_ptr + seq + 1) - q_start
    m_start = m_block * tokens_per_block
    if m_start >= q_len:
        # The grid is sized for the longest sequence (max_seqlen_q); shorter ones have fewer blocks.
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    context = seq_len - q_len

    # Rows of this block: seq_len=1000, q_len=300 (context 700), BLOCK_M=128, m_block 2 ->
    # rows 256..383, valid 256..299, at positions 956..999.
    rows = m_start + lane_token
    row_valid = lane_valid & (rows < q_len)
    query_positions = context + rows
    dims = tl.arange(0, HEAD_DIM)
    row_offsets = (q_start + rows).to(tl.int64)
    q_offsets = row_offsets[:, None] * q_token_stride + lane_head[:, None] * q_head_stride + dims[None, :]
    q = tl.load(q_ptr + q_offsets, mask=row_valid[:, None], other=0.0)

    slot_stride = num_kv_heads * HEAD_DIM
    head_offset = kv_head * HEAD_DIM
    block_table_row = block_tables_ptr + seq.to(tl.int64) * block_table_stride

    row_max = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    row_sum = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)

    # Keys 0 .. context + m_start are visible to every row of the block (the first row sits at
    # context + m_start), so whole tiles below that need no mask: context 700, m_start 256,
    # BLOCK_N 64 -> keys 0..956 visible to all -> 14 unmasked tiles (keys 0..895).
    unmasked_end = ((context + m_start + 1) // BLOCK_N) * BLOCK_N
    if ALWAYS_MASK:
        # Batch-invariant mode: every tile through the masked path. Which tiles are unmasked depends on
        # the block's first row, i.e. on how the queries were chunked; and the two paths round
        # differently on a GPU (the compiler fuses scale and max subtraction into one FMA only where no
        # mask sits between them), so a row's result must not depend on the path its tiles took.
        unmasked_end = 0
    # The block's last valid row sees keys up to context + min(m_start + tokens_per_block, q_len) - 1;
    # tiles past that are above the diagonal for every row and are not visited at all.
    key_end = context + tl.minimum(m_start + tokens_per_block, q_len)
    for tile_start in range(0, unmasked_end, BLOCK_N):
        acc, row_max, row_sum = _attend_tile(
            q,
            acc,
            row_max,
            row_sum,
            tile_start,
            query_positions,
            key_end,
            block_table_row,
            k_cache_ptr,
            v_cache_ptr,
            slot_stride,
            head_offset,
            scale_log2,
            HEAD_DIM,
            BLOCK_SIZE,
            BLOCK_N,
            False,
            DOT_PRECISION,
        )
    for tile_start in range(unmasked_end, key_end, BLOCK_N):
        acc, row_max, row_sum = _attend_tile(
            q,
            acc,
            row_max,
            row_sum,
            tile_start,
            query_positions,
            key_end,
            block_table_row,
            k_cache_ptr,
            v_cache_ptr,
            slot_stride,
            head_offset,
            scale_log2,
            HEAD_DIM,
            BLOCK_SIZE,
            BLOCK_N,
            True,
            DOT_PRECISION,
        )

    # Padding rows have row_sum 0; divide by 1 instead and never store them.
    safe_sum = tl.where(row_sum > 0, row_sum, 1.0)
    result = acc / safe_sum[:, None]
    out_offsets = row_offsets[:, None] * out_token_stride + lane_head[:, None] * out_head_stride + dims[None, :]
    tl.store(out_ptr + out_offsets, result.to(out_ptr.dtype.element_ty), mask=row_valid[:, None])


def _default_tiles(head_dim: int, dtype: torch.dtype, device: torch.device) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages) by head dim and dtype; tuned on an H200 (see NOTES.md).

    Shared memory bounds the choice: each pipeline stage holds a K and a V tile
    (2 * BLOCK_N * head_dim * element bytes; bf16, 64 x 128 -> 32 KiB), next to the q tile, and
    Hopper gives a program at most 227 KiB. fp32 (no tensor-core path worth tuning) gets small tiles.
    """
    if device.type != "cuda":
        return 64, 32, 4, 1  # interpreter: tile sizes only change how many numpy ops run
    if dtype == torch.float32:
        return (64, 32, 4, 2) if head_dim <= 128 else (32, 32, 4, 2)
    if head_dim <= 64:
        return 128, 64, 4, 3
    if head_dim <= 128:
        return 128, 32, 4, 4
    return 64, 32, 4, 2


def prefill_attention(
    q: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
    block_tables: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    scale: float,
    max_seqlen_q: int,
    *,
    block_m: int | None = None,
    block_n: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    out: torch.Tensor | None = None,
    always_mask: bool = False,
    pack_gqa: bool = False,
    pdl: bool = False,
) -> torch.Tensor:
    """Causal attention of packed queries over their paged caches; returns [num_tokens, num_q_heads, head_dim].

    always_mask: take the masked path for every key tile, so that a query row's arithmetic does not
        depend on where its query block starts (batch-invariant mode; slower).
    pack_gqa: a program's rows are (token, head) pairs of one KV head's query heads (block_m must
        hold a whole group): a one-token query fills group_size rows of the tile instead of one.
    pdl: launch with programmatic dependent launch (fast/kernels/pdl.py): the same bits; CUDA on Hopper only.

    max_seqlen_q: host-known maximum of the q lengths (sizes the grid; no device sync).
    Requirements not checked (they would need a sync): cu_seqlens_q is non-decreasing with
    cu_seqlens_q[-1] == num_tokens, each q length <= max_seqlen_q and <= its seq_lens entry,
    and each sequence's block-table row covers seq_lens[s] keys.
    """
    block_size, num_kv_heads = check_paged_attention_inputs(q, k_cache, v_cache, block_tables, seq_lens, scale)
    num_tokens, num_q_heads, head_dim = q.shape
    num_seqs = seq_lens.shape[0]
    check_tensor("cu_seqlens_q", cu_seqlens_q, ndim=1, dtypes=(torch.int32,))
    check_shape("cu_seqlens_q", cu_seqlens_q, (num_seqs + 1,))
    check_same_device("q", q, cu_seqlens_q=cu_seqlens_q)
    check_contiguous("cu_seqlens_q", cu_seqlens_q)
    check_positive_int("max_seqlen_q", max_seqlen_q)

    default_m, default_n, default_warps, default_stages = _default_tiles(head_dim, q.dtype, q.device)
    block_m = block_m or default_m
    block_n = block_n or default_n
    check_power_of_two("block_m", block_m, low=16, high=256)
    check_power_of_two("block_n", block_n, low=16, high=256)

    out = output_like("out", q, out)
    if num_tokens == 0 or num_seqs == 0:
        return out

    group_size = num_q_heads // num_kv_heads
    if pack_gqa and group_size > block_m:
        raise ValueError(f"pack_gqa needs block_m >= the GQA group size ({group_size}); got block_m={block_m}")
    tokens_per_block = block_m // group_size if pack_gqa else block_m
    num_m_blocks = triton.cdiv(max_seqlen_q, tokens_per_block)
    program_heads = num_kv_heads if pack_gqa else num_q_heads
    _prefill_attention_kernel[(program_heads, num_m_blocks, num_seqs)](
        q,
        k_cache,
        v_cache,
        out,
        cu_seqlens_q,
        seq_lens,
        block_tables,
        q.stride(0),
        q.stride(1),
        out.stride(0),
        out.stride(1),
        block_tables.stride(0),
        num_kv_heads,
        group_size,
        num_m_blocks,
        scale * _LOG2_E,
        HEAD_DIM=head_dim,
        BLOCK_SIZE=block_size,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        # fp32 inputs: full-precision dot (Triton's default would be tf32 on GPUs).
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        ALWAYS_MASK=always_mask,
        PACK_GQA=pack_gqa,
        USE_PDL=pdl,
        num_warps=num_warps or default_warps,
        num_stages=num_stages or default_stages,
        launch_pdl=pdl,
    )
    return out
