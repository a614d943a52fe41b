"""The sampler taking the LM head's row max and argmax (fast.logits.RowMax) instead of its own pass.

- Sampler.sample(logits, head_max) equals Sampler.sample(logits) and spec.sampling.sample_tokens, for all-greedy,
  mixed and no-greedy batches whose rows hold ties, NaN, +inf and -inf;
- end to end on the tiny fp32 model with the GEMV forced on (the head is then lm_head_argmax, in Triton's
  interpreter on the CPU): the same tokens as the reference engine, every step's head max present; and a row
  planted NaN after the head (tests.engines.plant_non_finite drops the head's max) still fails its request with
  spec's NaN code.
"""

from __future__ import annotations

from functools import partial

import pytest
import torch

import fast.model
import fast.model_runner
from fast.engine import FastEngine
from fast.logits import RowMax, StepLogits
from fast.sampler import Sampler
from spec.engine_config import EngineConfig
from spec.request import FinishReason
from spec.sampling import (
    UNSAMPLEABLE_NAN,
    UNSAMPLEABLE_NO_FINITE,
    UNSAMPLEABLE_POSITIVE_INF,
    SamplingRow,
    sample_tokens,
)
from spec.sampling_params import SamplingParams
from tests.engines import FAST_DEVICE, build_engine, plant_non_finite

VOCAB = 40
INF, NAN = float("inf"), float("nan")
GREEDY = SamplingParams(temperature=0.0)
SEEDED = SamplingParams(temperature=0.8, top_k=10)


def _logits() -> torch.Tensor:
    """Six rows: a tie for the max, NaN after +inf, +inf twice, all -inf, -inf beside one finite value, plain."""
    generator = torch.Generator().manual_seed(4)
    logits = torch.randn(6, VOCAB, generator=generator)
    logits[0, 7] = logits[0, 30] = 9.0
    logits[1, 3], logits[1, 20], logits[1, 25] = INF, NAN, NAN
    logits[2, 11] = logits[2, 12] = INF
    logits[3] = -INF
    logits[4] = -INF
    logits[4, 33] = -5.0
    return logits.to(FAST_DEVICE)


@pytest.mark.parametrize("kinds", ["all greedy", "mixed", "none greedy"])
def test_the_head_max_gives_the_sampler_s_own_tokens(kinds: str) -> None:
    logits = _logits()
    count = logits.shape[0]
    params = {"all greedy": [GREEDY] * count, "mixed": [GREEDY, SEEDED] * (count // 2), "none greedy": [SEEDED] * count}
    rows = [SamplingRow(p, seed=17 + i, output_position=i) for i, p in enumerate(params[kinds])]
    sampler = Sampler(max_num_seqs=8, vocab_size=VOCAB, device=FAST_DEVICE)
    sampler.set_rows(rows)
    head_max = RowMax(*torch.max(logits, dim=-1))
    with_head = sampler.sample(logits, head_max)
    assert torch.equal(with_head, sampler.sample(logits))
    assert torch.equal(with_head, sample_tokens(logits, rows))
    codes = with_head[1:4].tolist()
    assert codes == [UNSAMPLEABLE_NAN, UNSAMPLEABLE_POSITIVE_INF, UNSAMPLEABLE_NO_FINITE]
    if kinds == "all greedy":
        assert with_head[0].item() == 7 and with_head[4].item() == 33  # the first of the tie; the one finite


def test_the_head_max_must_match_the_rows() -> None:
    sampler = Sampler(max_num_seqs=4, vocab_size=VOCAB, device=FAST_DEVICE)
    sampler.set_rows([SamplingRow(GREEDY, 0, 0)] * 2)
    logits = torch.zeros(2, VOCAB, device=FAST_DEVICE)
    values, indices = torch.max(logits, dim=-1)
    with pytest.raises(ValueError, match="head_max"):
        sampler.sample(logits, RowMax(values[:1], indices[:1]))
    with pytest.raises(TypeError, match="head_max"):
        sampler.sample(logits, RowMax(values, indices.to(torch.int32)))


# -- end to end -------------------------------------------------------------------------------

PROMPTS = [[1, 2, 3, 4, 5], [7, 8, 9, 7], [11, 12, 13]]
FAILING = 7  # the request whose prompt starts with 7 gets the planted row
MAX_TOKENS = 4
SETTINGS = {"block_size": 4, "num_blocks": 64, "max_num_seqs": 4, "enable_cuda_graphs": False}


def _params() -> list[SamplingParams]:
    return [
        SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True),
        SamplingParams(seed=5, max_tokens=MAX_TOKENS, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=2),
    ]


def _engine_with_the_argmax_head(tiny_weights, monkeypatch: pytest.MonkeyPatch) -> tuple[FastEngine, list[bool]]:
    """A fast engine with the GEMV forced on (as on CUDA), wide tiles for the interpreter, and a record of whether
    each launched step came with the head's row max."""
    monkeypatch.setattr(fast.model_runner, "small_batch_gemv_enabled", lambda device, invariant: True)
    monkeypatch.setattr(fast.model, "small_batch_linear", partial(fast.model.small_batch_linear, block_n=64))
    monkeypatch.setattr(fast.model, "lm_head_argmax", partial(fast.model.lm_head_argmax, block_n=64))
    config, state_dict = tiny_weights
    engine = FastEngine(config, state_dict, EngineConfig(**SETTINGS), torch.float32, FAST_DEVICE)  # type: ignore[arg-type]
    assert engine.runner.model.head_workspace is not None
    seen: list[bool] = []
    launch = engine.runner.launch

    def recording_launch(prepared, num_shared: int = 0) -> StepLogits:
        step = launch(prepared, num_shared)
        seen.append(step.head_max is not None)
        return step

    engine.runner.launch = recording_launch
    return engine, seen


def test_the_argmax_head_gives_the_reference_engine_s_tokens(tiny_weights, monkeypatch: pytest.MonkeyPatch) -> None:
    config, state_dict = tiny_weights
    reference = build_engine("reference", config, state_dict, EngineConfig(**SETTINGS))
    expected = [list(o.token_ids) for o in reference.generate(PROMPTS, _params())]
    engine, seen = _engine_with_the_argmax_head(tiny_weights, monkeypatch)
    outputs = engine.generate(PROMPTS, _params())
    assert [list(o.token_ids) for o in outputs] == expected
    assert seen and all(seen)  # every step's head (at most 3 logit rows) took lm_head_argmax


def test_a_nan_planted_after_the_head_fails_its_request(tiny_weights, monkeypatch: pytest.MonkeyPatch) -> None:
    position = 2
    clean_engine, _ = _engine_with_the_argmax_head(tiny_weights, monkeypatch)
    clean = clean_engine.generate(PROMPTS, _params())
    engine, seen = _engine_with_the_argmax_head(tiny_weights, monkeypatch)
    plant_non_finite(engine, "nan", position, lambda request: request.prompt_token_ids[0] == FAILING)
    outputs = engine.generate(PROMPTS, _params())
    assert seen and all(seen)
    for prompt, expected, got in zip(PROMPTS, clean, outputs, strict=True):
        if prompt[0] != FAILING:
            assert got.token_ids == expected.token_ids
            continue
        assert got.finish_reason is FinishReason.ERROR
        assert got.token_ids == expected.token_ids[:position]
        assert got.error == f"the model produced non-finite logits (NaN) at output position {position}"
