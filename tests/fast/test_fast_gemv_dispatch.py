"""The fast model's small-batch GEMV dispatch: decode-sized projections through small_batch_linear.

On the CPU the runner leaves the GEMV off (Triton only interprets there); these tests force it on
by giving the runner CUDA's decision (fast.model_runner.small_batch_gemv_enabled with a CUDA
device), and off for the baseline, then check, on the tiny fp32 Qwen3 (on the GPU where there is one,
else through Triton's interpreter: tests.engines.FAST_DEVICE):
- logits within 1e-4 of the dispatch off, for steps of 5, 3 and 1 rows, and the same greedy tokens;
- which calls take the GEMV: the four projections of steps of <= SMALL_BATCH_ROWS rows (o_proj and down with
  the add + RMSNorm after them in the same launch, linear_add_rmsnorm, but for the last layer's down, which the
  final norm follows), the LM head of <= HEAD_ARGMAX_MAX_ROWS logit rows as lm_head_argmax (its row max and argmax
  exactly torch.max of its logits; torch's linear with HEAD_WITH_ROW_MAX off), nothing in a larger step (spies,
  so removing the wiring fails a test);
- batch-invariant mode never takes it.
The model's GEMV calls run with wider output tiles than the defaults (BLOCK_N=64: a few programs per
projection instead of N/2), as the interpreter's time grows with the number of programs; the default
configurations are checked against torch in tests/fast/kernels/test_gemv.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial

import pytest
import torch

import fast.model
import fast.model_runner
from fast.engine import FastEngine
from fast.input_batch import SequenceInput
from fast.logits import StepLogits
from fast.model import HEAD_ARGMAX_MAX_ROWS, SMALL_BATCH_ROWS, FastCausalLM, small_batch_dispatch_linear
from fast.model_runner import ModelRunner, small_batch_gemv_enabled
from fast.weights import pack_weights
from spec.engine_config import EngineConfig
from spec.sampling_params import SamplingParams
from tests.engines import FAST_DEVICE

BLOCK_SIZE = 8
CPU = torch.device("cpu")
DEVICE = torch.device(FAST_DEVICE)
# Small enough to build in milliseconds; 4 sequences so a decode step can have several rows. No CUDA graphs:
# the spies see the calls of eager forwards (a graph replay calls nothing from Python).
SETTINGS = {
    "block_size": BLOCK_SIZE,
    "num_blocks": 16,
    "max_num_seqs": 4,
    "max_model_len": 64,
    "enable_cuda_graphs": False,
}

Calls = list[tuple[str, int, tuple[int, ...]]]  # (kernel, rows of x, weight shape)


def _as_on_cuda(device: torch.device, batch_invariant: bool) -> bool:
    """The runner's decision as it is made for a CUDA device (on the CPU too)."""
    return small_batch_gemv_enabled(torch.device("cuda"), batch_invariant)


def _off(device: torch.device, batch_invariant: bool) -> bool:
    """The dispatch off (the baseline; on a CUDA device too)."""
    return False


@pytest.fixture
def gemv_forced(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fast.model_runner, "small_batch_gemv_enabled", _as_on_cuda)


@pytest.fixture
def wide_tiles(monkeypatch: pytest.MonkeyPatch) -> None:
    """The model's GEMV calls with BLOCK_N=64 (>= every N of the tiny model's projections: 64..256), and the LM
    head's (6 programs for its 384 vocabulary rows; its workspace is sized for the defaults' narrower tiles)."""
    monkeypatch.setattr(fast.model, "small_batch_linear", partial(fast.model.small_batch_linear, block_n=64))
    monkeypatch.setattr(fast.model, "lm_head_argmax", partial(fast.model.lm_head_argmax, block_n=64))


@pytest.fixture
def spy(wide_tiles: None, monkeypatch: pytest.MonkeyPatch) -> Calls:
    """Records every small_batch_linear and torch linear call the model makes (set before a model
    is built: the LM head and the GEMV-off model bind torch's linear at construction)."""
    calls: Calls = []

    def recording(name: str, function: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
        def wrapper(x: torch.Tensor, weight: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
            calls.append((name, x.shape[0], tuple(weight.shape)))
            return function(x, weight, *args, **kwargs)

        return wrapper

    monkeypatch.setattr(fast.model, "small_batch_linear", recording("gemv", fast.model.small_batch_linear))
    monkeypatch.setattr(fast.model, "linear_add_rmsnorm", recording("gemv+norm", fast.model.linear_add_rmsnorm))
    monkeypatch.setattr(torch.nn.functional, "linear", recording("linear", torch.nn.functional.linear))
    monkeypatch.setattr(fast.model, "invariant_linear", recording("invariant", fast.model.invariant_linear))
    monkeypatch.setattr(fast.model, "lm_head_argmax", recording("head", fast.model.lm_head_argmax))
    return calls


def _runner(tiny_weights, **settings: object) -> ModelRunner:
    config, state_dict = tiny_weights
    return ModelRunner(config, state_dict, EngineConfig(**(SETTINGS | settings)), torch.float32, DEVICE)  # type: ignore[arg-type]


def _prefill(lengths: list[int]) -> list[SequenceInput]:
    """One prompt per length, every position's logits wanted; sequence i in blocks [2i, 2i + 1]."""
    return [
        SequenceInput([(7 * i + 3 * t) % 384 for t in range(n)], 0, [2 * i, 2 * i + 1], list(range(n)))
        for i, n in enumerate(lengths)
    ]


def _decode(lengths: list[int], token: int = 5) -> list[SequenceInput]:
    """One more token for each prompt of _prefill(lengths) (lengths: each one's tokens so far)."""
    return [SequenceInput([11 * i + token], n, [2 * i, 2 * i + 1], [0]) for i, n in enumerate(lengths)]


STEP_ROWS = (5, 3, 1)


def _steps(runner: ModelRunner) -> list[StepLogits]:
    """Logits of a 5-row prefill (3 prompts), a 3-row decode step over them, then a 1-row one."""
    return [
        runner.run(_prefill([1, 2, 2])),
        runner.run(_decode([1, 2, 2])),
        runner.run(_decode([2], token=6)),
    ]


def _projection_shapes(runner: ModelRunner) -> list[tuple[int, ...]]:
    """Weight shapes of the calls one forward makes: per layer qkv, o_proj, gate_up, down."""
    shapes = []
    for layer in runner.model.weights.layers:
        shapes += [tuple(w.shape) for w in (layer.qkv, layer.o_proj, layer.gate_up, layer.down)]
    return shapes


def _gemv_kernels(runner: ModelRunner) -> list[str]:
    """The kernel of each projection of _projection_shapes in a decode-sized step: o_proj and down with their
    add + RMSNorm (linear_add_rmsnorm), but the last down, which the final norm follows, alone."""
    kernels = ["gemv", "gemv+norm", "gemv", "gemv+norm"] * len(runner.model.weights.layers)
    return [*kernels[:-1], "gemv"]


def test_runner_decision() -> None:
    assert small_batch_gemv_enabled(torch.device("cuda"), batch_invariant=False)
    assert not small_batch_gemv_enabled(torch.device("cuda"), batch_invariant=True)
    assert not small_batch_gemv_enabled(CPU, batch_invariant=False)


@pytest.mark.interpreter
def test_off_on_the_cpu_by_default(tiny_weights) -> None:
    config, state_dict = tiny_weights
    assert not ModelRunner(config, state_dict, EngineConfig(**SETTINGS), torch.float32, CPU).model.small_batch_gemv  # type: ignore[arg-type]


def test_logits_match_the_dispatch_off(tiny_weights, wide_tiles: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fast.model_runner, "small_batch_gemv_enabled", _off)
    baseline = _steps(_runner(tiny_weights))
    monkeypatch.setattr(fast.model_runner, "small_batch_gemv_enabled", _as_on_cuda)
    runner = _runner(tiny_weights)
    assert runner.model.small_batch_gemv
    for rows, (got, expected) in zip(STEP_ROWS, zip(_steps(runner), baseline, strict=True), strict=True):
        assert got.logits.shape == expected.logits.shape and got.logits.shape[0] == rows
        torch.testing.assert_close(
            got.logits, expected.logits, rtol=0, atol=1e-4, msg=lambda m, r=rows: f"{r} rows: {m}"
        )
        # The head's row max and argmax: torch.max of its own logits, bit for bit (the dispatch off has none), up to
        # HEAD_ARGMAX_MAX_ROWS logit rows; more rows take torch's linear, and the sampler its own pass.
        assert expected.head_max is None
        if rows > HEAD_ARGMAX_MAX_ROWS:
            assert got.head_max is None
            continue
        assert got.head_max is not None
        maxima, argmax = torch.max(got.logits, dim=-1)
        assert torch.equal(got.head_max.values, maxima) and torch.equal(got.head_max.indices, argmax)
        assert torch.equal(got.head_max.indices, torch.argmax(expected.logits, dim=-1)), f"{rows} rows: argmax"


def test_greedy_tokens_match_the_dispatch_off(tiny_weights, wide_tiles: None, monkeypatch: pytest.MonkeyPatch) -> None:
    config, state_dict = tiny_weights
    prompts = [[3, 1, 4, 1, 5], [9, 2, 6]]
    params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)

    def generate() -> tuple[list[list[int]], bool]:
        engine = FastEngine(config, state_dict, EngineConfig(**SETTINGS), torch.float32, DEVICE)  # type: ignore[arg-type]
        return [list(o.token_ids) for o in engine.generate(prompts, params)], engine.runner.model.small_batch_gemv

    monkeypatch.setattr(fast.model_runner, "small_batch_gemv_enabled", _off)
    baseline, baseline_gemv = generate()
    monkeypatch.setattr(fast.model_runner, "small_batch_gemv_enabled", _as_on_cuda)
    tokens, gemv = generate()
    assert (baseline_gemv, gemv) == (False, True)
    assert tokens == baseline and all(len(t) == 3 for t in tokens)


@pytest.mark.parametrize("rows", [1, 3, SMALL_BATCH_ROWS])
def test_decode_sized_steps_take_the_gemv(tiny_weights, gemv_forced: None, spy: Calls, rows: int) -> None:
    runner = _runner(tiny_weights)
    spy.clear()
    runner.run([SequenceInput(list(range(rows)), 0, [0, 1], [rows - 1])])
    # The projections through the GEMV at the step's rows, in order; the LM head (1 logit row) with its argmax.
    expected = zip(_gemv_kernels(runner), _projection_shapes(runner), strict=True)
    assert spy[:-1] == [(kernel, rows, shape) for kernel, shape in expected]
    assert spy[-1] == ("head", 1, tuple(runner.model.weights.lm_head.shape))


def test_the_head_with_row_max_can_be_turned_off(
    tiny_weights, gemv_forced: None, spy: Calls, monkeypatch: pytest.MonkeyPatch
) -> None:
    """HEAD_WITH_ROW_MAX off: the head on torch's linear, no head max, no workspace; the same greedy rows."""
    with_max = _runner(tiny_weights).run(_decode([0]))
    monkeypatch.setattr(fast.model, "HEAD_WITH_ROW_MAX", False)
    runner = _runner(tiny_weights)
    assert runner.model.head_workspace is None
    spy.clear()
    without = runner.run(_decode([0]))
    assert spy[-1] == ("linear", 1, tuple(runner.model.weights.lm_head.shape))
    assert without.head_max is None and with_max.head_max is not None
    torch.testing.assert_close(with_max.logits, without.logits, rtol=0, atol=1e-4)
    assert torch.equal(with_max.head_max.indices, torch.argmax(without.logits, dim=-1))


def test_a_hidden_size_above_the_fusion_limit_keeps_the_add_norm_apart(
    tiny_weights, gemv_forced: None, spy: Calls, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Above ADD_NORM_FUSION_MAX_HIDDEN (at Qwen3-8B's 4096 the fusion cost 0.30 ms a decode-bs1 step) o_proj and
    down take the plain GEMV and the add + RMSNorm its own kernel; the logits stay within 1e-4 of the fused ones."""
    # As measured: Qwen3-0.6B's hidden size (1024) keeps the fusion, Qwen3-8B's (4096) does not.
    assert 1024 <= fast.model.ADD_NORM_FUSION_MAX_HIDDEN < 4096
    config, _ = tiny_weights
    fused = _runner(tiny_weights)
    assert fused.model.gemv_counter is not None
    expected = fused.run(_decode([0]))
    monkeypatch.setattr(fast.model, "ADD_NORM_FUSION_MAX_HIDDEN", config.hidden_size - 1)
    runner = _runner(tiny_weights)
    assert runner.model.gemv_counter is None
    spy.clear()
    got = runner.run(_decode([0]))
    expected_calls = [("gemv", 1, shape) for shape in _projection_shapes(runner)]
    assert spy == [*expected_calls, ("head", 1, tuple(runner.model.weights.lm_head.shape))]
    torch.testing.assert_close(got.logits, expected.logits, rtol=0, atol=1e-4)


def test_larger_steps_and_their_lm_head_stay_on_torch(tiny_weights, gemv_forced: None, spy: Calls) -> None:
    runner = _runner(tiny_weights)
    rows = SMALL_BATCH_ROWS + 1
    spy.clear()
    step = runner.run([SequenceInput(list(range(rows)), 0, [0, 1, 2], list(range(rows)))])
    assert step.logits.shape[0] == rows and step.head_max is None
    head = tuple(runner.model.weights.lm_head.shape)
    assert spy == [("linear", rows, shape) for shape in _projection_shapes(runner)] + [("linear", rows, head)]


def test_batch_invariant_never_takes_the_gemv(tiny_weights, gemv_forced: None, spy: Calls) -> None:
    runner = _runner(tiny_weights, batch_invariant=True)
    assert not runner.model.small_batch_gemv
    spy.clear()
    runner.run(_prefill([1]))
    assert spy and {name for name, _, _ in spy} == {"invariant"}


def test_batch_invariant_refuses_the_gemv(tiny_weights) -> None:
    config, state_dict = tiny_weights
    weights = pack_weights(config, state_dict, torch.float32, DEVICE)
    with pytest.raises(ValueError, match="not batch-invariant"):
        FastCausalLM(config, weights, 64, DEVICE, batch_invariant=True, small_batch_gemv=True)


@contextmanager
def _no_gemv(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    with monkeypatch.context() as patch:
        patch.setattr(fast.model, "small_batch_linear", lambda *a, **k: pytest.fail("took the GEMV"))
        patch.setattr(fast.model, "linear_add_rmsnorm", lambda *a, **k: pytest.fail("took the GEMV"))
        yield


def test_dispatch_rule(spy: Calls, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows <= SMALL_BATCH_ROWS with a contiguous weight: the GEMV; otherwise torch (same values)."""
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(24, 40, generator=generator).to(DEVICE)
    bias = torch.randn(24, generator=generator).to(DEVICE)
    for rows, expected in ((1, "gemv"), (SMALL_BATCH_ROWS, "gemv"), (SMALL_BATCH_ROWS + 1, "linear")):
        x = torch.randn(rows, 40, generator=generator).to(DEVICE)
        spy.clear()
        out = small_batch_dispatch_linear(x, weight, bias)
        assert [name for name, _, _ in spy] == [expected]
        torch.testing.assert_close(out, x @ weight.T + bias, rtol=0, atol=1e-4)
    strided = torch.randn(40, 24, generator=generator).to(DEVICE).T  # [24, 40], not contiguous
    with _no_gemv(monkeypatch):
        x = torch.randn(1, 40, generator=generator).to(DEVICE)
        torch.testing.assert_close(small_batch_dispatch_linear(x, strided), x @ strided.T, rtol=0, atol=1e-4)


def test_compile_steps_cover_every_gemv_row_count(tiny_weights, gemv_forced: None) -> None:
    """The start-up forwards (_compile_kernels, CUDA only) include a step of every row count 2..16:
    decode-shaped up to max_num_seqs (4 here), then one prefill chunk."""
    runner = _runner(tiny_weights)
    steps = runner._small_batch_steps(longest=12)
    assert steps == [[1] * n for n in range(2, 5)] + [[n] for n in range(5, 13)]
    assert _runner(tiny_weights, max_num_seqs=SMALL_BATCH_ROWS)._small_batch_steps(64) == [
        [1] * n for n in range(2, SMALL_BATCH_ROWS + 1)
    ]
