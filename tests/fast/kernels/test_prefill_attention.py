"""Paged causal prefill attention against a float64 torch reference."""

from __future__ import annotations

import math

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import given

from fast.attention import INVARIANT_BLOCK_M, INVARIANT_BLOCK_N
from fast.kernels.prefill_attention import prefill_attention
from reports.bench.kernels.kernel_reference import reference_causal_attention
from tests.fast.kernels.reference import DEVICE, assert_close_scaled, build_paged_cache, poisoned_like
from tests.fast.kernels.strategies import CPU_DTYPES, kernel_settings, seeded_generator, sequence_length


def _run_case(
    seq_lens: list[int],
    q_lens: list[int],
    num_kv_heads: int,
    group: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype,
    seed: int,
    block_m: int | None = None,
    block_n: int | None = None,
    always_mask: bool = False,
    pack_gqa: bool = False,
) -> None:
    generator = seeded_generator(seed)
    cache = build_paged_cache(seq_lens, block_size, num_kv_heads, head_dim, dtype, generator)
    num_q_heads = num_kv_heads * group
    queries = [torch.randn((n, num_q_heads, head_dim), generator=generator).to(dtype).to(DEVICE) for n in q_lens]
    q = torch.cat(queries)
    cu_seqlens_q = torch.tensor([0] + list(torch.tensor(q_lens).cumsum(0)), dtype=torch.int32, device=DEVICE)
    scale = 1.0 / math.sqrt(head_dim)
    out = poisoned_like(q)
    result = prefill_attention(
        q,
        cu_seqlens_q,
        cache.seq_lens,
        cache.block_tables,
        cache.k_cache,
        cache.v_cache,
        scale,
        max(q_lens),
        block_m=block_m,
        block_n=block_n,
        out=out,
        always_mask=always_mask,
        pack_gqa=pack_gqa,
    )
    assert result is out
    expected = torch.cat(
        [
            reference_causal_attention(qs, k, v, scale)
            for qs, k, v in zip(queries, cache.keys, cache.values, strict=True)
        ]
    )
    assert_close_scaled(out, expected, dtype, f"prefill seq_lens={seq_lens} q_lens={q_lens}")


@st.composite
def _prefill_cases(draw: st.DrawFn, max_blocks: int, block_sizes: list[int]) -> dict:
    block_size = draw(st.sampled_from(block_sizes))
    num_seqs = draw(st.integers(1, 3))
    seq_lens = [draw(sequence_length(block_size, max_blocks)) for _ in range(num_seqs)]
    q_lens = []
    for seq_len in seq_lens:
        # Whole sequence new (empty cached prefix), prefix cached up to the last token, or a chunk.
        q_lens.append(draw(st.one_of(st.just(seq_len), st.just(1), st.integers(1, seq_len))))
    return {
        "seq_lens": seq_lens,
        "q_lens": q_lens,
        "block_size": block_size,
        "num_kv_heads": draw(st.sampled_from([1, 2])),
        "group": draw(st.sampled_from([1, 2, 4, 8])),
        "seed": draw(st.integers(0, 2**31 - 1)),
    }


@pytest.mark.parametrize("dtype", CPU_DTYPES)
@kernel_settings(cpu_examples=15)
@given(case=_prefill_cases(max_blocks=4, block_sizes=[16, 32]), tiles=st.sampled_from([(16, 16), (32, 16), (16, 32)]))
def test_prefill_matches_reference_small(dtype: torch.dtype, case: dict, tiles: tuple[int, int]) -> None:
    _run_case(head_dim=64, dtype=dtype, block_m=tiles[0], block_n=tiles[1], **case)


@pytest.mark.parametrize("dtype", CPU_DTYPES)
def test_prefill_default_tiles_mixed_batch(dtype: torch.dtype) -> None:
    """Default tile sizes, a batch mixing a fresh prefill, a chunk and a single decode-like query."""
    _run_case(
        seq_lens=[70, 33, 16],
        q_lens=[70, 9, 1],
        num_kv_heads=2,
        group=2,
        head_dim=64,
        block_size=16,
        dtype=dtype,
        seed=1,
    )


@pytest.mark.parametrize("dtype", CPU_DTYPES)
def test_prefill_unmasked_tiles_stop_at_first_rows_diagonal(dtype: torch.dtype) -> None:
    """context 14, block_m 16, block_n 16: query block 1 starts at position 30, so key tile 16..31
    crosses its diagonal (key 31 is invisible to position 30) and must take the masked path."""
    _run_case(
        seq_lens=[34],
        q_lens=[20],
        num_kv_heads=1,
        group=2,
        head_dim=64,
        block_size=16,
        dtype=dtype,
        seed=3,
        block_m=16,
        block_n=16,
    )


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@kernel_settings(cpu_examples=1, gpu_examples=5)
@given(case=_prefill_cases(max_blocks=12, block_sizes=[16, 64, 256]))
def test_prefill_matches_reference_gpu(dtype: torch.dtype, head_dim: int, case: dict) -> None:
    _run_case(head_dim=head_dim, dtype=dtype, **case)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_prefill_long_prompt_and_long_context_single_query_gpu(dtype: torch.dtype) -> None:
    _run_case(
        seq_lens=[4096, 3000, 2049],
        q_lens=[4096, 1, 700],
        num_kv_heads=8,
        group=4,
        head_dim=128,
        block_size=16,
        dtype=dtype,
        seed=7,
    )


# ----------------------------------------------------------------------------- validation


def _valid_args() -> dict:
    cache = build_paged_cache([5], 16, 2, 64, torch.float32, seeded_generator(0))
    return {
        "q": torch.randn(5, 4, 64, device=DEVICE),
        "cu_seqlens_q": torch.tensor([0, 5], dtype=torch.int32, device=DEVICE),
        "seq_lens": cache.seq_lens,
        "block_tables": cache.block_tables,
        "k_cache": cache.k_cache,
        "v_cache": cache.v_cache,
        "scale": 0.125,
        "max_seqlen_q": 5,
    }


@pytest.mark.parametrize(
    ("change", "error", "names"),
    [
        ({"q": torch.randn(5, 4, 64, dtype=torch.float64)}, TypeError, "q"),
        ({"q": torch.randn(5, 4, 48)}, ValueError, "k_cache"),
        ({"q": torch.randn(5, 3, 64)}, ValueError, "num_q_heads"),
        ({"cu_seqlens_q": torch.tensor([0, 5], dtype=torch.int64)}, TypeError, "cu_seqlens_q"),
        ({"cu_seqlens_q": torch.tensor([0, 2, 5], dtype=torch.int32)}, ValueError, "cu_seqlens_q"),
        ({"block_tables": torch.zeros(2, 2, dtype=torch.int32)}, ValueError, "block_tables"),
        ({"max_seqlen_q": torch.tensor(5)}, TypeError, "max_seqlen_q"),
        ({"scale": 1}, TypeError, "scale"),
    ],
)
def test_prefill_rejects_bad_arguments(change: dict, error: type[Exception], names: str) -> None:
    args = _valid_args()
    for key, value in change.items():
        args[key] = value.to(DEVICE) if isinstance(value, torch.Tensor) and key != "max_seqlen_q" else value
    with pytest.raises(error, match=names):
        prefill_attention(**args)


def test_prefill_rejects_k_cache_of_other_dtype() -> None:
    args = _valid_args()
    args["k_cache"] = args["k_cache"].half()
    args["v_cache"] = args["v_cache"].half()
    with pytest.raises(TypeError, match="k_cache"):
        prefill_attention(**args)


def test_prefill_rejects_tensors_on_different_devices() -> None:
    args = _valid_args()
    args["seq_lens"] = torch.empty(1, dtype=torch.int32, device="meta")
    with pytest.raises(ValueError, match="seq_lens"):
        prefill_attention(**args)


@pytest.mark.parametrize("dtype", CPU_DTYPES)
@pytest.mark.parametrize("head_dim", [16, 32])
def test_prefill_small_head_dims(dtype: torch.dtype, head_dim: int) -> None:
    """Small models (the tiny test models among them) use head_dim 16 or 32."""
    _run_case(
        seq_lens=[40, 17],
        q_lens=[40, 5],
        num_kv_heads=2,
        group=2,
        head_dim=head_dim,
        block_size=16,
        dtype=dtype,
        seed=4,
    )


@pytest.mark.parametrize("dtype", CPU_DTYPES)
def test_prefill_always_mask_matches_reference(dtype: torch.dtype) -> None:
    """The batch-invariant variant (every tile masked) computes the same attention."""
    _run_case(
        seq_lens=[70, 33],
        q_lens=[70, 9],
        num_kv_heads=2,
        group=2,
        head_dim=64,
        block_size=16,
        dtype=dtype,
        seed=2,
        always_mask=True,
    )


@pytest.mark.parametrize("dtype", CPU_DTYPES)
@pytest.mark.parametrize("group", [1, 2, 3])
@pytest.mark.parametrize("always_mask", [True, False], ids=["invariant-mode", "default-decode"])
def test_packed_gqa_rows_match_reference(dtype: torch.dtype, group: int, always_mask: bool) -> None:
    """Packed rows ((token, head) pairs of one KV head), as batch-invariant mode runs them (always masked)
    and as the default mode's decode steps of many sequences do (unmasked tiles before the diagonal):
    decode-like and prefill-like sequences in one call, a group of 3 leaving a lane of the 16 idle."""
    _run_case(
        seq_lens=[70, 33, 5], q_lens=[70, 1, 5], num_kv_heads=2, group=group, head_dim=32, block_size=16,
        dtype=dtype, seed=3, block_m=16, block_n=16, always_mask=always_mask, pack_gqa=True,
    )  # fmt: skip


def test_packed_gqa_refuses_a_group_wider_than_the_tile() -> None:
    cache = build_paged_cache([4], 16, 1, 16, torch.float32, seeded_generator(0))
    q = torch.zeros((4, 32, 16), device=DEVICE)
    cu = torch.tensor([0, 4], dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match="GQA group size"):
        prefill_attention(
            q, cu, cache.seq_lens, cache.block_tables, cache.k_cache, cache.v_cache, 0.25, 4, block_m=16, pack_gqa=True
        )


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("packed", [False, True], ids=["default-tiles", "invariant-mode-tiles"])
def test_a_query_row_is_bitwise_the_same_however_its_prompt_is_chunked_gpu(dtype: torch.dtype, packed: bool) -> None:
    """always_mask: the last query of a sequence gives the same bits computed alone (a decode) or as the
    last row of a chunk that starts anywhere (the tiles it visits unmasked would otherwise depend on that).
    With batch-invariant mode's packed GQA tiles too, where the chunk decides the row's lane in its tile."""
    tiles = dict(pack_gqa=True, block_m=INVARIANT_BLOCK_M, block_n=INVARIANT_BLOCK_N) if packed else {}
    generator = seeded_generator(9)
    seq_len, num_kv_heads, group, head_dim = 700, 2, 4, 128
    cache = build_paged_cache([seq_len], 16, num_kv_heads, head_dim, dtype, generator)
    q_all = torch.randn((seq_len, num_kv_heads * group, head_dim), generator=generator).to(dtype).to(DEVICE)
    results = []
    for q_len in (1, 7, 64, 300, seq_len):
        q = q_all[seq_len - q_len :].contiguous()
        cu = torch.tensor([0, q_len], dtype=torch.int32, device=DEVICE)
        out = prefill_attention(
            q,
            cu,
            cache.seq_lens,
            cache.block_tables,
            cache.k_cache,
            cache.v_cache,
            head_dim**-0.5,
            q_len,
            always_mask=True,
            **tiles,
        )
        results.append(out[-1])
    assert all(torch.equal(result, results[0]) for result in results[1:])
