"""Paged attention for one step: the prefill kernel for mixed steps, the decode kernel when every
sequence brings exactly one query and the step has few sequences, the prefill kernel with packed GQA
rows for decode steps of many sequences.

`PagedAttention` is built once per engine and owns the decode workspace and the decode kernel's
arrival counters (its last split program per sequence and KV head reduces, for groups of at most
LAST_PROGRAM_REDUCES_MAX_GROUP query heads), so no call allocates them. Each step gets a
`StepAttention` that holds views of the step's metadata (persistent device buffers of
`fast.input_batch.InputBatch`); the model calls `attend` once per layer.

The decode kernel's split size comes from the step's batch size (SMALL_BATCH_SPLIT_SIZE up to
SMALL_BATCH_MAX_SEQS sequences, a CUDA-graph size, so an eager step and the graph it would replay
agree; SINGLE_SEQUENCE_SPLIT_SIZE for one sequence under a short bound), and its split count from a
host-known bound on the step's longest sequence: the smallest of the context buckets 512, 1024, ...
max_model_len that holds it (`decode_context`). A split's
arithmetic and the reduction over a sequence's own splits do not depend on the split count, only the
launch grid does: with max_model_len's split count at Qwen3's default 40,960-token context, one
program per split was either a grid of mostly empty programs or the kernel's slower loop over
splits (decode-sweep batch 32, 1,152 keys: 2.55 ms per token against 2.37 ms at max_model_len 2048,
reports/results/kernels/decode_grid_e685cc4/). CUDA graphs are captured per (batch size, bucket)
where the bucket changes the grid (`graph_contexts`).

A decode step of more than PACKED_DECODE_MIN_SEQS sequences has enough (sequence, KV head) programs to
fill the GPU without splitting the keys, so it skips the split kernel's partial outputs and reduce
pass: the prefill kernel with packed GQA rows (one program per sequence and KV head, reading each K/V
tile once for its group_size query heads) took 154 us where the decode kernel took 174 us for 256
sequences over 600 keys on an H200 (reports/results/batch_invariant/run_125fb2e/attention_bench.json).
The threshold is a CUDA-graph batch size (fast.cuda_graphs.graph_batch_sizes has every multiple of 8
from 16), so a step replayed in a graph padded to the next size and the same step run eagerly pick
the same kernel.

Batch-invariant mode runs every step, decode steps included, through the prefill kernel: a query
row then always reduces over its keys in the same BLOCK_N tiles from key 0, whether it is computed
in a prefill chunk, in a decode step, or after a prefix-cache hit. (Tiles past a row's position add
exactly nothing: their scores are -inf, so the running max, sum and output are unchanged.) Every tile
takes the kernel's masked path there: the masked and unmasked paths round differently on a GPU, and
which tiles are unmasked depends on where a row's query block starts. The mode's tiles are fixed
(INVARIANT_BLOCK_M, INVARIANT_BLOCK_N) and its rows are packed GQA rows: a query row's arithmetic
is then one sequence of instructions in every step, and a decode token's program fills group_size
of its INVARIANT_BLOCK_M rows instead of one of 128.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton

from fast.kernels.decode_attention import (
    decode_attention,
    decode_counters,
    decode_workspace,
    fits_decode_tile,
    one_program_per_split,
)
from fast.kernels.prefill_attention import prefill_attention

# Keys per decode split: 512 keys x 128 dims is 128 KiB of bf16 K and V per program, enough work
# to amortise a split's fixed cost (query load, partial write) while a batch-1 decode over a
# few thousand keys still spreads over several programs per KV head.
DECODE_SPLIT_SIZE = 512
# An engine that never runs more than SMALL_BATCH_MAX_SEQS sequences has few programs per split
# (batch 1 on an 8-KV-head model: 8 per split), so its splits are shorter: on an H200 a batch-1
# decode over a few hundred keys spent 9.4 us per layer walking one 512-key split per KV head.
# The fp32 partial outputs grow with the split count (seqs x heads x splits x head_dim), which
# is what the larger split saves at large batches.
SMALL_BATCH_SPLIT_SIZE = 128
SMALL_BATCH_MAX_SEQS = 64
# One sequence under a bound of at most SINGLE_SEQUENCE_SPLIT_MAX_CONTEXT keys: 32-key splits (of one 32-key tile,
# decode_attention's tile for a split that short), so its few hundred keys spread over 4x the programs. On one
# H200, decode-bs1 (128 to 384 keys), bf16, no flags, two alternating runs each in one call: Qwen3-0.6B 0.983 and
# 0.993 ms a token against 1.034 and 1.035 with 128-key splits; Qwen3-8B 4.482 and 4.484 against 4.539 and 4.540
# (reports/results/bench/decode_split_ab/). Longer bounds keep 128-key splits: at thousands of keys the partial
# outputs, which grow with the split count, were not measured at 32.
SINGLE_SEQUENCE_SPLIT_SIZE = 32
SINGLE_SEQUENCE_SPLIT_MAX_CONTEXT = 512


# Batch-invariant mode's attention tiles, one choice for every step of every engine (see the module
# docstring). 16 rows: a decode step's program (one token x group_size heads) leaves the rest of the
# tile idle, and the idle rows' exp2 and MMA work is what a larger tile costs; 16 is the smallest
# row count of a tensor-core MMA. 64 keys per tile halves the loop trips of 32.
INVARIANT_BLOCK_M = 16
INVARIANT_BLOCK_N = 64

# Decode steps of more sequences than this run through the prefill kernel with packed GQA rows, on the
# mode's tiles without its always-masked path (see the module docstring); smaller ones keep the
# split-KV decode kernel, which spreads a few long sequences over more programs.
PACKED_DECODE_MIN_SEQS = 64

# The decode kernel's last split program per (sequence, KV head) reduces that head group's splits (no reduction
# kernel a layer) only for groups of at most this many query heads: it reduces them one after the other while the
# GPU waits. On one H200, decode-bs1, bf16, no flags: with Qwen3-0.6B's groups of 2 the last-program fusions
# together took a step from 1.064 to 1.032 ms (reports/results/fast_gpu/suite_and_report/run_5b6cd25/); with
# Qwen3-8B's groups of 4 this one cost 0.16 ms a step, 5.075 against 4.912 ms with the reduction kernel
# (reports/results/bench/landing_ab_session13/).
LAST_PROGRAM_REDUCES_MAX_GROUP = 2


# The decode kernel's smallest context bucket; the next ones double up to max_model_len (see the module
# docstring). 512 keys: one sequence's 32-key splits are then 16, so at Qwen3-0.6B's groups the last split
# program still reduces (LAST_PROGRAM_REDUCES_MAX_SPLITS); with 128-key splits it is 4 splits a sequence.
MIN_DECODE_CONTEXT = 512
# On the CPU (Triton's interpreter) the ladder starts at one 128-key split: every program of a grid, an empty one
# too, runs there in Python (about 10 ms each), and no CUDA graph is captured per bucket. A test's short
# sequences then launch one split per (sequence, KV head) instead of max_model_len's, or a lone sequence's four
# 32-key splits; the arithmetic is the same (the decode kernel's tests pin it for every bound).
MIN_DECODE_CONTEXT_INTERPRETED = SMALL_BATCH_SPLIT_SIZE


def decode_split_size(num_seqs: int, context: int) -> int:
    """The decode kernel's split size for a step of num_seqs sequences launched over the bound `context` (host
    ints of the graph the step is replayed in: SMALL_BATCH_MAX_SEQS is a graph size and the bound a bucket, so
    the eager step and its graph agree)."""
    if num_seqs == 1 and context <= SINGLE_SEQUENCE_SPLIT_MAX_CONTEXT:
        return SINGLE_SEQUENCE_SPLIT_SIZE
    return SMALL_BATCH_SPLIT_SIZE if num_seqs <= SMALL_BATCH_MAX_SEQS else DECODE_SPLIT_SIZE


def context_buckets(max_model_len: int, smallest: int = MIN_DECODE_CONTEXT) -> tuple[int, ...]:
    """smallest, twice that, ... below max_model_len, then max_model_len."""
    buckets = [smallest]
    while buckets[-1] < max_model_len:
        buckets.append(buckets[-1] * 2)
    return (*[bucket for bucket in buckets if bucket < max_model_len], max_model_len)


@dataclass(frozen=True)
class StepMetadata:
    """Device views describing one step's sequences (see fast.input_batch)."""

    # Query tokens of every sequence, where the decode kernel may take the step: 1 for a decode step, 1 + K
    # for a verify step's chunks padded to 1 + K tokens (fast.input_batch); 0 for any other step.
    query_len: int
    num_seqs: int
    max_query_len: int  # host-known, sizes the prefill grid
    decode_context: int  # host-known bound on seq_lens for the decode kernel (PagedAttention.decode_context)
    block_tables: torch.Tensor  # int32 [num_seqs, max_blocks_per_seq]
    seq_lens: torch.Tensor  # int32 [num_seqs]: keys each sequence attends to, its new ones included
    cu_seqlens_q: torch.Tensor  # int32 [num_seqs + 1]: query offsets into the flattened batch


class PagedAttention:
    def __init__(
        self,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        max_num_seqs: int,
        max_model_len: int,
        device: torch.device,
        batch_invariant: bool = False,
        packed_decode_min_seqs: int = PACKED_DECODE_MIN_SEQS,
        pdl: bool = False,
        smallest_context: int | None = None,
        verify_seqs: int = 0,
        verify_query_len: int = 1,
    ) -> None:
        """pdl: the attention kernels (decode and prefill) launch with programmatic dependent launch
        (fast/kernels/pdl.py).
        smallest_context: the first decode context bucket; None: the device's (MIN_DECODE_CONTEXT on CUDA,
        MIN_DECODE_CONTEXT_INTERPRETED elsewhere).
        verify_seqs, verify_query_len: the largest verify step of padded chunks (speculative decoding's
        verify graphs), whose rows the decode kernel's workspace must hold; 0: none."""
        self.scale = float(head_dim**-0.5)
        self.pdl = pdl
        self.group_size = num_heads // num_kv_heads
        # A group wider than the packed tile cannot be packed: such models keep the decode kernel.
        packable = self.group_size <= INVARIANT_BLOCK_M
        self.packed_decode_min_seqs = packed_decode_min_seqs if packable else max_num_seqs
        self.max_model_len = max_model_len
        self.num_kv_heads = num_kv_heads
        self.device = device
        self.batch_invariant = batch_invariant
        if smallest_context is None:
            smallest_context = MIN_DECODE_CONTEXT if device.type == "cuda" else MIN_DECODE_CONTEXT_INTERPRETED
        self.contexts = context_buckets(max_model_len, smallest_context)
        # The decode kernel's largest steps at every bound, one per split size (one sequence, and the most
        # sequences at each): the workspace views are flat prefixes (decode_attention), so its size is their largest.
        self.verify_seqs, self.verify_query_len = verify_seqs, verify_query_len
        decode_seqs = min(max_num_seqs, self.packed_decode_min_seqs)
        largest = [(n, 1) for n in (1, min(decode_seqs, SMALL_BATCH_MAX_SEQS), decode_seqs)]
        if verify_seqs and self.runs_decode_kernel(1, verify_query_len):
            verify_seqs = min(verify_seqs, self.packed_decode_min_seqs)
            largest += [(n, verify_query_len) for n in (1, min(verify_seqs, SMALL_BATCH_MAX_SEQS), verify_seqs)]
        rows = max(
            n * query_len * triton.cdiv(context, decode_split_size(n, context))
            for n, query_len in largest
            for context in self.contexts
        )
        self.workspace = decode_workspace(rows, num_heads, 1, head_dim, device)  # rows of (query, split)
        # The decode kernel's last split program per (sequence, KV head) reduces (no reduction kernel a layer):
        # their arrival counts, for a decode step's largest batch. None: the reduction kernel (wider groups).
        reduces_last = self.group_size <= LAST_PROGRAM_REDUCES_MAX_GROUP
        self.counters = decode_counters(decode_seqs, num_kv_heads, device) if reduces_last else None

    def for_step(self, metadata: StepMetadata) -> StepAttention:
        return StepAttention(self, metadata)

    def runs_decode_kernel(self, num_seqs: int, query_len: int = 1) -> bool:
        """Whether a step of num_seqs sequences of query_len query tokens each (1: a decode step; 1 + K: a
        verify step's padded chunks, of at most verify_seqs sequences: what the workspace holds) runs the
        split-KV decode kernel (see `attend`)."""
        if self.batch_invariant or num_seqs > self.packed_decode_min_seqs:
            return False
        if query_len == 1:
            return True
        verify = query_len == self.verify_query_len and num_seqs <= self.verify_seqs
        return verify and fits_decode_tile(query_len, self.group_size)

    def decode_context(self, num_seqs: int, max_seq_len: int, query_len: int = 1) -> int:
        """The bound the decode kernel is launched with for a step of num_seqs sequences of query_len query
        tokens whose longest has max_seq_len keys: the smallest context bucket that holds it, while that
        grid keeps one program per split; past that max_model_len (its bounded grid is the same for every
        longer bucket)."""
        if not self.runs_decode_kernel(num_seqs, query_len):
            return self.max_model_len  # the grid does not depend on it
        for context in self.contexts:
            if context >= max_seq_len:
                splits = triton.cdiv(context, decode_split_size(num_seqs, context))
                if one_program_per_split(num_seqs, self.num_kv_heads, splits, self.device):
                    return context
                break
        return self.max_model_len

    def graph_contexts(self, num_seqs: int, query_len: int = 1) -> tuple[int, ...]:
        """Every bound decode_context gives for num_seqs sequences of query_len query tokens: the CUDA graphs
        to capture at that size."""
        return tuple(sorted({self.decode_context(num_seqs, context, query_len) for context in self.contexts}))


class StepAttention:
    """What one forward pass's layers call: attention of the step's queries over their caches."""

    def __init__(self, backend: PagedAttention, metadata: StepMetadata) -> None:
        self.backend = backend
        self.metadata = metadata

    def attend(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
        """q [T, H, D] (rows may be strided) -> [T, H, D] contiguous."""
        meta, backend = self.metadata, self.backend
        invariant = backend.batch_invariant
        if meta.query_len and backend.runs_decode_kernel(meta.num_seqs, meta.query_len):
            return decode_attention(
                q,
                k_cache,
                v_cache,
                meta.block_tables,
                meta.seq_lens,
                backend.scale,
                meta.decode_context,
                split_size=decode_split_size(meta.num_seqs, meta.decode_context),
                workspace=backend.workspace,
                pdl=backend.pdl,
                query_len=meta.query_len,
                counters=backend.counters,
            )
        # Packed GQA rows: a decode or verify step of many sequences, and every step in batch-invariant mode.
        packed = invariant or meta.query_len > 0
        return prefill_attention(
            q,
            meta.cu_seqlens_q,
            meta.seq_lens,
            meta.block_tables,
            k_cache,
            v_cache,
            backend.scale,
            meta.max_query_len,
            always_mask=invariant,
            pack_gqa=packed,
            block_m=INVARIANT_BLOCK_M if packed else None,
            block_n=INVARIANT_BLOCK_N if packed else None,
            pdl=backend.pdl,
        )
