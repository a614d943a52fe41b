"""Decode steps on the two kernels the default mode chooses between, over batch sizes and contexts, on one
CUDA GPU (qwen3-0.6b heads: 16 query heads, 8 KV heads, head_dim 128, bf16, block size 16):

- the split-KV decode kernel with the split size the engine picks for a step of that many sequences
  (fast.attention.decode_split_size), which decode steps of at most fast.attention.PACKED_DECODE_MIN_SEQS
  sequences take;
- the prefill kernel with packed GQA rows on the 16 x 64 tiles, unmasked before the diagonal, which
  larger decode steps take.

    python -m reports.bench.kernels.decode_attention --json reports/results/bench/decode_attention_sweep.json

Each call is timed in a CUDA graph of back-to-back calls (reports.bench.graph_timing.time_in_graph, medians of the
replays); the two outputs are compared (max abs difference) so a fast wrong kernel shows. Needs CUDA;
without it the command exits with status 2.
"""

from __future__ import annotations

import statistics
import sys

import torch

from fast.attention import INVARIANT_BLOCK_M, INVARIANT_BLOCK_N, PACKED_DECODE_MIN_SEQS, decode_split_size
from fast.kernels.decode_attention import decode_attention, decode_workspace
from fast.kernels.prefill_attention import prefill_attention
from reports.bench.device import cuda_bench_record
from reports.bench.graph_timing import time_in_graph
from reports.bench.kernels.invariant_attention import (
    BLOCK_SIZE,
    HEAD_DIM,
    NUM_Q_HEADS,
    cu_seqlens,
    paged_cache,
    queries,
)

BATCHES = (1, 8, 16, 32, 48, 64, 96, 128, 192, 256)
CONTEXTS = (600, 2000)
CALLS = 20


def _kernels(num_seqs: int, context: int, generator: torch.Generator):
    """(decode call, packed call) over one random paged cache; each returns its output."""
    paged = paged_cache(num_seqs, context, generator)
    q = queries(num_seqs, generator)
    max_len = paged.block_tables.shape[1] * BLOCK_SIZE
    split = decode_split_size(num_seqs, max_len)
    workspace = decode_workspace(num_seqs, NUM_Q_HEADS, -(-max_len // split), HEAD_DIM, q.device)
    decode_out, packed_out = torch.empty_like(q), torch.empty_like(q)
    cu = cu_seqlens(num_seqs, 1)
    scale = HEAD_DIM**-0.5

    def decode(_: int) -> torch.Tensor:
        return decode_attention(
            q, paged.k_cache, paged.v_cache, paged.block_tables, paged.seq_lens, scale, max_len,
            split_size=split, workspace=workspace, out=decode_out,
        )  # fmt: skip

    def packed(_: int) -> torch.Tensor:
        return prefill_attention(
            q, cu, paged.seq_lens, paged.block_tables, paged.k_cache, paged.v_cache, scale, 1, out=packed_out,
            pack_gqa=True, block_m=INVARIANT_BLOCK_M, block_n=INVARIANT_BLOCK_N,
        )  # fmt: skip

    return decode, packed


def run() -> dict[str, object]:
    generator = torch.Generator().manual_seed(0)
    rows = []
    for context in CONTEXTS:
        for num_seqs in BATCHES:
            decode, packed = _kernels(num_seqs, context, generator)
            difference = (decode(0).float() - packed(0).float()).abs().max().item()
            decode_us = statistics.median(time_in_graph(decode, CALLS))
            packed_us = statistics.median(time_in_graph(packed, CALLS))
            rows.append(
                {
                    "seqs": num_seqs,
                    "context": context,
                    "decode_kernel_us": decode_us,
                    "packed_rows_us": packed_us,
                    "engine_takes": "packed" if num_seqs > PACKED_DECODE_MIN_SEQS else "decode",
                    "max_abs_difference": difference,
                }
            )
    return {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "shape": {"q_heads": NUM_Q_HEADS, "kv_heads": 8, "head_dim": HEAD_DIM, "dtype": "bfloat16"},
        "decode_split_sizes": {n: decode_split_size(n, max(CONTEXTS)) for n in BATCHES},
        "packed_decode_min_seqs": PACKED_DECODE_MIN_SEQS,
        "rows": rows,
    }


def main(argv: list[str] | None = None) -> int:
    result = cuda_bench_record("python -m reports.bench.kernels.decode_attention", __doc__, run, argv)
    if result is None:
        return 2
    print(f"{'seqs':>5} {'context':>7} {'decode us':>10} {'packed us':>10} {'engine':>7} {'max diff':>9}")
    for row in result["rows"]:
        print(
            f"{row['seqs']:5d} {row['context']:7d} {row['decode_kernel_us']:10.1f} {row['packed_rows_us']:10.1f} "
            f"{row['engine_takes']:>7} {row['max_abs_difference']:9.2e}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
