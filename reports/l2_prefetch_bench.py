"""Does prefetching o_proj's weight into L2 beside the attention kernels shorten a decode layer?

Per layer, as at batch-1 decode (bf16, H200): decode_attention over one sequence, then the o_proj
GEMV on that layer's own weight (LAYERS copies, so nothing stays in L2 from one layer to the next).
Variants, each replayed from one CUDA graph of all the layers (PDL on the main stream, as the engine):
  attention      the attention kernels alone
  gemv           the GEMVs alone
  both           attention then the GEMV, per layer
  gemv_twice     each GEMV twice (the second reads the weight from L2: the L2-resident GEMV's time)
  prefetch       attention then the GEMV, with l2_prefetch of the layer's weight on a second stream,
                 forked before the attention and joined at the end of the graph
  prefetch_same_stream  the prefetch on the main stream, before the attention
  prefetch_alone the prefetch kernels alone
Shapes: qwen3-8b (32 q / 8 kv heads, o_proj 4096 x 4096) and its 2-way rank share (16 / 4 heads,
4096 x 2048); contexts 600 and 4096.

    python -m reports.l2_prefetch_bench --json out.json

Result (reports/results/kernels/l2_prefetch_e120c1a/): no gain, so the engine does not prefetch. A
GEMV run right after another on the same weight (8B o_proj, 32 MiB, under the H200's 50 MB of L2) took
11.0 us against 12.2 for the first, so there was little to win; the prefetch kernel itself took 8 us a
layer, and every prefetch variant made the layer slower (19.7 -> 25.9 us).

The prefetch kernel: grid (cdiv(num_lines, LINES_PER_PROGRAM),); each program issues
`prefetch.global.L2::evict_last` for LINES_PER_PROGRAM 128-byte lines of the tensor's bytes (lines
past the end clamped to the last one). Nothing is read into registers and nothing is written.
"""

from __future__ import annotations

import argparse
import json

import torch
import triton
import triton.language as tl

from fast.kernels.decode_attention import decode_attention, decode_workspace
from fast.kernels.gemv import small_batch_linear
from reports.graph_timing import median_replay_us

LAYERS, REPLAYS = 36, 20
LINE_BYTES = 128
LINES_PER_PROGRAM = 1024


@triton.jit
def _l2_prefetch_kernel(data_ptr, num_lines, LINES_PER_PROGRAM: tl.constexpr, LINE_BYTES: tl.constexpr):
    lines = tl.program_id(0) * LINES_PER_PROGRAM + tl.arange(0, LINES_PER_PROGRAM)
    lines = tl.minimum(lines, num_lines - 1)
    addresses = data_ptr + lines.to(tl.int64) * LINE_BYTES  # data_ptr is a uint8 pointer: byte offsets
    tl.inline_asm_elementwise(
        "prefetch.global.L2::evict_last [$1]; mov.u32 $0, 0;",
        "=r,l",
        [addresses],
        dtype=tl.int32,
        is_pure=False,
        pack=1,
    )


def l2_prefetch(data: torch.Tensor) -> None:
    """Queue the prefetch of `data`'s bytes into L2 on the current stream (CUDA only)."""
    if data.device.type != "cuda":
        raise ValueError(f"l2_prefetch runs on CUDA devices only, got {data.device}")
    if not data.is_contiguous():
        raise ValueError("data must be contiguous")
    num_bytes = data.numel() * data.element_size()
    if num_bytes == 0:
        return
    num_lines = triton.cdiv(num_bytes, LINE_BYTES)
    grid = (triton.cdiv(num_lines, LINES_PER_PROGRAM),)
    _l2_prefetch_kernel[grid](data.view(torch.uint8), num_lines, LINES_PER_PROGRAM=LINES_PER_PROGRAM,
                              LINE_BYTES=LINE_BYTES, num_warps=4)  # fmt: skip


def _setup(heads: tuple[int, int], hidden: int, context: int) -> dict[str, object]:
    num_q_heads, num_kv_heads = heads
    device, head_dim, block_size = torch.device("cuda"), 128, 16
    blocks = context // block_size + 1
    k_cache = torch.randn(blocks + 1, block_size, num_kv_heads, head_dim, dtype=torch.bfloat16, device=device)
    return {
        "q": torch.randn(1, num_q_heads, head_dim, dtype=torch.bfloat16, device=device),
        "k": k_cache,
        "v": torch.randn_like(k_cache),
        "tables": torch.arange(blocks, dtype=torch.int32, device=device).view(1, blocks),
        "seq_lens": torch.full((1,), context, dtype=torch.int32, device=device),
        "max_seq_len": blocks * block_size,
        "workspace": decode_workspace(1, num_q_heads, blocks * block_size // 128 + 1, head_dim, device),
        "out": torch.empty(1, num_q_heads, head_dim, dtype=torch.bfloat16, device=device),
        "weights": [
            torch.randn(hidden, num_q_heads * head_dim, dtype=torch.bfloat16, device=device) * 0.01
            for _ in range(LAYERS)
        ],  # fmt: skip
        "gemv_out": torch.empty(1, hidden, dtype=torch.bfloat16, device=device),
    }


def _layer(
    b: dict[str, object], index: int, attention: bool, gemv: int, side: torch.cuda.Stream | None, same: bool
) -> None:
    if same:  # the prefetch on the main stream, before the attention
        l2_prefetch(b["weights"][index])
    if side is not None:
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            l2_prefetch(b["weights"][index])
    if attention:
        decode_attention(b["q"], b["k"], b["v"], b["tables"], b["seq_lens"], 0.088, b["max_seq_len"],
                         split_size=128, out=b["out"], workspace=b["workspace"], pdl=True)  # fmt: skip
    for _ in range(gemv):  # a second call reads the weight from L2 (it fits)
        small_batch_linear(b["out"].view(1, -1), b["weights"][index], out=b["gemv_out"], pdl=True)


def _time(b: dict[str, object], attention: bool, gemv: int, prefetch: str) -> float:
    """Median microseconds per layer. prefetch: "", "side" (second stream) or "same" (main stream)."""
    side = torch.cuda.Stream() if prefetch == "side" else None

    def run() -> None:
        for index in range(LAYERS):
            _layer(b, index, attention, gemv, side, prefetch == "same")
        if side is not None:
            torch.cuda.current_stream().wait_stream(side)

    return median_replay_us(run, REPLAYS - 3) / LAYERS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", required=True)
    args = parser.parse_args()
    rows = []
    for name, heads, hidden in (("qwen3-8b", (32, 8), 4096), ("qwen3-8b rank share of 2", (16, 4), 4096)):
        for context in (600, 4096):
            b = _setup(heads, hidden, context)
            row = {"shape": name, "context": context, "o_proj_mib": b["weights"][0].numel() * 2 / 2**20}
            for variant, flags in (("attention", (True, 0, "")), ("gemv", (False, 1, "")),
                                   ("gemv_twice", (False, 2, "")), ("both", (True, 1, "")),
                                   ("prefetch", (True, 1, "side")), ("prefetch_same_stream", (True, 1, "same")),
                                   ("prefetch_alone", (False, 0, "same"))):  # fmt: skip
                row[f"{variant}_us_per_layer"] = _time(b, *flags)
            rows.append(row)
            print(json.dumps(row), flush=True)
    with open(args.json, "w") as handle:
        json.dump({"device": torch.cuda.get_device_name(), "layers": LAYERS, "rows": rows}, handle, indent=1)


if __name__ == "__main__":
    main()
