"""Fused residual add + RMSNorm.

    new_residual = x + residual                      (rounded to residual's dtype)
    out          = new_residual / sqrt(mean(new_residual^2) + eps) * weight

x, residual, out: [num_tokens, hidden]; weight: [hidden]. All arithmetic is fp32 inside the
kernel. The norm is taken of the *rounded* sum, i.e. of exactly the residual that is stored
and carried to the next layer, as an unfused PyTorch model computes it.
Without a residual it is plain RMSNorm.

One program normalises one row (e.g. hidden 4096 -> one 4096-wide tile), so the row is read
once, reduced in registers and written once: 2 reads + 2 writes per element with a residual
(x, residual in; out, new_residual out), 1 + 1 without.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from fast.kernels._checks import (
    FLOAT_DTYPES,
    check_last_dim_contiguous,
    check_same_device,
    check_same_dtype,
    check_shape,
    check_tensor,
)
from fast.kernels.pdl import wait_then_release
from fast.kernels.rows_per_program import rows_per_program as resolve_rows_per_program

# A row of up to this many elements is held in registers by one program.
MAX_HIDDEN = 65536


@triton.jit
def _add_rmsnorm_kernel(
    x_ptr,
    residual_ptr,
    weight_ptr,
    out_ptr,
    residual_out_ptr,
    x_row_stride,
    residual_row_stride,
    out_row_stride,
    residual_out_row_stride,
    num_rows,
    hidden,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK_HIDDEN: tl.constexpr,
    ROWS_PER_PROGRAM: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    wait_then_release(USE_PDL)  # first: see fast/kernels/pdl.py
    if ROWS_PER_PROGRAM == 1:  # a GPU's choice: one row, a [BLOCK_HIDDEN] tile
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK_HIDDEN)  # hidden=4096 -> BLOCK_HIDDEN=4096; hidden=3000 -> 4096, masked
        mask = cols < hidden
    else:  # the interpreter's: rows pid * ROWS_PER_PROGRAM + r, a [ROWS_PER_PROGRAM, BLOCK_HIDDEN] tile
        row = (tl.program_id(0).to(tl.int64) * ROWS_PER_PROGRAM + tl.arange(0, ROWS_PER_PROGRAM))[:, None]
        cols = tl.arange(0, BLOCK_HIDDEN)[None, :]
        mask = (row < num_rows) & (cols < hidden)

    values = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    add_then_normalise(
        values, row, cols, mask, residual_ptr, residual_row_stride, residual_out_ptr, residual_out_row_stride,
        weight_ptr, out_ptr, out_row_stride, hidden, eps, HAS_RESIDUAL,
    )  # fmt: skip


@triton.jit
def add_then_normalise(
    values,  # fp32 [BLOCK_HIDDEN]: row `row` of x (masked columns 0); or [ROWS, BLOCK_HIDDEN] for rows [ROWS, 1]
    row,
    cols,
    mask,
    residual_ptr,
    residual_row_stride,
    residual_out_ptr,
    residual_out_row_stride,
    weight_ptr,
    out_ptr,
    out_row_stride,
    hidden,
    eps,
    HAS_RESIDUAL: tl.constexpr,
):
    """The row's residual add (stored, rounded) and RMSNorm (stored): add_rmsnorm's body, which
    fast/kernels/all_reduce_norm.py shares so that the two round alike."""
    if HAS_RESIDUAL:
        residual = tl.load(residual_ptr + row * residual_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
        summed = (values + residual).to(residual_out_ptr.dtype.element_ty)
        tl.store(residual_out_ptr + row * residual_out_row_stride + cols, summed, mask=mask)
        # Normalise the rounded sum: it is the residual the next layer will see.
        values = summed.to(tl.float32)

    # Masked columns were loaded as 0 so they add nothing to the sum of squares. Each row is reduced over
    # its last axis alone, whatever the rows of the tile ([1] or [ROWS, 1] kept for broadcasting).
    mean_square = tl.sum(values * values, axis=-1, keep_dims=True) / hidden
    inverse_rms = 1.0 / tl.sqrt(mean_square + eps)
    weight = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    out = values * inverse_rms * weight
    tl.store(out_ptr + row * out_row_stride + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


def _num_warps_for(block_hidden: int) -> int:
    # 4096 bf16 elements = 8 KiB per row: 8 warps give each thread 16 elements (two 16-byte loads).
    return max(1, min(16, block_hidden // 512))


def add_rmsnorm(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor,
    eps: float,
    *,
    out: torch.Tensor | None = None,
    residual_out: torch.Tensor | None = None,
    pdl: bool = False,
    rows_per_program: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Return (rmsnorm(x + residual) * weight, x + residual); with residual=None, (rmsnorm(x) * weight, None).

    Out-of-place by default. `out` and `residual_out` may be given to write into existing
    buffers; they may alias x / residual (each program reads its whole rows before writing them),
    so `add_rmsnorm(x, r, w, eps, out=x, residual_out=r)` runs fully in place. rows_per_program (a
    power of two) defaults to 1 on a GPU, more on the CPU
    (fast/kernels/rows_per_program.py).
    """
    check_tensor("x", x, ndim=2, dtypes=FLOAT_DTYPES)
    check_tensor("weight", weight, ndim=1, dtypes=FLOAT_DTYPES)
    num_tokens, hidden = x.shape
    check_shape("weight", weight, (hidden,))
    check_last_dim_contiguous("x", x)
    check_same_device("x", x, weight=weight)
    if hidden > MAX_HIDDEN:
        raise ValueError(f"x has hidden size {hidden}; at most {MAX_HIDDEN} is supported")
    if not isinstance(eps, float) or eps <= 0:
        raise ValueError(f"eps must be a positive float, got {eps!r}")
    if weight.stride(0) != 1:
        raise ValueError("weight must be contiguous")

    if residual is not None:
        check_tensor("residual", residual, ndim=2, dtypes=FLOAT_DTYPES)
        check_shape("residual", residual, (num_tokens, hidden))
        check_last_dim_contiguous("residual", residual)
        check_same_device("x", x, residual=residual)
        if residual_out is None:
            residual_out = torch.empty_like(residual)
        check_tensor("residual_out", residual_out, ndim=2, dtypes=FLOAT_DTYPES)
        check_shape("residual_out", residual_out, (num_tokens, hidden))
        check_same_dtype("residual", residual, residual_out=residual_out)
        check_last_dim_contiguous("residual_out", residual_out)
        check_same_device("x", x, residual_out=residual_out)
    elif residual_out is not None:
        raise ValueError("residual_out was given but residual is None")

    if out is None:
        out = torch.empty_like(x)
    check_tensor("out", out, ndim=2, dtypes=FLOAT_DTYPES)
    check_shape("out", out, (num_tokens, hidden))
    check_same_dtype("x", x, out=out)
    check_last_dim_contiguous("out", out)
    check_same_device("x", x, out=out)
    rows_per_program = resolve_rows_per_program("rows_per_program", rows_per_program, x)
    if num_tokens == 0:
        return out, residual_out

    block_hidden = triton.next_power_of_2(hidden)
    # Without a residual the residual pointers are unused; pass x so the kernel still gets a
    # valid pointer of the right type.
    residual_arg = residual if residual is not None else x
    residual_out_arg = residual_out if residual_out is not None else out
    _add_rmsnorm_kernel[(triton.cdiv(num_tokens, rows_per_program),)](
        x,
        residual_arg,
        weight,
        out,
        residual_out_arg,
        x.stride(0),
        residual_arg.stride(0),
        out.stride(0),
        residual_out_arg.stride(0),
        num_tokens,
        hidden,
        eps,
        HAS_RESIDUAL=residual is not None,
        BLOCK_HIDDEN=block_hidden,
        ROWS_PER_PROGRAM=rows_per_program,
        USE_PDL=pdl,
        launch_pdl=pdl,
        num_warps=_num_warps_for(block_hidden),
    )
    return out, residual_out


def rmsnorm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    *,
    out: torch.Tensor | None = None,
    pdl: bool = False,
    rows_per_program: int | None = None,
) -> torch.Tensor:
    """Plain RMSNorm (no residual): rmsnorm(x) * weight."""
    normed, _ = add_rmsnorm(x, None, weight, eps, out=out, pdl=pdl, rows_per_program=rows_per_program)
    return normed
