"""KV-store scatter into the paged cache: exact copy, padding slots skipped."""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import given

from fast.kernels.kv_store import store_kv
from tests.fast.kernels.reference import DEVICE
from tests.fast.kernels.strategies import CPU_DTYPES, kernel_settings, seeded_generator


def _run_case(
    num_tokens: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    num_blocks: int,
    num_padding: int,
    dtype: torch.dtype,
    seed: int,
    strided: bool,
) -> None:
    generator = seeded_generator(seed)
    num_slots = num_blocks * block_size
    real_tokens = min(num_tokens, num_slots)
    slots = torch.randperm(num_slots, generator=generator)[:real_tokens]
    slots = torch.cat([slots, torch.full((num_padding,), -1)])
    slots = slots[torch.randperm(len(slots), generator=generator)]  # padding rows anywhere
    total = len(slots)
    if strided:
        # k and v as views into one fused [T, (2 * Hkv) * D] buffer, like a qkv projection output.
        fused = torch.randn((total, 2, num_kv_heads, head_dim), generator=generator).to(dtype).to(DEVICE)
        k, v = fused[:, 0], fused[:, 1]
    else:
        k = torch.randn((total, num_kv_heads, head_dim), generator=generator).to(dtype).to(DEVICE)
        v = torch.randn((total, num_kv_heads, head_dim), generator=generator).to(dtype).to(DEVICE)
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=generator).to(dtype).to(DEVICE)
    v_cache = torch.randn(shape, generator=generator).to(dtype).to(DEVICE)
    expected_k, expected_v = k_cache.clone(), v_cache.clone()
    real = slots >= 0
    expected_k.view(num_slots, num_kv_heads, head_dim)[slots[real].to(DEVICE)] = k[real.to(DEVICE)]
    expected_v.view(num_slots, num_kv_heads, head_dim)[slots[real].to(DEVICE)] = v[real.to(DEVICE)]

    store_kv(k, v, k_cache, v_cache, slots.to(DEVICE))
    assert torch.equal(k_cache, expected_k)
    assert torch.equal(v_cache, expected_v)


@pytest.mark.parametrize("dtype", CPU_DTYPES)
@kernel_settings(cpu_examples=20)
@given(
    num_tokens=st.integers(1, 24),
    num_kv_heads=st.sampled_from([1, 2, 3, 8]),
    block_size=st.sampled_from([16, 32]),
    num_blocks=st.integers(1, 4),
    num_padding=st.integers(0, 3),
    seed=st.integers(0, 2**31 - 1),
    strided=st.booleans(),
)
def test_store_kv_scatters_rows(
    dtype: torch.dtype,
    num_tokens: int,
    num_kv_heads: int,
    block_size: int,
    num_blocks: int,
    num_padding: int,
    seed: int,
    strided: bool,
) -> None:
    _run_case(num_tokens, num_kv_heads, 64, block_size, num_blocks, num_padding, dtype, seed, strided)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("block_size", [16, 256])
def test_store_kv_large_gpu(dtype: torch.dtype, head_dim: int, block_size: int) -> None:
    _run_case(3000, 8, head_dim, block_size, 4096 // block_size * 4, 17, dtype, 0, True)


def test_store_kv_only_padding_writes_nothing() -> None:
    _run_case(0, 2, 64, 16, 2, 4, torch.float32, 0, False)


def _valid_args() -> dict:
    return {
        "k": torch.randn(4, 2, 64, device=DEVICE),
        "v": torch.randn(4, 2, 64, device=DEVICE),
        "k_cache": torch.zeros(2, 16, 2, 64, device=DEVICE),
        "v_cache": torch.zeros(2, 16, 2, 64, device=DEVICE),
        "slot_mapping": torch.tensor([0, 5, -1, 17], device=DEVICE),
    }


@pytest.mark.parametrize(
    ("change", "error", "names"),
    [
        ({"slot_mapping": torch.tensor([0, 5, -1, 17], dtype=torch.int32)}, TypeError, "slot_mapping"),
        ({"slot_mapping": torch.tensor([0, 5, 17])}, ValueError, "slot_mapping"),
        ({"v": torch.randn(4, 2, 32)}, ValueError, "v must have shape"),
        ({"k_cache": torch.zeros(2, 16, 4, 64)}, ValueError, "k_cache"),
        ({"v": torch.randn(4, 2, 64, dtype=torch.float16)}, TypeError, "v has dtype"),
        ({"k": torch.randn(4, 2, 64).int()}, TypeError, "k must have dtype"),
        ({"k": "strided"}, ValueError, "k must have stride 1"),
        ({"k_cache": torch.zeros(16, 2, 2, 64).transpose(0, 1)}, ValueError, "k_cache must be contiguous"),
        ({"k": [1, 2, 3]}, TypeError, "k must be a torch.Tensor"),
    ],
)
def test_store_kv_rejects_bad_arguments(change: dict, error: type[Exception], names: str) -> None:
    args = _valid_args()
    for key, value in change.items():
        args[key] = value.to(DEVICE) if isinstance(value, torch.Tensor) else value
    if (
        isinstance(args["k"], str) and args["k"] == "strided"
    ):  # made on the device: .to() would return a contiguous copy
        args["k"] = torch.randn(4, 2, 128, device=DEVICE)[:, :, ::2]
    with pytest.raises(error, match=names):
        store_kv(**args)


def test_store_kv_rejects_tensors_on_different_devices() -> None:
    args = _valid_args()
    args["v_cache"] = torch.empty((2, 16, 2, 64), device="meta")
    with pytest.raises(ValueError, match="v_cache is on meta"):
        store_kv(**args)
