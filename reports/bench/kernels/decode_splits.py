"""How the decode kernel's cost depends on max_seq_len (the split count) at a fixed context length.

The split kernel's grid is (num_seqs, num_kv_heads, cdiv(max_seq_len, split_size)); splits past a
sequence's length return at once. This times decode_attention at the engine's split sizes for
max_seq_len 2048 (the benchmarks' --max-model-len) and 40960 (Qwen3's max_position_embeddings, the
default), each call replayed from a CUDA graph of CALLS back-to-back calls (H200, bf16).
--sweep-grid also times each case at every grid_splits (programs along the split axis) of
GRID_SWEEP, to choose decode_attention's default. --small-batch instead times one sequence at decode-bs1's
contexts (a 128-token prompt and 256 output tokens: 128 to 384 keys) at each (split size, BLOCK_N, bound) of
SMALL_BATCH_CANDIDATES, with Qwen3-0.6B's heads (16 query, 8 KV: the last split program reduces, as the engine
runs it) and Qwen3-8B's (32, 8: the reduction kernel).

    python -m reports.bench.kernels.decode_splits --json out.json [--sweep-grid | --small-batch]
"""

from __future__ import annotations

import argparse
import json

import torch

from fast.kernels.decode_attention import decode_attention, decode_counters, decode_workspace
from reports.bench.graph_timing import median_replay_us

CALLS, REPLAYS = 20, 30
GRID_SWEEP = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64)
# (split size, BLOCK_N, max_seq_len): the engine's small-batch split (128 keys, 64-key tiles, the 2048-key bucket),
# then shorter splits with the bucket that keeps them at 16 splits, so the last split program still reduces.
SMALL_BATCH_CANDIDATES = ((128, 64, 2048), (64, 64, 1024), (64, 32, 1024), (32, 32, 512))
SMALL_BATCH_HEADS = (((16, 8), "qwen3-0.6b", True), ((32, 8), "qwen3-8b", False))


def time_case(
    num_seqs: int,
    context: int,
    max_seq_len: int,
    split_size: int,
    heads: tuple[int, int],
    grid_splits: int | None,
    block_n: int | None = None,
    reduce_last: bool = False,
) -> float:
    """Median microseconds per call; reduce_last: with arrival counters (the last split program reduces where
    the split count allows it)."""
    num_q_heads, num_kv_heads = heads
    head_dim, block_size, device = 128, 16, torch.device("cuda")
    blocks_per_seq = max_seq_len // block_size
    num_blocks = num_seqs * (context // block_size + 1) + 1
    k_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, dtype=torch.bfloat16, device=device)
    v_cache = torch.randn_like(k_cache)
    tables = torch.zeros(num_seqs, blocks_per_seq, dtype=torch.int32, device=device)
    used = context // block_size + 1
    for s in range(num_seqs):
        tables[s, :used] = torch.arange(s * used, (s + 1) * used, dtype=torch.int32)
    seq_lens = torch.full((num_seqs,), context, dtype=torch.int32, device=device)
    q = torch.randn(num_seqs, num_q_heads, head_dim, dtype=torch.bfloat16, device=device)
    out = torch.empty_like(q)
    workspace = decode_workspace(num_seqs, num_q_heads, -(-max_seq_len // split_size), head_dim, device)
    counters = decode_counters(num_seqs, num_kv_heads, device) if reduce_last else None

    def call() -> None:
        decode_attention(q, k_cache, v_cache, tables, seq_lens, head_dim**-0.5, max_seq_len,
                         split_size=split_size, out=out, workspace=workspace, grid_splits=grid_splits,
                         block_n=block_n, counters=counters)  # fmt: skip

    def calls() -> None:
        for _ in range(CALLS):
            call()

    return median_replay_us(calls, REPLAYS - 3) / CALLS


def _cases(sweep_grid: bool) -> list[dict[str, object]]:
    """Without sweep_grid: the default grid at max_seq_len 2048 / 8192 / 40960. With it: the model's default
    context (40,960) at both of the engine's split sizes, each grid_splits of GRID_SWEEP and num_splits."""
    cases = []
    for heads, name in (((16, 8), "qwen3-0.6b"), ((16, 4), "qwen3-8b rank share of 2")):
        for num_seqs in (1, 8, 32, 64) if sweep_grid else (1, 8, 64):
            for context in (600, 4096):
                for split_size in (128, 512) if sweep_grid else (128,):
                    for max_seq_len in (40960,) if sweep_grid else (2048, 8192, 40960):
                        if context > max_seq_len:
                            continue
                        num_splits = -(-max_seq_len // split_size)
                        grids = [None]
                        if sweep_grid:
                            grids += [g for g in GRID_SWEEP if g < num_splits] + [num_splits]
                        for grid_splits in grids:
                            cases.append({"heads": heads, "name": name, "num_seqs": num_seqs, "context": context,
                                          "split_size": split_size, "max_seq_len": max_seq_len,
                                          "grid_splits": grid_splits})  # fmt: skip
    return cases


def _small_batch_cases() -> list[dict[str, object]]:
    """One sequence at decode-bs1's contexts, each head shape at each of SMALL_BATCH_CANDIDATES."""
    return [
        {"heads": heads, "name": name, "reduce_last": reduce_last, "num_seqs": 1, "context": context,
         "split_size": split_size, "block_n": block_n, "max_seq_len": max_seq_len, "grid_splits": None}
        for heads, name, reduce_last in SMALL_BATCH_HEADS
        for context in (128, 256, 384)
        for split_size, block_n, max_seq_len in SMALL_BATCH_CANDIDATES
    ]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", required=True)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--sweep-grid", action="store_true", help="time every grid_splits of GRID_SWEEP too")
    mode.add_argument("--small-batch", action="store_true", help="one sequence, SMALL_BATCH_CANDIDATES' splits")
    args = parser.parse_args()
    rows = []
    for case in _small_batch_cases() if args.small_batch else _cases(args.sweep_grid):
        heads = case.pop("heads")
        us = time_case(case["num_seqs"], case["context"], case["max_seq_len"], case["split_size"], heads,
                       case["grid_splits"], case.get("block_n"), case.get("reduce_last", False))  # fmt: skip
        rows.append({**case, "grid_splits": case["grid_splits"] or "default", "us_per_call": us})
        print(json.dumps(rows[-1]), flush=True)
    with open(args.json, "w") as handle:
        json.dump({"device": torch.cuda.get_device_name(), "calls_per_graph": CALLS, "rows": rows}, handle, indent=1)


if __name__ == "__main__":
    main()
