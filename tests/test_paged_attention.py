"""fast.attention's choice of kernel for a step, and that each choice computes the same attention."""

from __future__ import annotations

from unittest import mock

import pytest
import torch

import fast.attention
from fast.attention import PACKED_DECODE_MIN_SEQS, PagedAttention, StepMetadata
from fast.cuda_graphs import graph_batch_sizes
from reports.kernel_reference import reference_causal_attention
from tests.kernels.reference import DEVICE, assert_close_scaled, build_paged_cache
from tests.kernels.strategies import seeded_generator

NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE = 2, 32, 16
SEQ_LENS = [5, 40, 17, 33, 64]


def _decode_step(group: int, dtype: torch.dtype):
    """One decode step of len(SEQ_LENS) sequences: (q [S, Hq, D], cache, metadata, expected output)."""
    generator = seeded_generator(11)
    cache = build_paged_cache(SEQ_LENS, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM, dtype, generator)
    q = torch.randn((len(SEQ_LENS), NUM_KV_HEADS * group, HEAD_DIM), generator=generator).to(dtype).to(DEVICE)
    metadata = StepMetadata(
        is_decode=True,
        num_seqs=len(SEQ_LENS),
        max_query_len=1,
        block_tables=cache.block_tables.clamp(min=0),  # the engine's padding columns point at a real block
        seq_lens=cache.seq_lens,
        cu_seqlens_q=torch.arange(len(SEQ_LENS) + 1, dtype=torch.int32, device=DEVICE),
    )
    scale = HEAD_DIM**-0.5
    expected = torch.cat(
        [
            reference_causal_attention(q[s : s + 1], k, v, scale)
            for s, (k, v) in enumerate(zip(cache.keys, cache.values, strict=True))
        ]
    )
    return q, cache, metadata, expected


def _backend(group: int, packed_decode_min_seqs: int) -> PagedAttention:
    return PagedAttention(
        NUM_KV_HEADS * group,
        NUM_KV_HEADS,
        HEAD_DIM,
        max_num_seqs=8,
        max_model_len=80,  # the test cache's table width: 5 blocks of 16
        device=DEVICE,
        packed_decode_min_seqs=packed_decode_min_seqs,
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


def test_a_group_wider_than_the_packed_tile_keeps_the_decode_kernel() -> None:
    backend = PagedAttention(64, 2, HEAD_DIM, max_num_seqs=256, max_model_len=128, device=DEVICE)
    assert backend.packed_decode_min_seqs == 256  # no decode step has more sequences than the engine
    assert _backend(2, PACKED_DECODE_MIN_SEQS).packed_decode_min_seqs == PACKED_DECODE_MIN_SEQS


@pytest.mark.parametrize("max_batch", [PACKED_DECODE_MIN_SEQS, 100, 256, 512])
def test_the_threshold_is_a_cuda_graph_batch_size(max_batch: int) -> None:
    """A step padded to its graph's batch size picks the kernel the same step picks run eagerly: no
    graph size lies strictly between a batch at or below the threshold and the threshold itself."""
    assert PACKED_DECODE_MIN_SEQS in graph_batch_sizes(max_batch)
