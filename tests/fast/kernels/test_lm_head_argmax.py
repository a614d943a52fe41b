"""The LM head with the greedy argmax in its epilogue (fast.kernels.lm_head_argmax) against torch.

CPU (Triton's interpreter, fp32 and fp16): small shapes with N not a multiple of BLOCK_N, several programs and
several chunks of partials in the last program's reduction, M = 1, 2, 3, 16; logits against an fp64 product
within tolerance, and (max, argmax) EXACTLY equal to torch.max over the kernel's own logits, with ties across
programs (the first wins), NaN (the first NaN wins, before any +inf), +inf, and rows of -inf planted through
the weight. GPU (bf16): the Qwen3-0.6B and -8B vocabulary heads, under PDL and in CUDA-graph replays.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from fast.kernels.lm_head_argmax import LmHeadResult, lm_head_argmax, lm_head_programs, lm_head_workspace
from fast.kernels.pdl import pdl_unsupported
from tests.fast.kernels.reference import DEVICE, assert_close_scaled, gpu_bf16_random, poisoned_like
from tests.fast.kernels.strategies import CPU_DTYPES, seeded_generator

# Narrow tiles and chunks: 19 programs of 2 columns for N = 37, their partials reduced 4 at a time (5 chunks).
SMALL_TILES = {"block_n": 2, "block_k": 64, "block_programs": 4}
N, K = 37, 201  # 37 = 18 x 2 + 1 columns; 201 = 3 x 64 + 9 depth


def _positive_x(rows: int, dtype: torch.dtype, generator: torch.Generator) -> torch.Tensor:
    """Rows of positive values, so that a weight row of ones gives each row's largest logit, and inf * x is inf."""
    return (torch.rand((rows, K), generator=generator) + 0.5).to(dtype).to(DEVICE)


def _weight(dtype: torch.dtype, generator: torch.Generator) -> torch.Tensor:
    return (torch.randn((N, K), generator=generator) * 0.1).to(dtype).to(DEVICE)


def _check_exact_max(result: LmHeadResult, what: str) -> None:
    """(max, argmax) bit for bit torch.max over the logits the kernel stored."""
    expected_max, expected_index = torch.max(result.logits, dim=-1)
    assert torch.equal(result.row_argmax, expected_index), f"{what}: argmax {result.row_argmax} != {expected_index}"
    assert torch.equal(result.row_max, expected_max) or (
        torch.equal(result.row_max.isnan(), expected_max.isnan())
        and torch.equal(result.row_max.nan_to_num(), expected_max.nan_to_num())
    ), f"{what}: max {result.row_max} != {expected_max}"


@pytest.mark.parametrize("dtype", CPU_DTYPES)
@pytest.mark.parametrize("rows", [1, 2, 3, 16])
@pytest.mark.parametrize("use_dot", [False, True])
def test_matches_torch(dtype: torch.dtype, rows: int, use_dot: bool) -> None:
    generator = seeded_generator(rows + 10 * use_dot)
    buffer = torch.full((rows, K + 7), float("nan"), dtype=dtype, device=DEVICE)  # strided rows, NaN padding
    x = buffer[:, :K]
    x.copy_(torch.randn((rows, K), generator=generator).to(dtype))
    weight = _weight(dtype, generator)
    logits = poisoned_like(torch.empty((rows, N), dtype=torch.float32, device=DEVICE))
    result = lm_head_argmax(x, weight, logits_out=logits, use_dot=use_dot, **SMALL_TILES)
    assert result.logits is logits and result.logits.dtype == torch.float32
    assert result.row_max.shape == (rows,) and result.row_argmax.dtype == torch.int64
    what = f"{dtype} rows={rows} dot={use_dot}"
    assert_close_scaled(logits, x.double() @ weight.double().T, dtype, what)
    _check_exact_max(result, what)


@pytest.mark.parametrize("dtype", CPU_DTYPES)
@pytest.mark.parametrize("rows", [1, 3])
def test_default_config(dtype: torch.dtype, rows: int) -> None:
    """gemv_config's tiles (one program's BLOCK_K wider than K) and the default chunk of partials."""
    generator = seeded_generator(50 + rows)
    x = torch.randn((rows, K), generator=generator).to(dtype).to(DEVICE)
    weight = _weight(dtype, generator)
    result = lm_head_argmax(x, weight)
    assert_close_scaled(result.logits, x.double() @ weight.double().T, dtype, f"default rows={rows}")
    _check_exact_max(result, f"default rows={rows}")


# Each plants weight rows (every x row is positive, so a weight row's sign and specials decide its logits), and
# gives the expected (index, kind of max) of every row: ties, NaN, +inf, -inf.
def _tie(weight: torch.Tensor) -> tuple[int, str]:
    weight[30] = 1.0  # program 15, chunk 3
    weight[5] = 1.0  # program 2, chunk 0: the first of the tie
    weight[6] = 1.0  # the same program: the first in it
    return 5, "finite"


def _tie_in_one_chunk(weight: torch.Tensor) -> tuple[int, str]:
    weight[17] = 1.0  # programs 8 and 9, both in chunk 2
    weight[19] = 1.0
    return 17, "finite"


def _nan(weight: torch.Tensor) -> tuple[int, str]:
    weight[2, 0] = float("inf")  # +inf before the NaN: the NaN still wins
    weight[33, 3] = float("nan")
    weight[10, 0] = float("nan")
    weight[9, 100] = float("nan")  # the first NaN: program 4's second column
    weight[20] = 1.0
    return 9, "nan"


def _positive_inf(weight: torch.Tensor) -> tuple[int, str]:
    weight[36, 0] = float("inf")  # the last program, a single column
    weight[12, 5] = float("inf")
    weight[1] = 1.0
    return 12, "+inf"


def _negative_inf(weight: torch.Tensor) -> tuple[int, str]:
    weight.zero_()
    weight[:, 0] = float("-inf")  # every logit -inf
    return 0, "-inf"


def _some_negative_inf(weight: torch.Tensor) -> tuple[int, str]:
    weight[:20, 7] = float("-inf")  # the first 20 columns -inf; the max among the others
    weight[27] = 1.0
    return 27, "finite"


PLANTS: dict[str, Callable[[torch.Tensor], tuple[int, str]]] = {
    "tie": _tie,
    "tie_in_one_chunk": _tie_in_one_chunk,
    "nan": _nan,
    "+inf": _positive_inf,
    "-inf": _negative_inf,
    "some_-inf": _some_negative_inf,
}


# The interpreter's dot multiplies the padding rows of x (zeros) by the planted infinities: NaN, never stored.
@pytest.mark.filterwarnings("ignore:invalid value encountered in matmul:RuntimeWarning")
@pytest.mark.parametrize("dtype", CPU_DTYPES)
@pytest.mark.parametrize("use_dot", [False, True])
@pytest.mark.parametrize("plant", PLANTS, ids=list(PLANTS))
def test_planted_specials(dtype: torch.dtype, use_dot: bool, plant: str) -> None:
    generator = seeded_generator(7)
    rows = 3
    x = _positive_x(rows, dtype, generator)
    weight = _weight(dtype, generator).cpu()
    index, kind = PLANTS[plant](weight)
    weight = weight.to(DEVICE)
    result = lm_head_argmax(x, weight, use_dot=use_dot, **SMALL_TILES)
    what = f"{plant} {dtype} dot={use_dot}"
    _check_exact_max(result, what)
    assert result.row_argmax.tolist() == [index] * rows, what
    maxima = result.row_max
    expected_kind = {
        "finite": torch.isfinite(maxima),
        "nan": torch.isnan(maxima),
        "+inf": maxima == float("inf"),
        "-inf": maxima == float("-inf"),
    }[kind]
    assert expected_kind.all(), f"{what}: max {maxima}, expected {kind}"
    if plant.startswith("tie"):  # the planted columns really tie (the same sums in the same order)
        tied = (result.logits == result.logits[:, index : index + 1]).sum(dim=1)
        assert (tied >= 2).all(), what


def test_workspace_is_reused() -> None:
    """Two calls with one workspace and one set of outputs: the same bits, no allocation needed, and the arrival
    counter back at 0 after each (else the second call's last program would never be found)."""
    generator = seeded_generator(3)
    dtype = torch.float32
    rows = 2
    x = torch.randn((rows, K), generator=generator).to(DEVICE)
    weight = _weight(dtype, generator)
    workspace = lm_head_workspace(4, N, K, dtype, DEVICE, block_n=SMALL_TILES["block_n"])
    assert workspace.partial_max.shape == (4, lm_head_programs(1, N, K, dtype, SMALL_TILES["block_n"]))
    outputs = {
        "logits_out": torch.empty((rows, N), dtype=torch.float32, device=DEVICE),
        "row_max_out": torch.empty(rows, dtype=torch.float32, device=DEVICE),
        "row_argmax_out": torch.empty(rows, dtype=torch.int64, device=DEVICE),
    }
    first = [t.clone() for t in lm_head_argmax(x, weight, workspace=workspace, **outputs, **SMALL_TILES)]
    assert workspace.counter.item() == 0
    workspace.partial_max.fill_(float("nan"))  # stale partials must not matter
    second = lm_head_argmax(x, weight, workspace=workspace, **outputs, **SMALL_TILES)
    assert workspace.counter.item() == 0
    assert second.logits is outputs["logits_out"] and second.row_argmax is outputs["row_argmax_out"]
    for before, after in zip(first, second, strict=True):
        assert torch.equal(before, after)
    _check_exact_max(second, "second call")


def test_empty_batch() -> None:
    weight = torch.randn((N, K), device=DEVICE)
    result = lm_head_argmax(torch.empty((0, K), device=DEVICE), weight)
    assert result.logits.shape == (0, N) and result.row_max.shape == (0,) and result.row_argmax.shape == (0,)


def _bad_calls() -> list[tuple[str, type[Exception], Callable[[], object]]]:
    x = torch.randn((2, K), device=DEVICE)
    weight = torch.randn((N, K), device=DEVICE)
    small = lm_head_workspace(1, N, K, torch.float32, DEVICE, block_n=8)
    half_logits = torch.empty((2, N), device=DEVICE, dtype=torch.float16)
    int32_argmax = torch.empty(2, dtype=torch.int32, device=DEVICE)
    return [
        ("too many rows", ValueError, lambda: lm_head_argmax(torch.randn((17, K), device=DEVICE), weight)),
        ("depth mismatch", ValueError, lambda: lm_head_argmax(x, torch.randn((N, K + 1), device=DEVICE))),
        ("strided weight", ValueError, lambda: lm_head_argmax(x, torch.randn((K, N), device=DEVICE).T)),
        ("fp16 logits", TypeError, lambda: lm_head_argmax(x, weight, logits_out=half_logits)),
        ("int32 argmax", TypeError, lambda: lm_head_argmax(x, weight, row_argmax_out=int32_argmax)),
        ("max shape", ValueError, lambda: lm_head_argmax(x, weight, row_max_out=torch.empty(3, device=DEVICE))),
        ("workspace rows", ValueError, lambda: lm_head_argmax(x, weight, workspace=small, block_n=8)),
        ("workspace programs", ValueError, lambda: lm_head_argmax(x[:1], weight, workspace=small, block_n=2)),
        ("empty vocabulary", ValueError, lambda: lm_head_argmax(x, torch.empty((0, K), device=DEVICE))),
        ("block_programs", ValueError, lambda: lm_head_argmax(x, weight, block_programs=3)),
    ]  # fmt: skip


@pytest.mark.parametrize("what, error, call", _bad_calls(), ids=[case[0] for case in _bad_calls()])
def test_bad_input(what: str, error: type[Exception], call: Callable[[], object]) -> None:
    with pytest.raises(error):
        call()


# ----------------------------------------------------------------------------- GPU

# The vocabulary heads (N, K) of Qwen3-0.6B and Qwen3-8B.
HEAD_SHAPES = [(151936, 1024), (151936, 4096)]


@pytest.mark.gpu
@pytest.mark.parametrize("shape", HEAD_SHAPES, ids=[f"{n}x{k}" for n, k in HEAD_SHAPES])
def test_real_heads_bf16_gpu(shape: tuple[int, int]) -> None:
    """Logits close to the fp32 product, (max, argmax) exactly torch.max of them, the same bits on a second call."""
    n, k = shape
    generator = torch.Generator(device="cuda").manual_seed(n + k)
    weight = gpu_bf16_random((n, k), generator, 0.02)
    workspace = lm_head_workspace(16, n, k, torch.bfloat16, weight.device)
    for rows in (1, 8, 16):
        x = gpu_bf16_random((rows, k), generator)
        result = lm_head_argmax(x, weight, workspace=workspace)
        expected = x.float() @ weight.float().T
        assert_close_scaled(result.logits, expected.double(), torch.bfloat16, f"{shape} rows={rows}")
        _check_exact_max(result, f"{shape} rows={rows}")
        again = lm_head_argmax(x, weight, workspace=workspace)
        for before, after in zip(result, again, strict=True):
            assert torch.equal(before, after), f"{shape} rows={rows}: not deterministic"


@pytest.mark.gpu
@pytest.mark.parametrize("shape", HEAD_SHAPES, ids=[f"{n}x{k}" for n, k in HEAD_SHAPES])
def test_pdl_and_cuda_graph_gpu(shape: tuple[int, int]) -> None:
    """The same bits under programmatic dependent launch and in 20 replays of a captured call (the counter must
    be back at 0 after every replay), with new inputs copied in before each."""
    n, k = shape
    generator = torch.Generator(device="cuda").manual_seed(n - k)
    weight = gpu_bf16_random((n, k), generator, 0.02)
    rows = 8
    workspace = lm_head_workspace(rows, n, k, torch.bfloat16, weight.device)
    pdl = pdl_unsupported(weight.device) is None
    x = gpu_bf16_random((rows, k), generator)
    plain = [t.clone() for t in lm_head_argmax(x, weight, workspace=workspace)]
    if pdl:
        with_pdl = lm_head_argmax(x, weight, workspace=workspace, pdl=True)
        for before, after in zip(plain, with_pdl, strict=True):
            assert torch.equal(before, after), "PDL changed the result"
    outputs = {
        "logits_out": torch.empty((rows, n), dtype=torch.float32, device="cuda"),
        "row_max_out": torch.empty(rows, dtype=torch.float32, device="cuda"),
        "row_argmax_out": torch.empty(rows, dtype=torch.int64, device="cuda"),
    }
    lm_head_argmax(x, weight, workspace=workspace, pdl=pdl, **outputs)  # compiled outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        lm_head_argmax(x, weight, workspace=workspace, pdl=pdl, **outputs)
    for _ in range(20):
        x.copy_(gpu_bf16_random((rows, k), generator))
        graph.replay()
        eager = lm_head_argmax(x, weight, workspace=workspace)
        for name, expected in zip(("logits_out", "row_max_out", "row_argmax_out"), eager, strict=True):
            assert torch.equal(outputs[name], expected), f"replay: {name} differs from the eager call"
    assert workspace.counter.item() == 0
