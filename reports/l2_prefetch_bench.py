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
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

from fast.kernels.decode_attention import decode_attention, decode_workspace
from fast.kernels.gemv import small_batch_linear
from fast.kernels.l2_prefetch import l2_prefetch

LAYERS, REPLAYS = 36, 20


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

    run()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    samples = []
    for _ in range(REPLAYS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1000 / LAYERS)
    return statistics.median(samples[3:])


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
