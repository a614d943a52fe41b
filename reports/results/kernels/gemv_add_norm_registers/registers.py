"""Registers a thread of fast.kernels.gemv._gemv_kernel built for sm_90 (an H200), plain and with linear_add_rmsnorm's
ADD_NORM epilogue, at the decode-bs1 (one row) shapes that take it: compiled on a machine without a GPU by Triton's
own compiler for GPUTarget("cuda", 90, 32), then read from the cubin with the cuobjdump Triton ships.

    python reports/results/kernels/gemv_add_norm_registers/registers.py [TREE]   (TREE: where fast/ is; default .)
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

sys.path.insert(0, sys.argv[1] if len(sys.argv) > 1 else ".")
from fast.kernels import gemv  # noqa: E402

SHAPES = {"0.6b o_proj": (1024, 2048), "0.6b down": (1024, 3072), "8b o_proj": (4096, 4096), "8b down": (4096, 12288)}
INTS = ("M", "N", "K", "x_row_stride", "out_row_stride")


def resource_usage(add_norm: bool, n: int, k: int) -> str:
    config = gemv.gemv_config(1, n, k, torch.bfloat16)
    kernel = gemv._gemv_kernel
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
    if "ADD_CHUNK" in kernel.arg_names:  # experiment/add-norm-chunked
        constants["ADD_CHUNK"] = gemv.ADD_NORM_CHUNK
    signature = {}
    for name in kernel.arg_names:
        if name in constants:
            signature[name] = "constexpr"
        elif name.endswith("_ptr"):
            signature[name] = "*i32" if name == "counter_ptr" else "*bf16"
        else:
            signature[name] = "i32" if name in INTS else "fp32"
    source = ASTSource(
        fn=kernel,
        signature=signature,
        constexprs={(kernel.arg_names.index(name),): value for name, value in constants.items()},
    )
    compiled = triton.compile(
        source,
        target=GPUTarget("cuda", 90, 32),
        options={"num_warps": config.num_warps, "num_stages": config.num_stages},
    )
    with tempfile.NamedTemporaryFile("wb", suffix=".cubin", delete=False) as cubin:
        cubin.write(compiled.asm["cubin"])
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    dump = subprocess.run([tool, "--dump-resource-usage", cubin.name], capture_output=True, text=True, check=True)
    os.unlink(cubin.name)
    usage = " ".join(line.split("Resource usage:")[-1].strip() for line in dump.stdout.splitlines() if "REG" in line)
    return f"{config} -> {usage}"


if __name__ == "__main__":
    for shape, (n, k) in SHAPES.items():
        for add_norm in (False, True):
            sys.stdout.write(f"{shape:12} {'add_norm' if add_norm else 'plain':8} {resource_usage(add_norm, n, k)}\n")
