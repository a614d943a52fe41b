"""Speculative decoding on the GPU, bf16, qwen3-0.6b shape (random weights): in batch-invariant mode a
batch's outputs with speculation are bit for bit its outputs without (token ids, logprobs and top
alternatives), for greedy and seeded sampling, with prompt lookup and with planted drafts (accepted
whole, cut midway and rejected at once), chunked prefill, prefix-cache hits and CUDA graphs on the
plain decode steps. Outside the mode the speculative run keeps to the bf16 near-tie rule."""

from __future__ import annotations

import random

import pytest
import torch

from reports.bench.shapes import SHAPES, random_state_dict
from spec.agreement import Trace, compare_traces
from spec.engine_config import EngineConfig
from spec.sampling_params import SamplingParams
from spec.speculative import SpeculativeConfig
from tests.engines import build_engine, record_plans
from tests.spec.speculation import PlantedDrafts, assert_same_outputs, spy_verifies

pytestmark = [pytest.mark.gpu, pytest.mark.large_gpu]

SHAPE = SHAPES["qwen3-0.6b"]


@pytest.fixture(scope="module")
def bf16_weights():
    config = SHAPE.model_config()
    return config, random_state_dict(config, torch.bfloat16, torch.device("cuda"), 0)


def engine(weights, speculative: SpeculativeConfig | None = None, batch_invariant: bool = True, **settings):
    config, state_dict = weights
    settings.setdefault("num_blocks", 4096)
    settings.setdefault("max_model_len", 2048)
    engine_config = EngineConfig(block_size=16, batch_invariant=batch_invariant, speculative=speculative, **settings)
    return build_engine("fast", config, state_dict, engine_config, torch.bfloat16, "cuda")


def workload(seed: int) -> tuple[list[list[int]], list[SamplingParams]]:
    """Prompts that repeat themselves (prompt lookup finds drafts) and two sharing a prefix (a cache hit)."""
    rng = random.Random(seed)
    shared = [rng.randrange(10000) for _ in range(64)]
    prompts = [[rng.randrange(10000) for _ in range(rng.randint(4, 40))] * rng.randint(2, 6) for _ in range(6)]
    prompts += [shared + [rng.randrange(10000) for _ in range(n)] for n in (5, 30)]
    params = [
        SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True, logprobs=5)
        if index % 2
        else SamplingParams(
            temperature=0.8, top_k=50, top_p=0.95, seed=index, max_tokens=48, ignore_eos=True, logprobs=5
        )
        for index in range(len(prompts))
    ]
    return prompts, params


@pytest.mark.parametrize("planted", [False, True], ids=["prompt-lookup", "planted-drafts"])
@pytest.mark.parametrize("chunk", [64, 8192])
def test_speculation_is_bitwise_invisible_in_batch_invariant_mode(bf16_weights, planted: bool, chunk: int) -> None:
    prompts, params = workload(chunk)
    plain_engine = engine(bf16_weights, max_num_batched_tokens=chunk)
    plain_plans = record_plans(plain_engine)
    plain = plain_engine.generate(prompts, params)
    fast = engine(bf16_weights, SpeculativeConfig("ngram", 4), max_num_batched_tokens=chunk)
    if planted:
        fast.scheduler.proposer = PlantedDrafts(plain, SHAPE.model_config().vocab_size)
    log, plans = spy_verifies(fast), record_plans(fast)
    speculative = fast.generate(prompts, params)
    assert_same_outputs(speculative, plain, tolerance=0.0)
    assert log.verifies, "no draft was verified"
    if planted:
        assert log.accepted_whole and log.cut_midway and log.rejected_at_once, log.verifies
    if chunk == 64:  # an 8192-token budget admits every prompt in the first step: the shared prefix has no hit
        assert any(output.num_cached_prompt_tokens for output in speculative), "no prefix-cache hit"
    if planted:  # drafts accepted whole save steps; prompt lookup on random weights is mostly rejected, and its
        # drafts take budget, so there it may even take a step more (57 against 56 on the H200 at a 64 budget)
        assert len(plans) < len(plain_plans), "accepted drafts saved no step"
    fast.step()  # idle: every block is free again (rolled-back blocks included)
    assert fast.scheduler.allocator.num_free_blocks == fast.config.num_blocks


def test_outside_the_mode_speculation_keeps_the_near_tie_rule(bf16_weights) -> None:
    prompts, params = workload(7)
    greedy = [SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True, logprobs=5) for _ in prompts]
    plain = engine(bf16_weights, batch_invariant=False).generate(prompts, greedy)
    fast = engine(bf16_weights, SpeculativeConfig("ngram", 4), batch_invariant=False)
    fast.scheduler.proposer = PlantedDrafts(plain, SHAPE.model_config().vocab_size)
    for ours, theirs in zip(fast.generate(prompts, greedy), plain, strict=True):
        comparison = compare_traces(trace(ours), trace(theirs), rule="near-tie")
        assert comparison.agree, comparison


def trace(output) -> Trace:
    return Trace(output.token_ids, tuple(dict(entry.top) for entry in output.logprobs))
