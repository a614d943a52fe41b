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
    if len(actual) != len(expected) or any(e is not None and a != e for a, e in zip(actual, expected)):
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
            raise TypeError(f"{name} has dtype {tensor.dtype} but {reference_name} has {reference.dtype}; they must match")


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
        raise TypeError(f"{name} must be a Python int (host-known, so no GPU sync is needed), got {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")
    return value


def check_head_dim(name: str, head_dim: int, supported: Sequence[int]) -> None:
    if head_dim not in supported:
        raise ValueError(f"{name} = {head_dim} is not supported; supported head dims are {tuple(supported)}")
