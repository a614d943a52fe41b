"""Registers and stack a thread of fast.kernels.decode_attention._decode_split_kernel built for sm_90 (an H200), at
the decode-bs1 tile (one query, Qwen3's head_dim 128, 16-token KV blocks, BLOCK_N 64), over warps and pipeline
stages, and with the last-program reduction (REDUCE_LAST): compiled on a machine without a GPU by Triton's own
compiler for GPUTarget("cuda", 90, 32), then read from the cubin with the cuobjdump Triton ships.

    python reports/results/kernels/decode_attention_registers/registers.py [TREE]   (TREE: where fast/ is; default .)
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

sys.path.insert(0, sys.argv[1] if len(sys.argv) > 1 else ".")
from fast.kernels import decode_attention  # noqa: E402

POINTER_TYPES = {
    "block_tables_ptr": "*i32",
    "seq_lens_ptr": "*i32",
    "counters_ptr": "*i32",
    "partial_out_ptr": "*fp32",
    "partial_lse_ptr": "*fp32",
}


def resource_usage(group_size: int, num_warps: int, num_stages: int, reduce_last: bool) -> str:
    kernel = decode_attention._decode_split_kernel
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
    signature = {}
    for name in kernel.arg_names:
        if name in constants:
            signature[name] = "constexpr"
        elif name.endswith("_ptr"):
            signature[name] = POINTER_TYPES.get(name, "*bf16")
        else:
            signature[name] = "fp32" if name == "scale_log2" else "i32"
    source = ASTSource(
        fn=kernel,
        signature=signature,
        constexprs={(kernel.arg_names.index(name),): value for name, value in constants.items()},
    )
    compiled = triton.compile(
        source, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps, "num_stages": num_stages}
    )
    with tempfile.NamedTemporaryFile("wb", suffix=".cubin", delete=False) as cubin:
        cubin.write(compiled.asm["cubin"])
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    dump = subprocess.run([tool, "--dump-resource-usage", cubin.name], capture_output=True, text=True, check=True)
    os.unlink(cubin.name)
    usage = " ".join(line.split("Resource usage:")[-1].strip() for line in dump.stdout.splitlines() if "REG" in line)
    return f"{usage.split(' CONSTANT')[0]} dynamic shared {compiled.metadata.shared} B"


if __name__ == "__main__":
    for model, group_size in (("qwen3-0.6b", 2), ("qwen3-8b", 4)):
        for num_warps in (4, 8):
            for num_stages in (1, 2, 3):
                usage = resource_usage(group_size, num_warps, num_stages, False)
                sys.stdout.write(f"{model} warps {num_warps} stages {num_stages} plain        {usage}\n")
        usage = resource_usage(group_size, 4, 3, True)
        sys.stdout.write(f"{model} warps 4 stages 3 REDUCE_LAST  {usage}\n")
