"""Batch-invariant matmul: out = x @ weight^T (+ bias), each output row reduced in one fixed order.

    x       [M, K]   rows may be strided (last dim dense)
    weight  [N, K]   contiguous (a linear layer's weight, as checkpoints store it)
    bias    [N] or None
    out     [M, N]   in x's dtype, fp32 accumulation

Why: a vendor GEMM picks its algorithm (tile shape, split-K, ...) from M, so a request's row can
be reduced in a different order when the batch around it changes, and its bf16 output with it.
Here the tiles (BLOCK_M, BLOCK_N, BLOCK_K) depend only on the weight's shape and the dtype, never
on M, and there is no split-K: output element (m, n) is always

    acc = 0;  for k0 in 0, BLOCK_K, 2 BLOCK_K, ...:  acc += dot(x[m, k0:k0+BLOCK_K], w[n, k0:k0+BLOCK_K])

with the same instruction for every tile. Rows of a tile do not interact in `tl.dot`, so a row's
result is the same whichever tile, and whichever batch, it lands in.

Grid (cdiv(M, BLOCK_M), cdiv(N, BLOCK_N)). Worked example, M=3, N=4096, BLOCK_N=64: 64 programs
along N; program (0, 5) reads weight rows 320..383 and writes out[0:3, 320:384] (rows 3.. masked).
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


@triton.jit
def _matmul_kernel(
    x_ptr,
    w_ptr,
    bias_ptr,
    out_ptr,
    M,
    N,
    K,
    x_row_stride,
    out_row_stride,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_valid = rows < M
    col_valid = cols < N
    depth = tl.arange(0, BLOCK_K)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_valid = (k0 + depth) < K
        # x tile [BLOCK_M, BLOCK_K]; weight tile read as [BLOCK_K, BLOCK_N] (w^T): w[n, k] at n * K + k.
        x_tile = tl.load(
            x_ptr + rows.to(tl.int64)[:, None] * x_row_stride + (k0 + depth)[None, :],
            mask=row_valid[:, None] & k_valid[None, :],
            other=0.0,
        )
        w_tile = tl.load(
            w_ptr + cols.to(tl.int64)[None, :] * K + (k0 + depth)[:, None],
            mask=col_valid[None, :] & k_valid[:, None],
            other=0.0,
        )
        acc += tl.dot(x_tile, w_tile, input_precision=DOT_PRECISION)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols, mask=col_valid, other=0.0).to(tl.float32)[None, :]
    out_offsets = rows.to(tl.int64)[:, None] * out_row_stride + cols[None, :]
    tl.store(out_ptr + out_offsets, acc.to(out_ptr.dtype.element_ty), mask=row_valid[:, None] & col_valid[None, :])


def matmul_tiles(n: int, k: int, dtype: torch.dtype) -> tuple[int, int, int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages) from the weight's shape and dtype only.

    BLOCK_M 16 wastes little on decode batches (1..16 rows) and still feeds tensor cores; a
    narrow BLOCK_N gives a batch-1 decode enough programs to spread over the SMs (N=1024 -> 16).
    fp32 halves BLOCK_K so a stage's tiles stay the same size in bytes.
    """
    block_k = 64 if dtype == torch.float32 else 128
    block_k = min(block_k, max(16, triton.next_power_of_2(k)))
    block_n = 64 if n >= 64 else max(16, triton.next_power_of_2(n))
    return 16, block_n, block_k, 4, 3


def invariant_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *, out: torch.Tensor | None = None
) -> torch.Tensor:
    """x [M, K] @ weight[N, K]^T (+ bias [N]) -> [M, N], each row reduced in an order independent of M."""
    check_tensor("x", x, ndim=2, dtypes=FLOAT_DTYPES)
    check_tensor("weight", weight, ndim=2, dtypes=FLOAT_DTYPES)
    rows, depth = x.shape
    width = weight.shape[0]
    check_shape("weight", weight, (width, depth))
    check_same_dtype("x", x, weight=weight)
    check_same_device("x", x, weight=weight)
    check_last_dim_contiguous("x", x)
    if not weight.is_contiguous():
        raise ValueError("weight must be contiguous")
    if bias is not None:
        check_tensor("bias", bias, ndim=1, dtypes=FLOAT_DTYPES)
        check_shape("bias", bias, (width,))
        check_same_device("x", x, bias=bias)
    if out is None:
        out = torch.empty((rows, width), dtype=x.dtype, device=x.device)
    check_tensor("out", out, ndim=2, dtypes=(x.dtype,))
    check_shape("out", out, (rows, width))
    check_last_dim_contiguous("out", out)
    if rows == 0:
        return out
    block_m, block_n, block_k, num_warps, num_stages = matmul_tiles(width, depth, x.dtype)
    grid = (triton.cdiv(rows, block_m), triton.cdiv(width, block_n))
    _matmul_kernel[grid](
        x,
        weight,
        bias if bias is not None else weight,  # unused without a bias; any valid pointer
        out,
        rows,
        width,
        depth,
        x.stride(0),
        out.stride(0),
        HAS_BIAS=bias is not None,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
        num_warps=num_warps,
        num_stages=num_stages,
    )
    return out
