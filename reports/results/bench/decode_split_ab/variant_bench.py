"""decode-bs1 (bf16, no engine flags) with the small-batch decode split under test: the engine's module constants set
in this process, then `twinfer bench` as the CLI runs it. An A/B harness for one call, not engine code.

    python reports/results/bench/decode_split_ab/variant_bench.py VARIANT SHAPE OUT.json

VARIANT names a (split size, BLOCK_N, smallest decode bound) of VARIANTS: the engine's 128-key splits of 64-key tiles
under a 2048-key bound, or shorter splits with the bound that keeps a 384-key context at 16 splits or fewer (so the
last split program still reduces at Qwen3-0.6B's groups).
"""

from __future__ import annotations

import sys

import fast.attention
import fast.kernels.decode_attention as decode_kernel
from twinfer.cli import main

VARIANTS = {"s128n64": (128, 64, 2048), "s64n64": (64, 64, 1024), "s64n32": (64, 32, 1024), "s32n32": (32, 32, 512)}


def apply(variant: str) -> None:
    split, block_n, smallest = VARIANTS[variant]
    fast.attention.SMALL_BATCH_SPLIT_SIZE = split
    fast.attention.MIN_DECODE_CONTEXT = smallest
    default_tiles = decode_kernel._default_tiles

    def tiles(head_dim: int, dtype: object) -> tuple[int, int, int]:
        _, warps, stages = default_tiles(head_dim, dtype)
        return block_n, warps, stages

    decode_kernel._default_tiles = tiles


if __name__ == "__main__":
    name, shape, out = sys.argv[1:4]
    apply(name)
    sys.exit(main(["bench", "decode-bs1", "--shape", shape, "--dtype", "bfloat16", "--engine", "fast",
                   "--no-progress", "--commit", f"{open('COMMIT').read().strip()}-{name}", "--json", out]))  # fmt: skip
