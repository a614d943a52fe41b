"""Batch-invariant matmul: out = x @ weight^T (+ bias), each output row reduced in one fixed order.

    x       [M, K]   rows may be strided (last dim dense)
    weight  [N, K]   contiguous (a linear layer's weight, as checkpoints store it)
    bias    [N] or None
    out     [M, N]   in x's dtype, fp32 accumulation

Why: a vendor GEMM picks its algorithm (tile shape, split-K, ...) from M, so a request's row can
be reduced in a different order when the batch around it changes, and its bf16 output with it.
Here the launch configuration (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages: MatmulConfig) depends
only on the weight's shape and the dtype, never on M, and there is no split-K. M is a runtime
argument that Triton does not specialise on (do_not_specialize, not even M == 1), so every M runs
the same compiled kernel (given the same strides and alignment, which only change how tiles are
copied, never the arithmetic), and output element (m, n) is always

    acc = 0;  for k0 in 0, BLOCK_K, 2 BLOCK_K, ...:  acc = dot(x[m, k0:k0+BLOCK_K], w[n, k0:k0+BLOCK_K], acc)

with the same instruction sequence for every tile. Rows of a tile do not interact in `tl.dot`
(row m of the product reads row m of the x tile only), so a row's result is the same whichever
tile, and whichever batch, it lands in. Rows past M in the last row tile are read from row
(r mod M), columns past N from weight row (n mod N): valid memory, no load mask; their results are
never stored.

Program order: a 1-D grid of cdiv(M, BLOCK_M) * cdiv(N, BLOCK_N) programs, in groups of GROUP_M
row tiles: within a group, consecutive programs take consecutive row tiles of one column tile,
then the next column tile. Programs running at the same time then share a few x row tiles and a
few weight column tiles (L2 reuse at large M). The order decides only which program computes a
tile, never how, so it does not affect any value (GROUP_M=0: no groups, row tiles fastest).

Worked example, Qwen3-0.6B qkv in bf16 (N=4096, K=1024; defaults BLOCK_M=64, BLOCK_N=128,
BLOCK_K=64, GROUP_M=8):
    M=3:    1 row tile x 32 column tiles = 32 programs. Program 5 computes tile (0, 5): x rows 0..63
            (rows 3..63 re-read rows 0..2 and are dropped), weight rows 640..767, in 16 steps of
            K=64 (w[n, k] at n * K + k); it writes out[0:3, 640:768].
    M=1000: 16 row tiles (the last covers rows 960..1023, 40 of them real) x 32 = 512 programs,
            two groups of 8 x 32 = 256. Program 300 is number 44 of group 1 (first row tile 8):
            tile (8 + 44 % 8, 44 // 8) = (12, 5): x rows 768..831, the same weight rows 640..767.
    Row 2 of the M=3 call and row 2 of the M=1000 call (tile (0, 5) there too) meet the same 16
    weight tiles in the same order: out[2, 640:768] is bitwise the same; so is row 800 of the
    M=1000 call and row 0 of a call with x[800:801] alone.
"""

from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from fast.kernels._checks import (
    FLOAT_DTYPES,
    check_last_dim_contiguous,
    check_power_of_two,
    check_same_device,
    check_same_dtype,
    check_shape,
    check_tensor,
)


@triton.jit(do_not_specialize=["M"])
def _matmul_kernel(
    x_ptr,
    w_ptr,
    bias_ptr,
    out_ptr,
    M,  # not specialised (not even M == 1): one compiled kernel for every row count
    N,
    K,
    x_row_stride,
    out_row_stride,
    HAS_BIAS: tl.constexpr,
    EVEN_K: tl.constexpr,  # K % BLOCK_K == 0 (a property of the weight): no mask along K
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    pid = tl.program_id(0)
    tiles_m = tl.cdiv(M, BLOCK_M)
    if GROUP_M == 0:
        tile_m = pid % tiles_m
        tile_n = pid // tiles_m
    else:
        tiles_n = tl.cdiv(N, BLOCK_N)
        group_size = GROUP_M * tiles_n
        first_m = (pid // group_size) * GROUP_M
        group_rows = tl.minimum(tiles_m - first_m, GROUP_M)
        tile_m = first_m + (pid % group_size) % group_rows
        tile_n = (pid % group_size) // group_rows
    rows = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)
    # Rows past M (cols past N) re-read real rows; each result row depends on its own x row only,
    # and the store below drops them. No mask on these loads: full-width, pipelined copies.
    read_rows = rows % M
    read_cols = cols % N
    depth = tl.arange(0, BLOCK_K)
    # x tile [BLOCK_M, BLOCK_K] at x[m, k] = m * x_row_stride + k; weight tile read as
    # [BLOCK_K, BLOCK_N] (w^T) at w[n, k] = n * K + k. int64: a vocabulary head's N * K may pass 2^31.
    x_ptrs = x_ptr + read_rows.to(tl.int64)[:, None] * x_row_stride + depth[None, :]
    w_ptrs = w_ptr + read_cols.to(tl.int64)[None, :] * K + depth[:, None]
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        if EVEN_K:
            x_tile = tl.load(x_ptrs)
            w_tile = tl.load(w_ptrs)
        else:
            k_valid = (k0 + depth) < K
            x_tile = tl.load(x_ptrs, mask=k_valid[None, :], other=0.0)
            w_tile = tl.load(w_ptrs, mask=k_valid[:, None], other=0.0)
        acc = tl.dot(x_tile, w_tile, acc, input_precision=DOT_PRECISION)
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    col_valid = cols < N
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols, mask=col_valid, other=0.0).to(tl.float32)[None, :]
    out_offsets = rows.to(tl.int64)[:, None] * out_row_stride + cols[None, :]
    tl.store(out_ptr + out_offsets, acc.to(out_ptr.dtype.element_ty), mask=(rows < M)[:, None] & col_valid[None, :])


class MatmulConfig(NamedTuple):
    """Launch parameters of invariant_linear; a function of the weight's shape and dtype, never of M."""

    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    group_m: int  # row tiles per group of the program order; 0: no groups (row tiles fastest)


@lru_cache(maxsize=256)  # called on every launch; a model has a handful of weight shapes
def matmul_tiles(n: int, k: int, dtype: torch.dtype) -> MatmulConfig:
    """The default launch parameters from the weight's shape [n, k] and the dtype only.

    - BLOCK_M 64: the smallest row tile Hopper's warpgroup MMA (wgmma) takes. The kernel must run
      the same tiles for a 1-row decode and an 8192-row prefill chunk. The previous default, 16-row
      tiles (below wgmma's minimum, and re-reading every weight tile once per 16 rows), cut the
      engine's offline-256 throughput by 56% in this mode on an H200. 64 rather than 128 wastes
      half as much tensor-core work at decode.
    - N >= 4096 (qkv, gate_up, the LM head, the 8B o_proj and down): BLOCK_N 128, BLOCK_K 64.
      Narrower weights (N < 4096: the 0.6B o_proj and down, N = 1024): BLOCK_N 64 keeps a batch-1
      decode at 16 programs rather than 8, and BLOCK_K 128 keeps a stage's weight tile at 16 KiB
      as with 128 x 64 (a decode is bound by the weight bytes those few programs keep in flight).
    - 4 warps (one warpgroup), 4 pipeline stages (at most 128 KiB of shared memory in bf16),
      GROUP_M 8.
    - fp32 (ieee dots) halves BLOCK_K, so a stage's tiles stay the same size in bytes.
    - Weights narrower or shallower than a tile get the next power of two >= 16 instead.
    Not yet tuned by measurement: reports/invariant_matmul_bench.py times these against cuBLAS
    and the alternatives it lists, at the Qwen3-0.6B and -8B shapes.
    """
    block_n, block_k = (128, 64) if n >= 4096 else (64, 128)
    if dtype == torch.float32:
        block_k //= 2
    block_n = min(block_n, max(16, triton.next_power_of_2(n)))
    block_k = min(block_k, max(16, triton.next_power_of_2(k)))
    return MatmulConfig(block_m=64, block_n=block_n, block_k=block_k, num_warps=4, num_stages=4, group_m=8)


def matmul_config(
    n: int,
    k: int,
    dtype: torch.dtype,
    *,
    block_m: int | None = None,
    block_n: int | None = None,
    block_k: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    group_m: int | None = None,
) -> MatmulConfig:
    """matmul_tiles(n, k, dtype) with the given fields replaced, each checked.

    Raises ValueError for an override out of range (TypeError for one that is not an int).
    """
    if block_m is not None:
        check_power_of_two("block_m", block_m, low=16, high=256)
    if block_n is not None:
        check_power_of_two("block_n", block_n, low=16, high=256)
    if block_k is not None:
        check_power_of_two("block_k", block_k, low=16, high=512)
    if num_warps is not None:
        check_power_of_two("num_warps", num_warps, low=1, high=16)
    if num_stages is not None:
        _check_int_in("num_stages", num_stages, 1, 8)
    if group_m is not None:
        _check_int_in("group_m", group_m, 0, 4096)
    overrides = {
        "block_m": block_m,
        "block_n": block_n,
        "block_k": block_k,
        "num_warps": num_warps,
        "num_stages": num_stages,
        "group_m": group_m,
    }
    return matmul_tiles(n, k, dtype)._replace(**{key: value for key, value in overrides.items() if value is not None})


def _check_int_in(name: str, value: object, low: int, high: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be a Python int, got {type(value).__name__}")
    if not low <= value <= high:
        raise ValueError(f"{name} must be in [{low}, {high}], got {value}")


def invariant_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    out: torch.Tensor | None = None,
    block_m: int | None = None,
    block_n: int | None = None,
    block_k: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    group_m: int | None = None,
) -> torch.Tensor:
    """x [M, K] @ weight[N, K]^T (+ bias [N]) -> [M, N], each row reduced in an order independent of M.

    The keyword-only tile arguments override matmul_tiles' defaults (benchmarks and tests). A row's
    result is batch-invariant only across calls with the same configuration: give the same
    overrides for every M.
    """
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
    config = matmul_config(
        width,
        depth,
        x.dtype,
        block_m=block_m,
        block_n=block_n,
        block_k=block_k,
        num_warps=num_warps,
        num_stages=num_stages,
        group_m=group_m,
    )
    if out is None:
        out = torch.empty((rows, width), dtype=x.dtype, device=x.device)
    check_tensor("out", out, ndim=2, dtypes=(x.dtype,))
    check_shape("out", out, (rows, width))
    check_last_dim_contiguous("out", out)
    check_same_device("x", x, out=out)
    if rows == 0 or width == 0:
        return out
    grid = (triton.cdiv(rows, config.block_m) * triton.cdiv(width, config.block_n),)
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
        EVEN_K=depth % config.block_k == 0,
        BLOCK_M=config.block_m,
        BLOCK_N=config.block_n,
        BLOCK_K=config.block_k,
        GROUP_M=config.group_m,
        DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
        num_warps=config.num_warps,
        num_stages=config.num_stages,
    )
    return out
