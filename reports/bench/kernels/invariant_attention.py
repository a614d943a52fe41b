"""Batch-invariant mode's attention tiles against the default paths, on one CUDA GPU (qwen3-0.6b heads:
16 query heads, 8 KV heads, head_dim 128, bf16, block size 16).

    python -m reports.bench.kernels.invariant_attention --json reports/results/batch_invariant/attention_bench.json

Cases:
- decode: SEQS sequences of one query each over CONTEXT keys (offline-256's decode steps are about
  256 x 600): the default decode kernel (split-KV), the invariant mode's tiles before packing
  (always_mask, default prefill tiles: one live row of 128 per program), and each candidate packed
  tile (always_mask, pack_gqa, block_m x block_n);
- prefill: PREFILL_SEQS prompts of PREFILL_LEN tokens: the default prefill tiles, the unpacked
  invariant tiles and the packed candidates.
Each call is timed in a CUDA graph of CALLS back-to-back calls (reports.bench.graph_timing.time_in_graph,
medians of the replays). Invariance: for each packed candidate, the last query row of a
sequence computed as a decode (q_len 1) and as the last row of chunks of 7 and 300 queries must be
bitwise equal (torch.equal), which is what the engine's mode relies on.

Needs CUDA; without it the command exits with status 2.
"""

from __future__ import annotations

import statistics
import sys
from dataclasses import asdict, dataclass

import torch

from fast.attention import INVARIANT_BLOCK_M, INVARIANT_BLOCK_N, decode_split_size
from fast.kernels.decode_attention import decode_attention, decode_workspace
from fast.kernels.prefill_attention import prefill_attention
from reports.bench.device import cuda_bench_record
from reports.bench.graph_timing import time_in_graph

NUM_Q_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE = 16, 8, 128, 16
SEQS, CONTEXT = 256, 600
PREFILL_SEQS, PREFILL_LEN = 4, 1024
CALLS = 20
DEVICE = torch.device("cuda")
PACKED_CANDIDATES = ((16, 64), (16, 32), (32, 64), (64, 64))


@dataclass(frozen=True)
class Timing:
    case: str
    path: str
    us_median: float
    us_samples: list[float]


@dataclass(frozen=True)
class Tiles:
    """prefill_attention's tile settings; block sizes None = its defaults."""

    always_mask: bool = False
    pack_gqa: bool = False
    block_m: int | None = None
    block_n: int | None = None


DEFAULT_TILES = Tiles()
UNPACKED_INVARIANT = Tiles(always_mask=True)


def packed_tiles(block_m: int, block_n: int) -> Tiles:
    return Tiles(always_mask=True, pack_gqa=True, block_m=block_m, block_n=block_n)


@dataclass(frozen=True)
class Paged:
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    block_tables: torch.Tensor
    seq_lens: torch.Tensor


def paged_cache(num_seqs: int, seq_len: int, generator: torch.Generator) -> Paged:
    """Each sequence on its own contiguous run of blocks, in random block order."""
    blocks_per_seq = -(-seq_len // BLOCK_SIZE)
    num_blocks = num_seqs * blocks_per_seq
    shape = (num_blocks, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM)
    k_cache = torch.randn(shape, generator=generator).to(torch.bfloat16).to(DEVICE)
    v_cache = torch.randn(shape, generator=generator).to(torch.bfloat16).to(DEVICE)
    order = torch.randperm(num_blocks, generator=generator).to(torch.int32)
    block_tables = order.view(num_seqs, blocks_per_seq).to(DEVICE)
    seq_lens = torch.full((num_seqs,), seq_len, dtype=torch.int32, device=DEVICE)
    return Paged(k_cache, v_cache, block_tables, seq_lens)


def queries(num_tokens: int, generator: torch.Generator) -> torch.Tensor:
    return torch.randn((num_tokens, NUM_Q_HEADS, HEAD_DIM), generator=generator).to(torch.bfloat16).to(DEVICE)


def cu_seqlens(num_seqs: int, q_len: int) -> torch.Tensor:
    return torch.arange(0, (num_seqs + 1) * q_len, q_len, dtype=torch.int32, device=DEVICE)


def prefill_call(q: torch.Tensor, paged: Paged, q_len: int, tiles: Tiles, out: torch.Tensor | None = None):
    cu = cu_seqlens(paged.seq_lens.shape[0], q_len)
    out = torch.empty_like(q) if out is None else out

    def call(_: int) -> torch.Tensor:
        return prefill_attention(
            q, cu, paged.seq_lens, paged.block_tables, paged.k_cache, paged.v_cache, HEAD_DIM**-0.5, q_len,
            out=out, always_mask=tiles.always_mask, pack_gqa=tiles.pack_gqa, block_m=tiles.block_m,
            block_n=tiles.block_n,
        )  # fmt: skip

    return call


def decode_call(q, paged: Paged):
    max_len = paged.block_tables.shape[1] * BLOCK_SIZE
    split = decode_split_size(SEQS, max_len)
    workspace = decode_workspace(SEQS, NUM_Q_HEADS, -(-max_len // split), HEAD_DIM, q.device)
    out = torch.empty_like(q)

    def call(_: int) -> None:
        decode_attention(
            q, paged.k_cache, paged.v_cache, paged.block_tables, paged.seq_lens, HEAD_DIM**-0.5, max_len,
            split_size=split, workspace=workspace, out=out,
        )  # fmt: skip

    return call


def timed(case: str, path: str, call) -> Timing:
    samples = time_in_graph(call, CALLS)
    return Timing(case, path, statistics.median(samples), samples)


def chunk_invariance(block_m: int, block_n: int, generator: torch.Generator) -> bool:
    """The last row of one 700-key sequence: as a decode, and as the last row of chunks of 7 and 300."""
    seq_len = 700
    paged = paged_cache(1, seq_len, generator)
    q_all = queries(seq_len, generator)
    rows = []
    for q_len in (1, 7, 300):
        q = q_all[seq_len - q_len :].contiguous()
        rows.append(prefill_call(q, paged, q_len, packed_tiles(block_m, block_n))(0)[-1])
    return all(torch.equal(row, rows[0]) for row in rows[1:])


def run() -> dict[str, object]:
    generator = torch.Generator().manual_seed(0)
    decode_cache = paged_cache(SEQS, CONTEXT, generator)
    decode_q = queries(SEQS, generator)
    prefill_cache = paged_cache(PREFILL_SEQS, PREFILL_LEN, generator)
    prefill_q = queries(PREFILL_SEQS * PREFILL_LEN, generator)
    timings = [
        timed("decode", "decode kernel (default mode)", decode_call(decode_q, decode_cache)),
        timed(
            "decode", "invariant, unpacked default tiles", prefill_call(decode_q, decode_cache, 1, UNPACKED_INVARIANT)
        ),
        timed(
            "prefill",
            "prefill kernel (default mode)",
            prefill_call(prefill_q, prefill_cache, PREFILL_LEN, DEFAULT_TILES),
        ),
        timed(
            "prefill",
            "invariant, unpacked default tiles",
            prefill_call(prefill_q, prefill_cache, PREFILL_LEN, UNPACKED_INVARIANT),
        ),
    ]
    invariance = {}
    for block_m, block_n in PACKED_CANDIDATES:
        name = f"invariant, packed {block_m}x{block_n}"
        tiles = packed_tiles(block_m, block_n)
        timings.append(timed("decode", name, prefill_call(decode_q, decode_cache, 1, tiles)))
        timings.append(timed("prefill", name, prefill_call(prefill_q, prefill_cache, PREFILL_LEN, tiles)))
        invariance[name] = chunk_invariance(block_m, block_n, generator)
    return {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "shape": {"q_heads": NUM_Q_HEADS, "kv_heads": NUM_KV_HEADS, "head_dim": HEAD_DIM, "dtype": "bfloat16"},
        "decode": {"seqs": SEQS, "context": CONTEXT},
        "prefill": {"seqs": PREFILL_SEQS, "tokens": PREFILL_LEN},
        "engine_invariant_tiles": f"packed {INVARIANT_BLOCK_M}x{INVARIANT_BLOCK_N}",
        "chunk_invariance": invariance,
        "timings": [asdict(t) for t in timings],
    }


def main(argv: list[str] | None = None) -> int:
    result = cuda_bench_record("python -m reports.bench.kernels.invariant_attention", __doc__, run, argv)
    if result is None:
        return 2
    for timing in result["timings"]:
        print(f"{timing['case']:8s} {timing['path']:40s} {timing['us_median']:9.1f} us")
    print("chunk invariance:", result["chunk_invariance"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
