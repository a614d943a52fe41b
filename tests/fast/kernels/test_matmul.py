"""Batch-invariant matmul: matches a float64 reference, and a row's result is bitwise the same
whatever the other rows are and however many there are, with the default tiles and with
overridden ones (row counts below, at and above BLOCK_M; N and K not multiples of the tiles), and
whichever launch path (fused or split-K) computes it."""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
import torch
import triton
from hypothesis import given

import fast.kernels.matmul as matmul_module
from fast.kernels.matmul import (
    DEFAULT_MULTIPROCESSORS,
    SPLIT_MAX_ROWS,
    invariant_linear,
    matmul_config,
    matmul_counters,
    matmul_tiles,
    num_chunks,
    takes_split_path,
)
from tests.fast.kernels.reference import DEVICE, assert_close_scaled
from tests.fast.kernels.strategies import CPU_DTYPES, kernel_settings, seeded_generator

# Overrides small enough for the interpreter to cross several tiles on tiny shapes. The second and
# third change only the program order (GROUP_M 0: row tiles fastest; 1: column tiles fastest); the
# last cuts K into chunks of 2 steps (at K=40: K 0..31, then one step masked past 40).
SMALL_CONFIGS = [
    {"block_m": 16, "block_n": 16, "block_k": 16, "group_m": 2},
    {"block_m": 32, "block_n": 16, "block_k": 32, "num_warps": 2, "num_stages": 2, "group_m": 0},
    {"block_m": 16, "block_n": 32, "block_k": 16, "group_m": 1},
    {"block_m": 16, "block_n": 16, "block_k": 16, "chunk_k": 32, "group_m": 2},
]
SMALL_CONFIG_IDS = ["m16n16k16g2", "m32n16k32g0", "m16n32k16g1", "m16n16k16c32g2"]
# Several reduction chunks on tiny shapes: the default 64-row tiles with 2-step chunks (K=72: 3
# chunks, the last a single step masked past 72), and 16-row tiles with 3-step chunks (a chunk
# need not be a power-of-two number of steps).
CHUNKED = {"block_k": 16, "chunk_k": 32}
CHUNKED_SMALL_TILES = {"block_m": 16, "block_n": 16, "block_k": 16, "chunk_k": 48, "group_m": 2}
QWEN3_06B_LAYERS = [(4096, 1024), (1024, 2048), (6144, 1024), (1024, 3072)]  # qkv, o_proj, gate_up, down


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
@pytest.mark.parametrize("config", SMALL_CONFIGS, ids=SMALL_CONFIG_IDS)
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
    for config in ({}, SMALL_CONFIGS[0], CHUNKED, CHUNKED_SMALL_TILES):
        alone = invariant_linear(needle, weight, **config)
        assert torch.equal(invariant_linear(batched, weight, **config)[position], alone[0]), config
    # The chunked ones split automatically at these sizes; the fused path gives the same row.
    for config in (CHUNKED, CHUNKED_SMALL_TILES):
        fused = invariant_linear(batched, weight, split=False, **config)[position]
        assert torch.equal(fused, invariant_linear(needle, weight, **config)[0]), config


def test_overrides_reach_the_kernel() -> None:
    """Another BLOCK_K changes the fp32 summation order, so some element differs (both stay close)."""
    generator = seeded_generator(3)
    x, weight = _random((8, 136), torch.float32, generator), _random((32, 136), torch.float32, generator)
    coarse = invariant_linear(x, weight, block_k=128)
    fine = invariant_linear(x, weight, block_k=16)
    assert not torch.equal(coarse, fine)
    for out in (coarse, fine):
        assert_close_scaled(out, _reference(x, weight, None), torch.float32, "matmul")


@pytest.mark.parametrize("dtype", CPU_DTYPES)
@pytest.mark.parametrize("depth", [96, 80, 72], ids=["K96even", "K80short-last-chunk", "K72masked"])
@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
def test_chunked_rows_are_bitwise_the_same_across_batches_and_paths(dtype: torch.dtype, depth: int, bias: bool) -> None:
    """With 3 chunks of 2 steps (K=96: full ones; K=80: the last one step short; K=72: that step
    masked too), every prefix and middle slice through the split path, the fused path and the
    automatic choice equals the same rows of the fused result over all 130 rows (3 row tiles of 64),
    bit for bit; both paths match the float64 reference. N=40 leaves a masked column tile."""
    generator = seeded_generator(6)
    x = _strided_rows(130, depth, dtype, generator)
    weight = _random((40, depth), dtype, generator)
    b = _random((40,), dtype, generator) if bias else None
    assert num_chunks(depth, matmul_config(40, depth, dtype, **CHUNKED)) == 3
    full = invariant_linear(x, weight, b, split=False, **CHUNKED)
    assert torch.equal(invariant_linear(x, weight, b, split=True, **CHUNKED), full)
    for split in (True, False, None):
        for start, stop in [(0, 1), (0, 3), (0, 64), (0, 65), (64, 65), (70, 73), (1, 130)]:
            part = invariant_linear(x[start:stop], weight, b, split=split, **CHUNKED)
            assert torch.equal(part, full[start:stop]), (start, stop, split)
    assert_close_scaled(full, _reference(x, weight, b), dtype, "matmul")


class _SumLaunches:
    """Counts the second kernel's launches (_sum_chunks_kernel[grid](...)) and runs them."""

    def __init__(self, kernel: object) -> None:
        self.kernel, self.count = kernel, 0

    def __getitem__(self, grid: tuple) -> object:
        self.count += 1
        return self.kernel[grid]


@pytest.mark.parametrize("dtype", CPU_DTYPES)
@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
def test_the_last_chunk_program_sums_to_the_same_bits(
    dtype: torch.dtype, bias: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With counters, the split path's tiles sum their 3 chunks in their last program: the same bits as the sum
    kernel for 1 to 130 rows (1 to 3 row tiles, a masked column tile), no sum kernel launched, the counters left
    at 0 for the next call; counters too few for the tiles leave the sum to the second kernel, same bits."""
    launches = _SumLaunches(matmul_module._sum_chunks_kernel)
    monkeypatch.setattr(matmul_module, "_sum_chunks_kernel", launches)
    generator = seeded_generator(9)
    x, weight = _strided_rows(130, 80, dtype, generator), _random((40, 80), dtype, generator)
    b = _random((40,), dtype, generator) if bias else None
    counters = matmul_counters(DEVICE)
    for rows in (1, 3, 64, 65, 130):
        expected = invariant_linear(x[:rows], weight, b, split=True, **CHUNKED)
        launches.count = 0
        summed_last = invariant_linear(x[:rows], weight, b, split=True, counters=counters, **CHUNKED)
        assert launches.count == 0, f"{rows} rows: the sum kernel ran"
        assert torch.equal(summed_last, expected), f"{rows} rows"
        assert not counters.any(), f"{rows} rows: counters left {counters.tolist()}"
    few = invariant_linear(x, weight, b, split=True, counters=counters[:2], **CHUNKED)  # 3 row tiles: 3 counters
    assert launches.count == 1 and torch.equal(few, invariant_linear(x, weight, b, split=True, **CHUNKED))


def test_bad_counters_are_named() -> None:
    generator = seeded_generator(10)
    x, weight = _random((2, 64), torch.float32, generator), _random((16, 64), torch.float32, generator)
    with pytest.raises(TypeError, match="counters"):
        invariant_linear(x, weight, counters=torch.zeros(4, dtype=torch.int64, device=DEVICE))
    with pytest.raises(ValueError, match="counters must be contiguous"):
        invariant_linear(x, weight, counters=torch.zeros(8, dtype=torch.int32, device=DEVICE)[::2])


def test_chunk_k_reaches_the_kernel() -> None:
    """Summing K in 2-step chunks (total + (step 1 + step 2)) is another fp32 summation order than
    one chunk over all of K ((total + step 1) + step 2): some element differs, on both paths (both
    stay close to the reference). 1-step chunks would not show it: total + (0 + step) is the
    un-chunked sum."""
    generator = seeded_generator(7)
    x, weight = _random((8, 136), torch.float32, generator), _random((32, 136), torch.float32, generator)
    for split in (True, False):
        chunked = invariant_linear(x, weight, block_k=16, chunk_k=32, split=split)
        whole = invariant_linear(x, weight, block_k=16, chunk_k=144, split=split)
        assert not torch.equal(chunked, whole), split
        for out in (chunked, whole):
            assert_close_scaled(out, _reference(x, weight, None), torch.float32, "matmul")


def test_split_argument_picks_the_launch_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """split=True runs the split kernels, split=False the fused one; None splits a small batch of a
    weight with several chunks, never one with a single chunk."""
    launched: list[str] = []
    for name in ("_launch_split", "_launch_fused"):
        original = getattr(matmul_module, name)
        monkeypatch.setattr(
            matmul_module, name, lambda *args, name=name, original=original: (launched.append(name), original(*args))
        )
    generator = seeded_generator(8)
    x, weight = _random((3, 64), torch.float32, generator), _random((16, 64), torch.float32, generator)
    for split, chunk_k, expected in [
        (True, 16, "_launch_split"),
        (True, 64, "_launch_split"),  # one chunk: forced anyway
        (False, 16, "_launch_fused"),
        (None, 16, "_launch_split"),
        (None, 64, "_launch_fused"),  # one chunk: nothing to split
    ]:
        launched.clear()
        invariant_linear(x, weight, block_k=16, chunk_k=chunk_k, split=split)
        assert launched == [expected], (split, chunk_k)


def test_automatic_path_splits_small_batches_only() -> None:
    """The automatic choice at the Qwen3-0.6B layers (bf16 defaults, an H200's 132 SMs off the GPU):
    a batch-1 decode splits (16 to 48 fused programs), a 2048-row prefill chunk does not, a 256-row decode step
    does not (its fused grids leave SMs idle, but the split path's fp32 parts cost more there), and the threshold
    is the smaller of SPLIT_MAX_ROWS and the last row count whose fused grid is smaller than the SM count."""
    cpu = torch.device("cpu")
    for n, k in QWEN3_06B_LAYERS:
        config = matmul_tiles(n, k, torch.bfloat16)
        assert num_chunks(k, config) == k // config.chunk_k > 1
        assert takes_split_path(1, n, k, config, cpu, None)
        assert not takes_split_path(2048, n, k, config, cpu, None)
        assert takes_split_path(2048, n, k, config, cpu, True) and not takes_split_path(1, n, k, config, cpu, False)
        tiles_n = triton.cdiv(n, config.block_n)
        last_split_rows = min((triton.cdiv(DEFAULT_MULTIPROCESSORS, tiles_n) - 1) * config.block_m, SPLIT_MAX_ROWS)
        assert not takes_split_path(256, n, k, config, cpu, None)
        assert takes_split_path(last_split_rows, n, k, config, cpu, None)
        assert not takes_split_path(last_split_rows + 1, n, k, config, cpu, None)


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


def test_default_chunk_is_four_steps_capped_by_the_depth() -> None:
    """CHUNK_K = 4 x BLOCK_K (256 and 512 in bf16 at the Qwen3-0.6B shapes, halved in fp32 with
    BLOCK_K), one chunk for a weight shallower than that; an overridden BLOCK_K brings its own
    default chunk, and chunk_k overrides it."""
    assert [matmul_tiles(n, k, torch.bfloat16).chunk_k for n, k in QWEN3_06B_LAYERS] == [256, 512, 256, 512]
    for n, k in QWEN3_06B_LAYERS:
        for dtype in (torch.bfloat16, torch.float16, torch.float32):
            config = matmul_tiles(n, k, dtype)
            assert config.chunk_k == 4 * config.block_k
        assert matmul_tiles(n, k, torch.float32).chunk_k * 2 == matmul_tiles(n, k, torch.bfloat16).chunk_k
    assert matmul_tiles(20, 24, torch.float16).chunk_k == 32  # one 32-wide step
    assert matmul_tiles(1024, 200, torch.bfloat16).chunk_k == 256  # 2 steps of 128: one chunk
    assert num_chunks(0, matmul_tiles(16, 0, torch.float32)) == 1  # K = 0: one empty chunk
    assert matmul_config(4096, 1024, torch.bfloat16, block_k=16).chunk_k == 64
    assert matmul_config(4096, 1024, torch.bfloat16, chunk_k=128).chunk_k == 128
    assert matmul_config(4096, 1024, torch.bfloat16, block_k=32, chunk_k=96).chunk_k == 96


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
        ({"chunk_k": 24}, r"chunk_k must be a positive multiple of block_k \(16\), got 24"),
        ({"chunk_k": 0}, r"chunk_k must be a positive multiple of block_k \(16\), got 0"),
        ({"chunk_k": -16}, r"chunk_k must be a positive multiple of block_k \(16\), got -16"),
        ({"block_k": 32, "chunk_k": 48}, r"chunk_k must be a positive multiple of block_k \(32\), got 48"),
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
    with pytest.raises(TypeError, match="chunk_k must be a Python int"):
        invariant_linear(x, weight, chunk_k=32.0)
    with pytest.raises(TypeError, match="split must be True, False or None"):
        invariant_linear(x, weight, split=1)
    with pytest.raises(TypeError, match="split must be True, False or None"):  # also for an empty batch
        invariant_linear(x[:0], weight, split="yes")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("shape", [(4096, 1024), (1024, 3072), (6144, 1024), (151936, 1024)])
def test_a_row_is_bitwise_the_same_in_any_batch_gpu(dtype: torch.dtype, shape: tuple[int, int]) -> None:
    generator = seeded_generator(0)
    weight = _random(shape, dtype, generator)
    needle = _random((1, shape[1]), dtype, generator)
    alone = invariant_linear(needle, weight)
    assert torch.equal(invariant_linear(needle, weight, split=True), alone)
    assert torch.equal(invariant_linear(needle, weight, split=False), alone)
    for batch in (1, 3, 17, 64, 255, 2048):
        others = _random((batch, shape[1]), dtype, generator)
        batched = torch.cat([others[: batch // 2], needle, others[batch // 2 :]])
        assert torch.equal(invariant_linear(batched, weight)[batch // 2], alone[0]), batch
    expected = needle.double() @ weight.double().T
    assert_close_scaled(alone, expected, dtype, "matmul")


@pytest.mark.gpu
@pytest.mark.parametrize("shape", QWEN3_06B_LAYERS)
@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
def test_split_and_fused_paths_are_bitwise_the_same_gpu(shape: tuple[int, int], bias: bool) -> None:
    """bf16 at the Qwen3-0.6B layer shapes (default tiles, 2 to 6 chunks): every prefix through the
    split path, the fused path and the automatic choice equals the fused result over 2048 rows, bit
    for bit, and so does a row from the middle alone."""
    generator = seeded_generator(9)
    n, k = shape
    x, weight = _random((2048, k), torch.bfloat16, generator), _random(shape, torch.bfloat16, generator)
    b = _random((n,), torch.bfloat16, generator) if bias else None
    assert num_chunks(k, matmul_tiles(n, k, torch.bfloat16)) > 1
    full = invariant_linear(x, weight, b, split=False)
    for m in (1, 7, 64, 256, 2048):
        for split in (True, False, None):
            assert torch.equal(invariant_linear(x[:m], weight, b, split=split), full[:m]), (m, split)
    for split in (True, False):
        assert torch.equal(invariant_linear(x[1000:1001], weight, b, split=split), full[1000:1001]), split
    assert_close_scaled(full[:256], _reference(x[:256], weight, b), torch.bfloat16, "matmul")
    # The split path summing in its tiles' last programs (the engine's batch-invariant decode): the same bits.
    counters = matmul_counters(x.device)
    for m in (1, 7, 64, 256):
        summed_last = invariant_linear(x[:m], weight, b, split=True, counters=counters)
        assert torch.equal(summed_last, full[:m]), (m, "counters")
    assert not counters.any()


@pytest.mark.gpu
def test_the_last_chunk_program_sums_in_cuda_graph_replays_gpu() -> None:
    """The Qwen3-0.6B down projection at batch 1 captured once with counters and replayed 20 times with new
    rows: each replay the fused path's bits (the counters back at 0 each time)."""
    generator = seeded_generator(11)
    weight = _random((1024, 3072), torch.bfloat16, generator)
    x = _random((1, 3072), torch.bfloat16, generator)
    out = torch.empty((1, 1024), dtype=torch.bfloat16, device=x.device)
    counters = matmul_counters(x.device)
    invariant_linear(x, weight, out=out, split=True, counters=counters)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        invariant_linear(x, weight, out=out, split=True, counters=counters)
    for replay in range(20):
        x.copy_(_random((1, 3072), torch.bfloat16, generator))
        graph.replay()
        assert torch.equal(out, invariant_linear(x, weight, split=False)), f"replay {replay}"
    assert not counters.any()


@pytest.mark.gpu
@pytest.mark.parametrize(
    "config", [{}, {"block_m": 128, "block_n": 128, "num_warps": 8, "num_stages": 3}, {"split": True}]
)
def test_prefixes_are_bitwise_the_same_gpu(config: dict) -> None:
    """bf16 at the Qwen3-0.6B gate_up shape: every prefix up to 4096 rows, and middle slices."""
    generator = seeded_generator(5)
    x, weight = _random((4096, 1024), torch.bfloat16, generator), _random((6144, 1024), torch.bfloat16, generator)
    _assert_rows_invariant(x, weight, None, [1, 3, 16, 64, 255, 256, 1000, 4096], config)
