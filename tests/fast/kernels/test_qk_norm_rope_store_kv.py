"""qk_norm_rope_store_kv_: one kernel doing qk_norm_rope_ then store_kv, bit for bit the two in turn."""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import given

from fast.kernels.kv_store import store_kv
from fast.kernels.qk_norm_rope import qk_norm_rope_, qk_norm_rope_store_kv_
from tests.fast.kernels.reference import DEVICE, ON_GPU, build_cos_sin_cache
from tests.fast.kernels.strategies import CPU_DTYPES, kernel_settings, seeded_generator

GPU_DTYPES = [torch.bfloat16, torch.float16, torch.float32]


def _case(
    num_tokens: int,
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    num_padding: int,
    dtype: torch.dtype,
    seed: int,
    with_norm: bool,
) -> dict[str, torch.Tensor | None]:
    """Inputs as the engine makes them: q, k, v views into one qkv buffer, distinct slots, padding rows (-1)."""
    generator = seeded_generator(seed)
    total = num_tokens + num_padding
    qkv = (torch.randn((total, num_q_heads + 2 * num_kv_heads, head_dim), generator=generator) * 3).to(dtype)
    num_blocks = num_tokens // block_size + 2
    slots = torch.randperm(num_blocks * block_size, generator=generator)[:num_tokens]
    slots = torch.cat([slots, torch.full((num_padding,), -1)])[torch.randperm(total, generator=generator)]
    cache_shape = (num_blocks, block_size, num_kv_heads, head_dim)
    weights = [torch.randn(head_dim, generator=generator).to(dtype) for _ in range(2)] if with_norm else [None, None]
    tensors = {
        "qkv": qkv,
        "q_weight": weights[0],
        "k_weight": weights[1],
        "cos_sin_cache": build_cos_sin_cache(4096, head_dim).cpu(),
        "positions": torch.randint(0, 4096, (total,), generator=generator),
        "k_cache": torch.randn(cache_shape, generator=generator).to(dtype),
        "v_cache": torch.randn(cache_shape, generator=generator).to(dtype),
        "slot_mapping": slots,
    }
    return {name: t.to(DEVICE) if t is not None else None for name, t in tensors.items()}


def _split(qkv: torch.Tensor, num_q_heads: int, num_kv_heads: int) -> tuple[torch.Tensor, ...]:
    return qkv[:, :num_q_heads], qkv[:, num_q_heads : num_q_heads + num_kv_heads], qkv[:, num_q_heads + num_kv_heads :]


def _check(
    num_q_heads: int,
    num_kv_heads: int,
    heads_per_program: int,
    tokens_per_program: tuple[int | None, int | None],
    **case_args: object,
) -> None:
    """The fused kernel with tokens_per_program[0], the two unfused ones with tokens_per_program[1] (on a GPU,
    where other counts may round a row otherwise, both take the fused one's)."""
    if ON_GPU:
        tokens_per_program = (tokens_per_program[0], tokens_per_program[0])
    fused = _case(num_q_heads=num_q_heads, num_kv_heads=num_kv_heads, **case_args)
    unfused = {name: t.clone() if t is not None else None for name, t in fused.items()}
    q, k, v = _split(fused["qkv"], num_q_heads, num_kv_heads)
    shared = {name: fused[name] for name in ("q_weight", "k_weight", "cos_sin_cache", "positions")}
    qk_norm_rope_store_kv_(
        q, k, v, **shared, eps=1e-6, k_cache=fused["k_cache"], v_cache=fused["v_cache"],
        slot_mapping=fused["slot_mapping"], heads_per_program=heads_per_program,
        tokens_per_program=tokens_per_program[0],
    )  # fmt: skip
    q2, k2, v2 = _split(unfused["qkv"], num_q_heads, num_kv_heads)
    qk_norm_rope_(
        q2, k2, **shared, eps=1e-6, heads_per_program=heads_per_program, tokens_per_program=tokens_per_program[1]
    )
    store_kv(k2, v2, unfused["k_cache"], unfused["v_cache"], unfused["slot_mapping"])
    for name in ("qkv", "k_cache", "v_cache"):
        assert torch.equal(fused[name], unfused[name]), name


@pytest.mark.parametrize("dtype", CPU_DTYPES)
@kernel_settings(cpu_examples=15)
@given(
    num_tokens=st.integers(1, 9),
    num_padding=st.integers(0, 3),
    heads=st.sampled_from([(1, 1), (4, 2), (6, 3), (8, 1), (12, 4)]),
    head_dim=st.sampled_from([64, 128]),
    block_size=st.sampled_from([4, 16]),
    heads_per_program=st.sampled_from([1, 2, 4, 8]),
    tokens_per_program=st.tuples(*[st.sampled_from([None, 1, 2, 16])] * 2),
    with_norm=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
def test_fused_equals_norm_rope_then_store(
    dtype: torch.dtype,
    num_tokens: int,
    num_padding: int,
    heads: tuple[int, int],
    head_dim: int,
    block_size: int,
    heads_per_program: int,
    tokens_per_program: tuple[int | None, int | None],
    with_norm: bool,
    seed: int,
) -> None:
    _check(
        heads[0], heads[1], heads_per_program, tokens_per_program, num_tokens=num_tokens, head_dim=head_dim,
        block_size=block_size, num_padding=num_padding, dtype=dtype, seed=seed, with_norm=with_norm,
    )  # fmt: skip


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", GPU_DTYPES)
@pytest.mark.parametrize("heads_per_program", [2, 8, 32])
@pytest.mark.parametrize("tokens_per_program", [(1, 1), (4, 4)])
def test_fused_equals_norm_rope_then_store_large_gpu(
    dtype: torch.dtype, heads_per_program: int, tokens_per_program: tuple[int, int]
) -> None:
    _check(
        32, 8, heads_per_program, tokens_per_program, num_tokens=2049, head_dim=128, block_size=16, num_padding=7,
        dtype=dtype, seed=1, with_norm=True,
    )  # fmt: skip


def test_fused_rejects_bad_cache_arguments() -> None:
    case = _case(3, 4, 2, 64, 16, 0, torch.float32, 0, True)
    q, k, v = _split(case["qkv"], 4, 2)
    shared = {name: case[name] for name in ("q_weight", "k_weight", "cos_sin_cache", "positions")}
    with pytest.raises(ValueError, match="slot_mapping must have shape"):
        qk_norm_rope_store_kv_(
            q, k, v, **shared, eps=1e-6, k_cache=case["k_cache"], v_cache=case["v_cache"],
            slot_mapping=case["slot_mapping"][:2],
        )  # fmt: skip
    with pytest.raises(ValueError, match="v_cache must have shape"):
        qk_norm_rope_store_kv_(
            q, k, v, **shared, eps=1e-6, k_cache=case["k_cache"], v_cache=case["v_cache"][:1],
            slot_mapping=case["slot_mapping"],
        )  # fmt: skip
