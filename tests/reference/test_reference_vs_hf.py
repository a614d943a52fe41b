"""The reference engine against transformers' Qwen3ForCausalLM in fp32 on CPU: identical greedy
tokens and top-k log-probabilities within 1e-4, whatever the batching, caching and memory pressure."""

from __future__ import annotations

import random

import pytest
import torch

from reports.diff.differential import hf_greedy_trace, trace_from_output
from spec.agreement import Trace, compare_traces
from spec.request import RequestOutput
from spec.sampling_params import SamplingParams
from tests.engines import record_plans

pytestmark = pytest.mark.differential

MAX_NEW_TOKENS = 64
TOP_K = 5
BLOCK_SIZE = 8
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_NEW_TOKENS, ignore_eos=True, logprobs=TOP_K)


def random_prompt(rng: random.Random, length: int, vocab_size: int = 384) -> list[int]:
    return [rng.randrange(vocab_size) for _ in range(length)]


_rng = random.Random(1234)
# 1 token, under a block, exactly a block, one past, several blocks.
MIXED_PROMPTS = [random_prompt(_rng, n) for n in (1, 5, BLOCK_SIZE, BLOCK_SIZE + 1, 3 * BLOCK_SIZE + 3, 5 * BLOCK_SIZE)]
SHARED_PREFIX = random_prompt(_rng, 5 * BLOCK_SIZE + 2)  # 42 tokens: 5 full blocks + 2
PREFIX_PROMPTS = [SHARED_PREFIX + random_prompt(_rng, n) for n in (1, 4, 9, 13)]


@pytest.fixture(scope="module")
def hf_traces(hf_model: torch.nn.Module):
    """Greedy transformers traces, computed once per distinct prompt."""
    cache: dict[tuple[int, ...], Trace] = {}

    def trace(prompt: list[int]) -> Trace:
        key = tuple(prompt)
        if key not in cache:
            cache[key] = hf_greedy_trace(hf_model, prompt, MAX_NEW_TOKENS, TOP_K)
        return cache[key]

    return trace


def assert_match_hf(outputs: list[RequestOutput], prompts: list[list[int]], hf_traces) -> None:
    for output, prompt in zip(outputs, prompts, strict=True):
        assert list(output.prompt_token_ids) == prompt
        assert len(output.token_ids) == MAX_NEW_TOKENS
        comparison = compare_traces(trace_from_output(output), hf_traces(prompt), logprob_tolerance=1e-4)
        assert comparison.first_divergence is None, f"prompt of {len(prompt)} tokens diverges at {comparison}"
        assert comparison.max_logprob_error <= 1e-4, comparison
        assert comparison.agree


def test_single_prompts_match_hf(make_engine, hf_traces) -> None:
    engine = make_engine(block_size=BLOCK_SIZE, num_blocks=64)
    for prompt in MIXED_PROMPTS:
        assert_match_hf(engine.generate([prompt], GREEDY), [prompt], hf_traces)


def test_batched_mixed_lengths_match_hf(make_engine, hf_traces) -> None:
    engine = make_engine(block_size=BLOCK_SIZE, num_blocks=128)
    plans = record_plans(engine)
    outputs = engine.generate(MIXED_PROMPTS, GREEDY)
    assert_match_hf(outputs, MIXED_PROMPTS, hf_traces)
    assert max(len(plan.chunks) for plan in plans) == len(MIXED_PROMPTS), "prompts were not batched together"


def test_shared_prefix_submitted_together_is_served_from_cache(make_engine, hf_traces) -> None:
    # Two run at a time: the later two are admitted once the first finish, and hit the cache.
    engine = make_engine(block_size=BLOCK_SIZE, num_blocks=128, max_num_seqs=2)
    outputs = engine.generate(PREFIX_PROMPTS, GREEDY)
    assert_match_hf(outputs, PREFIX_PROMPTS, hf_traces)
    cached = [output.num_cached_prompt_tokens for output in outputs]
    assert cached[2] == cached[3] == 5 * BLOCK_SIZE, cached


def test_shared_prefix_one_after_another_is_served_from_cache(make_engine, hf_traces) -> None:
    engine = make_engine(block_size=BLOCK_SIZE, num_blocks=128)
    outputs = [engine.generate([prompt], GREEDY)[0] for prompt in PREFIX_PROMPTS]
    assert_match_hf(outputs, PREFIX_PROMPTS, hf_traces)
    assert outputs[0].num_cached_prompt_tokens == 0
    assert all(output.num_cached_prompt_tokens == 5 * BLOCK_SIZE for output in outputs[1:])


def test_prefix_cache_off_serves_nothing(make_engine, hf_traces) -> None:
    engine = make_engine(block_size=BLOCK_SIZE, num_blocks=128, enable_prefix_caching=False)
    outputs = [engine.generate([prompt], GREEDY)[0] for prompt in PREFIX_PROMPTS[:2]]
    assert_match_hf(outputs, PREFIX_PROMPTS[:2], hf_traces)
    assert [output.num_cached_prompt_tokens for output in outputs] == [0, 0]


def test_small_token_budget_forces_chunked_prefill(make_engine, hf_traces) -> None:
    engine = make_engine(block_size=BLOCK_SIZE, num_blocks=128, max_num_batched_tokens=12)
    plans = record_plans(engine)
    outputs = engine.generate(MIXED_PROMPTS, GREEDY)
    assert_match_hf(outputs, MIXED_PROMPTS, hf_traces)
    partial_prefills = [c for plan in plans for c in plan.chunks if not c.samples and c.num_tokens > 1]
    assert partial_prefills, "no prompt was split into chunks"
    assert all(plan.num_batched_tokens <= 12 for plan in plans)


def test_small_kv_pool_forces_preemption(make_engine, hf_traces) -> None:
    # 16 blocks of 8 = 128 slots; each request alone needs up to 13 blocks.
    engine = make_engine(block_size=BLOCK_SIZE, num_blocks=16)
    plans = record_plans(engine)
    prompts = MIXED_PROMPTS[1:5]
    outputs = engine.generate(prompts, GREEDY)
    assert_match_hf(outputs, prompts, hf_traces)
    assert any(plan.preempted for plan in plans), "the pool never ran short"
