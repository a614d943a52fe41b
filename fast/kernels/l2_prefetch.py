"""Prefetch a tensor's bytes into the GPU's L2 cache, for a kernel that reads them soon after.

    data   any contiguous CUDA tensor (its bytes are what is prefetched; nothing is read into registers
           and nothing is written)

Why: at batch-1 decode the attention kernels of a layer leave HBM nearly idle for ~10 us (they read a
few hundred KiB of K/V), and the o_proj GEMV that follows them then streams its whole weight from HBM.
Issued on a second stream beside the attention kernels, this kernel moves that weight into L2 while
HBM is idle, so the GEMV reads it from L2. It has no effect on any result: prefetches change only what
the cache holds.

How: grid (cdiv(num_lines, LINES_PER_PROGRAM),); each program issues `prefetch.global.L2::evict_last`
for LINES_PER_PROGRAM 128-byte lines (evict_last: the lines should outlive the K/V the attention
streams meanwhile). A prefetch does not wait for its line: a program issues its instructions and ends.
Worked example: 32 MiB = 262,144 lines; LINES_PER_PROGRAM 1024 -> 256 programs; program 3 covers byte
offsets [3 * 1024 * 128, 4 * 1024 * 128). Lines past the end are clamped to the last one (prefetching
it twice is harmless). PTX only: there is no CPU (interpreter) version.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

LINE_BYTES = 128
LINES_PER_PROGRAM = 1024


@triton.jit
def _l2_prefetch_kernel(data_ptr, num_lines, LINES_PER_PROGRAM: tl.constexpr, LINE_BYTES: tl.constexpr):
    lines = tl.program_id(0) * LINES_PER_PROGRAM + tl.arange(0, LINES_PER_PROGRAM)
    lines = tl.minimum(lines, num_lines - 1)
    addresses = data_ptr + lines.to(tl.int64) * LINE_BYTES  # data_ptr is a uint8 pointer: byte offsets
    tl.inline_asm_elementwise(
        "prefetch.global.L2::evict_last [$1]; mov.u32 $0, 0;",
        "=r,l",
        [addresses],
        dtype=tl.int32,
        is_pure=False,
        pack=1,
    )


def l2_prefetch(data: torch.Tensor) -> None:
    """Queue the prefetch of `data`'s bytes into L2 on the current stream (CUDA only)."""
    if data.device.type != "cuda":
        raise ValueError(f"l2_prefetch runs on CUDA devices only, got {data.device}")
    if not data.is_contiguous():
        raise ValueError("data must be contiguous")
    num_bytes = data.numel() * data.element_size()
    if num_bytes == 0:
        return
    num_lines = triton.cdiv(num_bytes, LINE_BYTES)
    grid = (triton.cdiv(num_lines, LINES_PER_PROGRAM),)
    _l2_prefetch_kernel[grid](data.view(torch.uint8), num_lines, LINES_PER_PROGRAM=LINES_PER_PROGRAM,
                              LINE_BYTES=LINE_BYTES, num_warps=4)  # fmt: skip
