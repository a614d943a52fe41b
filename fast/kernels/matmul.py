"""Batch-invariant matmul: out = x @ weight^T (+ bias), each output row reduced in one fixed order.

    x       [M, K]   rows may be strided (last dim dense)
    weight  [N, K]   contiguous (a linear layer's weight, as checkpoints store it)
    bias    [N] or None
    out     [M, N]   in x's dtype, fp32 accumulation

Why: a vendor GEMM picks its algorithm (tile shape, split-K, ...) from M, so a request's row can
be reduced in a different order when the batch around it changes, and its bf16 output with it.
Here the launch configuration (BLOCK_M, BLOCK_N, BLOCK_K, CHUNK_K, warps, stages: MatmulConfig)
depends only on the weight's shape and the dtype, never on M. M is a runtime argument that Triton
does not specialise on (do_not_specialize, not even M == 1), so every M runs the same compiled
kernels (given the same strides and alignment, which only change how tiles are copied, never the
arithmetic).

The arithmetic: a fixed-chunk split of K. K is cut into chunks of CHUNK_K elements (a multiple of
BLOCK_K, from the weight's shape and dtype; the last chunk may be shorter), and output element
(m, n) is always

    total = 0  (fp32)
    for each chunk c (K range c * CHUNK_K .. min((c + 1) * CHUNK_K, K)):
        part = 0;  for each k0 in the chunk, BLOCK_K apart:  part = dot(x[m, k0:k0+BLOCK_K], w[n, k0:k0+BLOCK_K], part)
        total = total + part
    total = total + bias[n]  (if any);   out[m, n] = total cast to out's dtype

with the same instruction sequence for every tile. The chunk boundaries come from K and CHUNK_K
alone, each part starts from zero and takes the same BLOCK_K steps, and the parts are added in chunk
order: nothing in this depends on M. Rows of a tile do not interact in `tl.dot` (row m of the
product reads row m of the x tile only), so a row's result is the same whichever tile, and whichever
batch, it lands in. Rows past M in the last row tile are read from row (r mod M), columns past N
from weight row (n mod N): valid memory, no load mask; their results are never stored.

Two launch paths compute exactly that, bit for bit the same:
- fused (_matmul_kernel): one program per (row tile, column tile) walks all of K in one flat loop of
  BLOCK_K steps, adding `part` to `total` (and restarting it from zero) after the last step of each
  chunk. One flat loop, not a loop over chunks around a loop over steps: Triton's software
  pipeliner pipelines the innermost loop only, and a 4-step inner loop would pay the pipeline's
  fill and drain once per chunk on large-M prefill matmuls. (Triton pipelines a flat loop with a
  conditionally reset accumulator, as in its persistent-matmul tutorial. Compiled for sm_90 with
  Triton 3.9, the tile loads stay pipelined across chunk ends; the flush itself has to wait for
  the in-flight wgmma, so the MMAs drain once per chunk: reports/bench/kernels/invariant_matmul.py's
  `unchunked` variant measures what that costs a prefill.)
- split (_matmul_chunk_kernel, then _sum_chunks_kernel): one program per (row tile, column tile,
  chunk) computes its chunk's `part` with the same tile loads and the same dot sequence from zero,
  and stores it in fp32 to a workspace [num_chunks, M, N] (allocated with torch.empty by
  invariant_linear on each call; the caching allocator, or a CUDA graph's pool, makes that cheap).
  The second kernel adds the parts in chunk order from zero, adds the bias, casts and stores.
  A batch-1 decode launches num_chunks times as many matmul programs (with the defaults, 4 to 6
  times: 64 to 192 for the Qwen3-0.6B layers rather than 16 to 48), enough to keep more of the
  weight in flight.
  With `counters` (`matmul_counters`, int32, one per tile, all 0), the split path is one launch: the tile's chunk
  programs count themselves in as they finish (fast/kernels/arrival.py's last_to_arrive), and the last of them runs
  the second kernel's sum for the tile (`_sum_tile`: the same fp32 adds from zero in chunk order, elementwise, so the
  same bits on any device) and puts its counter back to 0. A batch-1 decode step in batch-invariant mode then launches
  one kernel per projection, not two (112 fewer a step at Qwen3-0.6B).
Because the two paths give the same bits, the choice between them may depend on M: the split path
when K has more than one chunk and the fused grid would have fewer programs than the GPU has SMs
(invariant_linear's `split` forces either path, for tests and benchmarks).

Program order: the (row tile, column tile) grid is 1-D, cdiv(M, BLOCK_M) * cdiv(N, BLOCK_N)
programs, in groups of GROUP_M row tiles: within a group, consecutive programs take consecutive
row tiles of one column tile, then the next column tile. Programs running at the same time then
share a few x row tiles and a few weight column tiles (L2 reuse at large M). The split path adds
the chunk as a second grid axis. The order decides only which program computes a tile, never how,
so it does not affect any value (GROUP_M=0: no groups, row tiles fastest).

Worked example, Qwen3-0.6B qkv in bf16 (N=4096, K=1024; defaults BLOCK_M=64, BLOCK_N=128,
BLOCK_K=64, CHUNK_K=256: 4 chunks of 4 steps, GROUP_M=8; an H200 has 132 SMs):
    M=3:    1 row tile x 32 column tiles = 32 fused programs, fewer than 132: the split path.
            Grid (32, 4) = 128 programs. Program (5, 2) computes tile (0, 5), chunk 2: x rows 0..63
            (rows 3..63 re-read rows 0..2 and are dropped), weight rows 640..767, K range 512..767
            in 4 steps from zero (k0 = 512, 576, 640, 704; w[n, k] at n * K + k); it writes
            ws[2, 0:3, 640:768] (ws[c, m, n] at (c * M + m) * N + n). Then, per element,
            out[m, n] = (((0 + ws[0, m, n]) + ws[1, m, n]) + ws[2, m, n]) + ws[3, m, n].
    M=1000: 16 row tiles (the last covers rows 960..1023, 40 of them real) x 32 = 512 programs:
            fused, two groups of 8 x 32 = 256. Program 300 is number 44 of group 1 (first row tile
            8): tile (8 + 44 % 8, 44 // 8) = (12, 5): x rows 768..831, the same weight rows
            640..767, in 16 steps (k0 = 0, 64, ..., 960), adding part to total after steps 3, 7, 11
            and 15 (after k0 = 192, 448, 704, 960): the same four parts, each from zero over the
            same K range, added in the same order.
    Row 2 of the M=3 call and row 2 of the M=1000 call (tile (0, 5) there too) meet the same 16
    weight tiles in the same chunks: out[2, 640:768] is bitwise the same; so is row 800 of the
    M=1000 call and row 0 of a call with x[800:801] alone.
A ragged K (the tests' overrides): K=72, BLOCK_K=16, CHUNK_K=32: 5 steps (k0 = 0, 16, 32, 48, 64; the
last masked past K, as 72 % 16 != 0: EVEN_K false) in chunks K 0..31, 32..63 and 64..71. The fused
loop adds part to total after steps 1, 3 and 4 (the last step); the split grid has 3 chunks, the
last running 1 step.
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
from fast.kernels.arrival import last_to_arrive
from fast.kernels.pdl import wait_then_release

CHUNK_STEPS = 4  # BLOCK_K steps per reduction chunk by default (CHUNK_K = CHUNK_STEPS * BLOCK_K)
# The split path's threshold where there is no CUDA device (the interpreter): an H200's SM count,
# so CPU tests choose the paths as the GPU the engine targets would.
DEFAULT_MULTIPROCESSORS = 132
SUM_BLOCK = 1024  # outputs per program of _sum_chunks_kernel (an elementwise pass: any size works)


# ----------------------------------------------------------------------------- tile helpers (inlined)


@triton.jit
def _tile_of_program(pid, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """(row tile, column tile) of 1-D program `pid` in the grouped order of the module docstring."""
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
    return tile_m, tile_n


@triton.jit
def _tile_pointers(x_ptr, w_ptr, rows, cols, M, N, K, x_row_stride, k_start, BLOCK_K: tl.constexpr):
    """Pointers to the first x tile [BLOCK_M, BLOCK_K] and weight tile [BLOCK_K, BLOCK_N] at K offset k_start."""
    # Rows past M (cols past N) re-read real rows; each result row depends on its own x row only,
    # and the stores drop them. No mask on these loads: full-width, pipelined copies.
    read_rows = rows % M
    read_cols = cols % N
    depth = k_start + tl.arange(0, BLOCK_K)
    # x[m, k] at m * x_row_stride + k; the weight tile read as w^T at w[n, k] = n * K + k.
    # int64: a vocabulary head's N * K may pass 2^31.
    x_ptrs = x_ptr + read_rows.to(tl.int64)[:, None] * x_row_stride + depth[None, :]
    w_ptrs = w_ptr + read_cols.to(tl.int64)[None, :] * K + depth[:, None]
    return x_ptrs, w_ptrs


@triton.jit
def _dot_step(
    x_ptrs,
    w_ptrs,
    part,
    k0,
    K,
    EVEN_K: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """part [BLOCK_M, BLOCK_N] + x tile [BLOCK_M, BLOCK_K] @ w tile [BLOCK_K, BLOCK_N] for K range k0..k0+BLOCK_K.

    The one step both paths run: same loads (masked past K only when K % BLOCK_K != 0), same dot.
    """
    if EVEN_K:
        x_tile = tl.load(x_ptrs)
        w_tile = tl.load(w_ptrs)
    else:
        k_valid = (k0 + tl.arange(0, BLOCK_K)) < K
        x_tile = tl.load(x_ptrs, mask=k_valid[None, :], other=0.0)
        w_tile = tl.load(w_ptrs, mask=k_valid[:, None], other=0.0)
    return tl.dot(x_tile, w_tile, part, input_precision=DOT_PRECISION)


# ----------------------------------------------------------------------------- kernels


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
    STEPS_PER_CHUNK: tl.constexpr,  # CHUNK_K // BLOCK_K
    GROUP_M: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """The fused path: one program per (row tile, column tile), all chunks in one flat K loop."""
    wait_then_release(USE_PDL)  # first: see fast/kernels/pdl.py
    tile_m, tile_n = _tile_of_program(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    rows = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)
    x_ptrs, w_ptrs = _tile_pointers(x_ptr, w_ptr, rows, cols, M, N, K, x_row_stride, 0, BLOCK_K)
    total = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    part = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    num_steps = tl.cdiv(K, BLOCK_K)
    # One flat loop over BLOCK_K steps (the pipeliner pipelines only the innermost loop), flushing
    # `part` into `total` at each chunk end: the same parts, added in the same order, as the split path.
    for step in range(0, num_steps):
        part = _dot_step(x_ptrs, w_ptrs, part, step * BLOCK_K, K, EVEN_K, BLOCK_K, DOT_PRECISION)
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
        if ((step + 1) % STEPS_PER_CHUNK == 0) | (step == num_steps - 1):
            total += part
            part = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    col_valid = cols < N
    if HAS_BIAS:
        total += tl.load(bias_ptr + cols, mask=col_valid, other=0.0).to(tl.float32)[None, :]
    out_offsets = rows.to(tl.int64)[:, None] * out_row_stride + cols[None, :]
    tl.store(out_ptr + out_offsets, total.to(out_ptr.dtype.element_ty), mask=(rows < M)[:, None] & col_valid[None, :])


@triton.jit(do_not_specialize=["M"])
def _matmul_chunk_kernel(
    x_ptr,
    w_ptr,
    ws_ptr,  # fp32 [num_chunks, M, N], contiguous
    bias_ptr,  # SUM_LAST only, as are the three below
    out_ptr,
    counters_ptr,  # int32 [>= tiles], 0
    M,  # not specialised, as in _matmul_kernel
    N,
    K,
    x_row_stride,
    out_row_stride,
    HAS_BIAS: tl.constexpr,
    SUM_LAST: tl.constexpr,  # the tile's last chunk program sums the parts into out (no _sum_chunks_kernel)
    NUM_CHUNKS: tl.constexpr,
    EVEN_K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    STEPS_PER_CHUNK: tl.constexpr,
    GROUP_M: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """The split path's first kernel: program (tile, chunk) stores its chunk's part to ws[chunk]."""
    wait_then_release(USE_PDL)  # first: see fast/kernels/pdl.py
    tile_m, tile_n = _tile_of_program(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    chunk = tl.program_id(1)
    rows = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)
    first_step = chunk * STEPS_PER_CHUNK
    steps = tl.minimum(STEPS_PER_CHUNK, tl.cdiv(K, BLOCK_K) - first_step)  # the last chunk may be shorter
    x_ptrs, w_ptrs = _tile_pointers(x_ptr, w_ptr, rows, cols, M, N, K, x_row_stride, first_step * BLOCK_K, BLOCK_K)
    part = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for step in range(0, steps):
        part = _dot_step(x_ptrs, w_ptrs, part, (first_step + step) * BLOCK_K, K, EVEN_K, BLOCK_K, DOT_PRECISION)
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    # ws[c, m, n] at (c * M + m) * N + n, in int64 (M * N of a large forced split may pass 2^31).
    ws_rows = chunk.to(tl.int64) * M + rows.to(tl.int64)
    ws_offsets = ws_rows[:, None] * N + cols[None, :]
    valid = (rows < M)[:, None] & (cols < N)[None, :]
    tl.store(ws_ptr + ws_offsets, part, mask=valid)
    if SUM_LAST:
        if last_to_arrive(counters_ptr + tl.program_id(0), NUM_CHUNKS):
            _sum_tile(ws_ptr, bias_ptr, out_ptr, rows, cols, valid, M, N, out_row_stride, HAS_BIAS, NUM_CHUNKS)


@triton.jit
def _sum_tile(
    ws_ptr, bias_ptr, out_ptr, rows, cols, valid, M, N, out_row_stride, HAS_BIAS: tl.constexpr, NUM_CHUNKS: tl.constexpr
):
    """out[rows, cols] = (0 + ws[0] + ws[1] + ...) (+ bias), cast: _sum_chunks_kernel's adds for one tile, read
    from L2 (".cg": the other chunks' programs wrote them)."""
    elements = M.to(tl.int64) * N
    offsets = rows.to(tl.int64)[:, None] * N + cols[None, :]  # m * N + n
    total = tl.zeros(offsets.shape, dtype=tl.float32)
    for chunk in tl.static_range(NUM_CHUNKS):
        total += tl.load(ws_ptr + (elements * chunk + offsets), mask=valid, other=0.0, cache_modifier=".cg")
    if HAS_BIAS:
        total += tl.load(bias_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
    out_offsets = rows.to(tl.int64)[:, None] * out_row_stride + cols[None, :]
    tl.store(out_ptr + out_offsets, total.to(out_ptr.dtype.element_ty), mask=valid)


@triton.jit(do_not_specialize=["M"])
def _sum_chunks_kernel(
    ws_ptr,  # fp32 [NUM_CHUNKS, M, N], contiguous
    bias_ptr,
    out_ptr,
    M,
    N,
    out_row_stride,
    HAS_BIAS: tl.constexpr,
    NUM_CHUNKS: tl.constexpr,  # cdiv(K, CHUNK_K): a property of the weight and the config
    BLOCK: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """The split path's second kernel: out[m, n] = (0 + ws[0, m, n] + ws[1, m, n] + ...) (+ bias[n]).

    Elementwise over the M * N outputs, BLOCK consecutive ones (row-major) per program. The chunk
    loop is unrolled so that all its loads are in flight at once (a decode's sum is latency-bound);
    the adds stay in chunk order.
    """
    wait_then_release(USE_PDL)  # first: see fast/kernels/pdl.py
    elements = M.to(tl.int64) * N
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)  # m * N + n
    valid = offsets < elements
    total = tl.zeros([BLOCK], dtype=tl.float32)
    for chunk in tl.static_range(NUM_CHUNKS):
        total += tl.load(ws_ptr + (elements * chunk + offsets), mask=valid, other=0.0)  # ws[c, m, n]
    cols = offsets % N
    if HAS_BIAS:
        total += tl.load(bias_ptr + cols, mask=valid, other=0.0).to(tl.float32)
    out_offsets = (offsets // N) * out_row_stride + cols
    tl.store(out_ptr + out_offsets, total.to(out_ptr.dtype.element_ty), mask=valid)


# ----------------------------------------------------------------------------- configuration


class MatmulConfig(NamedTuple):
    """Launch parameters of invariant_linear; a function of the weight's shape and dtype, never of M."""

    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    group_m: int  # row tiles per group of the program order; 0: no groups (row tiles fastest)
    chunk_k: int  # K elements per reduction chunk (a multiple of block_k): decides the arithmetic


def default_chunk_k(k: int, block_k: int) -> int:
    """CHUNK_STEPS * block_k, capped to the weight's depth rounded up to block_k (one chunk then)."""
    return min(CHUNK_STEPS, max(1, triton.cdiv(k, block_k))) * block_k


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
    - CHUNK_K 4 x BLOCK_K (256 or 512 in bf16/fp16): a batch-1 decode's split path then runs 4 to 6
      times as many programs as tiles (the Qwen3-0.6B layers: 64 to 192 rather than 16 to 48), each
      running 4 BLOCK_K steps. The split path's fp32
      workspace is num_chunks x M x N (the 0.6B layers: 4 to 6 chunks). A weight shallower than a
      chunk has one chunk (default_chunk_k).
    - 4 warps (one warpgroup), 4 pipeline stages (at most 128 KiB of shared memory in bf16),
      GROUP_M 8.
    - fp32 (ieee dots) halves BLOCK_K, so a stage's tiles stay the same size in bytes (and CHUNK_K
      halves with it).
    - Weights narrower or shallower than a tile get the next power of two >= 16 instead.
    Not yet tuned by measurement: reports/bench/kernels/invariant_matmul.py times these against cuBLAS
    and the alternatives it lists, at the Qwen3-0.6B and -8B shapes.
    """
    block_n, block_k = (128, 64) if n >= 4096 else (64, 128)
    if dtype == torch.float32:
        block_k //= 2
    block_n = min(block_n, max(16, triton.next_power_of_2(n)))
    block_k = min(block_k, max(16, triton.next_power_of_2(k)))
    return MatmulConfig(
        block_m=64,
        block_n=block_n,
        block_k=block_k,
        num_warps=4,
        num_stages=4,
        group_m=8,
        chunk_k=default_chunk_k(k, block_k),
    )


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
    chunk_k: int | None = None,
) -> MatmulConfig:
    """matmul_tiles(n, k, dtype) with the given fields replaced, each checked.

    Without chunk_k, the chunk is default_chunk_k of the (possibly overridden) block_k; a chunk_k
    given must be a positive multiple of the block_k in effect.
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
    config = matmul_tiles(n, k, dtype)._replace(**{key: value for key, value in overrides.items() if value is not None})
    if chunk_k is None:
        return config._replace(chunk_k=default_chunk_k(k, config.block_k))
    _check_chunk_k(chunk_k, config.block_k)
    return config._replace(chunk_k=chunk_k)


def _check_int_in(name: str, value: object, low: int, high: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be a Python int, got {type(value).__name__}")
    if not low <= value <= high:
        raise ValueError(f"{name} must be in [{low}, {high}], got {value}")


def _check_chunk_k(chunk_k: object, block_k: int) -> None:
    if not isinstance(chunk_k, int) or isinstance(chunk_k, bool):
        raise TypeError(f"chunk_k must be a Python int, got {type(chunk_k).__name__}")
    if chunk_k <= 0 or chunk_k % block_k != 0:
        raise ValueError(f"chunk_k must be a positive multiple of block_k ({block_k}), got {chunk_k}")


def _check_split(split: object) -> None:
    if split is not None and not isinstance(split, bool):
        raise TypeError(f"split must be True, False or None (automatic), got {type(split).__name__}")


def num_chunks(k: int, config: MatmulConfig) -> int:
    """Reduction chunks of a weight of depth k: cdiv(k, chunk_k), and one (empty) for k == 0."""
    return max(1, triton.cdiv(k, config.chunk_k))


# The split path writes and reads every chunk's fp32 part of the [M, N] product, traffic that grows with M while
# the fused grid's idle SMs do not: on the H200 at Qwen3-0.6B's projections the split path was faster at M = 64
# (a forward pass's projections 1.27 x cuBLAS, against 1.55 x fused) and slower at M = 256 (1.92 against 1.51;
# slower or equal at each shape), in reports/results/batch_invariant/run_c949ea7/invariant_matmul_bench.log (the
# split path with its separate sum kernel then). Batch-invariant offline-256 runs most of its decode steps at 256
# rows, where its projections took the split path (reports/results/bench/targets_session12/); with this limit it
# ran 7.8% faster in an alternating A/B (reports/results/bench/landing_ab_session13/). The split path between 64
# and 256 rows is not measured.
SPLIT_MAX_ROWS = 64


@lru_cache(maxsize=16)
def _multiprocessor_count(device: torch.device) -> int:
    if device.type != "cuda":
        return DEFAULT_MULTIPROCESSORS
    return torch.cuda.get_device_properties(device).multi_processor_count


def takes_split_path(m: int, n: int, k: int, config: MatmulConfig, device: torch.device, split: bool | None) -> bool:
    """Whether invariant_linear runs the split path: as forced, else when K has more than one chunk, the fused
    grid would leave SMs idle, and M is at most SPLIT_MAX_ROWS. Depends on M, which is allowed: both paths give
    the same bits."""
    if split is not None:
        return split
    return (
        m <= SPLIT_MAX_ROWS and num_chunks(k, config) > 1 and _tile_count(m, n, config) < _multiprocessor_count(device)
    )


# ----------------------------------------------------------------------------- launch


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
    chunk_k: int | None = None,
    split: bool | None = None,
    counters: torch.Tensor | None = None,
    pdl: bool = False,
) -> torch.Tensor:
    """x [M, K] @ weight[N, K]^T (+ bias [N]) -> [M, N], each row reduced in an order independent of M.

    The keyword-only tile arguments (chunk_k included) override matmul_tiles' defaults (benchmarks
    and tests). A row's result is batch-invariant only across calls with the same configuration:
    give the same overrides for every M. `split` picks the launch path (True: split, False: fused,
    None: takes_split_path's choice); it never changes a value. The split path allocates its fp32
    workspace [num_chunks, M, N] with torch.empty on each call. counters (`matmul_counters`): the split path's
    tiles sum their chunks in their last program (one launch, the same bits) where the counters hold a tile each;
    else, and without them, the second kernel sums. pdl: the kernels launch with programmatic dependent launch
    (fast/kernels/pdl.py: each waits for the one before it first), the same bits.
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
        chunk_k=chunk_k,
    )
    _check_split(split)
    if out is None:
        out = torch.empty((rows, width), dtype=x.dtype, device=x.device)
    check_tensor("out", out, ndim=2, dtypes=(x.dtype,))
    check_shape("out", out, (rows, width))
    check_last_dim_contiguous("out", out)
    check_same_device("x", x, out=out)
    if rows == 0 or width == 0:
        return out
    if counters is not None:
        check_tensor("counters", counters, ndim=1, dtypes=(torch.int32,))
        check_same_device("x", x, counters=counters)
        if not counters.is_contiguous():
            raise ValueError("counters must be contiguous")
    if takes_split_path(rows, width, depth, config, x.device, split):
        sums_last = counters is not None and counters.numel() >= _tile_count(rows, width, config)
        _launch_split(x, weight, bias, out, config, counters if sums_last else None, pdl)
    else:
        _launch_fused(x, weight, bias, out, config, pdl)
    return out


def _tile_parameters(config: MatmulConfig, depth: int, dtype: torch.dtype) -> dict[str, object]:
    """The compile-time parameters both matmul kernels share: the same tiles and the same dots."""
    return {
        "EVEN_K": depth % config.block_k == 0,
        "BLOCK_M": config.block_m,
        "BLOCK_N": config.block_n,
        "BLOCK_K": config.block_k,
        "STEPS_PER_CHUNK": config.chunk_k // config.block_k,
        "GROUP_M": config.group_m,
        "DOT_PRECISION": "ieee" if dtype == torch.float32 else "tf32",
        "num_warps": config.num_warps,
        "num_stages": config.num_stages,
    }


def _tile_count(rows: int, width: int, config: MatmulConfig) -> int:
    return triton.cdiv(rows, config.block_m) * triton.cdiv(width, config.block_n)


def _launch_fused(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    out: torch.Tensor,
    config: MatmulConfig,
    pdl: bool = False,
) -> None:
    (rows, depth), width = x.shape, weight.shape[0]
    _matmul_kernel[(_tile_count(rows, width, config),)](
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
        USE_PDL=pdl,
        launch_pdl=pdl,
        **_tile_parameters(config, depth, x.dtype),
    )


def matmul_counters(device: torch.device) -> torch.Tensor:
    """invariant_linear's split-path arrival counters: int32, one per tile of the largest split (the split path runs
    only while the tiles are fewer than the SMs: takes_split_path), all 0, and every call leaves them so. Calls on
    one stream may share them."""
    return torch.zeros(_multiprocessor_count(device), dtype=torch.int32, device=device)


def _launch_split(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    out: torch.Tensor,
    config: MatmulConfig,
    counters: torch.Tensor | None = None,
    pdl: bool = False,
) -> None:
    """The chunk kernel; then the sum kernel, unless `counters` (a tile each) let each tile's last program sum."""
    (rows, depth), width = x.shape, weight.shape[0]
    chunks = num_chunks(depth, config)
    workspace = torch.empty((chunks, rows, width), dtype=torch.float32, device=x.device)
    _matmul_chunk_kernel[(_tile_count(rows, width, config), chunks)](
        x,
        weight,
        workspace,
        bias if bias is not None else workspace,  # read only with a bias, and only where the last program sums
        out,
        counters if counters is not None else workspace,  # never read without SUM_LAST
        rows,
        width,
        depth,
        x.stride(0),
        out.stride(0),
        HAS_BIAS=bias is not None,
        SUM_LAST=counters is not None,
        NUM_CHUNKS=chunks,
        USE_PDL=pdl,
        launch_pdl=pdl,
        **_tile_parameters(config, depth, x.dtype),
    )
    if counters is not None:
        return
    _sum_chunks_kernel[(triton.cdiv(rows * width, SUM_BLOCK),)](
        workspace,
        bias if bias is not None else workspace,  # unused without a bias; any valid pointer
        out,
        rows,
        width,
        out.stride(0),
        HAS_BIAS=bias is not None,
        NUM_CHUNKS=chunks,
        BLOCK=SUM_BLOCK,
        USE_PDL=pdl,
        launch_pdl=pdl,
    )
