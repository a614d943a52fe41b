"""Batch-invariant matmul: matches a float64 reference, and a row's result is bitwise the same
whatever the other rows are and however many there are, with the default tiles and with
overridden ones (row counts below, at and above BLOCK_M; N and K not multiples of the tiles)."""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
import torch
import triton
from hypothesis import given

from fast.kernels.matmul import invariant_linear, matmul_config, matmul_tiles
from tests.kernels.reference import DEVICE, assert_close_scaled
from tests.kernels.strategies import CPU_DTYPES, kernel_settings, seeded_generator

# Overrides small enough for the interpreter to cross several tiles on tiny shapes. The last two
# change only the program order (GROUP_M 0: row tiles fastest; 1: column tiles fastest).
SMALL_CONFIGS = [
    {"block_m": 16, "block_n": 16, "block_k": 16, "group_m": 2},
    {"block_m": 32, "block_n": 16, "block_k": 32, "num_warps": 2, "num_stages": 2, "group_m": 0},
    {"block_m": 16, "block_n": 32, "block_k": 16, "group_m": 1},
]


def _random(shape: tuple[int, ...], dtype: torch.dtype, generator: torch.Generator) -> torch.Tensor:
    return torch.randn(shape, generator=generator).to(dtype).to(DEVICE)


def _strided_rows(rows: int, cols: int, dtype: torch.dtype, generator: torch.Generator) -> torch.Tensor:
    """[rows, cols] whose rows are `cols + 8` elements apart (a view into a wider buffer)."""
    return _random((rows, cols + 8), dtype, generator)[:, :cols]


def _reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return x.double() @ weight.double().T + (bias.double() if bias is not None else 0)


def _assert_rows_invariant(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, row_counts: list[int], config: dict
) -> torch.Tensor:
    """The result of every prefix x[:m] and of slices from the middle equals the same rows of the
    result of all of x, bit for bit. Returns the full result."""
    full = invariant_linear(x, weight, bias, **config)
    for m in row_counts:
        assert torch.equal(invariant_linear(x[:m], weight, bias, **config), full[:m]), (m, config)
    total = x.shape[0]
    for start, stop in [(total // 2, total // 2 + 1), (total // 3, total - 1), (1, total)]:
        part = invariant_linear(x[start:stop], weight, bias, **config)
        assert torch.equal(part, full[start:stop]), (start, stop, config)
    return full


@pytest.mark.parametrize("dtype", CPU_DTYPES)
@kernel_settings(cpu_examples=10)
@given(
    rows=st.integers(1, 150),
    width=st.sampled_from([16, 48, 80]),
    depth=st.sampled_from([16, 40, 136]),
    bias=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
def test_matmul_matches_reference(dtype: torch.dtype, rows: int, width: int, depth: int, bias: bool, seed: int) -> None:
    generator = seeded_generator(seed)
    x, weight = _random((rows, depth), dtype, generator), _random((width, depth), dtype, generator)
    b = _random((width,), dtype, generator) if bias else None
    assert_close_scaled(invariant_linear(x, weight, b), _reference(x, weight, b), dtype, "matmul")


@pytest.mark.parametrize("dtype", CPU_DTYPES)
@pytest.mark.parametrize("config", SMALL_CONFIGS, ids=["m16n16k16g2", "m32n16k32g0", "m16n32k16g1"])
def test_overridden_tiles_are_invariant_and_correct(dtype: torch.dtype, config: dict) -> None:
    """N=40 and K=40 leave masked tails in both; rows strided; 70 rows span 3 to 5 row tiles."""
    generator = seeded_generator(1)
    x = _strided_rows(70, 40, dtype, generator)
    weight, bias = _random((40, 40), dtype, generator), _random((40,), dtype, generator)
    full = _assert_rows_invariant(x, weight, bias, [1, 3, 15, 16, 17, 32, 33, 64, 65, 70], config)
    assert_close_scaled(full, _reference(x, weight, bias), dtype, f"matmul {config}")


@pytest.mark.parametrize("dtype", CPU_DTYPES)
def test_default_tiles_are_invariant_across_row_tiles(dtype: torch.dtype) -> None:
    """The real default configuration (BLOCK_M 64): 1 to 150 rows, one to three row tiles; N=80 is
    not a multiple of BLOCK_N (64) and K=72 not of BLOCK_K."""
    generator = seeded_generator(2)
    x, weight = _random((150, 72), dtype, generator), _random((80, 72), dtype, generator)
    assert matmul_tiles(80, 72, dtype).block_m == 64
    full = _assert_rows_invariant(x, weight, None, [1, 2, 63, 64, 65, 127, 128, 129], {})
    assert_close_scaled(full, _reference(x, weight, None), dtype, "matmul default")


@pytest.mark.parametrize("dtype", CPU_DTYPES)
@kernel_settings(cpu_examples=10)
@given(batch=st.integers(1, 37), position=st.integers(0, 36), seed=st.integers(0, 2**31 - 1))
def test_a_row_is_bitwise_the_same_in_any_batch(dtype: torch.dtype, batch: int, position: int, seed: int) -> None:
    generator = seeded_generator(seed)
    weight = _random((48, 72), dtype, generator)
    needle = _random((1, 72), dtype, generator)
    others = _random((batch, 72), dtype, generator)
    position = min(position, batch)
    batched = torch.cat([others[:position], needle, others[position:]])
    for config in ({}, SMALL_CONFIGS[0]):
        alone = invariant_linear(needle, weight, **config)
        assert torch.equal(invariant_linear(batched, weight, **config)[position], alone[0]), config


def test_overrides_reach_the_kernel() -> None:
    """Another BLOCK_K changes the fp32 summation order, so some element differs (both stay close)."""
    generator = seeded_generator(3)
    x, weight = _random((8, 136), torch.float32, generator), _random((32, 136), torch.float32, generator)
    coarse = invariant_linear(x, weight, block_k=128)
    fine = invariant_linear(x, weight, block_k=16)
    assert not torch.equal(coarse, fine)
    for out in (coarse, fine):
        assert_close_scaled(out, _reference(x, weight, None), torch.float32, "matmul")


def test_out_argument_and_empty_batch() -> None:
    generator = seeded_generator(4)
    x, weight = _random((5, 24), torch.float32, generator), _random((20, 24), torch.float32, generator)
    out = torch.full((5, 20), float("nan"), device=DEVICE)
    assert invariant_linear(x, weight, out=out) is out
    assert torch.equal(out, invariant_linear(x, weight))
    assert invariant_linear(x[:0], weight).shape == (0, 20)


def test_default_tiles_depend_on_the_weight_and_dtype_by_their_rules() -> None:
    """matmul_tiles' stated rules, each against another call: never M (it has no M argument), the
    same row tile for every weight, fp32 halving BLOCK_K, small weights rounded up to a power of two,
    and overrides replacing only the fields given."""
    shapes = [(4096, 1024), (151936, 1024), (1024, 3072), (20, 24)]
    assert len({matmul_tiles(n, k, torch.bfloat16).block_m for n, k in shapes}) == 1
    for n, k in [(4096, 1024), (1024, 3072)]:
        assert matmul_tiles(n, k, torch.float32).block_k * 2 == matmul_tiles(n, k, torch.bfloat16).block_k
    small = matmul_tiles(20, 24, torch.float16)
    assert (small.block_n, small.block_k) == (triton.next_power_of_2(20), triton.next_power_of_2(24))
    base = matmul_tiles(4096, 1024, torch.bfloat16)
    assert matmul_config(4096, 1024, torch.bfloat16, block_m=128, group_m=0) == base._replace(block_m=128, group_m=0)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"block_m": 8}, "block_m must be a power of two in"),
        ({"block_m": 48}, "block_m must be a power of two in"),
        ({"block_n": 512}, "block_n must be a power of two in"),
        ({"block_k": 8}, "block_k must be a power of two in"),
        ({"num_warps": 3}, "num_warps must be a power of two in"),
        ({"num_stages": 0}, r"num_stages must be in \[1, 8\]"),
        ({"group_m": -1}, r"group_m must be in \[0, 4096\]"),
    ],
)
def test_bad_overrides_raise(override: dict, message: str) -> None:
    x, weight = torch.zeros((2, 16), device=DEVICE), torch.zeros((16, 16), device=DEVICE)
    with pytest.raises(ValueError, match=message):
        invariant_linear(x, weight, **override)
    with pytest.raises(ValueError, match=message):  # also for an empty batch: the same config for every M
        invariant_linear(x[:0], weight, **override)


def test_non_int_override_raises_type_error() -> None:
    x, weight = torch.zeros((2, 16), device=DEVICE), torch.zeros((16, 16), device=DEVICE)
    with pytest.raises(TypeError, match="block_n must be a Python int"):
        invariant_linear(x, weight, block_n=64.0)
    with pytest.raises(TypeError, match="num_stages must be a Python int"):
        invariant_linear(x, weight, num_stages=True)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("shape", [(4096, 1024), (1024, 3072), (6144, 1024), (151936, 1024)])
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


@pytest.mark.gpu
@pytest.mark.parametrize("config", [{}, {"block_m": 128, "block_n": 128, "num_warps": 8, "num_stages": 3}])
def test_prefixes_are_bitwise_the_same_gpu(config: dict) -> None:
    """bf16 at the Qwen3-0.6B gate_up shape: every prefix up to 4096 rows, and middle slices."""
    generator = seeded_generator(5)
    x, weight = _random((4096, 1024), torch.bfloat16, generator), _random((6144, 1024), torch.bfloat16, generator)
    _assert_rows_invariant(x, weight, None, [1, 3, 16, 64, 255, 256, 1000, 4096], config)
