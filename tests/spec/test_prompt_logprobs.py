"""SamplingParams(prompt_logprobs=k): every prompt position's logprob and top-k, in every engine,
against log_softmax of transformers' fp32 logits (1e-4), however the prompt is computed: in one
chunk or several, across a preemption, and when its prefix is in the cache (a request that asks
for prompt logprobs takes no prefix-cache hit: every position is recomputed and scored)."""

from __future__ import annotations

import random

import pytest
import torch

from spec.engine_config import EngineConfig
from spec.request import RequestOutput
from spec.sampling_params import SamplingParams
from tests.engines import ENGINE_NAMES, build_engine, record_plans

pytestmark = [pytest.mark.differential, pytest.mark.parametrize("engine_name", ENGINE_NAMES)]

TOLERANCE = 1e-4
_rng = random.Random(2024)


def random_prompt(length: int) -> list[int]:
    return [_rng.randrange(384) for _ in range(length)]


PROMPTS = [random_prompt(n) for n in (1, 2, 7, 16, 23)]
LONG_PROMPT = random_prompt(30)
SHARED_PREFIX = random_prompt(16)


def make_engine(name: str, tiny_weights, **settings: object):
    config, state_dict = tiny_weights
    settings.setdefault("check_invariants", True)
    return build_engine(name, config, state_dict, EngineConfig(**settings), torch.float32)


@torch.inference_mode()
def hf_prompt_logprobs(hf_model: torch.nn.Module, prompt: list[int]) -> torch.Tensor:
    """log_softmax of transformers' fp32 logits [len(prompt), V]; row p predicts token p + 1."""
    logits = hf_model(input_ids=torch.tensor([prompt])).logits[0].to(torch.float32)
    return torch.log_softmax(logits, dim=-1)


def assert_prompt_logprobs_match_hf(output: RequestOutput, count: int, hf_model: torch.nn.Module) -> None:
    prompt = list(output.prompt_token_ids)
    entries = output.prompt_logprobs
    assert entries is not None and len(entries) == len(prompt), entries
    assert entries[0] is None, "nothing predicts the first prompt token"
    expected = hf_prompt_logprobs(hf_model, prompt)
    for position in range(1, len(prompt)):
        entry = entries[position]
        assert entry is not None, f"prompt position {position} was not scored"
        row = expected[position - 1]
        assert entry.token_id == prompt[position]
        assert entry.logprob == pytest.approx(float(row[prompt[position]]), abs=TOLERANCE), position
        assert len(entry.top) == count
        smallest_allowed = float(torch.topk(row, count).values[-1]) - TOLERANCE if count else 0.0
        previous = float("inf")
        for top_id, top_value in entry.top:
            assert top_value == pytest.approx(float(row[top_id]), abs=TOLERANCE), (position, top_id)
            assert smallest_allowed <= top_value <= previous + TOLERANCE, "not the top values, most likely first"
            previous = top_value


def wants(count: int | None, max_tokens: int = 3) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, prompt_logprobs=count)


def test_prompt_logprobs_match_transformers(engine_name: str, tiny_weights, hf_model) -> None:
    engine = make_engine(engine_name, tiny_weights, block_size=4, num_blocks=64)
    counts = [0, 3, 5, 1, 20]
    outputs = engine.generate(PROMPTS, [wants(count) for count in counts])
    for output, count in zip(outputs, counts, strict=True):
        assert_prompt_logprobs_match_hf(output, count, hf_model)
    assert outputs[0].prompt_logprobs == (None,)


def test_requests_that_do_not_ask_get_none(engine_name: str, tiny_weights) -> None:
    engine = make_engine(engine_name, tiny_weights, block_size=4, num_blocks=64)
    asked, not_asked = engine.generate([PROMPTS[2], PROMPTS[2]], [wants(2), wants(None)])
    assert asked.prompt_logprobs is not None and not_asked.prompt_logprobs is None


def test_chunked_prefill_scores_every_chunk(engine_name: str, tiny_weights, hf_model) -> None:
    engine = make_engine(engine_name, tiny_weights, block_size=4, num_blocks=64, max_num_batched_tokens=8)
    plans = record_plans(engine)
    outputs = engine.generate([LONG_PROMPT, PROMPTS[3]], [wants(4), wants(2)])
    for output, count in zip(outputs, [4, 2], strict=True):
        assert_prompt_logprobs_match_hf(output, count, hf_model)
    long_chunks = [c for plan in plans for c in plan.chunks if c.request_id == outputs[0].request_id]
    assert sum(1 for c in long_chunks if c.start < len(LONG_PROMPT) - 1) >= 4, "the prompt was not chunked"


def test_preemption_keeps_prompt_logprobs_right(engine_name: str, tiny_weights, hf_model) -> None:
    # 8 blocks of 4 = 32 slots; each request fits alone, the three together need about 18 blocks.
    engine = make_engine(engine_name, tiny_weights, block_size=4, num_blocks=8, max_num_batched_tokens=16)
    plans = record_plans(engine)
    prompts = [PROMPTS[3], random_prompt(12), PROMPTS[2]]
    outputs = engine.generate(prompts, [wants(3, max_tokens=10) for _ in prompts])
    assert any(plan.preempted for plan in plans), "the pool never ran short"
    for output in outputs:
        assert_prompt_logprobs_match_hf(output, 3, hf_model)


def test_a_cached_prefix_is_recomputed_and_scored(engine_name: str, tiny_weights, hf_model) -> None:
    engine = make_engine(engine_name, tiny_weights, block_size=4, num_blocks=64)
    first, second, third = (SHARED_PREFIX + random_prompt(n) for n in (3, 5, 6))
    engine.generate([first], wants(None))
    scored = engine.generate([second], wants(4))[0]
    assert scored.num_cached_prompt_tokens == 0, "a request that asks for prompt logprobs takes no cache hit"
    assert_prompt_logprobs_match_hf(scored, 4, hf_model)
    # Without prompt logprobs the same prefix is served from the cache: the case above was a real hit candidate.
    assert engine.generate([third], wants(None))[0].num_cached_prompt_tokens == len(SHARED_PREFIX)
