"""Batch-invariant mode: a request's tokens and logprobs are bitwise the same alone and among any
other requests, submitted at any step, with its prompt chunked or served from the prefix cache.

On the GPU where there is one, else the Triton interpreter: tiny Qwen3 in fp32 and fp16; hypothesis
draws the batches (up to 8 others here: each step through the interpreter costs by the sequence, and
tests/fast/test_batch_invariant_gpu.py puts the needle among up to 256 others). Outside the mode the same
kind of run does differ, which shows the check can fail.
"""

from __future__ import annotations

import random

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import HealthCheck, given, settings

from spec.engine_config import EngineConfig
from spec.sampling_params import SamplingParams
from tests.engines import build_engine

BLOCK_SIZE = 8
MAX_OTHERS = 8
NEEDLE_PARAMS = (
    SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True, logprobs=3),
    SamplingParams(temperature=0.8, top_k=50, seed=5, max_tokens=4, ignore_eos=True, logprobs=3),
)


def tiny_engine(tiny_weights, dtype: torch.dtype, batch_invariant: bool, **settings_: object):
    config, state_dict = tiny_weights
    settings_.setdefault("num_blocks", 256)
    engine_config = EngineConfig(block_size=BLOCK_SIZE, batch_invariant=batch_invariant, **settings_)
    return build_engine("fast", config, {k: v.to(dtype) for k, v in state_dict.items()}, engine_config, dtype)


def run_needle(
    engine, needle: list[int], params: SamplingParams, others: list[tuple[int, list[int], int]], needle_step: int
):
    """Submit `others` (step, prompt, max_tokens) and the needle at their steps; the needle's output."""
    pending = sorted(others, key=lambda item: item[0])
    step, needle_id, result = 0, None, None
    while result is None:
        while pending and pending[0][0] <= step:
            _, prompt, max_tokens = pending.pop(0)
            engine.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True))
        if step == needle_step:
            needle_id = engine.add_request(needle, params)
        for output in engine.step():
            if output.request_id == needle_id and output.finished:
                result = output
        step += 1
    return result.token_ids, [(lp.token_id, lp.logprob, lp.top) for lp in result.logprobs]


@st.composite
def batches(draw: st.DrawFn) -> dict:
    rng = random.Random(draw(st.integers(0, 2**31 - 1)))
    needle = [rng.randrange(384) for _ in range(rng.randint(3, 20))]
    num_others = draw(st.integers(1, MAX_OTHERS))
    others = []
    for _ in range(num_others):
        shares_prefix = rng.random() < 0.2 and len(needle) > BLOCK_SIZE
        prompt = needle[: BLOCK_SIZE + rng.randint(0, 4)] if shares_prefix else []
        prompt = prompt + [rng.randrange(384) for _ in range(rng.randint(1, 10))]
        others.append((rng.randint(0, 3), prompt, rng.randint(1, 3)))
    return {
        "needle": needle,
        "others": others,
        "needle_step": draw(st.integers(0, 3)),
        "budget": draw(st.sampled_from([16, 40, 512])),
        "params": draw(st.sampled_from(NEEDLE_PARAMS)),
    }


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@settings(max_examples=2, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=batches())
def test_needle_is_bitwise_identical_in_any_batch(tiny_weights, dtype: torch.dtype, case: dict) -> None:
    alone = run_needle(tiny_engine(tiny_weights, dtype, True), case["needle"], case["params"], [], 0)
    assert all(torch.isfinite(torch.tensor(lp)) for _, lp, _ in alone[1])
    engine = tiny_engine(tiny_weights, dtype, True, max_num_batched_tokens=case["budget"])
    batched = run_needle(engine, case["needle"], case["params"], case["others"], case["needle_step"])
    assert batched == alone


def test_outside_the_mode_outputs_differ(tiny_weights) -> None:
    """The same comparison without the mode finds a difference: the needle's decode tokens run in the
    split-KV decode kernel alone, and in the prefill kernel (and other matmul shapes) beside prefills."""
    rng = random.Random(7)
    needle = [rng.randrange(384) for _ in range(12)]
    others = [(step, [rng.randrange(384) for _ in range(9)], 3) for step in range(1, 3) for _ in range(2)]
    params = NEEDLE_PARAMS[0]
    alone = run_needle(tiny_engine(tiny_weights, torch.float32, False), needle, params, [], 0)
    batched = run_needle(tiny_engine(tiny_weights, torch.float32, False), needle, params, others, 0)
    assert batched[0] == alone[0], "greedy tokens should still agree in fp32"
    assert batched[1] != alone[1], "logprobs were bitwise equal outside the mode: the needle test could not fail"
    invariant = [run_needle(tiny_engine(tiny_weights, torch.float32, True), needle, params, o, 0) for o in ([], others)]
    assert invariant[0] == invariant[1]
