"""Registers a thread of fast.kernels.gemv._gemv_kernel built for sm_90 (an H200), plain and with linear_add_rmsnorm's
ADD_NORM epilogue, at the decode-bs1 (one row) shapes that take it, on a machine without a GPU
(reports.bench.kernels.sm90_build).

    python reports/results/kernels/gemv_add_norm_registers/registers.py [TREE]   (TREE: where fast/ is; default .)
"""

from __future__ import annotations

import sys

import torch
import triton

from reports.bench.kernels.sm90_build import build_resources

# The tree measured (fast/ only, as git archive writes it) comes first; the harness is this checkout's.
sys.path.insert(0, sys.argv[1] if len(sys.argv) > 1 else ".")
from fast.kernels import gemv  # noqa: E402

SHAPES = {"0.6b o_proj": (1024, 2048), "0.6b down": (1024, 3072), "8b o_proj": (4096, 4096), "8b down": (4096, 12288)}


def resources(add_norm: bool, n: int, k: int) -> str:
    config = gemv.gemv_config(1, n, k, torch.bfloat16)
    constants = {
        "HAS_BIAS": False,
        "SILU_MUL": False,
        "ADD_NORM": add_norm,
        "BLOCK_HIDDEN": triton.next_power_of_2(n) if add_norm else 1,
        "EVEN_K": k % config.block_k == 0,
        "USE_DOT": config.use_dot,
        "BLOCK_M": config.block_m,
        "BLOCK_N": config.block_n,
        "BLOCK_K": config.block_k,
        "DOT_PRECISION": "tf32",
        "USE_PDL": True,
    }
    if "ADD_CHUNK" in gemv._gemv_kernel.arg_names:  # experiment/add-norm-chunked
        constants["ADD_CHUNK"] = gemv.ADD_NORM_CHUNK
    built = build_resources(
        gemv._gemv_kernel,
        constants,
        {"counter_ptr": "*i32"},
        num_warps=config.num_warps,
        num_stages=config.num_stages,
        float_args=("eps",),
    )
    return f"{config} -> {built}"


if __name__ == "__main__":
    for shape, (n, k) in SHAPES.items():
        for add_norm in (False, True):
            sys.stdout.write(f"{shape:12} {'add_norm' if add_norm else 'plain':8} {resources(add_norm, n, k)}\n")
