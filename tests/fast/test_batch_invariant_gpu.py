"""Batch-invariant mode on the GPU, bf16, qwen3-0.6b shape (random weights): the needle's token ids
and logprobs are bitwise identical alone and among up to 256 other requests, for chunk sizes 64, 512
and 8192, prefix cache on and off, CUDA graphs on and off; and 100 runs in different batches give
one distinct output. Outside the mode the outputs differ."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest
import torch

from reports.bench.shapes import SHAPES, random_state_dict
from spec.engine_config import EngineConfig
from spec.sampling_params import SamplingParams
from tests.engines import build_engine

pytestmark = [pytest.mark.gpu, pytest.mark.large_gpu]

SHAPE = SHAPES["qwen3-0.6b"]
NEEDLE_PARAMS = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, logprobs=5)


@pytest.fixture(scope="module")
def bf16_weights():
    config = SHAPE.model_config()
    return config, random_state_dict(config, torch.bfloat16, torch.device("cuda"), 0)


def engine(weights, batch_invariant: bool = True, **settings):
    config, state_dict = weights
    settings.setdefault("num_blocks", 8192)
    settings.setdefault("max_model_len", 2048)
    settings.setdefault("max_num_seqs", 256)
    engine_config = EngineConfig(block_size=16, batch_invariant=batch_invariant, **settings)
    return build_engine("fast", config, state_dict, engine_config, torch.bfloat16, "cuda")


def random_batch(rng: random.Random, needle: list[int], max_others: int) -> list[tuple[int, list[int], int]]:
    others = []
    for _ in range(rng.randint(1, max_others)):
        prefix = needle[: rng.choice([16, 48, 100])] if rng.random() < 0.2 else []
        prompt = prefix + [rng.randrange(10000) for _ in range(rng.randint(1, 300))]
        others.append((rng.randint(0, 6), prompt, rng.randint(1, 40)))
    return others


def run_needle(fast, needle, others, needle_step: int):
    pending = sorted(others, key=lambda item: item[0])
    step, needle_id, result = 0, None, None
    while result is None or fast.has_unfinished:
        while pending and pending[0][0] <= step:
            _, prompt, max_tokens = pending.pop(0)
            fast.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True))
        if step == needle_step:
            needle_id = fast.add_request(needle, NEEDLE_PARAMS)
        for output in fast.step():
            if output.request_id == needle_id and output.finished:
                result = output
        step += 1
    return result.token_ids, tuple((lp.token_id, lp.logprob, lp.top) for lp in result.logprobs)


def test_needle_bitwise_identical_across_settings(bf16_weights) -> None:
    rng = random.Random(0)
    needle = [rng.randrange(10000) for _ in range(200)]
    alone = run_needle(engine(bf16_weights), needle, [], 0)
    # Every chunk size with the prefix cache on and off; CUDA graphs on in half the runs.
    settings = [
        {"max_num_batched_tokens": chunk, "enable_prefix_caching": prefix, "enable_cuda_graphs": prefix == graphs}
        for graphs, chunk in ((True, 64), (False, 512), (True, 8192))
        for prefix in (True, False)
    ]
    for index, setting in enumerate(settings):
        fast = engine(bf16_weights, **setting)
        others = random_batch(rng, needle, 256)
        assert run_needle(fast, needle, others, rng.randint(0, 6)) == alone, (setting, len(others))
        fast.step()  # idle
        assert fast.scheduler.allocator.num_free_blocks == fast.config.num_blocks, index


def test_hundred_runs_in_different_batches_give_one_output(bf16_weights) -> None:
    rng = random.Random(1)
    needle = [rng.randrange(10000) for _ in range(120)]
    fast = engine(bf16_weights, max_num_batched_tokens=512)
    outputs = {run_needle(fast, needle, random_batch(rng, needle, 12), rng.randint(0, 6)) for _ in range(100)}
    directory = os.environ.get("TWINFER_RESULTS_DIR")
    if directory:
        Path(directory).mkdir(parents=True, exist_ok=True)
        record = {"runs": 100, "distinct_outputs": len(outputs)}
        (Path(directory) / "batch_invariant_100_runs.json").write_text(json.dumps(record))
    assert len(outputs) == 1


def test_outside_the_mode_outputs_differ(bf16_weights) -> None:
    rng = random.Random(2)
    needle = [rng.randrange(10000) for _ in range(200)]
    fast = engine(bf16_weights, batch_invariant=False, max_num_batched_tokens=512)
    outputs = {run_needle(fast, needle, random_batch(rng, needle, 32), rng.randint(0, 6)) for _ in range(10)}
    assert len(outputs) > 1, "ten batches gave one output outside the mode: the invariance test could not fail"
