"""One-shot all-reduce fused with the residual add + RMSNorm that follows it (tensor parallelism).

    partial       [rows, hidden]   this rank's term of a row-parallel product (o_proj or down)
    bias          [hidden] or None added once, after the sum
    residual      [rows, hidden]
    weight        [hidden]         the RMSNorm weight
    ->  hidden       = sum over ranks of partial, in rank order (fp32), rounded; + bias, rounded
        residual_out = hidden + residual, rounded to residual's dtype
        out          = rmsnorm(residual_out) * weight

The result is, bit for bit, what the unfused sequence computes with an all-reduce that sums in rank
order in fp32 and rounds once: all_reduce, `+ bias`, then fast/kernels/add_rmsnorm.py (same
expressions, same roundings).

Why: at batch-1 decode under 2-way tensor parallelism each layer has two small all-reduces, each
followed by add_rmsnorm. PyTorch's one-shot all-reduce is one kernel (copy in, barrier, read the
peers, sum, closing barrier) outside our PDL chain, and the norm is another. Here it is one kernel in
the chain (fast/kernels/pdl.py): one launch and one barrier a call instead of two launches and two
barriers.

How: grid (rows,), one program per row (a row of up to MAX_HIDDEN elements is held in registers, as
in add_rmsnorm). Program r of rank q:
  1. copies partial[r] into row r of rank q's region of the symmetric buffer;
  2. meets program r of every other rank at a barrier over the signal pads (below);
  3. reads row r of every rank's region (its own included) over NVLink, sums them in rank order in
     fp32, then adds the bias and the residual and normalises, as add_rmsnorm does.

Symmetric memory (torch.distributed._symmetric_memory) gives every rank the addresses of every rank's
buffer and signal pad. `buffer_ptrs` and `signal_pad_ptrs` are int64 [world] device tensors of those
addresses (as this process maps them); `region_offset` (elements) picks the part of each buffer this
call uses.

The barrier: slot s of a signal pad is a 32-bit flag at `signal_pad + s * 4` bytes. Program r of
rank q raises flag (r * world + q) in each rank's pad, with a system-scope release after a block-wide
barrier (so every thread's copy is visible first), then lowers flags (r * world + p), p = 0..world-1,
in its own pad as each one is raised, with a system-scope acquire. A raise waits while its flag is
still up (the peer has not yet lowered the previous call's), so the pads are all zero again after
every call: no host-side epoch counter, and a captured CUDA graph can replay the kernel any number of
times. Worked slot: world 2, rank 1, row 3 -> it raises flag 3 * 2 + 1 = 7 in both pads and waits for
flags 6 and 7 in its own.

No closing barrier: a rank overwrites a region only at its next call on that region, and callers
(fast.parallel.Collectives) alternate regions so that every two calls on one region are separated by
another collective of all ranks; passing that one means every peer has finished this kernel (stream
order), so nobody can still be reading the region.

Every program must be resident at once for the barrier to make progress (program r waits only for
program r of its peers, but a GPU that runs them in another order must not starve): rows is at most
MAX_ROWS, well under the number of SMs.

A bounded wait: a peer that never arrives (its process was killed mid-step) would leave this kernel
spinning, and the host waiting on it, forever; no NCCL abort reaches a Triton kernel. So on a GPU every
wait for a flag gives up after `barrier_timeout_s` (read from %globaltimer) and executes `trap`: the
kernel fails, the CUDA context reports the error at the host's next synchronisation, and the engine
turns it into its tensor-parallel error (fast.tp_launch). The timeout is far above any skew between
live ranks (a rank compiling a kernel the others already have takes seconds). Triton's interpreter runs
no PTX, so there the wait is unbounded: on the CPU only one rank ever calls the kernel.
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
from fast.kernels.add_rmsnorm import MAX_HIDDEN, _num_warps_for, add_then_normalise
from fast.kernels.pdl import wait_then_release

# One program per row, and all of them resident at once (see the barrier above).
MAX_ROWS = 64
# How long a program waits at the barrier for a peer before it traps (see "A bounded wait" above).
BARRIER_TIMEOUT_S = 30.0


@triton.jit
def _trap():
    """End the kernel with an error the host sees at its next synchronisation."""
    tl.inline_asm_elementwise("trap;", "=r", [], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _swap_flag(flag, expected, desired, deadline_ns, SEM: tl.constexpr, BOUNDED: tl.constexpr):
    """Set the flag from `expected` to `desired` once it holds `expected`, waiting as long as it takes
    (BOUNDED: until the %globaltimer passes deadline_ns, then trap)."""
    while tl.atomic_cas(flag, expected, desired, sem=SEM, scope="sys") != expected:
        if BOUNDED:
            if tl.extra.cuda.globaltimer() > deadline_ns:
                _trap()


@triton.jit
def _raise_then_wait(signal_pad_ptrs, slot_base, rank, timeout_ns, WORLD: tl.constexpr, BOUNDED: tl.constexpr):
    """Barrier of this program with the programs of the same row on every rank (see the module doc).
    Scalar atomics run once per program, and their result reaches every thread."""
    deadline_ns = timeout_ns
    if BOUNDED:
        deadline_ns += tl.extra.cuda.globaltimer()
    tl.debug_barrier()  # every thread's copy into the buffer precedes the release below
    for peer in tl.static_range(WORLD):
        pad = tl.load(signal_pad_ptrs + peer).to(tl.pointer_type(tl.int32))
        _swap_flag(pad + slot_base + rank, 0, 1, deadline_ns, "release", BOUNDED)
    own_pad = tl.load(signal_pad_ptrs + rank).to(tl.pointer_type(tl.int32))
    for peer in tl.static_range(WORLD):
        _swap_flag(own_pad + slot_base + peer, 1, 0, deadline_ns, "acquire", BOUNDED)
    tl.debug_barrier()  # the acquire above precedes every thread's reads of the peers' rows


# `rank` is neither a constexpr nor specialised (Triton would make rank 1 a constant): one compiled
# kernel serves every rank. Where ranks share a GPU (the tests' streams), a rank loading a second
# module while another rank's kernel waits at the barrier could wait for that kernel to end.
@triton.jit(do_not_specialize=["rank", "timeout_ns"])
def _all_reduce_add_rmsnorm_kernel(
    buffer_ptrs,  # int64 [WORLD]: each rank's symmetric buffer, as mapped in this process
    signal_pad_ptrs,  # int64 [WORLD]: each rank's signal pad
    partial_ptr,
    bias_ptr,
    residual_ptr,
    weight_ptr,
    out_ptr,
    residual_out_ptr,
    partial_row_stride,
    residual_row_stride,
    out_row_stride,
    residual_out_row_stride,
    region_offset,  # elements from each buffer's start to this call's region
    hidden,
    eps,
    rank,
    timeout_ns,  # int64: how long the barrier waits for a peer (BOUNDED only)
    WORLD: tl.constexpr,
    BOUNDED: tl.constexpr,  # False in Triton's interpreter, which runs no PTX
    HAS_BIAS: tl.constexpr,
    BLOCK_HIDDEN: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    wait_then_release(USE_PDL)  # first: see fast/kernels/pdl.py
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_HIDDEN)
    mask = cols < hidden
    dtype = partial_ptr.dtype.element_ty
    # Row r of a region sits at region_offset + r * hidden in every rank's buffer.
    staged = region_offset + row * hidden + cols

    # 1. This rank's term into its own buffer.
    own_buffer = tl.load(buffer_ptrs + rank).to(tl.pointer_type(dtype))
    term = tl.load(partial_ptr + row * partial_row_stride + cols, mask=mask, other=0.0)
    tl.store(own_buffer + staged, term, mask=mask)

    # 2. Meet the same row's program on every rank.
    _raise_then_wait(signal_pad_ptrs, row * WORLD, rank, timeout_ns, WORLD, BOUNDED)

    # 3. Sum every rank's term in rank order (".cv": read the peer's memory afresh, never a cached line).
    total = tl.zeros([BLOCK_HIDDEN], dtype=tl.float32)
    for peer in tl.static_range(WORLD):
        buffer = tl.load(buffer_ptrs + peer).to(tl.pointer_type(dtype))
        total += tl.load(buffer + staged, mask=mask, other=0.0, cache_modifier=".cv").to(tl.float32)
    values = total.to(dtype).to(tl.float32)  # the all-reduce's result, rounded as it would be stored
    if HAS_BIAS:
        values = (values + tl.load(bias_ptr + cols, mask=mask, other=0.0).to(tl.float32)).to(dtype).to(tl.float32)

    # The residual add + RMSNorm of fast/kernels/add_rmsnorm.py, the same code.
    add_then_normalise(
        values, row, cols, mask, residual_ptr, residual_row_stride, residual_out_ptr, residual_out_row_stride,
        weight_ptr, out_ptr, out_row_stride, hidden, eps, True,
    )  # fmt: skip


def all_reduce_add_rmsnorm(
    partial: torch.Tensor,
    bias: torch.Tensor | None,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    *,
    buffer_ptrs: torch.Tensor,
    signal_pad_ptrs: torch.Tensor,
    region_offset: int,
    region_numel: int,
    rank: int,
    world_size: int,
    out: torch.Tensor | None = None,
    residual_out: torch.Tensor | None = None,
    pdl: bool = False,
    barrier_timeout_s: float = BARRIER_TIMEOUT_S,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rmsnorm(sum_ranks(partial) + bias + residual) * weight, sum_ranks(partial) + bias + residual).

    Every rank calls it with the same shapes and region (a collective). The region
    [region_offset, region_offset + rows * hidden) of every rank's buffer must lie in the region
    of region_numel elements the caller set aside; out/residual_out may alias partial/residual.
    barrier_timeout_s: on a GPU, a peer that has not arrived at the barrier after this long makes the
    kernel trap (a CUDA error at the host's next synchronisation) instead of waiting forever.
    """
    check_tensor("partial", partial, ndim=2, dtypes=FLOAT_DTYPES)
    rows, hidden = partial.shape
    check_last_dim_contiguous("partial", partial)
    check_tensor("residual", residual, ndim=2, dtypes=FLOAT_DTYPES)
    check_shape("residual", residual, (rows, hidden))
    check_last_dim_contiguous("residual", residual)
    check_tensor("weight", weight, ndim=1, dtypes=FLOAT_DTYPES)
    check_shape("weight", weight, (hidden,))
    check_same_device("partial", partial, residual=residual, weight=weight)
    if bias is not None:
        check_tensor("bias", bias, ndim=1, dtypes=FLOAT_DTYPES)
        check_shape("bias", bias, (hidden,))
        check_same_device("partial", partial, bias=bias)
    if weight.stride(0) != 1 or (bias is not None and bias.stride(0) != 1):
        raise ValueError("weight and bias must be contiguous")
    if hidden > MAX_HIDDEN:
        raise ValueError(f"partial has hidden size {hidden}; at most {MAX_HIDDEN} is supported")
    if rows > MAX_ROWS:
        raise ValueError(f"partial has {rows} rows; at most MAX_ROWS = {MAX_ROWS} (one resident program per row)")
    if rows * hidden > region_numel:
        raise ValueError(f"partial has {rows * hidden} elements; the region holds {region_numel}")
    if not isinstance(eps, float) or eps <= 0:
        raise ValueError(f"eps must be a positive float, got {eps!r}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
    if isinstance(barrier_timeout_s, bool) or not isinstance(barrier_timeout_s, (int, float)) or barrier_timeout_s <= 0:
        raise ValueError(f"barrier_timeout_s must be a positive number of seconds, got {barrier_timeout_s!r}")
    for name, pointers in (("buffer_ptrs", buffer_ptrs), ("signal_pad_ptrs", signal_pad_ptrs)):
        check_tensor(name, pointers, ndim=1, dtypes=(torch.int64,))
        check_shape(name, pointers, (world_size,))
        check_same_device("partial", partial, **{name: pointers})
    if out is None:
        out = torch.empty_like(partial)
    if residual_out is None:
        residual_out = torch.empty_like(residual)
    for name, tensor, like in (("out", out, partial), ("residual_out", residual_out, residual)):
        check_tensor(name, tensor, ndim=2, dtypes=(like.dtype,))
        check_shape(name, tensor, (rows, hidden))
        check_last_dim_contiguous(name, tensor)
        check_same_device("partial", partial, **{name: tensor})
    check_same_dtype("partial", partial, out=out)
    if rows == 0:
        return out, residual_out

    block_hidden = triton.next_power_of_2(hidden)
    _all_reduce_add_rmsnorm_kernel[(rows,)](
        buffer_ptrs,
        signal_pad_ptrs,
        partial,
        bias if bias is not None else weight,  # unused without a bias; any valid pointer
        residual,
        weight,
        out,
        residual_out,
        partial.stride(0),
        residual.stride(0),
        out.stride(0),
        residual_out.stride(0),
        region_offset,
        hidden,
        eps,
        rank,
        int(barrier_timeout_s * 1e9),
        WORLD=world_size,
        BOUNDED=partial.is_cuda,
        HAS_BIAS=bias is not None,
        BLOCK_HIDDEN=block_hidden,
        USE_PDL=pdl,
        launch_pdl=pdl,
        num_warps=_num_warps_for(block_hidden),
    )
    return out, residual_out
