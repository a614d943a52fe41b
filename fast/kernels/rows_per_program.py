"""How many rows (tokens) one program of a row-wise kernel takes: one on a GPU, more in Triton's interpreter.

On a GPU a program per token spreads a step's tokens over the SMs. On the CPU, Triton's interpreter runs a
program's operations in Python one after another, so a program costs by how many operations it runs and
hardly by how many elements each has: 16 tokens a program made a fast-engine run of the tests' tiny model
2.3x cheaper (fast/kernels/NOTES.md). The kernels that take it (add_rmsnorm, qk_norm_rope_, silu_and_mul)
give a row the same bits for any count in the interpreter (their tests hold them to it there); on a GPU a row
reduced in a larger tile may round otherwise (an H200 did, for add_rmsnorm in fp16 and qk_norm_rope_ at two
heads a program), which is why the engine takes one row a program there always: a row's bits never depend on
its batch. Counts above one are checked against the reference on the GPU too.
"""

from __future__ import annotations

import torch

from fast.kernels._checks import check_power_of_two

INTERPRETER_ROWS_PER_PROGRAM = 16
MAX_ROWS_PER_PROGRAM = 1024


def rows_per_program(name: str, value: int | None, tensor: torch.Tensor) -> int:
    """`value`, checked (a power of two up to MAX_ROWS_PER_PROGRAM), or the default for `tensor`'s device."""
    if value is None:
        return 1 if tensor.is_cuda else INTERPRETER_ROWS_PER_PROGRAM
    check_power_of_two(name, value, low=1, high=MAX_ROWS_PER_PROGRAM)
    return value
