"""spec.sampling's Gumbel-max step in one pass over the logits: scale, noise, mask and argmax fused.

    token[b] = argmax_v  where(keep[b, v], logits[b, v] / temperature[b] + g(row_key[b], v), -inf)
    g(key, v) = -log(-log(u)),  u = ((fmix32(key ^ v) >> (32 - UNIFORM_BITS)) + 0.5) / 2**UNIFORM_BITS

Layout:
    logits       fp32 [B, V] (rows may be strided, the vocabulary contiguous)
    temperature  fp32 [B] (may be strided: a column of the sampler's parameter buffer)
    row_keys     int64 [B] contiguous, in [0, 2**32): spec.sampling.row_keys(seeds, positions)
    keep         bool [B, V] or None (None: every token may be sampled)
    out          int64 [B]

Why a kernel: the spec's batch-wide torch version materialises int64 hashes of every (row, token)
through about twenty elementwise passes; at 256 rows x 151,936 tokens each pass moves 311 MB,
and on an H200 they took 2.4 s of offline-256's 7.5 s of GPU time. Here each logit is read once.

Two launches, so that a small batch still spreads over the GPU:
  1. `_chunk_argmax_kernel`, grid (B, cdiv(V, BLOCK_V)): the best (value, token) of one chunk of
     one row. V = 151,936, BLOCK_V = 4096 -> 38 chunks; chunk 2 of row 5 covers tokens 8192..12287.
  2. torch: the chunk whose best value is largest (argmax takes the first, i.e. lowest tokens, on
     ties), and its token.
Ties go to the lowest token id, as torch.argmax does: tl.argmax takes the first maximum within a
chunk, and the first chunk wins across chunks.

Bit-identical to spec.sampling on the same GPU: the division is IEEE round-to-nearest (div_rn),
u is exact, log is libdevice's logf (the same routine CUDA's logf, which torch.log calls, uses),
and the sum s + g is one fp32 add. NaN logits are not handled as torch.argmax would (first NaN
wins there): a row holding one is unsampleable (spec.sampling), and fast.sampler.Sampler puts the
row's code in place of whatever this kernel drew for it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from fast.kernels._checks import check_shape, check_tensor
from spec.sampling import FMIX32_MULTIPLIER_1, FMIX32_MULTIPLIER_2, UNIFORM_BITS

BLOCK_V = 4096  # tokens per program: 16 KiB of fp32 logits
FMIX32_M1 = tl.constexpr(FMIX32_MULTIPLIER_1)
FMIX32_M2 = tl.constexpr(FMIX32_MULTIPLIER_2)


@triton.jit
def _fmix32(h):
    """MurmurHash3's finaliser on uint32 (multiplications wrap mod 2**32)."""
    h ^= h >> 16
    h *= FMIX32_M1
    h ^= h >> 13
    h *= FMIX32_M2
    h ^= h >> 16
    return h


@triton.jit
def _chunk_argmax_kernel(
    logits_ptr,
    temperature_ptr,
    row_keys_ptr,
    keep_ptr,
    best_value_ptr,
    best_token_ptr,
    vocab_size,
    logits_row_stride,
    temperature_stride,
    keep_row_stride,
    num_chunks,
    HAS_KEEP: tl.constexpr,
    UNIFORM_SHIFT: tl.constexpr,
    UNIFORM_SCALE: tl.constexpr,
    PRECISE_LOG: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    tokens = chunk * BLOCK_V + tl.arange(0, BLOCK_V)
    valid = tokens < vocab_size
    logits = tl.load(logits_ptr + row * logits_row_stride + tokens, mask=valid, other=0.0)
    temperature = tl.load(temperature_ptr + row * temperature_stride)
    scaled = tl.math.div_rn(logits, temperature)

    key = (tl.load(row_keys_ptr + row) & 0xFFFFFFFF).to(tl.uint32)
    hashed = _fmix32(key ^ tokens.to(tl.uint32))
    # u = (top bits + 0.5) * 2**-UNIFORM_BITS, exactly: the top bits need at most 23 significant bits.
    uniform = ((hashed >> UNIFORM_SHIFT).to(tl.float32) + 0.5) * UNIFORM_SCALE
    if PRECISE_LOG:
        noise = -libdevice.log(-libdevice.log(uniform))
    else:  # Triton's interpreter (numpy's log) has no libdevice
        noise = -tl.log(-tl.log(uniform))
    candidates = scaled + noise
    if HAS_KEEP:
        kept = tl.load(keep_ptr + row * keep_row_stride + tokens, mask=valid, other=0)
        valid = valid & (kept != 0)
    candidates = tl.where(valid, candidates, float("-inf"))
    best = tl.argmax(candidates, axis=0, tie_break_left=True)
    best_value = tl.max(candidates, axis=0)
    out = row * num_chunks + chunk
    tl.store(best_value_ptr + out, best_value)
    tl.store(best_token_ptr + out, (chunk * BLOCK_V + best).to(tl.int64))


def chunk_count(vocab_size: int) -> int:
    return triton.cdiv(vocab_size, BLOCK_V)


def gumbel_sample(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    row_keys: torch.Tensor,
    keep: torch.Tensor | None = None,
    *,
    workspace: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """int64 [B]: each row's Gumbel-max token (spec.sampling.gumbel_max of the scaled logits).

    workspace: (best values fp32, best tokens int64), each with at least B * chunk_count(V)
    elements, owned by the caller so that no call allocates them; default: allocated here.
    """
    check_tensor("logits", logits, ndim=2, dtypes=(torch.float32,))
    num_rows, vocab_size = logits.shape
    if logits.stride(1) != 1:
        raise ValueError("logits must be contiguous along the vocabulary")
    check_tensor("temperature", temperature, ndim=1, dtypes=(torch.float32,))
    check_shape("temperature", temperature, (num_rows,))
    check_tensor("row_keys", row_keys, ndim=1, dtypes=(torch.int64,))
    check_shape("row_keys", row_keys, (num_rows,))
    if not row_keys.is_contiguous():
        raise ValueError("row_keys must be contiguous")
    if keep is not None:
        check_tensor("keep", keep, ndim=2, dtypes=(torch.bool,))
        check_shape("keep", keep, (num_rows, vocab_size))
        if keep.stride(1) != 1:
            raise ValueError("keep must be contiguous along the vocabulary")
    num_chunks = chunk_count(vocab_size)
    needed = num_rows * num_chunks
    if workspace is None:
        workspace = (
            torch.empty(needed, dtype=torch.float32, device=logits.device),
            torch.empty(needed, dtype=torch.int64, device=logits.device),
        )
    values, tokens = workspace
    if values.numel() < needed or tokens.numel() < needed:
        raise ValueError(f"the workspace holds fewer than {needed} (rows x chunks) entries")
    values = values.view(-1)[:needed].view(num_rows, num_chunks)
    tokens = tokens.view(-1)[:needed].view(num_rows, num_chunks)
    if num_rows == 0:
        return tokens[:, 0]
    _chunk_argmax_kernel[(num_rows, num_chunks)](
        logits,
        temperature,
        row_keys,
        keep if keep is not None else logits,  # unread without HAS_KEEP
        values,
        tokens,
        vocab_size,
        logits.stride(0),
        temperature.stride(0),
        keep.stride(0) if keep is not None else 0,
        num_chunks,
        HAS_KEEP=keep is not None,
        UNIFORM_SHIFT=32 - UNIFORM_BITS,
        UNIFORM_SCALE=1.0 / 2**UNIFORM_BITS,
        PRECISE_LOG=logits.device.type == "cuda",
        BLOCK_V=BLOCK_V,
        num_warps=8,
    )
    best_chunk = torch.argmax(values, dim=1, keepdim=True)  # first maximum: the lowest tokens win ties
    return tokens.gather(1, best_chunk)[:, 0]
