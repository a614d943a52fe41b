"""Batch-invariant matmul: matches a float64 reference, and a row's result is bitwise the same
whatever the other rows are and however many there are."""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import given

from fast.kernels.matmul import invariant_linear
from tests.kernels.reference import DEVICE, assert_close_scaled
from tests.kernels.strategies import CPU_DTYPES, kernel_settings, seeded_generator


def _random(shape: tuple[int, ...], dtype: torch.dtype, generator: torch.Generator) -> torch.Tensor:
    return torch.randn(shape, generator=generator).to(dtype).to(DEVICE)


@pytest.mark.parametrize("dtype", CPU_DTYPES)
@kernel_settings(cpu_examples=10)
@given(
    rows=st.integers(1, 40),
    width=st.sampled_from([16, 48, 80]),
    depth=st.sampled_from([16, 40, 136]),
    bias=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
def test_matmul_matches_reference(dtype: torch.dtype, rows: int, width: int, depth: int, bias: bool, seed: int) -> None:
    generator = seeded_generator(seed)
    x, weight = _random((rows, depth), dtype, generator), _random((width, depth), dtype, generator)
    b = _random((width,), dtype, generator) if bias else None
    expected = x.double() @ weight.double().T + (b.double() if b is not None else 0)
    assert_close_scaled(invariant_linear(x, weight, b), expected, dtype, "matmul")


@pytest.mark.parametrize("dtype", CPU_DTYPES)
@kernel_settings(cpu_examples=10)
@given(batch=st.integers(1, 37), position=st.integers(0, 36), seed=st.integers(0, 2**31 - 1))
def test_a_row_is_bitwise_the_same_in_any_batch(dtype: torch.dtype, batch: int, position: int, seed: int) -> None:
    generator = seeded_generator(seed)
    weight = _random((48, 72), dtype, generator)
    needle = _random((1, 72), dtype, generator)
    alone = invariant_linear(needle, weight)
    others = _random((batch, 72), dtype, generator)
    position = min(position, batch)
    batched = torch.cat([others[:position], needle, others[position:]])
    assert torch.equal(invariant_linear(batched, weight)[position], alone[0])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("shape", [(1024, 3072), (6144, 1024), (151936, 1024)])
def test_a_row_is_bitwise_the_same_in_any_batch_gpu(dtype: torch.dtype, shape: tuple[int, int]) -> None:
    generator = seeded_generator(0)
    weight = _random(shape, dtype, generator)
    needle = _random((1, shape[1]), dtype, generator)
    alone = invariant_linear(needle, weight)
    for batch in (1, 3, 17, 64, 255, 2048):
        others = _random((batch, shape[1]), dtype, generator)
        batched = torch.cat([others[: batch // 2], needle, others[batch // 2 :]])
        assert torch.equal(invariant_linear(batched, weight)[batch // 2], alone[0]), batch
    expected = needle.double() @ weight.double().T
    assert_close_scaled(alone, expected, dtype, "matmul")
