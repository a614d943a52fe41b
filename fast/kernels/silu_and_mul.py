"""Fused SwiGLU activation: x [num_tokens, 2 * intermediate] -> silu(gate) * up.

gate = x[:, :intermediate], up = x[:, intermediate:] (the layout of a merged gate_up
projection). silu(g) = g * sigmoid(g), computed in fp32; the product is stored in x's dtype.
Bytes: each input element read once, each output element written once (3 * I elements per row).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from fast.kernels._checks import (
    FLOAT_DTYPES,
    check_last_dim_contiguous,
    check_same_device,
    check_shape,
    check_tensor,
)
from fast.kernels.pdl import wait_then_release
from fast.kernels.rows_per_program import rows_per_program as resolve_rows_per_program

# Elements of one row handled by one program (a 2-D grid covers wide rows).
_BLOCK_COLS = 1024


@triton.jit
def _silu_and_mul_kernel(
    x_ptr,
    out_ptr,
    x_row_stride,
    out_row_stride,
    num_rows,
    intermediate,
    BLOCK_COLS: tl.constexpr,
    ROWS_PER_PROGRAM: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    wait_then_release(USE_PDL)  # first: see fast/kernels/pdl.py
    # Program (row block, column block): intermediate=14336, BLOCK_COLS=1024 -> 14 column blocks;
    # block 3 covers columns 3072..4095 of gate (x[row, 3072:4096]) and of up (x[row, 14336+3072:...]),
    # for ROWS_PER_PROGRAM rows: a [ROWS_PER_PROGRAM, BLOCK_COLS] tile.
    rows = (tl.program_id(0).to(tl.int64) * ROWS_PER_PROGRAM + tl.arange(0, ROWS_PER_PROGRAM))[:, None]
    cols = (tl.program_id(1) * BLOCK_COLS + tl.arange(0, BLOCK_COLS))[None, :]
    mask = (rows < num_rows) & (cols < intermediate)
    gate = tl.load(x_ptr + rows * x_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + rows * x_row_stride + intermediate + cols, mask=mask, other=0.0).to(tl.float32)
    activated = gate / (1.0 + tl.exp(-gate)) * up
    tl.store(out_ptr + rows * out_row_stride + cols, activated.to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul(
    x: torch.Tensor, *, out: torch.Tensor | None = None, pdl: bool = False, rows_per_program: int | None = None
) -> torch.Tensor:
    """Return silu(x[:, :I]) * x[:, I:] as a new [num_tokens, I] tensor (or into `out`). rows_per_program (a
    power of two; elementwise, so the result is the same for any) defaults to 1 on a GPU, more on the CPU
    (fast/kernels/rows_per_program.py)."""
    check_tensor("x", x, ndim=2, dtypes=FLOAT_DTYPES)
    num_tokens, width = x.shape
    if width % 2:
        raise ValueError(f"x must have an even last dimension (gate and up halves), got {width}")
    check_last_dim_contiguous("x", x)
    intermediate = width // 2
    if out is None:
        out = torch.empty((num_tokens, intermediate), dtype=x.dtype, device=x.device)
    check_tensor("out", out, ndim=2, dtypes=FLOAT_DTYPES)
    check_shape("out", out, (num_tokens, intermediate))
    check_last_dim_contiguous("out", out)
    check_same_device("x", x, out=out)
    rows_per_program = resolve_rows_per_program("rows_per_program", rows_per_program, x)
    if num_tokens == 0 or intermediate == 0:
        return out
    block_cols = min(_BLOCK_COLS, triton.next_power_of_2(intermediate))
    grid = (triton.cdiv(num_tokens, rows_per_program), triton.cdiv(intermediate, block_cols))
    _silu_and_mul_kernel[grid](
        x, out, x.stride(0), out.stride(0), num_tokens, intermediate, BLOCK_COLS=block_cols,
        ROWS_PER_PROGRAM=rows_per_program, USE_PDL=pdl, launch_pdl=pdl, num_warps=4,
    )  # fmt: skip
    return out
