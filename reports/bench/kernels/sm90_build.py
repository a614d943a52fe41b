"""A Triton kernel's resources as built for sm_90 (an H200), on a machine without a GPU.

Triton's own compiler builds the kernel for GPUTarget("cuda", 90, 32), and the cuobjdump that Triton ships reads
registers and stack a thread from the cubin. The counts are the installed Triton's build, which may differ from the
device image's: a lead for the GPU, not a measurement of it.

    from reports.bench.kernels.sm90_build import build_resources
    build_resources(_gemv_kernel, constants, pointer_types, num_warps=2, num_stages=3)
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime.jit import JITFunction

SM90 = GPUTarget("cuda", 90, 32)


@dataclass(frozen=True)
class BuildResources:
    registers: int  # a thread's
    stack_bytes: int  # a thread's stack frame: spilled values, among others
    dynamic_shared_bytes: int  # a program's, as Triton launches it

    def __str__(self) -> str:
        return f"{self.registers} registers, stack {self.stack_bytes} B, dynamic shared {self.dynamic_shared_bytes} B"


def build_resources(
    kernel: JITFunction,
    constants: Mapping[str, object],
    pointer_types: Mapping[str, str],
    *,
    num_warps: int,
    num_stages: int,
    float_args: tuple[str, ...] = (),
) -> BuildResources:
    """constants: every tl.constexpr argument's value. pointer_types: the Triton type of each `*_ptr` argument not
    bf16 ("*i32", "*fp32"). float_args: the scalar arguments that are floats; the other scalars are int32."""
    if not isinstance(kernel, JITFunction):
        raise TypeError(
            f"{getattr(kernel, '__name__', kernel)!r} is not a compiled-mode Triton kernel (a {type(kernel).__name__}):"
            " import it with TRITON_INTERPRET unset"
        )
    signature = {}
    for name in kernel.arg_names:
        if name in constants:
            signature[name] = "constexpr"
        elif name.endswith("_ptr"):
            signature[name] = pointer_types.get(name, "*bf16")
        else:
            signature[name] = "fp32" if name in float_args else "i32"
    source = ASTSource(
        fn=kernel,
        signature=signature,
        constexprs={(kernel.arg_names.index(name),): value for name, value in constants.items()},
    )
    compiled = triton.compile(source, target=SM90, options={"num_warps": num_warps, "num_stages": num_stages})
    with tempfile.NamedTemporaryFile("wb", suffix=".cubin", delete=False) as cubin:
        cubin.write(compiled.asm["cubin"])
    try:
        tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
        dump = subprocess.run([tool, "--dump-resource-usage", cubin.name], capture_output=True, text=True, check=True)
    finally:
        os.unlink(cubin.name)
    fields = dict(
        field.split(":", 1)
        for line in dump.stdout.splitlines()
        if "REG:" in line
        for field in line.split()
        if ":" in field
    )
    return BuildResources(int(fields["REG"]), int(fields["STACK"]), int(compiled.metadata.shared))
