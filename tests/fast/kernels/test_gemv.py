"""Small-batch linear (GEMV), its fused SiLU * up variant and its fused add + RMSNorm against torch references
and the unfused kernels.

CPU (Triton's interpreter, fp32 and fp16): small shapes with N not a multiple of BLOCK_N and K
not a multiple of BLOCK_K, strided rows, `out=`, bias, both tile paths (FMA and tl.dot). GPU (bf16):
the Qwen3-0.6B and Qwen3-8B projection shapes, determinism, and a CUDA-graph replay.
"""

from __future__ import annotations

import pytest
import torch

from fast.kernels.add_rmsnorm import add_rmsnorm
from fast.kernels.gemv import (
    MAX_GEMV_ROWS,
    gemv_config,
    gemv_counter,
    linear_add_rmsnorm,
    silu_mul_linear,
    small_batch_linear,
)
from fast.kernels.silu_and_mul import silu_and_mul
from tests.fast.kernels.reference import DEVICE, ON_GPU, assert_close_scaled, gpu_bf16_random, poisoned_like
from tests.fast.kernels.strategies import CPU_DTYPES, seeded_generator

# Tiles smaller than the shapes below, so several programs and several K steps run, with tails.
SMALL_TILES = {"block_n": 8, "block_k": 64}
N, K = 37, 200  # 37 = 4 x 8 + 5 output columns; 200 = 3 x 64 + 8 depth


def _random(shape: tuple[int, ...], dtype: torch.dtype, generator: torch.Generator) -> torch.Tensor:
    return torch.randn(shape, generator=generator).to(dtype).to(DEVICE)


def _strided_rows(rows: int, cols: int, dtype: torch.dtype, generator: torch.Generator, pad: int) -> torch.Tensor:
    """[rows, cols] view of a wider buffer (row stride cols + pad), the padding filled with NaN."""
    buffer = torch.full((rows, cols + pad), float("nan"), dtype=dtype, device=DEVICE)
    buffer[:, :cols] = _random((rows, cols), dtype, generator)
    return buffer[:, :cols]


def _reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    expected = x.double() @ weight.double().T
    return expected + bias.double() if bias is not None else expected


@pytest.mark.parametrize("dtype", CPU_DTYPES)
@pytest.mark.parametrize("rows", [1, 3, 16])
@pytest.mark.parametrize("use_dot", [False, True])
def test_matches_torch(dtype: torch.dtype, rows: int, use_dot: bool) -> None:
    generator = seeded_generator(rows)
    x = _strided_rows(rows, K, dtype, generator, pad=24)
    weight = _random((N, K), dtype, generator)
    bias = _random((N,), dtype, generator)
    out = poisoned_like(torch.empty((rows, N), dtype=dtype, device=DEVICE))
    result = small_batch_linear(x, weight, bias, out=out, use_dot=use_dot, **SMALL_TILES)
    assert result is out
    assert_close_scaled(out, _reference(x, weight, bias), dtype, f"gemv rows={rows} dot={use_dot}")
    no_bias = small_batch_linear(x, weight, use_dot=use_dot, **SMALL_TILES)
    assert no_bias.dtype == dtype and no_bias.shape == (rows, N)
    assert_close_scaled(no_bias, _reference(x, weight, None), dtype, f"gemv rows={rows} dot={use_dot}, no bias")


@pytest.mark.parametrize("dtype", CPU_DTYPES)
@pytest.mark.parametrize("rows", [1, 2, 5, 16])
def test_default_config(dtype: torch.dtype, rows: int) -> None:
    """The defaults (BLOCK_K larger than K here: one masked tile), strided output rows."""
    generator = seeded_generator(100 + rows)
    x = _random((rows, K), dtype, generator)
    weight = _random((N, K), dtype, generator)
    wide = torch.full((rows, N + 3), float("nan"), dtype=dtype, device=DEVICE)
    small_batch_linear(x, weight, out=wide[:, :N])
    assert_close_scaled(wide[:, :N], _reference(x, weight, None), dtype, f"gemv default rows={rows}")
    assert torch.isnan(wide[:, N:]).all(), "wrote past the output view"


def test_even_k_and_single_column() -> None:
    """K a multiple of BLOCK_K (the unmasked loop) and N = 1, both variants."""
    generator = seeded_generator(7)
    x = _random((4, 128), torch.float32, generator)
    gate_up = _random((4, 256), torch.float32, generator)
    for width in (1, 24):
        weight = _random((width, 128), torch.float32, generator)
        result = small_batch_linear(x, weight, block_n=16, block_k=32)
        assert_close_scaled(result, _reference(x, weight, None), torch.float32, f"even K, N={width}")
        for use_dot in (False, True):
            tiles = {"block_n": 16, "block_k": 32, "use_dot": use_dot}
            fused = silu_mul_linear(gate_up, weight, **tiles)
            assert torch.equal(fused, small_batch_linear(silu_and_mul(gate_up), weight, **tiles))


@pytest.mark.parametrize("dtype", CPU_DTYPES)
@pytest.mark.parametrize("rows", [1, 3, 16])
@pytest.mark.parametrize("use_dot", [False, True])
def test_silu_mul_matches_silu_and_mul_then_linear(dtype: torch.dtype, rows: int, use_dot: bool) -> None:
    generator = seeded_generator(200 + rows)
    gate_up = _strided_rows(rows, 2 * K, dtype, generator, pad=8)
    weight = _random((N, K), dtype, generator)
    bias = _random((N,), dtype, generator)
    activated = silu_and_mul(gate_up)
    out = poisoned_like(torch.empty((rows, N), dtype=dtype, device=DEVICE))
    result = silu_mul_linear(gate_up, weight, bias, out=out, use_dot=use_dot, **SMALL_TILES)
    assert result is out
    assert_close_scaled(out, _reference(activated, weight, bias), dtype, f"silu_mul rows={rows} dot={use_dot}")
    # The activation is rounded as silu_and_mul rounds it: same config, same bits.
    unfused = small_batch_linear(activated, weight, bias, use_dot=use_dot, **SMALL_TILES)
    assert torch.equal(out, unfused)


def _unfused_add_norm(x, weight, bias, residual, norm_weight, eps):
    return add_rmsnorm(small_batch_linear(x, weight, bias), residual, norm_weight, eps)


@pytest.mark.parametrize("dtype", CPU_DTYPES)
@pytest.mark.parametrize("rows", [1, 3, 16])
def test_linear_add_rmsnorm_is_the_linear_then_add_rmsnorm(dtype: torch.dtype, rows: int) -> None:
    """The last program's add + RMSNorm over the whole product rows: the same bits as small_batch_linear then
    add_rmsnorm in the interpreter (its reductions do not depend on warps), with and without a bias, several programs
    (N = 37 columns, the default tiles of 2 or 8 columns); the counter is left at 0 after every call. On a GPU the
    fused program's warps may sum the squares in another order than add_rmsnorm's launch (the H200 gave other last
    bits at fp32, 16 rows): within the dtype's rounding there, as the real-shape GPU test promises."""
    generator = seeded_generator(rows)
    weight, bias = _random((N, K), dtype, generator), _random((N,), dtype, generator)
    norm_weight = _random((N,), dtype, generator)
    counter = gemv_counter(DEVICE)
    for call in range(2):  # the second call starts from the counter the first left
        x, residual = _random((rows, K), dtype, generator), _random((rows, N), dtype, generator)
        for with_bias in (None, bias):
            normed, summed = linear_add_rmsnorm(x, weight, with_bias, residual, norm_weight, 1e-6, counter)
            expected_normed, expected_summed = _unfused_add_norm(x, weight, with_bias, residual, norm_weight, 1e-6)
            for got, expected, what in ((summed, expected_summed, "residual"), (normed, expected_normed, "normed")):
                if ON_GPU:
                    assert_close_scaled(got, expected.double(), dtype, f"call {call}: the {what} rows")
                else:
                    assert torch.equal(got, expected), f"call {call}: the {what} rows"
            assert counter.tolist() == [0]


def test_linear_add_rmsnorm_refuses_bad_input() -> None:
    generator = seeded_generator(5)
    x, weight = _random((2, K), torch.float32, generator), _random((N, K), torch.float32, generator)
    residual, norm_weight = _random((2, N), torch.float32, generator), _random((N,), torch.float32, generator)
    counter = gemv_counter(DEVICE)
    with pytest.raises(ValueError, match="residual must have shape"):
        linear_add_rmsnorm(x, weight, None, residual[:, :-1], norm_weight, 1e-6, counter)
    with pytest.raises(ValueError, match="norm_weight must have shape"):
        linear_add_rmsnorm(x, weight, None, residual, norm_weight[:-1], 1e-6, counter)
    with pytest.raises(TypeError, match="counter"):
        linear_add_rmsnorm(x, weight, None, residual, norm_weight, 1e-6, counter.long())
    with pytest.raises(ValueError, match="eps must be a positive float"):
        linear_add_rmsnorm(x, weight, None, residual, norm_weight, 0.0, counter)
    with pytest.raises(ValueError, match="contiguous"):
        linear_add_rmsnorm(x, weight, None, residual.T.contiguous().T, norm_weight, 1e-6, counter)


def test_empty_batch() -> None:
    weight = torch.zeros((N, K))
    assert small_batch_linear(torch.zeros((0, K)), weight).shape == (0, N)
    assert silu_mul_linear(torch.zeros((0, 2 * K)), weight).shape == (0, N)


def test_default_config_choices() -> None:
    for rows in range(1, MAX_GEMV_ROWS + 1):
        config = gemv_config(rows, 6144, 1024, torch.bfloat16)
        assert config.block_m >= rows and config.block_m & (config.block_m - 1) == 0
        assert config.block_k <= 1024
    assert gemv_config(1, 1024, 16, torch.float32).block_k == 16
    # One row through tensor cores (the largest weights): K tiles of at least 256 below 64 Mi elements
    # (the gemv_rank_share sweep), the whole 8B gate_up as measured before it.
    assert gemv_config(1, 12288, 4096, torch.bfloat16)[1:] == (64, 256, 4, 4, True)
    assert gemv_config(1, 24576, 4096, torch.bfloat16)[1:] == (64, 128, 4, 4, True)
    assert gemv_config(1, 4096, 12288, torch.bfloat16)[1:] == (32, 256, 4, 4, True)
    assert gemv_config(2, 12288, 4096, torch.bfloat16)[1:] == (64, 128, 4, 4, True)


def _bad_calls() -> list[tuple[str, type[Exception], object]]:
    x, weight = torch.zeros((2, 8)), torch.zeros((4, 8))
    return [
        ("too many rows", ValueError, lambda: small_batch_linear(torch.zeros((MAX_GEMV_ROWS + 1, 8)), weight)),
        ("x 1-D", ValueError, lambda: small_batch_linear(torch.zeros(8), weight)),
        ("weight 3-D", ValueError, lambda: small_batch_linear(x, torch.zeros((1, 4, 8)))),
        ("K mismatch", ValueError, lambda: small_batch_linear(x, torch.zeros((4, 9)))),
        ("dtype mismatch", TypeError, lambda: small_batch_linear(x, weight.half())),
        ("integer x", TypeError, lambda: small_batch_linear(x.int(), weight)),
        ("weight not contiguous", ValueError, lambda: small_batch_linear(x, torch.zeros((8, 4)).T)),
        ("x columns strided", ValueError, lambda: small_batch_linear(torch.zeros((8, 2)).T, torch.zeros((4, 2)))),
        ("bias shape", ValueError, lambda: small_batch_linear(x, weight, torch.zeros(5))),
        ("bias strided", ValueError, lambda: small_batch_linear(x, weight, torch.zeros(8)[::2])),
        ("out shape", ValueError, lambda: small_batch_linear(x, weight, out=torch.zeros((2, 5)))),
        ("out dtype", TypeError, lambda: small_batch_linear(x, weight, out=torch.zeros((2, 4), dtype=torch.float64))),
        ("block_n", ValueError, lambda: small_batch_linear(x, weight, block_n=6)),
        ("block_k", ValueError, lambda: small_batch_linear(x, weight, block_k=8)),
        ("num_warps", ValueError, lambda: small_batch_linear(x, weight, num_warps=3)),
        ("num_stages", ValueError, lambda: small_batch_linear(x, weight, num_stages=0)),
        ("x not a tensor", TypeError, lambda: small_batch_linear([[1.0]], weight)),
        ("gate_up odd", ValueError, lambda: silu_mul_linear(torch.zeros((2, 9)), weight)),
        ("gate_up half mismatch", ValueError, lambda: silu_mul_linear(torch.zeros((2, 8)), weight)),
        ("gate_up too many rows", ValueError, lambda: silu_mul_linear(torch.zeros((17, 16)), weight)),
    ]


@pytest.mark.parametrize("what, error, call", _bad_calls(), ids=[case[0] for case in _bad_calls()])
def test_bad_input(what: str, error: type[Exception], call) -> None:
    with pytest.raises(error):
        call()


# ----------------------------------------------------------------------------- GPU

# (N, K) of qkv, o_proj, gate_up, down: Qwen3-0.6B, then Qwen3-8B.
GPU_SHAPES = [(4096, 1024), (1024, 2048), (6144, 1024), (1024, 3072), (6144, 4096), (4096, 4096), (24576, 4096)]
GPU_SHAPES.append((4096, 12288))
DOWN_SHAPES = [(1024, 3072), (4096, 12288)]


@pytest.mark.gpu
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=[f"{n}x{k}" for n, k in GPU_SHAPES])
def test_real_shapes_bf16_gpu(shape: tuple[int, int]) -> None:
    n, k = shape
    generator = torch.Generator(device="cuda").manual_seed(n + k)
    weight = gpu_bf16_random((n, k), generator, 0.02)
    bias = gpu_bf16_random((n,), generator)
    for rows in (1, 2, 3, 8, 13, 16):
        x = gpu_bf16_random((rows, k), generator)
        expected = x.double() @ weight.double().T
        for use_dot in (None, False, True):
            result = small_batch_linear(x, weight, use_dot=use_dot)
            assert_close_scaled(result, expected, torch.bfloat16, f"{shape} rows={rows} dot={use_dot}")
        with_bias = small_batch_linear(x, weight, bias)
        assert_close_scaled(with_bias, expected + bias.double(), torch.bfloat16, f"{shape} rows={rows} bias")
        # Deterministic: the same call gives the same bits.
        assert torch.equal(small_batch_linear(x, weight, bias), with_bias)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", DOWN_SHAPES, ids=[f"{n}x{k}" for n, k in DOWN_SHAPES])
def test_silu_mul_real_shapes_bf16_gpu(shape: tuple[int, int]) -> None:
    n, k = shape
    generator = torch.Generator(device="cuda").manual_seed(n)
    weight = gpu_bf16_random((n, k), generator, 0.02)
    for rows in (1, 4, 11, 16):
        gate_up = gpu_bf16_random((rows, 2 * k), generator, 2.0)
        activated = silu_and_mul(gate_up)
        expected = activated.double() @ weight.double().T
        default = gemv_config(rows, n, k, torch.bfloat16, silu_mul=True)
        for use_dot in (default.use_dot, not default.use_dot):
            config = {"block_n": default.block_n, "block_k": default.block_k, "use_dot": use_dot}
            fused = silu_mul_linear(gate_up, weight, **config)
            assert_close_scaled(fused, expected, torch.bfloat16, f"silu_mul {shape} rows={rows} dot={use_dot}")
            # Same config, same bits as silu_and_mul then small_batch_linear.
            assert torch.equal(fused, small_batch_linear(activated, weight, **config))
        explicit = {name: value for name, value in default._asdict().items() if name != "block_m"}
        assert torch.equal(silu_mul_linear(gate_up, weight), silu_mul_linear(gate_up, weight, **explicit))
        baseline = torch.nn.functional.linear(activated, weight)
        assert_close_scaled(fused, baseline.double(), torch.bfloat16, f"silu_mul {shape} rows={rows} vs cuBLAS")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_other_dtypes_gpu(dtype: torch.dtype) -> None:
    generator = seeded_generator(3)
    weight = _random((3000, 1000), dtype, generator)  # no multiple of 16 anywhere
    for rows in (1, 7, 16):
        x = _strided_rows(rows, 1000, dtype, generator, pad=5)
        assert_close_scaled(small_batch_linear(x, weight), _reference(x, weight, None), dtype, f"{dtype} {rows}")


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(1024, 2048), (1024, 3072), (4096, 4096), (4096, 12288)])
def test_linear_add_rmsnorm_real_shapes_bf16_gpu(shape: tuple[int, int]) -> None:
    """The o_proj and down shapes of Qwen3-0.6B and -8B, 1 to 16 rows: the residual and the normalised rows within
    bf16's rounding of small_batch_linear then add_rmsnorm (the same code, but the compiler may order a reduction
    otherwise in the fused kernel, and this program's warps may sum the squares in another order than
    add_rmsnorm's launch: equal bits are promised in the interpreter only), and in 20 CUDA-graph replays with
    new inputs the same bits as eager calls; the counter left at 0."""
    n, k = shape
    generator = torch.Generator(device="cuda").manual_seed(n + k)
    weight, norm_weight = gpu_bf16_random((n, k), generator, 0.02), gpu_bf16_random((n,), generator)
    counter = gemv_counter(torch.device("cuda"))
    for rows in (1, 2, 5, 16):
        x, residual = gpu_bf16_random((rows, k), generator), gpu_bf16_random((rows, n), generator)
        normed, summed = linear_add_rmsnorm(x, weight, None, residual, norm_weight, 1e-6, counter)
        expected_normed, expected_summed = _unfused_add_norm(x, weight, None, residual, norm_weight, 1e-6)
        assert_close_scaled(summed, expected_summed.double(), torch.bfloat16, f"{shape} rows={rows}: residual")
        assert_close_scaled(normed, expected_normed.double(), torch.bfloat16, f"{shape} rows={rows}: normed")
    x, residual = gpu_bf16_random((1, k), generator), gpu_bf16_random((1, n), generator)
    linear_add_rmsnorm(x, weight, None, residual, norm_weight, 1e-6, counter)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = linear_add_rmsnorm(x, weight, None, residual, norm_weight, 1e-6, counter)
    for replay in range(20):
        x.copy_(gpu_bf16_random((1, k), generator))
        residual.copy_(gpu_bf16_random((1, n), generator))
        graph.replay()
        eager = linear_add_rmsnorm(x, weight, None, residual, norm_weight, 1e-6, counter)
        assert all(torch.equal(a, b) for a, b in zip(outputs, eager, strict=True)), f"replay {replay}"
    assert counter.tolist() == [0]


@pytest.mark.gpu
def test_cuda_graph_replay_gpu() -> None:
    """Captured once with out=; new values written into x in place are picked up on replay."""
    generator = torch.Generator(device="cuda").manual_seed(0)
    weight = gpu_bf16_random((4096, 1024), generator, 0.02)
    down = gpu_bf16_random((1024, 2048), generator, 0.02)
    x = gpu_bf16_random((4, 1024), generator)
    gate_up = gpu_bf16_random((4, 4096), generator)
    out = torch.empty((4, 4096), device="cuda", dtype=torch.bfloat16)
    down_out = torch.empty((4, 1024), device="cuda", dtype=torch.bfloat16)
    small_batch_linear(x, weight, out=out)  # compile outside the capture
    silu_mul_linear(gate_up, down, out=down_out)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        small_batch_linear(x, weight, out=out)
        silu_mul_linear(gate_up, down, out=down_out)
    for _ in range(2):
        x.copy_(gpu_bf16_random((4, 1024), generator))
        gate_up.copy_(gpu_bf16_random((4, 4096), generator))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, small_batch_linear(x, weight))
        assert torch.equal(down_out, silu_mul_linear(gate_up, down))
