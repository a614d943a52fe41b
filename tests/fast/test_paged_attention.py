"""fast.attention's choice of kernel for a step, and that each choice computes the same attention."""

from __future__ import annotations

from unittest import mock

import pytest
import torch

import fast.attention
from fast.attention import PACKED_DECODE_MIN_SEQS, PagedAttention, StepMetadata
from fast.cuda_graphs import graph_batch_sizes
from fast.kernels.decode_attention import LAST_PROGRAM_REDUCES_MAX_SPLITS
from reports.bench.kernels.kernel_reference import reference_causal_attention
from tests.fast.kernels.reference import DEVICE, assert_close_scaled, build_paged_cache
from tests.fast.kernels.strategies import seeded_generator

NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE = 2, 32, 16
SEQ_LENS = [5, 40, 17, 33, 64]


def _decode_step(group: int, dtype: torch.dtype, query_len: int = 1):
    """One step of len(SEQ_LENS) sequences of query_len query tokens each (1: a decode step; more: a verify
    step's padded chunks): (q [S * query_len, Hq, D], cache, metadata, expected output)."""
    generator = seeded_generator(11)
    cache = build_paged_cache(SEQ_LENS, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM, dtype, generator)
    num_rows = len(SEQ_LENS) * query_len
    q = torch.randn((num_rows, NUM_KV_HEADS * group, HEAD_DIM), generator=generator).to(dtype).to(DEVICE)
    metadata = StepMetadata(
        query_len=query_len,
        num_seqs=len(SEQ_LENS),
        max_query_len=query_len,
        decode_context=80,
        block_tables=cache.block_tables.clamp(min=0),  # the engine's padding columns point at a real block
        seq_lens=cache.seq_lens,
        cu_seqlens_q=torch.arange(0, num_rows + 1, query_len, dtype=torch.int32, device=DEVICE),
    )
    scale = HEAD_DIM**-0.5
    expected = torch.cat(
        [
            reference_causal_attention(q[s * query_len : (s + 1) * query_len], k, v, scale)
            for s, (k, v) in enumerate(zip(cache.keys, cache.values, strict=True))
        ]
    )
    return q, cache, metadata, expected


def _backend(group: int, packed_decode_min_seqs: int, verify_query_len: int = 1) -> PagedAttention:
    return PagedAttention(
        NUM_KV_HEADS * group,
        NUM_KV_HEADS,
        HEAD_DIM,
        max_num_seqs=8,
        max_model_len=80,  # the test cache's table width: 5 blocks of 16
        device=DEVICE,
        packed_decode_min_seqs=packed_decode_min_seqs,
        verify_seqs=8,
        verify_query_len=verify_query_len,
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("group", [1, 2, 3])
def test_a_decode_step_of_many_sequences_runs_packed_rows_and_matches_the_decode_kernel(
    dtype: torch.dtype, group: int
) -> None:
    q, cache, metadata, expected = _decode_step(group, dtype)
    # Above the threshold: the packed prefill kernel, never the split decode kernel.
    with mock.patch.object(fast.attention, "decode_attention", side_effect=AssertionError("decode kernel ran")):
        packed = _backend(group, packed_decode_min_seqs=2).for_step(metadata).attend(q, cache.k_cache, cache.v_cache)
    # At or below it: the split decode kernel, never the prefill kernel.
    with mock.patch.object(fast.attention, "prefill_attention", side_effect=AssertionError("prefill kernel ran")):
        split = _backend(group, packed_decode_min_seqs=8).for_step(metadata).attend(q, cache.k_cache, cache.v_cache)
    assert_close_scaled(packed, expected, dtype, "packed decode rows")
    assert_close_scaled(split, expected, dtype, "split decode kernel")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(("group", "query_len"), [(1, 5), (2, 5), (3, 3)])
def test_a_verify_step_of_padded_chunks_runs_the_decode_kernel_and_matches_packed_rows(
    dtype: torch.dtype, group: int, query_len: int
) -> None:
    """A verify step (every chunk query_len tokens, the last ones of its sequence): at or below the packed
    threshold the split decode kernel takes all of a chunk's rows, above it the packed prefill kernel."""
    q, cache, metadata, expected = _decode_step(group, dtype, query_len)
    with mock.patch.object(fast.attention, "decode_attention", side_effect=AssertionError("decode kernel ran")):
        packed = _backend(group, 2, query_len).for_step(metadata).attend(q, cache.k_cache, cache.v_cache)
    with mock.patch.object(fast.attention, "prefill_attention", side_effect=AssertionError("prefill kernel ran")):
        split = _backend(group, 8, query_len).for_step(metadata).attend(q, cache.k_cache, cache.v_cache)
    assert_close_scaled(packed, expected, dtype, "packed verify rows")
    assert_close_scaled(split, expected, dtype, "split decode kernel, several queries")


def test_the_last_split_program_reduces_only_narrow_groups() -> None:
    """Groups of at most LAST_PROGRAM_REDUCES_MAX_GROUP query heads get the arrival counters (the last split
    program reduces); wider ones none (the reduction kernel: at Qwen3-8B's groups of 4 the last program's one-by-one
    reduction cost 0.16 ms a decode-bs1 step). The decode test above runs both (groups 1, 2 and 3)."""
    for group in (1, 2):
        counters = _backend(group, 8).counters
        assert counters is not None and counters.numel() >= 8 * NUM_KV_HEADS and not counters.any()
    assert _backend(3, 8).counters is None
    assert PagedAttention(32, 8, 128, 1, 4096, torch.device("cpu")).counters is None  # Qwen3-8B's heads
    assert PagedAttention(16, 8, 128, 1, 4096, torch.device("cpu")).counters is not None  # Qwen3-0.6B's


def test_a_verify_step_too_wide_for_the_decode_tile_takes_the_prefill_kernel() -> None:
    assert _backend(4, 8, verify_query_len=8).runs_decode_kernel(5, query_len=8)  # 32 rows: one tile
    too_wide = _backend(4, 8, verify_query_len=9)
    assert not too_wide.runs_decode_kernel(5, query_len=9)  # 36 rows
    assert too_wide.decode_context(5, 40, query_len=9) == 80  # the prefill grid: one bound, max_model_len


def test_only_the_verify_steps_the_workspace_holds_take_the_decode_kernel() -> None:
    backend = _backend(2, 8, verify_query_len=5)
    assert backend.runs_decode_kernel(8, query_len=5)
    assert not backend.runs_decode_kernel(8, query_len=4)  # not the verify graphs' chunk length
    assert not _backend(2, 8).runs_decode_kernel(2, query_len=5)  # no verify steps: no room for their rows


def test_the_decode_workspace_holds_the_largest_verify_step() -> None:
    """The verify graphs' largest step at max_model_len writes (sequences x 1 + K) query rows of partial
    outputs per split; an engine with no verify graphs keeps the decode step's size."""
    plain = PagedAttention(4, 2, HEAD_DIM, max_num_seqs=8, max_model_len=1024, device=DEVICE)
    verify = PagedAttention(
        4, 2, HEAD_DIM, max_num_seqs=8, max_model_len=1024, device=DEVICE, verify_seqs=8, verify_query_len=5
    )
    splits = -(-1024 // fast.attention.decode_split_size(8, 1024))
    assert plain.workspace[1].numel() == 8 * 4 * splits
    assert verify.workspace[1].numel() == 8 * 5 * 4 * splits


def test_a_group_wider_than_the_packed_tile_keeps_the_decode_kernel() -> None:
    backend = PagedAttention(64, 2, HEAD_DIM, max_num_seqs=256, max_model_len=128, device=DEVICE)
    assert backend.packed_decode_min_seqs == 256  # no decode step has more sequences than the engine
    assert _backend(2, PACKED_DECODE_MIN_SEQS).packed_decode_min_seqs == PACKED_DECODE_MIN_SEQS


@pytest.mark.parametrize("max_batch", [PACKED_DECODE_MIN_SEQS, 100, 256, 512])
def test_the_threshold_is_a_cuda_graph_batch_size(max_batch: int) -> None:
    """A step padded to its graph's batch size picks the kernel the same step picks run eagerly: no
    graph size lies strictly between a batch at or below the threshold and the threshold itself."""
    assert PACKED_DECODE_MIN_SEQS in graph_batch_sizes(max_batch)


def test_decode_context_buckets_double_from_512_up_to_max_model_len() -> None:
    assert fast.attention.context_buckets(40960) == (512, 1024, 2048, 4096, 8192, 16384, 32768, 40960)
    assert fast.attention.context_buckets(4096, 2048) == (2048, 4096)
    assert fast.attention.context_buckets(3000, 2048) == (2048, 3000)
    assert fast.attention.context_buckets(100) == (100,)


def test_one_sequence_under_a_short_bound_takes_shorter_splits_and_the_workspace_holds_them() -> None:
    """decode-bs1's few hundred keys spread over 32-key splits (fast.attention, measured there); a batch, or
    one sequence under a longer bound, keeps 128-key splits. The workspace holds the most partial rows of any
    step: one sequence's 16 splits at the 512-key bound, where 2048 keys at 128 would make 16 too."""
    split = fast.attention.decode_split_size
    assert split(1, 512) < split(2, 512) == split(1, 1024) == fast.attention.SMALL_BATCH_SPLIT_SIZE
    one = PagedAttention(16, 8, 128, max_num_seqs=1, max_model_len=1024, device=DEVICE, smallest_context=512)
    assert one.workspace[1].numel() == 16 * (512 // split(1, 512))  # heads x splits: 16 x 16, not 16 x 8
    assert one.decode_context(1, 300) == 512
    assert one.counters is not None  # Qwen3-0.6B's groups: the last split program reduces its 16 splits


CPU = torch.device("cpu")


def test_the_ladder_starts_where_one_sequence_takes_short_splits_and_at_one_split_in_the_interpreter() -> None:
    smallest = fast.attention.MIN_DECODE_CONTEXT
    assert smallest <= fast.attention.SINGLE_SEQUENCE_SPLIT_MAX_CONTEXT  # decode-bs1's bound: 32-key splits
    assert smallest // fast.attention.decode_split_size(1, smallest) <= LAST_PROGRAM_REDUCES_MAX_SPLITS
    assert PagedAttention(16, 8, 128, 256, 4096, CPU).contexts == (128, 256, 512, 1024, 2048, 4096)


def test_a_decode_step_launches_over_the_smallest_bucket_that_keeps_one_program_per_split() -> None:
    """decode_context: a short step at Qwen3's default 40,960-token context launches the decode kernel
    over the smallest bucket holding its longest sequence, as at max_model_len 2048, while that grid keeps
    one program per split; past that over max_model_len (one bounded grid for every longer bucket). On
    the CPU the wrapper counts 4 SMs: one program per split up to 124 x 4 = 496 programs; 128-key splits
    up to 64 sequences, 512-key ones beyond."""
    backend = PagedAttention(16, 8, 128, max_num_seqs=256, max_model_len=40960, device=CPU, smallest_context=2048)
    assert backend.decode_context(1, 300) == 2048  # 16 splits x 8 KV heads: 128 programs
    assert backend.decode_context(1, 2049) == 4096  # 32 x 8 = 256
    assert backend.decode_context(1, 5000) == 40960  # 64 x 8 = 512 > 496: the bounded grid
    assert backend.decode_context(4, 300) == 40960  # 4 x 8 x 16 = 512 > 496
    assert backend.decode_context(3, 2048) == 2048  # 3 x 8 x 16 = 384
    assert backend.decode_context(PACKED_DECODE_MIN_SEQS + 1, 300) == 40960  # packed rows: no decode kernel
    assert backend.graph_contexts(1) == (2048, 4096, 40960)
    assert backend.graph_contexts(4) == (40960,)
    invariant = PagedAttention(16, 8, 128, 256, 40960, CPU, batch_invariant=True, smallest_context=2048)
    assert invariant.graph_contexts(1) == (40960,)  # every step runs the prefill kernel


@pytest.mark.parametrize("max_model_len", [100, 2048, 5000, 40960])
def test_every_decode_context_holds_the_step_and_has_a_graph(max_model_len: int) -> None:
    """For every graph batch size and longest sequence, the bound holds the sequence and a graph of that
    (size, bound) is captured: a replay never finds its graph missing or reads past its grid."""
    backend = PagedAttention(16, 8, 128, max_num_seqs=256, max_model_len=max_model_len, device=CPU)
    lengths = sorted({1, 2, 2047, 2048, 2049, max_model_len - 1, max_model_len} - {0})
    for size in graph_batch_sizes(256):
        graphs = backend.graph_contexts(size)
        for length in (n for n in lengths if n <= max_model_len):
            context = backend.decode_context(size, length)
            assert length <= context <= max_model_len and context in graphs, (size, length, context)
