"""Paged split-KV decode attention against a float64 torch reference."""

from __future__ import annotations

import math

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import given

from fast.kernels.decode_attention import decode_attention, decode_counters, reduces_in_last_program
from reports.bench.kernels.kernel_reference import reference_causal_attention
from tests.fast.kernels.reference import DEVICE, assert_close_scaled, build_paged_cache, poisoned_like
from tests.fast.kernels.strategies import CPU_DTYPES, kernel_settings, seeded_generator, sequence_length


def _run_case(
    seq_lens: list[int],
    num_kv_heads: int,
    group: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype,
    seed: int,
    split_size: int | None = None,
    block_n: int | None = None,
    extra_max_len: int = 0,
    query_len: int = 1,
) -> None:
    generator = seeded_generator(seed)
    # Extra table columns let max_seq_len run past the longest sequence (a graph captured for a
    # larger bound): the extra splits must contribute nothing.
    extra_columns = 1 + extra_max_len // block_size
    cache = build_paged_cache(
        seq_lens, block_size, num_kv_heads, head_dim, dtype, generator, spare_table_columns=extra_columns
    )
    num_q_heads = num_kv_heads * group
    q = torch.randn((len(seq_lens) * query_len, num_q_heads, head_dim), generator=generator).to(dtype).to(DEVICE)
    scale = 1.0 / math.sqrt(head_dim)
    out = poisoned_like(q)
    max_seq_len = max(seq_lens) + extra_max_len
    result = decode_attention(
        q,
        cache.k_cache,
        cache.v_cache,
        cache.block_tables,
        cache.seq_lens,
        scale,
        max_seq_len,
        split_size=split_size,
        block_n=block_n,
        out=out,
        query_len=query_len,
    )
    assert result is out
    expected = torch.cat(
        [
            reference_causal_attention(q[i * query_len : (i + 1) * query_len], k, v, scale)
            for i, (k, v) in enumerate(zip(cache.keys, cache.values, strict=True))
        ]
    )
    assert_close_scaled(out, expected, dtype, f"decode seq_lens={seq_lens} query_len={query_len}")


@st.composite
def _decode_cases(draw: st.DrawFn, max_blocks: int, block_sizes: list[int]) -> dict:
    block_size = draw(st.sampled_from(block_sizes))
    num_seqs = draw(st.integers(1, 3))
    return {
        "seq_lens": [draw(sequence_length(block_size, max_blocks)) for _ in range(num_seqs)],
        "block_size": block_size,
        "num_kv_heads": draw(st.sampled_from([1, 2])),
        "group": draw(st.sampled_from([1, 2, 4, 8])),
        "seed": draw(st.integers(0, 2**31 - 1)),
        "extra_max_len": draw(st.sampled_from([0, 0, 40])),
    }


@pytest.mark.parametrize("dtype", CPU_DTYPES)
@kernel_settings(cpu_examples=25)
@given(case=_decode_cases(max_blocks=5, block_sizes=[16, 32]), split_size=st.sampled_from([16, 32, 64, None]))
def test_decode_matches_reference_small(dtype: torch.dtype, case: dict, split_size: int | None) -> None:
    _run_case(head_dim=64, dtype=dtype, split_size=split_size, block_n=16, **case)


@pytest.mark.parametrize("split_size", [16, 32])
def test_a_split_shorter_than_the_default_tile_is_one_tile_of_its_keys(split_size: int) -> None:
    """Head size 128's default tile is 64 keys; a 16- or 32-key split (the engine's one-sequence splits) takes
    tiles of its own length instead of being refused, and the result still matches the reference: 100 keys over
    several splits, the last one partial, and a bound past them."""
    _run_case([100, 37], num_kv_heads=2, group=2, head_dim=128, block_size=16, dtype=torch.float32, seed=3,
              split_size=split_size, extra_max_len=40)  # fmt: skip


@st.composite
def _verify_cases(draw: st.DrawFn) -> dict:
    """Several queries per sequence (a verify step's chunks), at lengths where a split holds keys that only
    the later queries see: 33 keys at split size 16 -> split 2 holds key 32, seen by the last query alone."""
    query_len = draw(st.integers(2, 5))
    group = draw(st.sampled_from([g for g in (1, 2, 4) if query_len * g <= 32]))
    num_seqs = draw(st.integers(1, 3))
    return {
        "seq_lens": [draw(st.integers(query_len, 80)) for _ in range(num_seqs)],
        "block_size": 16,
        "num_kv_heads": draw(st.sampled_from([1, 2])),
        "group": group,
        "seed": draw(st.integers(0, 2**31 - 1)),
        "extra_max_len": draw(st.sampled_from([0, 40])),
        "query_len": query_len,
    }


@pytest.mark.parametrize("dtype", CPU_DTYPES)
@kernel_settings(cpu_examples=15)
@given(case=_verify_cases(), split_size=st.sampled_from([16, 32, None]))
def test_decode_of_several_queries_matches_reference(dtype: torch.dtype, case: dict, split_size: int | None) -> None:
    _run_case(head_dim=64, dtype=dtype, split_size=split_size, block_n=16, **case)


def test_decode_of_several_queries_refuses_a_tile_too_wide() -> None:
    cache = build_paged_cache([40], 16, 1, 64, torch.float32, seeded_generator(0))
    q = torch.zeros((9, 4, 64), device=DEVICE)  # 9 queries x a 4-head group: 36 rows
    with pytest.raises(ValueError, match="exceeds the decode tile"):
        decode_attention(q, cache.k_cache, cache.v_cache, cache.block_tables, cache.seq_lens, 0.125, 40, query_len=9)
    with pytest.raises(ValueError, match="whole number of sequences"):
        decode_attention(q, cache.k_cache, cache.v_cache, cache.block_tables, cache.seq_lens, 0.125, 40, query_len=2)


@pytest.mark.parametrize("dtype", CPU_DTYPES)
def test_decode_default_split_and_tile(dtype: torch.dtype) -> None:
    _run_case(seq_lens=[300, 1, 257], num_kv_heads=2, group=4, head_dim=64, block_size=16, dtype=dtype, seed=5)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@kernel_settings(cpu_examples=1, gpu_examples=5)
@given(case=_decode_cases(max_blocks=40, block_sizes=[16, 64, 256]))
def test_decode_matches_reference_gpu(dtype: torch.dtype, head_dim: int, case: dict) -> None:
    _run_case(head_dim=head_dim, dtype=dtype, **case)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("query_len", [2, 5])
def test_decode_of_several_queries_gpu(dtype: torch.dtype, query_len: int) -> None:
    """Verify steps at the qwen3-0.6b and 8B head shapes, at the engine's small-batch split size."""
    for group in (2, 4):
        _run_case(
            seq_lens=[707, query_len, 1300], num_kv_heads=8, group=group, head_dim=128, block_size=16, dtype=dtype,
            seed=3, split_size=128, extra_max_len=2048, query_len=query_len,
        )  # fmt: skip


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("block_size", [16, 256])
def test_decode_32k_context_gpu(dtype: torch.dtype, block_size: int) -> None:
    _run_case(
        seq_lens=[32768, 20001, 1],
        num_kv_heads=8,
        group=4,
        head_dim=128,
        block_size=block_size,
        dtype=dtype,
        seed=11,
    )


@pytest.mark.gpu
def test_decode_is_cuda_graph_capturable() -> None:
    """Capture once, change seq_lens and q in place, replay: the result follows the new values."""
    generator = seeded_generator(2)
    cache = build_paged_cache([700, 1500], 16, 2, 128, torch.bfloat16, generator)
    q = torch.randn((2, 8, 128), generator=generator).to(torch.bfloat16).to(DEVICE)
    out = torch.empty_like(q)
    seq_lens = cache.seq_lens.clone()
    args = (q, cache.k_cache, cache.v_cache, cache.block_tables, seq_lens, 0.088, 1500)
    decode_attention(*args, out=out)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        decode_attention(*args, out=out)
    seq_lens.copy_(torch.tensor([650, 1499], dtype=torch.int32))
    q.copy_(torch.randn(q.shape, generator=generator).to(torch.bfloat16))
    graph.replay()
    torch.cuda.synchronize()
    expected = torch.cat(
        [
            reference_causal_attention(q[i : i + 1], cache.keys[i][:n], cache.values[i][:n], 0.088)
            for i, n in enumerate([650, 1499])
        ]
    )
    assert_close_scaled(out, expected, torch.bfloat16, "decode graph replay")


# ----------------------------------------------------------------------------- validation


def _valid_args() -> dict:
    cache = build_paged_cache([5, 20], 16, 2, 64, torch.float32, seeded_generator(0))
    return {
        "q": torch.randn(2, 4, 64, device=DEVICE),
        "k_cache": cache.k_cache,
        "v_cache": cache.v_cache,
        "block_tables": cache.block_tables,
        "seq_lens": cache.seq_lens,
        "scale": 0.125,
        "max_seq_len": 20,
    }


@pytest.mark.parametrize(
    ("change", "error", "names"),
    [
        ({"q": torch.randn(2, 4, 64, dtype=torch.float16)}, TypeError, "k_cache"),
        ({"q": torch.randn(3, 4, 64)}, ValueError, "block_tables"),
        ({"q": torch.randn(2, 4, 64)[:, :, ::2]}, ValueError, "k_cache"),
        ({"seq_lens": torch.tensor([5, 20])}, TypeError, "seq_lens"),
        ({"block_tables": torch.zeros(2, 3, dtype=torch.int64)}, TypeError, "block_tables"),
        ({"max_seq_len": 10_000}, ValueError, "max_seq_len"),
        ({"max_seq_len": 0}, ValueError, "max_seq_len"),
        ({"split_size": 24}, ValueError, "split_size"),
        ({"split_size": 16, "block_n": 16, "grid_splits": 0}, ValueError, "grid_splits"),
        ({"split_size": 16, "block_n": 16, "grid_splits": 3}, ValueError, "grid_splits 3 exceeds the 2 splits"),
        ({"split_size": 16, "block_n": 16, "grid_splits": 1.0}, TypeError, "grid_splits"),
    ],
)
def test_decode_rejects_bad_arguments(change: dict, error: type[Exception], names: str) -> None:
    args = _valid_args()
    for key, value in change.items():
        args[key] = value.to(DEVICE) if isinstance(value, torch.Tensor) else value
    with pytest.raises(error, match=names):
        decode_attention(**args)


def test_decode_rejects_non_contiguous_cache() -> None:
    args = _valid_args()
    args["k_cache"] = args["k_cache"].transpose(2, 3).contiguous().transpose(2, 3)
    with pytest.raises(ValueError, match="k_cache must be contiguous"):
        decode_attention(**args)


def test_decode_rejects_tensors_on_different_devices() -> None:
    args = _valid_args()
    args["block_tables"] = torch.empty((2, 2), dtype=torch.int32, device="meta")
    with pytest.raises(ValueError, match="block_tables"):
        decode_attention(**args)


@pytest.mark.parametrize("dtype", CPU_DTYPES)
@pytest.mark.parametrize("head_dim", [16, 32])
def test_decode_small_head_dims(dtype: torch.dtype, head_dim: int) -> None:
    """Small models (the tiny test models among them) use head_dim 16 or 32."""
    _run_case(
        seq_lens=[40, 1, 17],
        num_kv_heads=2,
        group=2,
        head_dim=head_dim,
        block_size=16,
        dtype=dtype,
        seed=7,
        split_size=16,
        block_n=16,
    )


@pytest.mark.parametrize("dtype", CPU_DTYPES)
def test_decode_result_is_the_same_bits_for_every_grid_split_count(dtype: torch.dtype) -> None:
    """The split axis of the grid only decides which program computes which split (program p takes
    splits p, p + grid_splits, ...): every count from 1 to num_splits gives the same bits. Sequences of
    1, 2 and 5 splits of 16 keys in a grid made for 7 (max_seq_len 100). So does every max_seq_len bound
    at or above the longest sequence (the engine's decode context buckets, fast.attention): it sets only
    the split count, and the reduction reads only a sequence's own splits."""
    generator = seeded_generator(11)
    cache = build_paged_cache([70, 1, 33], 16, 2, 32, dtype, generator, spare_table_columns=3)
    q = torch.randn((3, 4, 32), generator=generator).to(dtype).to(DEVICE)
    args = (q, cache.k_cache, cache.v_cache, cache.block_tables, cache.seq_lens, 0.125, 100)
    results = [decode_attention(*args, split_size=16, block_n=16, grid_splits=g) for g in range(1, 8)]
    for grid_splits, result in enumerate(results[1:], start=2):
        assert torch.equal(result, results[0]), f"grid_splits={grid_splits}"
    assert torch.equal(decode_attention(*args, split_size=16, block_n=16), results[0]), "the default count"
    for bound in (70, 71, 128):  # the table holds 5 + 3 blocks of 16 keys
        bounded = decode_attention(*args[:-1], bound, split_size=16, block_n=16)
        assert torch.equal(bounded, results[0]), f"max_seq_len={bound}"


@pytest.mark.parametrize("dtype", CPU_DTYPES)
def test_one_split_writes_the_output_the_reduction_would(dtype: torch.dtype) -> None:
    """Where max_seq_len fits one split, the split kernel writes the output itself and no reduction runs
    (the reduction would weigh the split by exp2(0) = 1 and divide by 1): the same bits as with a larger
    bound, where a second split exists and the reduction runs over each sequence's one used split."""
    generator = seeded_generator(12)
    cache = build_paged_cache([40, 1, 64], 16, 2, 32, dtype, generator, spare_table_columns=4)
    q = torch.randn((3, 4, 32), generator=generator).to(dtype).to(DEVICE)
    args = (q, cache.k_cache, cache.v_cache, cache.block_tables, cache.seq_lens, 0.125)
    one_split = decode_attention(*args, 64, split_size=64, block_n=16)
    two_splits = decode_attention(*args, 128, split_size=64, block_n=16)
    assert torch.equal(one_split, two_splits)
    expected = torch.cat(
        [
            reference_causal_attention(q[i : i + 1], k, v, 0.125)
            for i, (k, v) in enumerate(zip(cache.keys, cache.values, strict=True))
        ]
    )
    assert_close_scaled(one_split, expected, dtype, "one split")


@pytest.mark.parametrize("dtype", CPU_DTYPES)
def test_the_last_split_program_reduces_to_the_reduction_kernels_bits(dtype: torch.dtype) -> None:
    """With counters, the last split program of each (sequence, KV head) runs the reduction for its group's heads
    (no reduction kernel): the same bits as the reduction kernel, for every grid split count (programs with one
    split and with several), sequences of 1 to 5 used splits, GQA groups of 1 and 4; the counters are left at 0
    after every call, so the next call (a graph replay) starts from them as this one did."""
    generator = seeded_generator(13)
    for group in (1, 4):
        cache = build_paged_cache([70, 1, 33, 17], 16, 2, 32, dtype, generator, spare_table_columns=3)
        q = torch.randn((4, 2 * group, 32), generator=generator).to(dtype).to(DEVICE)
        args = (q, cache.k_cache, cache.v_cache, cache.block_tables, cache.seq_lens, 0.125, 100)
        counters = decode_counters(4, 2, DEVICE)
        separate = decode_attention(*args, split_size=16, block_n=16)  # 7 splits: the reduction kernel
        for grid_splits in (1, 2, 3, 7):
            fused = decode_attention(*args, split_size=16, block_n=16, grid_splits=grid_splits, counters=counters)
            assert torch.equal(fused, separate), f"group={group} grid_splits={grid_splits}"
            assert not counters.any(), f"counters left {counters.tolist()}"


def test_the_last_program_reduces_only_decode_steps_of_few_splits() -> None:
    """reduces_in_last_program: one query per sequence and 2..16 splits (a verify step's rows and long contexts keep
    the reduction kernel; one split writes its output anyway)."""
    assert [reduces_in_last_program(n, 1) for n in (1, 2, 16, 17)] == [False, True, True, False]
    assert not reduces_in_last_program(8, 3)


def test_the_reduction_kernel_does_not_run_where_the_last_program_reduces(monkeypatch: pytest.MonkeyPatch) -> None:
    """With counters the split kernel's launch is the only one (the point: a launch a layer fewer); without them, or
    for a verify step, the reduction kernel runs as before."""
    import fast.kernels.decode_attention as module

    launches = []

    class Spy:
        def __getitem__(self, grid: tuple) -> object:
            launches.append(grid)
            return lambda *args, **kwargs: None

    monkeypatch.setattr(module, "_decode_reduce_kernel", Spy())
    cache = build_paged_cache([40, 20], 16, 2, 32, torch.float32, seeded_generator(14), spare_table_columns=4)
    q = torch.randn((2, 4, 32)).to(DEVICE)
    args = (q, cache.k_cache, cache.v_cache, cache.block_tables, cache.seq_lens, 0.125, 64)
    decode_attention(*args, split_size=16, block_n=16, counters=decode_counters(2, 2, DEVICE))
    assert launches == []
    decode_attention(*args, split_size=16, block_n=16)
    assert len(launches) == 1


def test_decode_rejects_bad_counters() -> None:
    cache = build_paged_cache([40, 20], 16, 2, 32, torch.float32, seeded_generator(15), spare_table_columns=4)
    q = torch.randn((2, 4, 32)).to(DEVICE)
    args = (q, cache.k_cache, cache.v_cache, cache.block_tables, cache.seq_lens, 0.125, 64)
    with pytest.raises(ValueError, match="at least 4 elements"):
        decode_attention(*args, split_size=16, block_n=16, counters=decode_counters(1, 2, DEVICE))
    with pytest.raises(TypeError, match="counters"):
        decode_attention(*args, split_size=16, block_n=16, counters=torch.zeros(4, dtype=torch.int64, device=DEVICE))


@pytest.mark.gpu
def test_the_last_program_reduces_in_cuda_graph_replays() -> None:
    """Captured once with counters and replayed 20 times with new seq_lens and q (up to 12 used splits of 16): every
    replay the same bits as an eager call with the counters (so they went back to 0 each time), and as close to a
    float64 reference as the reduction kernel's path (the same code; on a GPU the compiler may lay its tile out
    otherwise inside the split kernel, so equal bits are promised only in the interpreter), at bf16 and the
    engine's batch-1 shape."""
    generator = seeded_generator(16)
    # max_seq_len 2048 (the engine's first bucket) must fit the table: 94 blocks of the longest + 34 spare = 128.
    cache = build_paged_cache([300, 1500, 129], 16, 8, 128, torch.bfloat16, generator, spare_table_columns=34)
    q = torch.randn((3, 16, 128), generator=generator).to(torch.bfloat16).to(DEVICE)
    out = torch.empty_like(q)
    seq_lens = cache.seq_lens.clone()
    counters = decode_counters(3, 8, DEVICE)
    args = (q, cache.k_cache, cache.v_cache, cache.block_tables, seq_lens, 0.088, 2048)
    decode_attention(*args, out=out, split_size=128, counters=counters)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        decode_attention(*args, out=out, split_size=128, counters=counters)
    for step in range(20):
        lengths = [300 - step, 1500 - 37 * step, 129 - step]  # within the tokens the cache holds
        seq_lens.copy_(torch.tensor(lengths, dtype=torch.int32))
        q.copy_(torch.randn(q.shape, generator=generator).to(torch.bfloat16))
        graph.replay()
        assert torch.equal(out, decode_attention(*args, split_size=128, counters=counters)), f"replay {step}"
        expected = torch.cat(
            [
                reference_causal_attention(q[i : i + 1], cache.keys[i][:n], cache.values[i][:n], 0.088)
                for i, n in enumerate(lengths)
            ]
        )
        assert_close_scaled(out, expected, torch.bfloat16, f"replay {step}")
        assert_close_scaled(decode_attention(*args, split_size=128), expected, torch.bfloat16, f"kernel {step}")
    assert not counters.any()


def test_decode_grid_keeps_one_program_per_split_unless_the_grid_grows_large() -> None:
    """_grid_splits: one program per split (the loop-free kernel) while the grid stays within
    ONE_PROGRAM_PER_SPLIT_MAX_PER_SM programs per SM; past that, about GRID_PROGRAMS_PER_SM per SM."""
    from fast.kernels.decode_attention import _grid_splits

    # The wrapper counts 4 SMs on the CPU: at most 124 x 4 = 496 programs keep one per split; past that,
    # 8 x 4 = 32 programs in all. 2 sequences x 4 KV heads = 8 (sequence, KV head) pairs:
    cpu = torch.device("cpu")
    assert _grid_splits(2, 4, 62, cpu) == 62  # 8 x 62 = 496 programs: one per split
    assert _grid_splits(2, 4, 63, cpu) == 4  # 8 x 63 = 504: 32 / 8 = 4 programs per pair
    assert _grid_splits(2, 4, 3, cpu) == 3  # a small grid: one program per split
