"""Registers and stack a thread of fast.kernels.decode_attention._decode_split_kernel built for sm_90 (an H200), at
the decode-bs1 tile (one query, Qwen3's head_dim 128, 16-token KV blocks, BLOCK_N 64), over warps and pipeline
stages, and with the last-program reduction (REDUCE_LAST), on a machine without a GPU
(reports.bench.kernels.sm90_build).

    python reports/results/kernels/decode_attention_registers/registers.py [TREE]   (TREE: where fast/ is; default .)
"""

from __future__ import annotations

import sys

from reports.bench.kernels.sm90_build import build_resources

# The tree measured (fast/ only, as git archive writes it) comes first; the harness is this checkout's.
sys.path.insert(0, sys.argv[1] if len(sys.argv) > 1 else ".")
from fast.kernels import decode_attention  # noqa: E402

POINTER_TYPES = {
    "block_tables_ptr": "*i32",
    "seq_lens_ptr": "*i32",
    "counters_ptr": "*i32",
    "partial_out_ptr": "*fp32",
    "partial_lse_ptr": "*fp32",
}


def resources(group_size: int, num_warps: int, num_stages: int, reduce_last: bool) -> str:
    constants = {
        "HEAD_DIM": 128,
        "BLOCK_SIZE": 16,
        "BLOCK_GROUP": decode_attention.decode_tile_rows(1, group_size),
        "QUERY_LEN": 1,
        "BLOCK_N": 64,
        "DOT_PRECISION": "tf32",
        "LOOP_SPLITS": False,
        "WRITE_OUT": False,
        "REDUCE_LAST": reduce_last,
        "BLOCK_SPLITS": 16,
        "USE_PDL": True,
    }
    built = build_resources(
        decode_attention._decode_split_kernel,
        constants,
        POINTER_TYPES,
        num_warps=num_warps,
        num_stages=num_stages,
        float_args=("scale_log2",),
    )
    return str(built)


if __name__ == "__main__":
    for model, group_size in (("qwen3-0.6b", 2), ("qwen3-8b", 4)):
        for num_warps in (4, 8):
            for num_stages in (1, 2, 3):
                usage = resources(group_size, num_warps, num_stages, False)
                sys.stdout.write(f"{model} warps {num_warps} stages {num_stages} plain        {usage}\n")
        sys.stdout.write(f"{model} warps 4 stages 3 REDUCE_LAST  {resources(group_size, 4, 3, True)}\n")
