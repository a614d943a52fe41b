"""Fused elementwise kernels (add + RMSNorm, q/k norm + RoPE, SiLU * mul) against float64 references."""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import given

from fast.kernels.add_rmsnorm import add_rmsnorm, rmsnorm
from fast.kernels.qk_norm_rope import qk_norm_rope_
from fast.kernels.silu_and_mul import silu_and_mul
from reports.bench.kernels.kernel_reference import reference_add_rmsnorm, reference_qk_norm_rope, reference_silu_and_mul
from tests.fast.kernels.reference import DEVICE, ON_GPU, assert_close_scaled, build_cos_sin_cache, poisoned_like
from tests.fast.kernels.strategies import CPU_DTYPES, kernel_settings, seeded_generator

GPU_DTYPES = [torch.bfloat16, torch.float16, torch.float32]


def _random(shape: tuple[int, ...], dtype: torch.dtype, generator: torch.Generator, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(shape, generator=generator) * scale).to(dtype).to(DEVICE)


# ----------------------------------------------------------------------------- add + RMSNorm


def _check_add_rmsnorm(
    num_tokens: int,
    hidden: int,
    with_residual: bool,
    dtype: torch.dtype,
    seed: int,
    rows_per_program: int | None = None,
) -> None:
    """Close to the reference; in Triton's interpreter also a row's bits the same whatever the rows per program
    (the engine's CPU runs take 16, its batch-invariance tests compare them). On a GPU a row reduced in a
    larger tile may round otherwise (an H200 differed in fp16), and the engine takes one row there always."""
    generator = seeded_generator(seed)
    x = _random((num_tokens, hidden), dtype, generator)
    residual = _random((num_tokens, hidden), dtype, generator, scale=4.0) if with_residual else None
    weight = _random((hidden,), dtype, generator)
    out = poisoned_like(x)
    residual_out = poisoned_like(residual) if with_residual else None
    result, new_residual = add_rmsnorm(
        x, residual, weight, 1e-6, out=out, residual_out=residual_out, rows_per_program=rows_per_program
    )
    expected, expected_residual = reference_add_rmsnorm(x, residual, weight, 1e-6)
    if not ON_GPU:
        one_row = add_rmsnorm(x, residual, weight, 1e-6, rows_per_program=1)
        assert torch.equal(one_row[0], out)
        assert (one_row[1] is None) == (not with_residual)
        assert not with_residual or torch.equal(one_row[1], new_residual)
    assert result is out
    assert_close_scaled(out, expected, dtype, "add_rmsnorm out")
    if with_residual:
        assert new_residual is residual_out
        # The sum is computed in fp32 and rounded once. For fp32/fp16 inputs the fp32 sum is
        # exact, so it equals the reference's rounded fp64 sum bit for bit; bf16 operands can
        # differ in exponent by more than fp32 holds (rare double rounding): compare to tolerance.
        if dtype == torch.bfloat16:
            assert_close_scaled(new_residual, expected_residual.double(), dtype, "add_rmsnorm residual")
        else:
            assert torch.equal(new_residual, expected_residual)
    else:
        assert new_residual is None


@pytest.mark.parametrize("dtype", CPU_DTYPES)
@kernel_settings(cpu_examples=20)
@given(
    num_tokens=st.integers(1, 9),
    hidden=st.sampled_from([64, 96, 256, 1000]),
    with_residual=st.booleans(),
    rows_per_program=st.sampled_from([None, 1, 2, 16]),
    seed=st.integers(0, 2**31 - 1),
)
def test_add_rmsnorm_matches_reference(
    dtype: torch.dtype, num_tokens: int, hidden: int, with_residual: bool, rows_per_program: int | None, seed: int
) -> None:
    _check_add_rmsnorm(num_tokens, hidden, with_residual, dtype, seed, rows_per_program)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", GPU_DTYPES)
@pytest.mark.parametrize("hidden", [1024, 4096, 5120])
@pytest.mark.parametrize("rows_per_program", [1, 4])
def test_add_rmsnorm_large_gpu(dtype: torch.dtype, hidden: int, rows_per_program: int) -> None:
    _check_add_rmsnorm(4097, hidden, True, dtype, 0, rows_per_program)
    _check_add_rmsnorm(33, hidden, False, dtype, 1, rows_per_program)


def test_add_rmsnorm_in_place() -> None:
    generator = seeded_generator(0)
    x, residual = _random((3, 64), torch.float32, generator), _random((3, 64), torch.float32, generator)
    weight = _random((64,), torch.float32, generator)
    expected, expected_residual = reference_add_rmsnorm(x, residual, weight, 1e-5)
    add_rmsnorm(x, residual, weight, 1e-5, out=x, residual_out=residual)
    assert_close_scaled(x, expected, torch.float32, "in-place add_rmsnorm")
    assert torch.equal(residual, expected_residual)


def test_rmsnorm_without_residual() -> None:
    generator = seeded_generator(1)
    x, weight = _random((2, 128), torch.float16, generator), _random((128,), torch.float16, generator)
    assert_close_scaled(
        rmsnorm(x, weight, 1e-6), reference_add_rmsnorm(x, None, weight, 1e-6)[0], torch.float16, "rmsnorm"
    )


@pytest.mark.parametrize(
    ("kwargs", "error", "names"),
    [
        ({"x": torch.zeros(2, 64, dtype=torch.int32)}, TypeError, "x must have dtype"),
        ({"weight": torch.zeros(32)}, ValueError, "weight must have shape"),
        ({"residual": torch.zeros(3, 64)}, ValueError, "residual must have shape"),
        ({"x": "strided"}, ValueError, "x must have stride 1"),
        ({"eps": 0.0}, ValueError, "eps"),
        ({"out": torch.zeros(2, 64, dtype=torch.float16)}, TypeError, "out has dtype"),
        ({"weight": torch.zeros(64, device="meta")}, ValueError, "weight is on meta"),
    ],
)
def test_add_rmsnorm_rejects_bad_arguments(kwargs: dict, error: type[Exception], names: str) -> None:
    args = {"x": torch.zeros(2, 64), "residual": torch.zeros(2, 64), "weight": torch.ones(64), "eps": 1e-6}
    args.update(kwargs)
    args = {k: v.to(DEVICE) if isinstance(v, torch.Tensor) and v.device.type != "meta" else v for k, v in args.items()}
    if isinstance(args["x"], str):  # made on the device: .to() would return a contiguous copy
        args["x"] = torch.zeros(2, 128, device=DEVICE)[:, ::2]
    with pytest.raises(error, match=names):
        add_rmsnorm(**args)


# ----------------------------------------------------------------------------- q/k norm + RoPE


def _check_qk_norm_rope(
    num_tokens: int,
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    seed: int,
    heads_per_program: int = 8,
    tokens_per_program: int | None = None,
) -> None:
    generator = seeded_generator(seed)
    max_positions = 4096
    cos_sin_cache = build_cos_sin_cache(max_positions, head_dim)
    # q and k as views into one qkv buffer [T, (Hq + 2 Hkv) * D], as the engine produces them.
    qkv = _random((num_tokens, num_q_heads + 2 * num_kv_heads, head_dim), dtype, generator, scale=3.0)
    q, k = qkv[:, :num_q_heads], qkv[:, num_q_heads : num_q_heads + num_kv_heads]
    v_before = qkv[:, num_q_heads + num_kv_heads :].clone()
    q_weight, k_weight = _random((head_dim,), dtype, generator), _random((head_dim,), dtype, generator)
    positions = torch.randint(0, max_positions, (num_tokens,), generator=generator).to(DEVICE)
    expected_q = reference_qk_norm_rope(q, q_weight, cos_sin_cache, positions, 1e-6)
    expected_k = reference_qk_norm_rope(k, k_weight, cos_sin_cache, positions, 1e-6)
    launch = {"heads_per_program": heads_per_program, "tokens_per_program": tokens_per_program}
    qk_norm_rope_(q, k, q_weight, k_weight, cos_sin_cache, positions, 1e-6, **launch)
    assert_close_scaled(q, expected_q, dtype, "qk_norm_rope q")
    assert_close_scaled(k, expected_k, dtype, "qk_norm_rope k")
    assert torch.equal(qkv[:, num_q_heads + num_kv_heads :], v_before), "v must be untouched"


@pytest.mark.parametrize("dtype", CPU_DTYPES)
@kernel_settings(cpu_examples=20)
@given(
    num_tokens=st.integers(1, 9),
    heads=st.sampled_from([(1, 1), (4, 2), (6, 3), (8, 1), (12, 4)]),
    head_dim=st.sampled_from([64, 128]),
    heads_per_program=st.sampled_from([1, 2, 4, 8]),
    tokens_per_program=st.sampled_from([None, 1, 2, 4, 16]),
    seed=st.integers(0, 2**31 - 1),
)
def test_qk_norm_rope_matches_reference(
    dtype: torch.dtype,
    num_tokens: int,
    heads: tuple[int, int],
    head_dim: int,
    heads_per_program: int,
    tokens_per_program: int | None,
    seed: int,
) -> None:
    _check_qk_norm_rope(num_tokens, heads[0], heads[1], head_dim, dtype, seed, heads_per_program, tokens_per_program)


def _rotated(qkv: torch.Tensor, num_q_heads: int, tokens_per_program: int, **shared: object) -> torch.Tensor:
    qkv = qkv.clone()
    q, k = qkv[:, :num_q_heads], qkv[:, num_q_heads:]
    qk_norm_rope_(q, k, **shared, eps=1e-6, tokens_per_program=tokens_per_program)
    return qkv


@pytest.mark.interpreter
@pytest.mark.parametrize("dtype", CPU_DTYPES)
def test_qk_norm_rope_is_bitwise_the_same_for_any_tokens_per_program(dtype: torch.dtype) -> None:
    """In Triton's interpreter a token's rotated heads do not depend on how many tokens its program holds,
    nor on its row there (the engine's CPU runs take 16 a program). On a GPU, where a row reduced in a larger
    tile may round otherwise (an H200 did at 2 heads a program), the engine takes one token a program always."""
    generator = seeded_generator(4)
    head_dim, num_q_heads, num_kv_heads, num_tokens = 64, 6, 3, 37
    qkv = _random((num_tokens, num_q_heads + num_kv_heads, head_dim), dtype, generator, scale=3.0)
    shared = {
        "q_weight": _random((head_dim,), dtype, generator),
        "k_weight": _random((head_dim,), dtype, generator),
        "cos_sin_cache": build_cos_sin_cache(4096, head_dim),
        "positions": torch.randint(0, 4096, (num_tokens,), generator=generator).to(DEVICE),
    }
    one = _rotated(qkv, num_q_heads, 1, **shared)
    for tokens_per_program in (2, 16, 64):
        assert torch.equal(_rotated(qkv, num_q_heads, tokens_per_program, **shared), one), tokens_per_program


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", GPU_DTYPES)
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("heads_per_program", [2, 4, 8, 16, 32])
@pytest.mark.parametrize("tokens_per_program", [1, 4])
def test_qk_norm_rope_large_gpu(
    dtype: torch.dtype, head_dim: int, heads_per_program: int, tokens_per_program: int
) -> None:
    _check_qk_norm_rope(2049, 32, 8, head_dim, dtype, 0, heads_per_program, tokens_per_program)


@pytest.mark.parametrize(
    ("kwargs", "error", "names"),
    [
        ({"positions": torch.zeros(3, dtype=torch.int32)}, TypeError, "positions"),
        ({"positions": torch.zeros(2, dtype=torch.int64)}, ValueError, "positions must have shape"),
        ({"cos_sin_cache": torch.zeros(16, 64, dtype=torch.float16)}, TypeError, "cos_sin_cache"),
        ({"cos_sin_cache": torch.zeros(16, 32)}, ValueError, "cos_sin_cache must have shape"),
        ({"k": torch.zeros(3, 2, 32)}, ValueError, "k must have shape"),
        ({"k": torch.zeros(3, 2, 64, dtype=torch.float16)}, TypeError, "k has dtype"),
        ({"q_weight": torch.zeros(32)}, ValueError, "q_weight must have shape"),
        ({"k_weight": torch.zeros(64, device="meta")}, ValueError, "k_weight is on meta"),
    ],
)
def test_qk_norm_rope_rejects_bad_arguments(kwargs: dict, error: type[Exception], names: str) -> None:
    args = {
        "q": torch.zeros(3, 4, 64),
        "k": torch.zeros(3, 2, 64),
        "q_weight": torch.ones(64),
        "k_weight": torch.ones(64),
        "cos_sin_cache": torch.zeros(16, 64),
        "positions": torch.zeros(3, dtype=torch.int64),
        "eps": 1e-6,
    }
    args.update(kwargs)
    args = {k: v.to(DEVICE) if isinstance(v, torch.Tensor) and v.device.type != "meta" else v for k, v in args.items()}
    with pytest.raises(error, match=names):
        qk_norm_rope_(**args)


# ----------------------------------------------------------------------------- SiLU * mul


def _check_silu_and_mul(
    num_tokens: int, intermediate: int, dtype: torch.dtype, seed: int, rows_per_program: int | None = None
) -> None:
    """Close to the reference, and the same bits for every rows_per_program (elementwise: a row's result
    cannot depend on the program that holds it)."""
    generator = seeded_generator(seed)
    x = _random((num_tokens, 2 * intermediate), dtype, generator, scale=3.0)
    out = torch.full((num_tokens, intermediate), float("nan"), dtype=dtype, device=DEVICE)
    assert silu_and_mul(x, out=out, rows_per_program=rows_per_program) is out
    assert_close_scaled(out, reference_silu_and_mul(x), dtype, "silu_and_mul")
    assert torch.equal(silu_and_mul(x, rows_per_program=1), out)


@pytest.mark.parametrize("dtype", CPU_DTYPES)
@kernel_settings(cpu_examples=20)
@given(
    num_tokens=st.integers(1, 9),
    intermediate=st.sampled_from([1, 64, 100, 1024, 1500]),
    rows_per_program=st.sampled_from([None, 1, 2, 16]),
    seed=st.integers(0, 2**31 - 1),
)
def test_silu_and_mul_matches_reference(
    dtype: torch.dtype, num_tokens: int, intermediate: int, rows_per_program: int | None, seed: int
) -> None:
    _check_silu_and_mul(num_tokens, intermediate, dtype, seed, rows_per_program)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", GPU_DTYPES)
@pytest.mark.parametrize("rows_per_program", [1, 4])
def test_silu_and_mul_large_gpu(dtype: torch.dtype, rows_per_program: int) -> None:
    _check_silu_and_mul(4097, 12288, dtype, 0, rows_per_program)


@pytest.mark.parametrize(
    ("x", "out", "error", "names"),
    [
        (torch.zeros(2, 7), None, ValueError, "even"),
        (torch.zeros(2, 8, dtype=torch.int64), None, TypeError, "x must have dtype"),
        (torch.zeros(2, 8), torch.zeros(2, 8), ValueError, "out must have shape"),
        ("strided", None, ValueError, "x must have stride 1"),
        (torch.zeros(2, 8), torch.zeros(2, 4, device="meta"), ValueError, "out is on meta"),
    ],
)
def test_silu_and_mul_rejects_bad_arguments(
    x: torch.Tensor | str, out: torch.Tensor | None, error: type[Exception], names: str
) -> None:
    # The strided view is made on the device: .to() would return a contiguous copy.
    x = torch.zeros(2, 16, device=DEVICE)[:, ::2] if isinstance(x, str) else x.to(DEVICE)
    out = out.to(DEVICE) if out is not None and out.device.type != "meta" else out
    with pytest.raises(error, match=names):
        silu_and_mul(x, out=out)


def test_programs_per_row_knobs_must_be_powers_of_two() -> None:
    x = torch.zeros(3, 8, device=DEVICE)
    with pytest.raises(ValueError, match=r"rows_per_program must be a power of two in \[1, 1024\], got 3"):
        silu_and_mul(x, rows_per_program=3)
    q, k, cache = torch.zeros(3, 2, 16, device=DEVICE), torch.zeros(3, 1, 16, device=DEVICE), build_cos_sin_cache(8, 16)
    positions = torch.zeros(3, dtype=torch.int64, device=DEVICE)
    with pytest.raises(ValueError, match=r"tokens_per_program must be a power of two in \[1, 1024\], got 0"):
        qk_norm_rope_(q, k, None, None, cache, positions, 1e-6, tokens_per_program=0)


@pytest.mark.parametrize("dtype", CPU_DTYPES)
@pytest.mark.parametrize("head_dim", [16, 64])
def test_rope_without_norm_matches_reference(dtype: torch.dtype, head_dim: int) -> None:
    """RoPE alone (Llama, Qwen2): the norm weights None leave the norm out."""
    from fast.kernels.qk_norm_rope import rope_

    generator = seeded_generator(3)
    cos_sin_cache = build_cos_sin_cache(64, head_dim)
    qkv = _random((5, 4 + 2 * 2, head_dim), dtype, generator, scale=3.0)
    q, k = qkv[:, :4], qkv[:, 4:6]
    positions = torch.randint(0, 64, (5,), generator=generator).to(DEVICE)

    def rotated(x: torch.Tensor) -> torch.Tensor:
        half = head_dim // 2
        cos = cos_sin_cache[positions, :half].double()[:, None, :]
        sin = cos_sin_cache[positions, half:].double()[:, None, :]
        first, second = x.double()[..., :half], x.double()[..., half:]
        return torch.cat([first * cos - second * sin, second * cos + first * sin], dim=-1)

    expected_q, expected_k = rotated(q), rotated(k)
    rope_(q, k, cos_sin_cache, positions)
    assert_close_scaled(q, expected_q, dtype, "rope q")
    assert_close_scaled(k, expected_k, dtype, "rope k")
