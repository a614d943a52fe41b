"""LM head with the greedy argmax in its epilogue: logits = x @ weight^T in fp32, and each row's (max, argmax).

    x               [M, K]     M <= MAX_GEMV_ROWS; rows may be strided (last dim dense)
    weight          [N, K]     contiguous (the vocabulary head: N = vocab rows)
    logits          [M, N]     fp32 (the fp32 accumulator itself, never rounded to x's dtype); rows dense
    row_max         [M]        fp32: torch.max(logits, dim=-1).values
    row_argmax      [M]        int64: torch.max(logits, dim=-1).indices
    workspace       LmHeadWorkspace: per-program partials [rows, programs] and an arrival counter (int32, 0)

Why: at batch-1 decode the LM head is the largest single weight read of a step (Qwen3-0.6B: 151936 x 1024
bf16, 311 MB; 8B: 151936 x 4096). The engine's path was cuBLAS's linear in bf16, a cast of [M, V] to fp32,
then the sampler's torch.max pass over the fp32 logits for the greedy rows: three launches and two extra
trips of [M, V] through memory. Here the GEMV (fast/kernels/gemv.py's tile loop) writes the fp32 logits and
finds each row's greedy token in the same launch. On one H200 (reports/results/kernels/lm_head_argmax/, bf16,
per call in a CUDA graph, weight from HBM) it beats cuBLAS + cast + max up to 4 rows (0.6B head: 88.5 -> 82.5 us
at M=1, 91.6 -> 90.5 at M=4; 8B: 299.2 -> 287.4, 302.2 -> 292.8) and loses from 8 (0.6B M=16: 103.3 -> 112.0):
the last program's reduction grows with M while the GEMV alone stays at the copy floor (72.8 us against 73.2).
fast.model takes it up to HEAD_ARGMAX_MAX_ROWS rows.

How: grid (cdiv(N, BLOCK_N),), tiles from gemv_config, the K loop of fast.kernels.gemv.gemv_tile (fp32
accumulation, one fixed order). Then each program
    1. stores its fp32 tile of logits,
    2. reduces its tile per row to (max, first index of the max) and stores them at
       partial_max[m, p], partial_index[m, p] (p: the program),
    3. counts itself in (fast.kernels.arrival.last_to_arrive); the last program to arrive reads every
       program's partials back from L2 (".cg" loads) in program order, chunk by chunk, and reduces them to
       the row's max and argmax. The counter is back at 0 for the next call (and for a CUDA-graph replay).
The order of both reductions is fixed, so the results are deterministic. They equal torch.max over the
stored logits exactly (spec.sampling's greedy_tokens and row_max): the first index of the max on ties
(the tiles are in index order, each keeps its first, and a later tile wins only with a strictly larger
value); a row holding a NaN gives NaN and the index of its first NaN; a row of -inf gives -inf and index
0; +inf is a value like any other. These are explicit reductions (min of the indices where a value is
NaN; max of the others, then min of the indices where the value equals it), not tl.argmax, whose NaN
handling is not specified.

Worked example (Qwen3-0.6B, bf16, M=1: gemv_config gives tensor-core tiles BLOCK_N=64, BLOCK_K=256):
2374 programs (151936 / 64). Program 100 reads weight rows 6400..6463, writes logits[0, 6400:6464], and
stores the max of those 64 logits and its first column, say (17.25, 6431), at partial_max[0, 100] and
partial_index[0, 100]. The last of the 2374 programs to finish reads partial_max[0, 0:2374] in chunks of
BLOCK_PROGRAMS, and writes row_max[0] and row_argmax[0].

No host syncs, and no allocation when the outputs and the workspace are given: the wrapper reads shapes,
strides and dtypes only, so a call can be captured in a CUDA graph. Calls on one stream may share a
workspace (each waits for the one before it: stream order, or programmatic dependent launch's wait).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from fast.kernels._checks import (
    FLOAT_DTYPES,
    check_last_dim_contiguous,
    check_power_of_two,
    check_same_device,
    check_shape,
    check_tensor,
)
from fast.kernels.arrival import last_to_arrive
from fast.kernels.gemv import MAX_GEMV_ROWS, Tiles, check_gemv_operands, configured, gemv_config, gemv_tile
from fast.kernels.pdl import wait_then_release

# The partials of this many programs per step of the last program's reduction, at most (times BLOCK_M rows).
REDUCE_ELEMENTS = 4096
# The index of "none" in the index reductions (larger than any vocabulary index: N < 2^31 is checked).
_NO_INDEX = tl.constexpr(2**31 - 1)


@triton.jit
def _first_max(values, indices, valid, AXIS: tl.constexpr):
    """(max, first index of the max) of `values` along AXIS over the `valid` entries, as torch.max gives
    them: NaN and the smallest index holding a NaN where there is one. `indices` are the entries' indices
    (int32), ordered as the values' positions are (the first maximum is the one with the smallest index)."""
    is_nan = valid & (values != values)
    nan_index = tl.min(tl.where(is_nan, indices, _NO_INDEX), axis=AXIS)
    ordinary = valid & (values == values)
    top = tl.max(tl.where(ordinary, values, float("-inf")), axis=AXIS)
    # A row of -inf: top is -inf and equals every valid value, so the first index is the row's first.
    at_top = ordinary & (values == tl.expand_dims(top, AXIS))
    first = tl.min(tl.where(at_top, indices, _NO_INDEX), axis=AXIS)
    has_nan = nan_index != _NO_INDEX
    return tl.where(has_nan, float("nan"), top), tl.where(has_nan, nan_index, first)


@triton.jit
def _lm_head_argmax_kernel(
    x_ptr,
    w_ptr,
    logits_ptr,
    partial_max_ptr,  # fp32 [>= M, partial_row_stride]
    partial_index_ptr,  # int32, the same shape
    row_max_ptr,
    row_argmax_ptr,
    counter_ptr,
    M,
    N,
    K,
    x_row_stride,
    logits_row_stride,
    partial_row_stride,
    EVEN_K: tl.constexpr,
    USE_DOT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    BLOCK_PROGRAMS: tl.constexpr,  # partials per row read at once by the last program
    USE_PDL: tl.constexpr,
):
    wait_then_release(USE_PDL)  # first: see fast/kernels/pdl.py
    # cols: this program's weight rows = vocabulary indices; rows: x's.
    acc, cols, rows = gemv_tile(
        x_ptr, w_ptr, M, N, K, x_row_stride, False, EVEN_K, USE_DOT, BLOCK_M, BLOCK_N, BLOCK_K, DOT_PRECISION
    )  # fmt: skip
    program = tl.program_id(0)
    col_valid = cols < N
    row_valid = rows < M
    # acc[n, m] -> logits[m, n], the fp32 accumulator as it is (the head's logits are fp32 anyway).
    valid = col_valid[:, None] & row_valid[None, :]
    tl.store(logits_ptr + rows.to(tl.int64)[None, :] * logits_row_stride + cols[:, None], acc, mask=valid)
    # This tile's (max, first index) per row, over its valid columns: [BLOCK_M] each.
    indices = tl.broadcast_to(cols[:, None], [BLOCK_N, BLOCK_M])
    tile_max, tile_index = _first_max(acc, indices, valid, 0)
    partial_offsets = rows * partial_row_stride + program
    tl.store(partial_max_ptr + partial_offsets, tile_max, mask=row_valid)
    tl.store(partial_index_ptr + partial_offsets, tile_index, mask=row_valid)
    if last_to_arrive(counter_ptr, tl.num_programs(0)):
        num_programs = tl.num_programs(0)
        programs = tl.arange(0, BLOCK_PROGRAMS)
        row_offsets = rows[:, None] * partial_row_stride
        # The first chunk, then the others in program order: a later chunk's (max, index) replaces the running
        # one only if the running max is not NaN and the chunk's is NaN or strictly larger (ties keep the first).
        mask = row_valid[:, None] & (programs < num_programs)[None, :]
        chunk_max = tl.load(partial_max_ptr + row_offsets + programs[None, :], mask=mask, cache_modifier=".cg")
        chunk_index = tl.load(partial_index_ptr + row_offsets + programs[None, :], mask=mask, cache_modifier=".cg")
        best_max, best_index = _first_max(chunk_max, chunk_index, mask, 1)
        for start in range(BLOCK_PROGRAMS, num_programs, BLOCK_PROGRAMS):
            mask = row_valid[:, None] & (start + programs < num_programs)[None, :]
            offsets = row_offsets + start + programs[None, :]
            chunk_max = tl.load(partial_max_ptr + offsets, mask=mask, cache_modifier=".cg")
            chunk_index = tl.load(partial_index_ptr + offsets, mask=mask, cache_modifier=".cg")
            next_max, next_index = _first_max(chunk_max, chunk_index, mask, 1)
            best_is_nan = best_max != best_max
            takes_next = ~best_is_nan & ((next_max != next_max) | (next_max > best_max))
            best_max = tl.where(takes_next, next_max, best_max)
            best_index = tl.where(takes_next, next_index, best_index)
        tl.store(row_max_ptr + rows, best_max, mask=row_valid)
        tl.store(row_argmax_ptr + rows, best_index.to(tl.int64), mask=row_valid)


class LmHeadWorkspace(NamedTuple):
    """lm_head_argmax's scratch: each program's (max, first index) per row, fp32 and int32 [max_rows,
    max_programs], and the arrival counter (int32 [1], 0; every call leaves it 0)."""

    partial_max: torch.Tensor
    partial_index: torch.Tensor
    counter: torch.Tensor


class LmHeadResult(NamedTuple):
    """lm_head_argmax's outputs: fp32 logits [M, N], each row's max fp32 [M] and its first index int64 [M]."""

    logits: torch.Tensor
    row_max: torch.Tensor
    row_argmax: torch.Tensor


def lm_head_programs(rows: int, n: int, k: int, dtype: torch.dtype, block_n: int | None = None) -> int:
    """The grid of a call of `rows` rows (gemv_config's BLOCK_N, or block_n's override)."""
    return triton.cdiv(n, block_n if block_n is not None else gemv_config(rows, n, k, dtype).block_n)


def lm_head_workspace(
    max_rows: int, n: int, k: int, dtype: torch.dtype, device: torch.device, *, block_n: int | None = None
) -> LmHeadWorkspace:
    """A workspace for every call of up to max_rows rows on a weight [n, k] of `dtype` (with block_n's override
    if given), made once by the caller."""
    if not 1 <= max_rows <= MAX_GEMV_ROWS:
        raise ValueError(f"max_rows must be in [1, {MAX_GEMV_ROWS}], got {max_rows}")
    programs = max(lm_head_programs(rows, n, k, dtype, block_n) for rows in range(1, max_rows + 1))
    return LmHeadWorkspace(
        torch.empty((max_rows, programs), dtype=torch.float32, device=device),
        torch.empty((max_rows, programs), dtype=torch.int32, device=device),
        torch.zeros(1, dtype=torch.int32, device=device),
    )


def lm_head_argmax(
    x: torch.Tensor,
    weight: torch.Tensor,
    *,
    workspace: LmHeadWorkspace | None = None,
    logits_out: torch.Tensor | None = None,
    row_max_out: torch.Tensor | None = None,
    row_argmax_out: torch.Tensor | None = None,
    pdl: bool = False,
    block_n: int | None = None,
    block_k: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    use_dot: bool | None = None,
    block_programs: int | None = None,
) -> LmHeadResult:
    """(fp32 x [M, K] @ weight [N, K]^T, torch.max of it per row) for M <= MAX_GEMV_ROWS, in one launch.

    Outputs and the workspace are allocated where not given (a captured call must be given them all). The
    keyword-only tile arguments override gemv_config's defaults, and block_programs the chunk of partials the
    last program reduces at once (benchmarks and tests)."""
    check_tensor("x", x, ndim=2, dtypes=FLOAT_DTYPES)
    rows, width = check_gemv_operands("x", x, x.shape[1], weight, "x's last dimension")
    depth = x.shape[1]
    if width == 0:
        raise ValueError("weight has no rows: an empty vocabulary has no max")
    if width >= _NO_INDEX.value:
        raise ValueError(f"weight has {width} rows; the argmax's indices are int32 inside the kernel")
    device = x.device
    if logits_out is None:
        logits_out = torch.empty((rows, width), dtype=torch.float32, device=device)
    if row_max_out is None:
        row_max_out = torch.empty(rows, dtype=torch.float32, device=device)
    if row_argmax_out is None:
        row_argmax_out = torch.empty(rows, dtype=torch.int64, device=device)
    check_tensor("logits_out", logits_out, ndim=2, dtypes=(torch.float32,))
    check_shape("logits_out", logits_out, (rows, width))
    check_last_dim_contiguous("logits_out", logits_out)
    check_tensor("row_max_out", row_max_out, ndim=1, dtypes=(torch.float32,))
    check_shape("row_max_out", row_max_out, (rows,))
    check_tensor("row_argmax_out", row_argmax_out, ndim=1, dtypes=(torch.int64,))
    check_shape("row_argmax_out", row_argmax_out, (rows,))
    check_same_device("x", x, logits_out=logits_out, row_max_out=row_max_out, row_argmax_out=row_argmax_out)
    for name, tensor in (("row_max_out", row_max_out), ("row_argmax_out", row_argmax_out)):
        check_last_dim_contiguous(name, tensor)
    if rows == 0:
        return LmHeadResult(logits_out, row_max_out, row_argmax_out)
    tiles: Tiles = (block_n, block_k, num_warps, num_stages, use_dot)
    config = configured(gemv_config(rows, width, depth, x.dtype), tiles)
    programs = triton.cdiv(width, config.block_n)
    if workspace is None:
        workspace = lm_head_workspace(rows, width, depth, x.dtype, device, block_n=config.block_n)
    _check_workspace(workspace, rows, programs, x)
    block_m = config.block_m
    if block_programs is None:
        block_programs = min(triton.next_power_of_2(programs), max(16, REDUCE_ELEMENTS // block_m))
    check_power_of_two("block_programs", block_programs, low=1, high=REDUCE_ELEMENTS)
    _lm_head_argmax_kernel[(programs,)](
        x,
        weight,
        logits_out,
        workspace.partial_max,
        workspace.partial_index,
        row_max_out,
        row_argmax_out,
        workspace.counter,
        rows,
        width,
        depth,
        x.stride(0),
        logits_out.stride(0),
        workspace.partial_max.stride(0),
        EVEN_K=depth % config.block_k == 0,
        USE_DOT=config.use_dot,
        BLOCK_M=block_m,
        BLOCK_N=config.block_n,
        BLOCK_K=config.block_k,
        DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
        BLOCK_PROGRAMS=block_programs,
        USE_PDL=pdl,
        launch_pdl=pdl,
        num_warps=config.num_warps,
        num_stages=config.num_stages,
    )
    return LmHeadResult(logits_out, row_max_out, row_argmax_out)


def _check_workspace(workspace: LmHeadWorkspace, rows: int, programs: int, x: torch.Tensor) -> None:
    """The workspace holds `rows` rows of `programs` partials (dense rows of one stride) and a counter."""
    partial_max, partial_index, counter = workspace
    check_tensor("workspace.partial_max", partial_max, ndim=2, dtypes=(torch.float32,))
    check_tensor("workspace.partial_index", partial_index, ndim=2, dtypes=(torch.int32,))
    check_tensor("workspace.counter", counter, ndim=1, dtypes=(torch.int32,))
    check_shape("workspace.counter", counter, (1,))
    check_same_device("x", x, partial_max=partial_max, partial_index=partial_index, counter=counter)
    if partial_max.shape != partial_index.shape or partial_max.stride() != partial_index.stride():
        raise ValueError("workspace.partial_max and workspace.partial_index must have the same shape and strides")
    if partial_max.shape[0] < rows or partial_max.shape[1] < programs:
        raise ValueError(
            f"the workspace holds {tuple(partial_max.shape)} partials; this call needs ({rows}, {programs}): "
            "make it with lm_head_workspace for the largest call"
        )
    check_last_dim_contiguous("workspace.partial_max", partial_max)
