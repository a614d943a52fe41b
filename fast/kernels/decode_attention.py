"""Paged decode attention (query_len new queries per sequence, 1 for a decode step), split along the KV length.

Layout:
    q                  [num_seqs * query_len, num_q_heads, head_dim]: sequence s's queries are rows
                       s * query_len .. s * query_len + query_len - 1, at its last query_len positions
    k_cache, v_cache   [num_blocks, block_size, num_kv_heads, head_dim]   contiguous
    block_tables       int32 [num_seqs, max_blocks_per_seq]; entries past a sequence's blocks
                       are never read, so they may hold anything (e.g. -1)
    seq_lens           int32 [num_seqs]: keys of each sequence, its new token included (>= 1)
    out                [num_seqs * query_len, num_q_heads, head_dim] in q's dtype

query_len > 1 is a verify step of speculative decoding (fast.attention: every chunk padded to 1 + K
tokens). Query t of a sequence of seq_len keys sees keys 0 .. seq_len - query_len + t, so the program
of a (sequence, KV head, split) packs all query_len x group rows into its tile and masks each row at its
own bound: 5 queries of a 2-head group are rows 0..9 of 16. A split past some rows' bounds leaves those
rows empty (weight 0, lse -inf), which the reduction skips; split 0 holds key 0, which every row sees.

Flash-decoding in two launches:
  1. `_decode_split_kernel`, grid (num_seqs, num_kv_heads, grid_splits): each program takes
     one KV head of one sequence and ALL the query heads that share that KV head (the GQA
     group, e.g. 32 q / 8 kv -> 4 heads, padded to 16 rows so `tl.dot` runs on tensor cores;
     with query_len > 1, every query's group rows),
     over the splits of `split_size` keys p, p + grid_splits, p + 2 * grid_splits, ... that the
     sequence has (program p of the split axis). K and V of a split are read once. It writes
     each split's normalised partial output and its log-sum-exp into fp32 workspaces.
  2. `_decode_reduce_kernel`, grid (num_seqs * query_len, num_q_heads): rescales a query's splits'
     partial outputs by exp(lse_split - lse_max), sums them and divides by the weights' sum.
     With counters (`decode_counters`), one query per sequence and at most LAST_PROGRAM_REDUCES_MAX_SPLITS
     splits, the last split program of each (sequence, KV head) to finish runs this reduction for its group's
     heads instead (REDUCE_LAST: the same code, `_reduce_head`; the same bits in the interpreter, and on a GPU
     unless the compiler lays the tile out otherwise inside the split kernel), and this launch is skipped:
     a decode step at batch 1 launched 2 attention kernels a layer, each a few microseconds of mostly fixed cost.
     Where max_seq_len fits one split the split kernel writes the output itself (WRITE_OUT) and this
     launch is skipped: with one split the reduction multiplies by exp2(0) = 1 and divides by 1, so the
     bits are the same (tests/fast/kernels/test_decode_attention.py). Triton's interpreter runs every program
     in Python, and the CPU's decode context buckets start at one split (fast/attention.py), so the
     engine's CPU tests save a launch per layer and step.

The number of splits comes from `max_seq_len`, a host-known bound (e.g. the model's
maximum context), never from seq_lens' values: no device sync, and the launch shapes stay
fixed, so the wrapper can be captured in a CUDA graph. A program visits only the splits its
sequence has (cdiv(seq_len, split_size)) and the reduction reads only those, so neither
kernel's work grows with max_seq_len.

Why the split axis of the grid is not always num_splits: one program per split made the grid
grow with max_seq_len, and the programs of splits past a sequence's length, which return at
once, were not free. On an H200 (reports/results/kernels/decode_splits_9613ba5/), 64 sequences
of 600 keys took 53 us a call with max_seq_len 2048 and 147 us with 40,960 (Qwen3's default
context): 163,840 programs, 98% of them empty. So where one program per split would make a large
grid, grid_splits is smaller (from host ints: the batch, the KV heads, the SM count) and each
program loops over its splits (_grid_splits). Which program computes a split does not change its
arithmetic, so the result is the same bits for every grid_splits.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from fast.kernels._checks import (
    FLOAT_DTYPES,
    check_paged_attention_inputs,
    check_positive_int,
    check_power_of_two,
    check_tensor,
    output_like,
)
from fast.kernels.arrival import last_to_arrive
from fast.kernels.pdl import wait_then_release

_LOG2_E = 1.4426950408889634  # exp(x) = exp2(x * log2(e)); the kernels use exp2
# The split kernel's grid aims at this many programs per SM (_grid_splits): at 64 sequences x 8 KV heads
# and 132 SMs that is 3 programs per (sequence, KV head), at batch 1 every split of a context of up to
# 132 x split_size keys side by side. From a sweep on an H200 at max_seq_len 40,960 (32 cases: batch
# 1-64, contexts 600 and 4096, split sizes 128 and 512, 8 and 4 KV heads; reports/results/kernels/
# decode_grid_sweep_142723a/), taking the nearest swept count at or below the one each rule picks: 8 came
# within 3.5% of each case's best count on average (14% at worst), 4 within 5.4% (23%), 32 within 4.7%
# (19%); one program per split (the old grid) 50% (3.5x).
GRID_PROGRAMS_PER_SM = 8
# ... but only where one program per split would make a large grid. The kernel compiled with the loop over a
# program's further splits (LOOP_SPLITS) is slower even where each program has one split (more registers
# and spills: 540 bytes against 112 in ptxas for sm_90 at head_dim 128): 64 sequences x 600 keys at
# max_seq_len 2048 took 57.8 us with 3 programs per (sequence, KV head) against 53.3 with one per split
# (16 splits, 8,192 programs: 62 per SM); 8 sequences at 40,960 took 11.0 us against 19.3 with one per
# split (20,480 programs: 155 per SM). So up to 124 programs per SM (16,384 on an H200) keep one per split.
ONE_PROGRAM_PER_SPLIT_MAX_PER_SM = 124
# Splits the reduction reads per iteration: a [16, head_dim] fp32 tile stays in registers however
# many splits max_seq_len allows (a 40,960-token context at 128-key splits has 320).
_REDUCE_BLOCK_SPLITS = 16
# The most splits for which the last split program reduces (REDUCE_LAST): one block of the reduction. It reduces
# its group's heads one after the other, which costs more than the reduction kernel's launch once there are many
# blocks to read (long contexts, whose splits take longer anyway).
LAST_PROGRAM_REDUCES_MAX_SPLITS = _REDUCE_BLOCK_SPLITS
# The most query rows (queries per sequence x the GQA group) one program's tile packs: a verify step's 5
# queries of Qwen3-8B's 4-head group are 20 rows in a 32-row tile. Wider steps take the prefill kernel.
MAX_DECODE_TILE_ROWS = 32


def decode_tile_rows(query_len: int, group_size: int) -> int:
    """The split kernel's tile rows: query_len x group_size rows, padded to a power of two of at least 16
    (tl.dot's smallest)."""
    return max(16, triton.next_power_of_2(query_len * group_size))


def fits_decode_tile(query_len: int, group_size: int) -> bool:
    """Whether query_len queries of a group_size-head group fit one program of the decode kernel."""
    return query_len * group_size <= MAX_DECODE_TILE_ROWS or query_len == 1


@triton.jit
def _decode_split_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    seq_lens_ptr,
    partial_out_ptr,
    partial_lse_ptr,
    out_ptr,
    counters_ptr,
    q_seq_stride,
    q_head_stride,
    out_seq_stride,
    out_head_stride,
    block_table_stride,
    num_kv_heads,
    group_size,
    split_size,
    num_splits,
    scale_log2,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_GROUP: tl.constexpr,
    QUERY_LEN: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    LOOP_SPLITS: tl.constexpr,  # grid_splits < num_splits: a program may take several splits
    WRITE_OUT: tl.constexpr,  # num_splits == 1: the output is written here, and no reduction runs
    REDUCE_LAST: tl.constexpr,  # the last program of each (sequence, KV head) reduces: no reduction kernel
    BLOCK_SPLITS: tl.constexpr,  # the reduction's splits per iteration (REDUCE_LAST)
    USE_PDL: tl.constexpr,
):
    wait_then_release(USE_PDL)  # first: see fast/kernels/pdl.py
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    first_split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + seq)
    # The sequence's splits: split_size=512, seq_len=1300 -> splits 0..2 (keys 0..511,
    # 512..1023, 1024..1299). With grid_splits=2, program 0 takes splits 0 and 2, program 1
    # split 1; splits 3+ are empty, visited by no program and never written (the reduction
    # reads only the sequence's own splits).
    num_used = tl.cdiv(seq_len, split_size)
    if first_split >= num_used:
        return
    # The program's first split, then (LOOP_SPLITS only) its further ones. Compiled with the loop the
    # kernel is slower even for programs of one split (see ONE_PROGRAM_PER_SPLIT_MAX_PER_SM), so the
    # wrapper keeps one program per split, and no loop, wherever that grid stays small.
    _attend_split(
        q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, partial_out_ptr, partial_lse_ptr, out_ptr, q_seq_stride,
        q_head_stride, out_seq_stride, out_head_stride, block_table_stride, num_kv_heads, group_size, split_size,
        num_splits, scale_log2, seq, kv_head, first_split, seq_len, HEAD_DIM, BLOCK_SIZE, BLOCK_GROUP, QUERY_LEN,
        BLOCK_N, DOT_PRECISION, WRITE_OUT,
    )  # fmt: skip
    if LOOP_SPLITS:
        grid_splits = tl.num_programs(2)
        for split in range(first_split + grid_splits, num_used, grid_splits):
            _attend_split(
                q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, partial_out_ptr, partial_lse_ptr, out_ptr,
                q_seq_stride, q_head_stride, out_seq_stride, out_head_stride, block_table_stride, num_kv_heads,
                group_size, split_size, num_splits, scale_log2, seq, kv_head, split, seq_len, HEAD_DIM, BLOCK_SIZE,
                BLOCK_GROUP, QUERY_LEN, BLOCK_N, DOT_PRECISION, False,
            )  # fmt: skip
    if REDUCE_LAST:
        # The programs of this (sequence, KV head) that have splits count themselves in as they finish; the
        # last reduces their splits.
        counter = counters_ptr + seq * num_kv_heads + kv_head
        if last_to_arrive(counter, tl.minimum(tl.num_programs(2), num_used)):
            num_q_heads = num_kv_heads * group_size
            for q_head in range(kv_head * group_size, (kv_head + 1) * group_size):
                _reduce_head(
                    partial_out_ptr, partial_lse_ptr, out_ptr, out_seq_stride, out_head_stride, seq, q_head,
                    num_q_heads, num_splits, num_used, HEAD_DIM, BLOCK_SPLITS, ".cg",
                )  # fmt: skip


@triton.jit
def _attend_split(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    partial_out_ptr,
    partial_lse_ptr,
    out_ptr,
    q_seq_stride,
    q_head_stride,
    out_seq_stride,
    out_head_stride,
    block_table_stride,
    num_kv_heads,
    group_size,
    split_size,
    num_splits,
    scale_log2,
    seq,
    kv_head,
    split,
    seq_len,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_GROUP: tl.constexpr,
    QUERY_LEN: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    WRITE_OUT: tl.constexpr,
):
    """One split of one sequence and KV head, for all its queries and the query heads of its group: keys
    [split * split_size, min((split + 1) * split_size, seq_len)), at least one of them. WRITE_OUT (one
    split in all): the normalised output goes straight to out."""
    split_start = split * split_size
    split_end = tl.minimum(split_start + split_size, seq_len)

    # Query rows: row r is query r // group_size of the sequence and head kv_head*group_size +
    # r % group_size; rows past QUERY_LEN * group_size are padding (zeros in, never stored). One query
    # of a 4-head group -> rows 0..3 real, 4..15 padding; 5 queries of a 2-head group -> rows 0..9.
    rows = tl.arange(0, BLOCK_GROUP)
    row_valid = rows < QUERY_LEN * group_size
    q_rows = seq.to(tl.int64) * QUERY_LEN + rows // group_size  # q's row of each tile row
    q_heads = kv_head * group_size + rows % group_size
    # Each row's keys end at its own position: query t sees keys < seq_len - QUERY_LEN + 1 + t.
    key_ends = seq_len - QUERY_LEN + 1 + rows // group_size
    dims = tl.arange(0, HEAD_DIM)
    q = tl.load(
        q_ptr + q_rows[:, None] * q_seq_stride + q_heads[:, None] * q_head_stride + dims[None, :],
        mask=row_valid[:, None],
        other=0.0,
    )

    # Running softmax state in base 2 (exp2 is cheaper than exp): scores are pre-multiplied by
    # scale * log2(e).
    row_max = tl.full([BLOCK_GROUP], float("-inf"), dtype=tl.float32)
    row_sum = tl.zeros([BLOCK_GROUP], dtype=tl.float32)
    acc = tl.zeros([BLOCK_GROUP, HEAD_DIM], dtype=tl.float32)

    # A cache slot holds num_kv_heads * HEAD_DIM elements; this head's row starts kv_head * HEAD_DIM in.
    slot_stride = num_kv_heads * HEAD_DIM
    head_offset = kv_head * HEAD_DIM
    block_table_row = block_tables_ptr + seq.to(tl.int64) * block_table_stride
    tile_tokens = tl.arange(0, BLOCK_N)
    for tile_start in range(split_start, split_end, BLOCK_N):
        tokens = tile_start + tile_tokens
        token_valid = tokens < split_end
        # Page lookup per token: block_size=16, token 37 -> table entry 2, offset 5, so its
        # slot is block_tables[seq, 2] * 16 + 5. Tokens past the end load no table entry.
        block_ids = tl.load(block_table_row + tokens // BLOCK_SIZE, mask=token_valid, other=0)
        slots = block_ids.to(tl.int64) * BLOCK_SIZE + tokens % BLOCK_SIZE
        kv_offsets = slots[:, None] * slot_stride + head_offset + dims[None, :]
        k = tl.load(k_cache_ptr + kv_offsets, mask=token_valid[:, None], other=0.0)
        v = tl.load(v_cache_ptr + kv_offsets, mask=token_valid[:, None], other=0.0)

        # scores [BLOCK_GROUP, BLOCK_N] = q [BLOCK_GROUP, D] @ k^T [D, BLOCK_N]
        scores = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale_log2
        scores = tl.where(tokens[None, :] < key_ends[:, None], scores, float("-inf"))
        # With one query every tile holds a key of every row (tile_start < split_end), so the max is
        # finite; with more, a row whose keys all lie before the tile keeps -inf: it is shifted by 0
        # instead, so its probabilities are exp2(-inf) = 0 and its correction exp2(-inf) = 0, not NaN.
        new_max = tl.maximum(row_max, tl.max(scores, axis=1))
        if QUERY_LEN > 1:
            new_max = tl.where(new_max == float("-inf"), 0.0, new_max)
        correction = tl.exp2(row_max - new_max)
        probs = tl.exp2(scores - new_max[:, None])
        row_sum = row_sum * correction + tl.sum(probs, axis=1)
        acc = acc * correction[:, None] + tl.dot(probs.to(v.dtype), v, input_precision=DOT_PRECISION)
        row_max = new_max

    # A row with a key in the split has row_sum >= 1 (its max term is exp2(0)). With more than one
    # query a row may have none: its row_sum is 0, and its split weighs nothing (lse -inf, output 0).
    if QUERY_LEN > 1:
        has_keys = row_sum > 0.0
        lse = tl.where(has_keys, row_max + tl.log2(row_sum), float("-inf"))
        partial = acc / tl.where(has_keys, row_sum, 1.0)[:, None]
    else:
        lse = row_max + tl.log2(row_sum)
        partial = acc / row_sum[:, None]

    if WRITE_OUT:
        # One split: the reduction would weigh it by exp2(0) = 1 and divide by 1, so this is its result.
        out_offsets = q_rows[:, None] * out_seq_stride + q_heads[:, None] * out_head_stride + dims[None, :]
        tl.store(out_ptr + out_offsets, partial.to(out_ptr.dtype.element_ty), mask=row_valid[:, None])
    else:
        # Workspace index: ((q_row * num_q_heads + q_head) * num_splits + split).
        num_q_heads = num_kv_heads * group_size
        lse_index = (q_rows * num_q_heads + q_heads) * num_splits + split
        tl.store(partial_lse_ptr + lse_index, lse, mask=row_valid)
        tl.store(partial_out_ptr + lse_index[:, None] * HEAD_DIM + dims[None, :], partial, mask=row_valid[:, None])


@triton.jit
def _decode_reduce_kernel(
    partial_out_ptr,
    partial_lse_ptr,
    seq_lens_ptr,
    out_ptr,
    out_seq_stride,
    out_head_stride,
    num_q_heads,
    num_splits,
    split_size,
    HEAD_DIM: tl.constexpr,
    BLOCK_SPLITS: tl.constexpr,
    QUERY_LEN: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    wait_then_release(USE_PDL)  # first: see fast/kernels/pdl.py
    q_row = tl.program_id(0)  # query q_row % QUERY_LEN of sequence q_row // QUERY_LEN
    q_head = tl.program_id(1)
    # Only the sequence's own splits were written: seq_len=1300, split_size=512 -> splits 0..2.
    # The count never depends on max_seq_len, so a long maximum context costs nothing here.
    num_used = tl.cdiv(tl.load(seq_lens_ptr + q_row // QUERY_LEN), split_size)
    _reduce_head(
        partial_out_ptr, partial_lse_ptr, out_ptr, out_seq_stride, out_head_stride, q_row, q_head, num_q_heads,
        num_splits, num_used, HEAD_DIM, BLOCK_SPLITS, "",
    )  # fmt: skip


@triton.jit
def _reduce_head(
    partial_out_ptr,
    partial_lse_ptr,
    out_ptr,
    out_seq_stride,
    out_head_stride,
    q_row,
    q_head,
    num_q_heads,
    num_splits,
    num_used,
    HEAD_DIM: tl.constexpr,
    BLOCK_SPLITS: tl.constexpr,
    LOAD_CACHE: tl.constexpr,  # ".cg" where other programs of the same kernel wrote the partials: read from L2
):
    """One query row and head: its num_used splits' partial outputs, weighted by exp2(lse_split - lse_max) and
    normalised, into out. The reduction kernel's program, and the split kernel's last program per head."""
    base = (q_row.to(tl.int64) * num_q_heads + q_head) * num_splits
    dims = tl.arange(0, HEAD_DIM)
    # Pass 1: the largest split lse (split 0 holds key 0, which every query sees, so it is finite).
    total_max = float("-inf")
    for start in range(0, num_used, BLOCK_SPLITS):
        splits = start + tl.arange(0, BLOCK_SPLITS)
        lse = tl.load(
            partial_lse_ptr + base + splits, mask=splits < num_used, other=float("-inf"), cache_modifier=LOAD_CACHE
        )
        total_max = tl.maximum(total_max, tl.max(lse, axis=0))
    # Pass 2: the splits' outputs weighted by exp2(lse_split - lse_max), normalised at the end.
    combined = tl.zeros([HEAD_DIM], dtype=tl.float32)
    weight_sum = 0.0
    for start in range(0, num_used, BLOCK_SPLITS):
        splits = start + tl.arange(0, BLOCK_SPLITS)
        used = splits < num_used
        lse = tl.load(partial_lse_ptr + base + splits, mask=used, other=float("-inf"), cache_modifier=LOAD_CACHE)
        weights = tl.exp2(lse - total_max)  # splits past the used ones: exp2(-inf) = 0
        partial = tl.load(
            partial_out_ptr + (base + splits)[:, None] * HEAD_DIM + dims[None, :],
            mask=used[:, None],
            other=0.0,
            cache_modifier=LOAD_CACHE,
        )
        combined += tl.sum(partial * weights[:, None], axis=0)
        weight_sum += tl.sum(weights, axis=0)
    out_offsets = q_row.to(tl.int64) * out_seq_stride + q_head * out_head_stride + dims
    tl.store(out_ptr + out_offsets, (combined / weight_sum).to(out_ptr.dtype.element_ty))


def _default_tiles(head_dim: int, dtype: torch.dtype) -> tuple[int, int, int]:
    """(BLOCK_N, num_warps, num_stages); tuned on an H200 (see NOTES.md).

    Each pipeline stage holds a K and a V tile: 2 * BLOCK_N * head_dim * element bytes
    (bf16, 64 x 128 -> 32 KiB); fp32 or head_dim 256 halve the depth so that three stages stay
    well inside Hopper's 227 KiB per program.
    """
    block_n = 64 if head_dim <= 128 else 32
    num_stages = 2 if dtype == torch.float32 else 3
    return block_n, 4, num_stages


@functools.cache
def _num_sms(device: torch.device) -> int:
    """The device's SM count (4 on the CPU), looked up once per device: every decode call's grid needs it."""
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4


def one_program_per_split(num_seqs: int, num_kv_heads: int, num_splits: int, device: torch.device) -> bool:
    """Whether the default grid has one program per split (the loop-free kernel) for these host ints:
    while the whole grid stays within ONE_PROGRAM_PER_SPLIT_MAX_PER_SM programs per SM."""
    return max(1, num_seqs * num_kv_heads) * num_splits <= ONE_PROGRAM_PER_SPLIT_MAX_PER_SM * _num_sms(device)


def _grid_splits(num_seqs: int, num_kv_heads: int, num_splits: int, device: torch.device) -> int:
    """Programs along the split axis, from host ints only. One per split where `one_program_per_split`;
    beyond that about GRID_PROGRAMS_PER_SM per SM in all, each taking every grid_splits-th split of its
    sequence."""
    if one_program_per_split(num_seqs, num_kv_heads, num_splits, device):
        return num_splits
    pairs = max(1, num_seqs * num_kv_heads)
    return max(1, min(num_splits, triton.cdiv(GRID_PROGRAMS_PER_SM * _num_sms(device), pairs)))


def _default_split_size(num_seqs: int, num_kv_heads: int, max_seq_len: int, device: torch.device) -> int:
    """Pick a split so that the grid has a few programs per SM, from host-known numbers only."""
    target_programs = 2 * _num_sms(device)
    programs_per_split = num_seqs * num_kv_heads
    wanted_splits = max(1, triton.cdiv(target_programs, programs_per_split))
    # Powers of two in [256, 4096]: below 256 keys the split's fixed costs (q load, partial
    # write) dominate; above 4096 there is little to gain and the reduction stays small.
    split_size = triton.next_power_of_2(max(1, triton.cdiv(max_seq_len, wanted_splits)))
    return max(256, min(4096, split_size))


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    max_seq_len: int,
    *,
    split_size: int | None = None,
    block_n: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    out: torch.Tensor | None = None,
    workspace: tuple[torch.Tensor, torch.Tensor] | None = None,
    pdl: bool = False,
    grid_splits: int | None = None,
    query_len: int = 1,
    counters: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of query_len queries per sequence (its last positions) over its paged cache; returns
    [num_seqs * query_len, num_q_heads, head_dim].

    max_seq_len: host-known upper bound on every seq_lens entry; it fixes the number of
        splits, cdiv(max_seq_len, split_size). Keys past a sequence's seq_lens are never read.
    split_size: keys per split (power of two, multiple of block_n); default chosen from the
        shapes and the SM count.
    block_n: keys per tile; default the head size's tile (`_default_tiles`), or split_size where that is less.
    workspace: (partial_out fp32 [>= num_seqs * query_len, num_q_heads, >= num_splits, head_dim],
        partial_lse fp32 [>= num_seqs * query_len, num_q_heads, >= num_splits]) owned by the caller, so that
        nothing is allocated per call (see `decode_workspace`); default: allocated here.
    grid_splits: programs along the split axis (1..num_splits); default from the shapes and the SM
        count. The result is the same bits for every value (tests pin it).
    query_len: queries per sequence; (query_len x the GQA group) rows share a program's tile, at most
        MAX_DECODE_TILE_ROWS (`fits_decode_tile`).
    counters: int32 [>= num_seqs * num_kv_heads], all 0 (`decode_counters`), owned by the caller and left all 0:
        where `reduces_in_last_program`, the last split program of each (sequence, KV head) reduces and no
        reduction kernel runs (the reduction kernel's code). None: the reduction kernel.
    Every seq_lens entry must be >= query_len and <= max_seq_len (not checked: it would need a sync).
    """
    q = check_tensor("q", q, ndim=3, dtypes=FLOAT_DTYPES)
    check_positive_int("query_len", query_len)
    num_rows, num_q_heads, head_dim = q.shape
    if num_rows % query_len:
        raise ValueError(f"q's {num_rows} rows are not a whole number of sequences of query_len {query_len}")
    num_seqs = num_rows // query_len
    block_size, num_kv_heads = check_paged_attention_inputs(
        q, k_cache, v_cache, block_tables, seq_lens, scale, num_seqs
    )
    if not fits_decode_tile(query_len, num_q_heads // num_kv_heads):
        raise ValueError(
            f"query_len {query_len} x a GQA group of {num_q_heads // num_kv_heads} heads exceeds the decode tile's "
            f"{MAX_DECODE_TILE_ROWS} rows"
        )
    check_positive_int("max_seq_len", max_seq_len)
    if max_seq_len > block_tables.shape[1] * block_size:
        raise ValueError(
            f"max_seq_len {max_seq_len} exceeds the block table's capacity "
            f"({block_tables.shape[1]} blocks x {block_size} tokens)"
        )

    default_n, default_warps, default_stages = _default_tiles(head_dim, q.dtype)
    num_warps = num_warps or default_warps
    num_stages = num_stages or default_stages
    if split_size is None:
        split_size = _default_split_size(num_seqs, num_kv_heads, max_seq_len, q.device)
    check_power_of_two("split_size", split_size, low=16, high=1 << 20)
    # A split shorter than the default tile is one tile of its keys.
    block_n = block_n or min(default_n, split_size)
    check_power_of_two("block_n", block_n, low=16, high=256)
    check_power_of_two("split_size", split_size, low=block_n, high=1 << 20)
    num_splits = triton.cdiv(max_seq_len, split_size)
    if grid_splits is None:
        grid_splits = _grid_splits(num_seqs, num_kv_heads, num_splits, q.device)
    check_positive_int("grid_splits", grid_splits)
    if grid_splits > num_splits:
        raise ValueError(f"grid_splits {grid_splits} exceeds the {num_splits} splits of max_seq_len {max_seq_len}")

    reduce_last = counters is not None and reduces_in_last_program(num_splits, query_len)
    if counters is not None:
        counters = check_tensor("counters", counters, ndim=1, dtypes=(torch.int32,))
    if reduce_last:
        if counters.device != q.device or not counters.is_contiguous() or counters.numel() < num_seqs * num_kv_heads:
            raise ValueError(
                f"counters must be a contiguous int32 tensor of at least {num_seqs * num_kv_heads} elements "
                f"on {q.device}"
            )

    out = output_like("out", q, out)
    if num_seqs == 0:
        return out

    group_size = num_q_heads // num_kv_heads
    if workspace is None:
        workspace = decode_workspace(num_rows, num_q_heads, num_splits, head_dim, q.device)
    partial_out, partial_lse = _workspace_views(workspace, num_rows, num_q_heads, num_splits, head_dim)
    _decode_split_kernel[(num_seqs, num_kv_heads, grid_splits)](
        q,
        k_cache,
        v_cache,
        block_tables,
        seq_lens,
        partial_out,
        partial_lse,
        out,
        counters if reduce_last else partial_lse,  # never read without REDUCE_LAST
        q.stride(0),
        q.stride(1),
        out.stride(0),
        out.stride(1),
        block_tables.stride(0),
        num_kv_heads,
        group_size,
        split_size,
        num_splits,
        scale * _LOG2_E,
        HEAD_DIM=head_dim,
        BLOCK_SIZE=block_size,
        BLOCK_GROUP=decode_tile_rows(query_len, group_size),
        QUERY_LEN=query_len,
        BLOCK_N=block_n,
        # fp32 inputs: full-precision dot (Triton's default would be tf32 on GPUs).
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        LOOP_SPLITS=grid_splits < num_splits,
        WRITE_OUT=num_splits == 1,
        REDUCE_LAST=reduce_last,
        BLOCK_SPLITS=_REDUCE_BLOCK_SPLITS,
        USE_PDL=pdl,
        launch_pdl=pdl,
        num_warps=num_warps,
        num_stages=num_stages,
    )
    if num_splits == 1 or reduce_last:
        return out
    _decode_reduce_kernel[(num_rows, num_q_heads)](
        partial_out,
        partial_lse,
        seq_lens,
        out,
        out.stride(0),
        out.stride(1),
        num_q_heads,
        num_splits,
        split_size,
        HEAD_DIM=head_dim,
        BLOCK_SPLITS=_REDUCE_BLOCK_SPLITS,
        QUERY_LEN=query_len,
        USE_PDL=pdl,
        launch_pdl=pdl,
        num_warps=4,
    )
    return out


def reduces_in_last_program(num_splits: int, query_len: int) -> bool:
    """Whether, given counters, the split kernel's last program per (sequence, KV head) reduces (host ints only, so
    a CUDA graph captures the one launch): one query per sequence (a verify step's rows would be reduced one after
    the other) and 2..LAST_PROGRAM_REDUCES_MAX_SPLITS splits (one split writes its output anyway)."""
    return query_len == 1 and 1 < num_splits <= LAST_PROGRAM_REDUCES_MAX_SPLITS


def decode_counters(max_num_seqs: int, num_kv_heads: int, device: torch.device) -> torch.Tensor:
    """The split kernel's arrival counters for up to max_num_seqs sequences (see `decode_attention`): all 0, and
    every launch leaves them so."""
    return torch.zeros(max(1, max_num_seqs * num_kv_heads), dtype=torch.int32, device=device)


def decode_workspace(
    max_num_rows: int, num_q_heads: int, max_num_splits: int, head_dim: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Split workspaces for up to `max_num_rows` query rows (sequences x query_len) and `max_num_splits` splits."""
    partial_out = torch.empty((max_num_rows, num_q_heads, max_num_splits, head_dim), dtype=torch.float32, device=device)
    partial_lse = torch.empty((max_num_rows, num_q_heads, max_num_splits), dtype=torch.float32, device=device)
    return partial_out, partial_lse


def _workspace_views(
    workspace: tuple[torch.Tensor, torch.Tensor], num_rows: int, num_q_heads: int, num_splits: int, head_dim: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Contiguous [num_rows, num_q_heads, num_splits, (head_dim)] views at the start of the workspaces.

    The kernels index the workspaces densely ((q_row * num_q_heads + head) * num_splits + split), so
    the views are flat prefixes of the buffers, not slices of their leading dimensions.
    """
    partial_out, partial_lse = workspace
    needed = num_rows * num_q_heads * num_splits
    for name, buffer, per_row in (("partial_out", partial_out, head_dim), ("partial_lse", partial_lse, 1)):
        if buffer.dtype != torch.float32 or not buffer.is_contiguous() or buffer.numel() < needed * per_row:
            raise ValueError(
                f"workspace {name} must be a contiguous fp32 tensor of at least {needed * per_row} elements"
            )
    flat_out = partial_out.view(-1)[: needed * head_dim].view(num_rows, num_q_heads, num_splits, head_dim)
    flat_lse = partial_lse.view(-1)[:needed].view(num_rows, num_q_heads, num_splits)
    return flat_out, flat_lse
