"""Argument checks shared by the kernel wrappers.

Every wrapper validates its inputs on the host before launching: a Triton kernel that
receives a wrong shape or stride reads or writes the wrong memory silently, so the wrapper
is the last place where a mistake can be reported clearly. Each check names the argument.

None of these checks reads tensor *values*: they look at metadata only (shape, dtype,
device, strides), so they never synchronise with the GPU and are safe during CUDA-graph
capture.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

FLOAT_DTYPES: tuple[torch.dtype, ...] = (torch.float16, torch.bfloat16, torch.float32)
ATTENTION_HEAD_DIMS = (16, 32, 64, 128, 256)


def check_tensor(
    name: str,
    tensor: object,
    *,
    ndim: int,
    dtypes: Sequence[torch.dtype],
) -> torch.Tensor:
    """Check that `tensor` is a torch.Tensor of `ndim` dimensions and one of `dtypes`."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
    if tensor.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {tuple(tensor.shape)}")
    if tensor.dtype not in dtypes:
        allowed = ", ".join(str(dtype) for dtype in dtypes)
        raise TypeError(f"{name} must have dtype in ({allowed}), got {tensor.dtype}")
    return tensor


def check_shape(name: str, tensor: torch.Tensor, expected: Sequence[int | None]) -> None:
    """Check each dimension of `tensor` against `expected` (None means any size)."""
    actual = tuple(tensor.shape)
    if len(actual) != len(expected) or any(e is not None and a != e for a, e in zip(actual, expected, strict=True)):
        shown = tuple("*" if e is None else e for e in expected)
        raise ValueError(f"{name} must have shape {shown}, got {actual}")


def check_same_device(reference_name: str, reference: torch.Tensor, **others: torch.Tensor) -> None:
    """Check that every tensor in `others` lives on the device of `reference`."""
    for name, tensor in others.items():
        if tensor.device != reference.device:
            raise ValueError(
                f"{name} is on {tensor.device} but {reference_name} is on {reference.device}; "
                "all tensors must be on the same device"
            )


def check_same_dtype(reference_name: str, reference: torch.Tensor, **others: torch.Tensor) -> None:
    """Check that every tensor in `others` has the dtype of `reference`."""
    for name, tensor in others.items():
        if tensor.dtype != reference.dtype:
            raise TypeError(
                f"{name} has dtype {tensor.dtype} but {reference_name} has {reference.dtype}; they must match"
            )


def check_contiguous(name: str, tensor: torch.Tensor) -> None:
    if not tensor.is_contiguous():
        raise ValueError(f"{name} must be contiguous (strides {tensor.stride()} for shape {tuple(tensor.shape)})")


def check_last_dim_contiguous(name: str, tensor: torch.Tensor) -> None:
    """Rows may be strided (e.g. q as a view into a fused qkv buffer) but each row must be dense."""
    if tensor.stride(-1) != 1:
        raise ValueError(f"{name} must have stride 1 in its last dimension, got strides {tensor.stride()}")


def check_power_of_two(name: str, value: int, *, low: int, high: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be a Python int, got {type(value).__name__}")
    if value < low or value > high or value & (value - 1):
        raise ValueError(f"{name} must be a power of two in [{low}, {high}], got {value}")


def check_positive_int(name: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(
            f"{name} must be a Python int (host-known, so no GPU sync is needed), got {type(value).__name__}"
        )
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")
    return value


def check_head_dim(name: str, head_dim: int, supported: Sequence[int]) -> None:
    if head_dim not in supported:
        raise ValueError(f"{name} = {head_dim} is not supported; supported head dims are {tuple(supported)}")


def check_paged_attention_inputs(
    q: object,
    k_cache: object,
    v_cache: object,
    block_tables: object,
    seq_lens: object,
    scale: object,
    num_seqs: int | None = None,
) -> tuple[int, int]:
    """Checks both paged-attention wrappers share; returns (block_size, num_kv_heads).

    q is [rows, num_q_heads, head_dim]; the caches [num_blocks, block_size, num_kv_heads, head_dim];
    block_tables int32 [num_seqs, max_blocks]; seq_lens int32 [num_seqs]. num_seqs defaults to
    seq_lens' length (decode passes q's rows: one query per sequence).
    """
    q = check_tensor("q", q, ndim=3, dtypes=FLOAT_DTYPES)
    k_cache = check_tensor("k_cache", k_cache, ndim=4, dtypes=FLOAT_DTYPES)
    v_cache = check_tensor("v_cache", v_cache, ndim=4, dtypes=FLOAT_DTYPES)
    block_tables = check_tensor("block_tables", block_tables, ndim=2, dtypes=(torch.int32,))
    seq_lens = check_tensor("seq_lens", seq_lens, ndim=1, dtypes=(torch.int32,))
    num_seqs = seq_lens.shape[0] if num_seqs is None else num_seqs
    _, num_q_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    check_shape("k_cache", k_cache, (None, None, None, head_dim))
    check_shape("v_cache", v_cache, tuple(k_cache.shape))
    check_shape("block_tables", block_tables, (num_seqs, None))
    check_shape("seq_lens", seq_lens, (num_seqs,))
    check_same_dtype("q", q, k_cache=k_cache, v_cache=v_cache)
    check_same_device("q", q, k_cache=k_cache, v_cache=v_cache, block_tables=block_tables, seq_lens=seq_lens)
    check_last_dim_contiguous("q", q)
    check_contiguous("k_cache", k_cache)
    check_contiguous("v_cache", v_cache)
    check_contiguous("seq_lens", seq_lens)
    if block_tables.stride(1) != 1:
        raise ValueError(f"block_tables must have stride 1 in its last dimension, got strides {block_tables.stride()}")
    check_head_dim("head_dim", head_dim, ATTENTION_HEAD_DIMS)
    check_power_of_two("block_size", block_size, low=1, high=1024)
    if num_kv_heads == 0 or num_q_heads % num_kv_heads:
        raise ValueError(f"num_q_heads ({num_q_heads}) must be a multiple of num_kv_heads ({num_kv_heads})")
    if not isinstance(scale, float):
        raise TypeError(f"scale must be a Python float, got {type(scale).__name__}")
    return block_size, num_kv_heads


def output_like(name: str, q: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    """`out` checked to match q (shape, dtype, device, dense last dim), or a new tensor like q."""
    if out is None:
        return torch.empty_like(q)
    check_tensor(name, out, ndim=q.dim(), dtypes=(q.dtype,))
    check_shape(name, out, tuple(q.shape))
    check_last_dim_contiguous(name, out)
    check_same_device("q", q, **{name: out})
    return out
