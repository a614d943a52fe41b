"""Small-batch linear (GEMV) for decode: out = x @ weight^T (+ bias), 1..16 rows of x.

    x       [M, K]     M <= MAX_GEMV_ROWS; rows may be strided (last dim dense)
    weight  [N, K]     contiguous (a linear layer's weight, as checkpoints store it)
    bias    [N] or None
    out     [M, N]     in x's dtype; fp32 accumulation

Why: at decode a linear layer reads its whole weight to multiply it by a handful of rows, so the
only figure that matters is weight bytes per second. A vendor GEMM is built for large M: in the
engine's batch-1 decode graph on an H200 (reports/results/bench/after/decode-bs1.json, profile)
cuBLAS spent 29 us per Qwen3-0.6B layer on 31 MB of weights (about 1.1 TB/s against a ~4.2 TB/s
copy bandwidth), one kernel alone 12.2 us, and split K for the down projection (a second kernel).
In reports/bench/kernels/gemv.py (graphs of back-to-back calls, weights from HBM) cuBLAS took 12.6 us for
the 0.6B o_proj at M=1..2, where this kernel takes 3.9 us; at the 8B shapes both reach 3.3-4.1 TB/s.

How: grid (cdiv(N, BLOCK_N),), no split-K. Program p owns weight rows [p*BLOCK_N, (p+1)*BLOCK_N)
and reads that [BLOCK_N, K] slab exactly once, in [BLOCK_N, BLOCK_K] tiles (each weight row is
BLOCK_K dense elements: 16-byte vector loads, coalesced along K). Every tile meets all M rows of
x at once (the x tile [BLOCK_M, BLOCK_K] comes from L2: it is shared by all programs), so the
weight is read once whatever M is. Per tile either
    - FMA:  acc[BLOCK_N, BLOCK_M] += sum_k w[n, k] * x[m, k]   (broadcast product, tl.sum over K), or
    - DOT:  acc[BLOCK_N, BLOCK_M] += tl.dot(w_tile, x_tile^T)   (tensor cores; BLOCK_M padded to 16)
with fp32 accumulation in both. The K loop runs in one fixed order and nothing is atomic, so a
call's result is deterministic (bitwise the same on every run of the same shapes and config).
It is not promised to be batch-invariant (the reduction tree inside a tile may depend on BLOCK_M):
fast/kernels/matmul.py's invariant_linear is the kernel for that.

Worked example (Qwen3-0.6B gate_up: N=6144, K=1024, M=1; defaults BLOCK_N=2, BLOCK_K=1024): 3072
programs. Program 20 reads weight rows 40 and 41 in one tile (k 0..1023); w[41, 700] is at element
offset 41 * K + 700 = 42684; it writes out[0, 40:42]. With M=8 (tensor-core tiles, BLOCK_N=64,
BLOCK_K=128): 96 programs; program 1 reads rows 64..127 in 8 tiles and writes out[0:8, 64:128].
x[m, k] is at m * x_row_stride + k and out[m, n] at m * out_row_stride + n.

silu_mul_linear is the MLP down projection fused with the activation: its input is the gate_up
output [M, 2*I] (gate | up halves) and its x operand is silu(gate) * up, computed per tile in fp32
and rounded to the input dtype exactly as fast/kernels/silu_and_mul.py rounds it, so
silu_mul_linear(gate_up, w) == small_batch_linear(silu_and_mul(gate_up), w) bit for bit (same
config). Each program recomputes the activation of the whole [M, I] input, which saves a launch
and the activation's round trip through memory but costs (N / BLOCK_N) * M * I silu evaluations
(an exp and an IEEE division each). Measured on an H200 before the gate/up prefetch below was
added, it was slower than silu_and_mul + small_batch_linear at every M (M=1: 5.9 vs 5.6 us at
0.6B, 32 vs 29 us at 8B; M>=2: 1.3-5x slower): at decode, prefer the two kernels unless a new
measurement (reports/bench/kernels/gemv.py records both) says otherwise.

linear_add_rmsnorm is a projection whose output joins the residual stream (o_proj, down) fused with the
add + RMSNorm after it: each program stores its columns of out = x @ W^T as small_batch_linear does, then counts
itself in on an arrival counter (fast/kernels/arrival.py's last_to_arrive, CUTLASS's semaphore); the last
program to arrive reads the whole out rows back from L2 and runs fast/kernels/add_rmsnorm.py's own code
(add_then_normalise) on each, and puts the counter back to 0 for the next call. So it equals
add_rmsnorm(small_batch_linear(x, W), residual, weight) (the same stored out, then the same add and norm; on a
GPU the norm's sum of squares is reduced by this program's warps, which may order it differently from
add_rmsnorm's launch at hidden sizes above 1024) with one launch fewer: at batch 1 a decode step of Qwen3-0.6B
ran 56 add_rmsnorm launches of a few microseconds each, mostly fixed cost (reports/results/bench/
offline_hf_session9/: 307 kernels a step).

No host syncs and, when `out` is given, no allocation: the wrappers read shapes, strides and
dtypes only, so a call can be captured in a CUDA graph.

In the engine: fast/model.py (small_batch_dispatch_linear) sends the qkv, o_proj, gate_up and down
projections of a step with at most SMALL_BATCH_ROWS (= MAX_GEMV_ROWS) rows here, on CUDA outside
batch-invariant mode (fast.model_runner.small_batch_gemv_enabled), and everything larger to cuBLAS. The LM
head of such a step runs this module's tile loop (gemv_tile) in fast/kernels/lm_head_argmax.py, which also
finds each row's greedy token. silu_mul_linear is not used by the engine.
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
    check_same_dtype,
    check_shape,
    check_tensor,
)
from fast.kernels.add_rmsnorm import MAX_HIDDEN, add_then_normalise
from fast.kernels.arrival import last_to_arrive
from fast.kernels.pdl import wait_then_release

MAX_GEMV_ROWS = 16


@triton.jit
def _gemv_kernel(
    x_ptr,
    w_ptr,
    bias_ptr,
    out_ptr,
    residual_ptr,  # ADD_NORM only (any valid pointer otherwise), as are the four below
    norm_weight_ptr,
    normed_ptr,
    residual_out_ptr,
    counter_ptr,
    M,
    N,
    K,
    x_row_stride,
    out_row_stride,
    eps,
    HAS_BIAS: tl.constexpr,
    SILU_MUL: tl.constexpr,  # x is gate_up [M, 2K]: the operand is silu(x[:, :K]) * x[:, K:]
    ADD_NORM: tl.constexpr,  # the last program adds out to the residual and normalises (linear_add_rmsnorm)
    BLOCK_HIDDEN: tl.constexpr,  # ADD_NORM: next_power_of_2(N), a whole row in one tile
    EVEN_K: tl.constexpr,  # K % BLOCK_K == 0: no mask along K
    USE_DOT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    wait_then_release(USE_PDL)  # first: see fast/kernels/pdl.py
    acc, cols, rows = gemv_tile(
        x_ptr, w_ptr, M, N, K, x_row_stride, SILU_MUL, EVEN_K, USE_DOT, BLOCK_M, BLOCK_N, BLOCK_K, DOT_PRECISION
    )  # fmt: skip
    col_valid = cols < N
    row_valid = rows < M
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols, mask=col_valid, other=0.0).to(tl.float32)[:, None]
    # acc[n, m] -> out[m, n] at m * out_row_stride + n.
    out_offsets = rows.to(tl.int64)[None, :] * out_row_stride + cols[:, None]
    tl.store(out_ptr + out_offsets, acc.to(out_ptr.dtype.element_ty), mask=col_valid[:, None] & row_valid[None, :])
    if ADD_NORM:
        _add_norm_in_last_program(
            out_ptr, residual_ptr, norm_weight_ptr, normed_ptr, residual_out_ptr, counter_ptr, M, N, out_row_stride,
            eps, BLOCK_HIDDEN,
        )  # fmt: skip


@triton.jit
def gemv_tile(
    x_ptr,
    w_ptr,
    M,
    N,
    K,
    x_row_stride,
    SILU_MUL: tl.constexpr,
    EVEN_K: tl.constexpr,
    USE_DOT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """(acc, cols, rows): fp32 acc [BLOCK_N, BLOCK_M] = weight[cols, :] @ x[rows, :]^T for this program's weight rows
    cols [BLOCK_N] (= its output columns) and rows = tl.arange(0, BLOCK_M) of x (M <= BLOCK_M: one tile). The whole
    K loop of one program, shared by every kernel that reads a weight slab once (this module's,
    fast/kernels/lm_head_argmax.py's); the epilogue (bias, store, fused work) is the caller's."""
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = tl.arange(0, BLOCK_M)
    depth = tl.arange(0, BLOCK_K)
    col_valid = cols < N
    row_valid = rows < M
    # Pointers of the first tiles; each step adds BLOCK_K. w[n, k] at n * K + k (int64: N * K may
    # pass 2^31 for a vocabulary head), x[m, k] at m * x_row_stride + k.
    w_ptrs = w_ptr + cols.to(tl.int64)[:, None] * K + depth[None, :]  # [BLOCK_N, BLOCK_K]
    x_ptrs = x_ptr + rows.to(tl.int64)[:, None] * x_row_stride + depth[None, :]  # [BLOCK_M, BLOCK_K]
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    if SILU_MUL:
        # The gate and up tiles are loaded one step ahead (register double buffering): they feed
        # arithmetic before the dot, which Triton's pipeliner does not prefetch, and a program
        # would otherwise wait for them from L2 on every step.
        first_mask = row_valid[:, None] & (depth < K)[None, :]
        gate_next = tl.load(x_ptrs, mask=first_mask, other=0.0)
        up_next = tl.load(x_ptrs + K, mask=first_mask, other=0.0)
    for k0 in range(0, K, BLOCK_K):
        if EVEN_K:
            w_mask = col_valid[:, None]
            x_mask = row_valid[:, None]
        else:
            k_valid = (k0 + depth) < K
            w_mask = col_valid[:, None] & k_valid[None, :]
            x_mask = row_valid[:, None] & k_valid[None, :]
        w_tile = tl.load(w_ptrs, mask=w_mask, other=0.0)
        if SILU_MUL:
            gate = gate_next.to(tl.float32)
            up = up_next.to(tl.float32)
            next_mask = row_valid[:, None] & ((k0 + BLOCK_K + depth) < K)[None, :]  # nothing past K
            gate_next = tl.load(x_ptrs + BLOCK_K, mask=next_mask, other=0.0)
            up_next = tl.load(x_ptrs + BLOCK_K + K, mask=next_mask, other=0.0)
            # The same expression and rounding as _silu_and_mul_kernel (fp32, then x's dtype).
            x_tile = (gate / (1.0 + tl.exp(-gate)) * up).to(x_ptr.dtype.element_ty)
        else:
            x_tile = tl.load(x_ptrs, mask=x_mask, other=0.0)
        if USE_DOT:
            # [BLOCK_N, BLOCK_K] @ [BLOCK_K, BLOCK_M]: products exact, fp32 accumulation.
            acc = tl.dot(w_tile, tl.trans(x_tile), acc, input_precision=DOT_PRECISION)
        else:
            # [BLOCK_N, 1, BLOCK_K] * [1, BLOCK_M, BLOCK_K] in fp32, summed over K.
            product = w_tile.to(tl.float32)[:, None, :] * x_tile.to(tl.float32)[None, :, :]
            acc += tl.sum(product, axis=2)
        w_ptrs += BLOCK_K
        x_ptrs += BLOCK_K
    return acc, cols, rows


@triton.jit
def _add_norm_in_last_program(
    out_ptr,
    residual_ptr,
    norm_weight_ptr,
    normed_ptr,
    residual_out_ptr,
    counter_ptr,
    M,
    N,
    row_stride,  # of out, residual, normed and residual_out alike: [M, N] contiguous rows (the wrapper checks)
    eps,
    BLOCK_HIDDEN: tl.constexpr,
):
    """Count this program in; the last of the grid's programs adds each whole out row to the residual and
    normalises it (add_rmsnorm's code), then puts the counter back to 0."""
    if last_to_arrive(counter_ptr, tl.num_programs(0)):
        cols = tl.arange(0, BLOCK_HIDDEN)
        mask = cols < N
        for row in range(M):
            # ".cg": from L2, where the other programs' stores went (never a line this SM's L1 might hold).
            values = tl.load(out_ptr + row * row_stride + cols, mask=mask, other=0.0, cache_modifier=".cg")
            add_then_normalise(
                values.to(tl.float32), row, cols, mask, residual_ptr, row_stride, residual_out_ptr, row_stride,
                norm_weight_ptr, normed_ptr, row_stride, N, eps, True,
            )  # fmt: skip


class GemvConfig(NamedTuple):
    """Launch parameters of one call: tiles, warps, pipeline stages, FMA or tensor-core tiles."""

    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    use_dot: bool


def gemv_config(m: int, n: int, k: int, dtype: torch.dtype, silu_mul: bool = False) -> GemvConfig:
    """Default launch parameters from host ints and the dtype only (never from tensor values).

    Chosen from a sweep on one H200 (bf16, Qwen3-0.6B and -8B projection shapes, M = 1..16,
    calls replayed from a CUDA graph with weights read from HBM: reports/bench/kernels/gemv.py --sweep wide);
    each default is within ~7% of the best configuration found for its shape.

    - One row (M=1): FMA tiles of BLOCK_N=2 rows x BLOCK_K=1024, 2 warps, 3 stages: many small
      programs (N/2 of them), each streaming 4 KiB per step in 16-byte vectors. BLOCK_N=4 for
      N >= 6144 and K >= 4096. The largest weights (N * K >= 32 Mi elements: the 8B gate_up and
      down, and gate_up of a rank's share under 2-way tensor parallelism) use the tensor-core tiles
      below, 1-7% faster there (one run), with BLOCK_K at least 256 below 64 Mi elements: at the
      rank share's gate_up (N=12288, K=4096) BLOCK_K=128 took 33.7 us against 27.5 us with 256
      (reports/results/kernels/gemv_rank_share/). The whole 8B gate_up (96 Mi) keeps 128: 49.6
      against 50.0 us in isolation, and with 256 the whole model's decode-graph GEMVs averaged
      26.9 us a call against 25.6 (two separate calls, so not conclusive, but no gain).
    - Two to four rows and N <= 2048: the same FMA tiles (few output columns: the grid must stay
      wide, and the extra rows cost little).
    - Otherwise tensor cores (tl.dot, the M rows padded inside the MMA): BLOCK_N =
      next_power_of_2(N / 128) clamped to 8..64 (about one program per SM: N=1024 -> 8,
      4096 -> 32, 6144 and up -> 64), BLOCK_K so a weight tile is ~16 KiB (8192 / BLOCK_N,
      clamped to 128..512), 4 warps, 4 stages. The FMA tile's [BLOCK_N, BLOCK_M, BLOCK_K]
      product was 1.2-5x slower than tl.dot from 2 rows up on the larger shapes.
    - fp32 halves BLOCK_K (same bytes per tile).
    - silu_mul: every program recomputes the activation of the whole [M, K] input, so the work
      it adds is (N / BLOCK_N) * M * K silu evaluations. Up to 2 rows FMA tiles of 4 x 1024, else
      tensor-core tiles of 32 x 256: the best of a small sweep before the gate/up prefetch was
      added (not re-measured since).
    """
    block_m = triton.next_power_of_2(max(m, 1))
    use_dot = m >= 2 and not (m <= 4 and n <= 2048)
    if m == 1 and n * k >= 32 * 2**20:
        use_dot = True
    if silu_mul:
        use_dot = m > 2
    if use_dot:
        block_n = min(64, max(8, triton.next_power_of_2(triton.cdiv(n, 128))))
        block_k = min(512, max(128, 8192 // block_n))
        if m == 1 and n * k < 64 * 2**20:
            block_k = max(block_k, 256)
        if silu_mul:
            block_n, block_k = 32, 256
        num_warps, num_stages = 4, 4
    else:
        block_n = 4 if (n >= 6144 and k >= 4096) or silu_mul else 2
        block_k, num_warps, num_stages = 1024, 2, 3
    if dtype == torch.float32:
        block_k //= 2
    block_k = min(block_k, max(16, triton.next_power_of_2(k)))
    return GemvConfig(block_m, block_n, block_k, num_warps, num_stages, use_dot)


Tiles = tuple[int | None, int | None, int | None, int | None, bool | None]


def configured(config: GemvConfig, tiles: Tiles) -> GemvConfig:
    """config with a caller's overrides: tiles = (block_n, block_k, num_warps, num_stages, use_dot), None for
    the default (benchmarks and tests pass them), each checked."""
    block_n, block_k, num_warps, num_stages, use_dot = tiles
    if block_n is not None:
        check_power_of_two("block_n", block_n, low=1, high=256)
    if block_k is not None:
        check_power_of_two("block_k", block_k, low=16, high=4096)
    if num_warps is not None:
        check_power_of_two("num_warps", num_warps, low=1, high=16)
    if num_stages is not None and (not isinstance(num_stages, int) or isinstance(num_stages, bool) or num_stages < 1):
        raise ValueError(f"num_stages must be a Python int >= 1, got {num_stages!r}")
    return config._replace(
        block_n=config.block_n if block_n is None else block_n,
        block_k=config.block_k if block_k is None else block_k,
        num_warps=config.num_warps if num_warps is None else num_warps,
        num_stages=config.num_stages if num_stages is None else num_stages,
        use_dot=config.use_dot if use_dot is None else bool(use_dot),
    )


def small_batch_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    out: torch.Tensor | None = None,
    block_n: int | None = None,
    block_k: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    use_dot: bool | None = None,
    pdl: bool = False,
) -> torch.Tensor:
    """x [M, K] @ weight [N, K]^T (+ bias [N]) -> [M, N] in x's dtype, for M <= MAX_GEMV_ROWS.

    The keyword-only tile arguments override gemv_config's defaults (benchmarks and tests).
    """
    check_tensor("x", x, ndim=2, dtypes=FLOAT_DTYPES)
    tiles = (block_n, block_k, num_warps, num_stages, use_dot)
    return _launch(x, x.shape[1], weight, bias, out, False, tiles, pdl)


def silu_mul_linear(
    gate_up: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    out: torch.Tensor | None = None,
    block_n: int | None = None,
    block_k: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    use_dot: bool | None = None,
    pdl: bool = False,
) -> torch.Tensor:
    """(silu(gate_up[:, :I]) * gate_up[:, I:]) @ weight [N, I]^T (+ bias) -> [M, N], M <= MAX_GEMV_ROWS.

    Equal, bit for bit, to small_batch_linear(silu_and_mul(gate_up), weight, bias) with the same config.
    """
    check_tensor("gate_up", gate_up, ndim=2, dtypes=FLOAT_DTYPES)
    if gate_up.shape[1] % 2:
        raise ValueError(f"gate_up must have an even last dimension (gate and up halves), got {gate_up.shape[1]}")
    depth = gate_up.shape[1] // 2
    tiles = (block_n, block_k, num_warps, num_stages, use_dot)
    return _launch(gate_up, depth, weight, bias, out, True, tiles, pdl)


class AddNorm(NamedTuple):
    """linear_add_rmsnorm's epilogue: the residual [M, N] the product joins, the RMSNorm weight [N] and eps, where
    the normalised rows and the new residual go ([M, N] each), and the arrival counter (int32 [1], 0)."""

    residual: torch.Tensor
    norm_weight: torch.Tensor
    eps: float
    normed: torch.Tensor
    residual_out: torch.Tensor
    counter: torch.Tensor


def gemv_counter(device: torch.device) -> torch.Tensor:
    """linear_add_rmsnorm's arrival counter: int32 [1], 0, and every call leaves it so. Calls on one stream may
    share it (each waits for the one before it: stream order, or programmatic dependent launch's wait)."""
    return torch.zeros(1, dtype=torch.int32, device=device)


def linear_add_rmsnorm(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    residual: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
    counter: torch.Tensor,
    *,
    pdl: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rmsnorm(h + residual) * norm_weight, h + residual) for h = x [M, K] @ weight [N, K]^T (+ bias), in one
    launch for M <= MAX_GEMV_ROWS: add_rmsnorm(small_batch_linear(x, weight, bias), residual, norm_weight, eps).
    counter: `gemv_counter` (int32 [1], 0; left 0)."""
    check_tensor("x", x, ndim=2, dtypes=FLOAT_DTYPES)
    check_tensor("weight", weight, ndim=2, dtypes=FLOAT_DTYPES)
    rows, width = x.shape[0], weight.shape[0]
    check_tensor("residual", residual, ndim=2, dtypes=(x.dtype,))
    check_shape("residual", residual, (rows, width))
    check_tensor("norm_weight", norm_weight, ndim=1, dtypes=FLOAT_DTYPES)
    check_shape("norm_weight", norm_weight, (width,))
    check_tensor("counter", counter, ndim=1, dtypes=(torch.int32,))
    check_shape("counter", counter, (1,))
    check_same_device("x", x, residual=residual, norm_weight=norm_weight, counter=counter)
    if not residual.is_contiguous() or not norm_weight.is_contiguous():
        raise ValueError("residual and norm_weight must be contiguous")
    if width > MAX_HIDDEN:
        raise ValueError(f"the product's {width} columns exceed add_rmsnorm's MAX_HIDDEN = {MAX_HIDDEN}")
    if not isinstance(eps, float) or eps <= 0:
        raise ValueError(f"eps must be a positive float, got {eps!r}")
    add_norm = AddNorm(residual, norm_weight, eps, torch.empty_like(residual), torch.empty_like(residual), counter)
    _launch(x, x.shape[1], weight, bias, None, False, (None,) * 5, pdl, add_norm)
    return add_norm.normed, add_norm.residual_out


def check_gemv_operands(name: str, x: torch.Tensor, depth: int, weight: torch.Tensor, what: str) -> tuple[int, int]:
    """(M, N) of a GEMV's operands, checked: at most MAX_GEMV_ROWS rows of x (named `name`, rows dense), a
    contiguous weight [N, depth] (`what` says where depth comes from) of x's dtype and device."""
    rows = x.shape[0]
    if rows > MAX_GEMV_ROWS:
        raise ValueError(
            f"{name} has {rows} rows; small_batch_linear takes at most MAX_GEMV_ROWS = {MAX_GEMV_ROWS} "
            "(use a GEMM for larger batches)"
        )
    check_tensor("weight", weight, ndim=2, dtypes=FLOAT_DTYPES)
    width = weight.shape[0]
    if weight.shape[1] != depth:
        raise ValueError(f"weight must have shape (N, {depth}) ({what}), got {tuple(weight.shape)}")
    check_same_dtype(name, x, weight=weight)
    check_same_device(name, x, weight=weight)
    check_last_dim_contiguous(name, x)
    if not weight.is_contiguous():
        raise ValueError(f"weight must be contiguous (strides {weight.stride()} for shape {tuple(weight.shape)})")
    return rows, width


def _launch(
    x: torch.Tensor,
    depth: int,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    out: torch.Tensor | None,
    silu_mul: bool,
    tiles: Tiles,
    pdl: bool,
    add_norm: AddNorm | None = None,
) -> torch.Tensor:
    """tiles: (block_n, block_k, num_warps, num_stages, use_dot) overrides, None for the default."""
    name = "gate_up" if silu_mul else "x"
    what = f"half of gate_up's {x.shape[1]} columns" if silu_mul else "x's last dimension"
    rows, width = check_gemv_operands(name, x, depth, weight, what)
    if bias is not None:
        check_tensor("bias", bias, ndim=1, dtypes=FLOAT_DTYPES)
        check_shape("bias", bias, (width,))
        check_same_device(name, x, bias=bias)
        check_last_dim_contiguous("bias", bias)
    if out is None:
        out = torch.empty((rows, width), dtype=x.dtype, device=x.device)
    check_tensor("out", out, ndim=2, dtypes=(x.dtype,))
    check_shape("out", out, (rows, width))
    check_last_dim_contiguous("out", out)
    check_same_device(name, x, out=out)
    if rows == 0 or width == 0:
        return out

    config = configured(gemv_config(rows, width, depth, x.dtype, silu_mul), tiles)
    grid = (triton.cdiv(width, config.block_n),)
    if add_norm is not None:
        residual, norm_weight, normed, residual_out, counter = (
            add_norm.residual,
            add_norm.norm_weight,
            add_norm.normed,
            add_norm.residual_out,
            add_norm.counter,
        )
        if out.stride(0) != width:
            raise ValueError("linear_add_rmsnorm's out rows must be contiguous, as its other [M, N] tensors are")
    else:  # unused: any valid pointers
        residual = norm_weight = normed = residual_out = counter = out
    _gemv_kernel[grid](
        x,
        weight,
        bias if bias is not None else weight,  # unused without a bias; any valid pointer
        out,
        residual,
        norm_weight,
        normed,
        residual_out,
        counter,
        rows,
        width,
        depth,
        x.stride(0),
        out.stride(0),
        add_norm.eps if add_norm is not None else 1.0,
        HAS_BIAS=bias is not None,
        SILU_MUL=silu_mul,
        ADD_NORM=add_norm is not None,
        BLOCK_HIDDEN=triton.next_power_of_2(width) if add_norm is not None else 1,
        EVEN_K=depth % config.block_k == 0,
        USE_DOT=config.use_dot,
        BLOCK_M=config.block_m,
        BLOCK_N=config.block_n,
        BLOCK_K=config.block_k,
        DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
        USE_PDL=pdl,
        launch_pdl=pdl,
        num_warps=config.num_warps,
        num_stages=config.num_stages,
    )
    return out
