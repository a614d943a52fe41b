"""The decode split kernel at 4 and 8 warps on the H200 (Triton 3.6), as the engine calls it at decode-bs1:
one sequence, the small-batch split size, PDL off, bf16, head_dim 128, 8 KV heads with 16 query heads (Qwen3-0.6B:
the last split program reduces, with counters) and 32 (Qwen3-8B: the reduction kernel after it), contexts 600 and
2000 under the engine's smallest decode bound, 2048 keys (fast.attention.MIN_DECODE_CONTEXT). Triton 3.9's sm_90
build on the CPU machine gave 255 registers and a 152-byte stack at 4 warps, 233 registers and no stack at 8
(../../kernels/decode_attention_registers/): this checks the registers as 3.6 builds the kernel and whether 8 warps
is faster. Each figure: time_in_graph's median of 10 replays of 20 back-to-back calls, in microseconds a call.

    python reports/results/bench/landing_ab_session13/decode_warps.py > OUT.txt
"""

from __future__ import annotations

import statistics

import torch

from fast.attention import LAST_PROGRAM_REDUCES_MAX_GROUP, decode_split_size
from fast.kernels.decode_attention import _decode_split_kernel, decode_attention, decode_counters, decode_workspace
from reports.bench.graph_timing import time_in_graph
from reports.bench.kernels.invariant_attention import BLOCK_SIZE, HEAD_DIM, NUM_KV_HEADS, Paged, paged_cache


def compiled_registers() -> list[tuple[int, int, int]]:
    """(num_warps, n_regs, n_spills) of every compiled variant of the split kernel in this process."""
    found = []
    for cache in _decode_split_kernel.device_caches.values():
        for kernel in cache[0].values():
            found.append((kernel.metadata.num_warps, kernel.n_regs, kernel.n_spills))
    return sorted(set(found))


def time_decode(q: torch.Tensor, paged: Paged, bound: int, warps: int) -> tuple[float, torch.Tensor]:
    """(microseconds a call, output) of the split kernel at `warps`, as the engine launches it at one sequence."""
    split = decode_split_size(1, bound)  # 128 at this bound, as when it ran
    workspace = decode_workspace(1, q.shape[1], -(-bound // split), HEAD_DIM, q.device)
    reduces_last = q.shape[1] // NUM_KV_HEADS <= LAST_PROGRAM_REDUCES_MAX_GROUP  # as fast.attention decides
    counters = decode_counters(1, NUM_KV_HEADS, q.device) if reduces_last else None
    out = torch.empty_like(q)

    def call(_: int) -> torch.Tensor:
        return decode_attention(
            q, paged.k_cache, paged.v_cache, paged.block_tables, paged.seq_lens, HEAD_DIM**-0.5, bound,
            split_size=split, workspace=workspace, counters=counters, num_warps=warps, out=out,
        )  # fmt: skip

    result = call(0).float()
    return statistics.median(time_in_graph(call, 20)), result


def main() -> None:
    generator = torch.Generator().manual_seed(0)
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__}")
    print(f"{'q heads':>7} {'context':>7} {'warps':>5} {'us':>7} {'max diff vs 4':>13}")
    for q_heads in (16, 32):
        for context in (600, 2000):
            # A block table of the bound's width (the engine's holds max_model_len), keys up to the context only.
            bound = 2048
            paged = paged_cache(1, bound, generator)
            paged.seq_lens.fill_(context)
            q = torch.randn((1, q_heads, HEAD_DIM), generator=generator).to(torch.bfloat16).to("cuda")
            outputs = {}
            for warps in (4, 8, 4, 8):
                micros, outputs[warps] = time_decode(q, paged, bound, warps)
                difference = (outputs[warps] - outputs[4]).abs().max().item()
                print(f"{q_heads:7d} {context:7d} {warps:5d} {micros:7.2f} {difference:13.2e}")
    assert BLOCK_SIZE == 16
    for warps, registers, spills in compiled_registers():
        print(f"split kernel variant: {warps} warps, {registers} registers, {spills} spills")


if __name__ == "__main__":
    main()
