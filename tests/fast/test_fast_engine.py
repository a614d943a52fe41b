"""The fast engine (on the GPU where there is one, else its Triton kernels through the CPU interpreter;
fp32) against the reference engine and transformers: identical greedy tokens and top-5 logprobs within
1e-4 on the differential cases, with the scheduling decisions (plans, prefix hits, preemptions)
identical to the reference's.

Sequences are short (8 new tokens: every prompt's decode still crosses a block boundary): the
interpreter costs about a second per decode step of the tiny model. Longer runs, bf16 and the 0.6B
shape run on the GPU (tests/fast/test_fast_gpu.py).
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from fast.engine import FastEngine
from reports.diff.differential import hf_greedy_trace, trace_from_output
from spec.agreement import Trace, compare_traces
from spec.checkpoint import load_model_config, load_state_dict
from spec.engine_config import EngineConfig
from spec.errors import ConfigError
from spec.request import RequestOutput
from spec.sampling_params import SamplingParams
from tests.engines import build_engine, record_plans
from twinfer.models.tiny_model import TinyModelShape, write_tiny_model

pytestmark = pytest.mark.differential

MAX_NEW_TOKENS = 8
TOP_K = 5
BLOCK_SIZE = 8
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_NEW_TOKENS, ignore_eos=True, logprobs=TOP_K)

_rng = random.Random(4321)


def _prompt(length: int) -> list[int]:
    return [_rng.randrange(384) for _ in range(length)]


# 1 token, exactly a block, one past, several blocks.
MIXED_PROMPTS = [_prompt(n) for n in (1, BLOCK_SIZE, BLOCK_SIZE + 1, 3 * BLOCK_SIZE + 3)]
SHARED_PREFIX = _prompt(3 * BLOCK_SIZE + 2)  # 3 full blocks + 2
PREFIX_PROMPTS = [SHARED_PREFIX + _prompt(n) for n in (1, 5, 9)]


@pytest.fixture(scope="module")
def hf_traces(hf_model: torch.nn.Module):
    cache: dict[tuple[int, ...], Trace] = {}

    def trace(prompt: list[int]) -> Trace:
        if tuple(prompt) not in cache:
            cache[tuple(prompt)] = hf_greedy_trace(hf_model, prompt, MAX_NEW_TOKENS, TOP_K)
        return cache[tuple(prompt)]

    return trace


@pytest.fixture
def twins(tiny_weights):
    """(fast, reference) engines over the tiny Qwen3 with the same settings and invariant checks on."""

    def build(**settings: object):
        config, state_dict = tiny_weights
        engine_config = EngineConfig(check_invariants=True, **settings)  # type: ignore[arg-type]
        return (
            build_engine("fast", config, state_dict, engine_config),
            build_engine("reference", config, state_dict, engine_config),
        )

    return build


def assert_three_way(
    fast_outputs: list[RequestOutput], reference_outputs: list[RequestOutput], prompts: list[list[int]], hf_traces
) -> None:
    for fast, reference, prompt in zip(fast_outputs, reference_outputs, prompts, strict=True):
        assert list(fast.prompt_token_ids) == prompt
        assert len(fast.token_ids) == MAX_NEW_TOKENS
        for baseline_name, baseline in (("hf", hf_traces(prompt)), ("reference", trace_from_output(reference))):
            comparison = compare_traces(trace_from_output(fast), baseline, logprob_tolerance=1e-4)
            assert comparison.agree, f"fast vs {baseline_name}, prompt of {len(prompt)} tokens: {comparison}"
        assert fast.num_cached_prompt_tokens == reference.num_cached_prompt_tokens


def run_twins(fast, reference, prompts, params=GREEDY):
    fast_plans, reference_plans = record_plans(fast), record_plans(reference)
    fast_outputs, reference_outputs = fast.generate(prompts, params), reference.generate(prompts, params)
    assert fast_plans == reference_plans, "the fast scheduler decided differently from the reference"
    return fast_outputs, reference_outputs, fast_plans


def test_mixed_lengths_in_one_batch(twins, hf_traces) -> None:
    fast, reference = twins(block_size=BLOCK_SIZE, num_blocks=64)
    fast_outputs, reference_outputs, plans = run_twins(fast, reference, MIXED_PROMPTS)
    assert_three_way(fast_outputs, reference_outputs, MIXED_PROMPTS, hf_traces)
    assert max(len(plan.chunks) for plan in plans) == len(MIXED_PROMPTS), "prompts were not batched together"


def test_prefix_hits_submitted_together(twins, hf_traces) -> None:
    fast, reference = twins(block_size=BLOCK_SIZE, num_blocks=64, max_num_seqs=1)
    fast_outputs, reference_outputs, _ = run_twins(fast, reference, PREFIX_PROMPTS)
    assert_three_way(fast_outputs, reference_outputs, PREFIX_PROMPTS, hf_traces)
    assert [o.num_cached_prompt_tokens for o in fast_outputs] == [0, 3 * BLOCK_SIZE, 3 * BLOCK_SIZE]


def test_prefix_hits_one_after_another_and_a_repeated_prompt(twins, hf_traces) -> None:
    fast, reference = twins(block_size=BLOCK_SIZE, num_blocks=64)
    prompts = [PREFIX_PROMPTS[0], PREFIX_PROMPTS[1], PREFIX_PROMPTS[1]]
    fast_outputs = [fast.generate([p], GREEDY)[0] for p in prompts]
    reference_outputs = [reference.generate([p], GREEDY)[0] for p in prompts]
    assert_three_way(fast_outputs, reference_outputs, prompts, hf_traces)
    # The repeated prompt hits every full block of its 31 tokens that leaves one to compute.
    assert [o.num_cached_prompt_tokens for o in fast_outputs] == [0, 3 * BLOCK_SIZE, 3 * BLOCK_SIZE]


def test_chunked_prefill_forced_by_a_small_budget(twins, hf_traces) -> None:
    fast, reference = twins(block_size=BLOCK_SIZE, num_blocks=64, max_num_batched_tokens=10)
    fast_outputs, reference_outputs, plans = run_twins(fast, reference, MIXED_PROMPTS[2:])
    assert_three_way(fast_outputs, reference_outputs, MIXED_PROMPTS[2:], hf_traces)
    assert any(not c.samples and c.num_tokens > 1 for plan in plans for c in plan.chunks), "no prompt was chunked"


def test_preemption_forced_by_a_small_pool(twins, hf_traces) -> None:
    # 7 blocks of 8 = 56 slots for prompts of 8, 9 and 27 tokens growing by 8 each (68 in all).
    fast, reference = twins(block_size=BLOCK_SIZE, num_blocks=7)
    prompts = MIXED_PROMPTS[1:]
    fast_outputs, reference_outputs, plans = run_twins(fast, reference, prompts)
    assert_three_way(fast_outputs, reference_outputs, prompts, hf_traces)
    assert any(plan.preempted for plan in plans), "the pool never ran short"


def test_abort_mid_run_frees_everything_and_others_go_on(twins, hf_traces) -> None:
    fast, _ = twins(block_size=BLOCK_SIZE, num_blocks=64)
    keep = fast.add_request(MIXED_PROMPTS[3], GREEDY)
    dropped = fast.add_request(MIXED_PROMPTS[2], GREEDY)
    for _ in range(3):
        fast.step()
    aborted = fast.abort(dropped)
    assert aborted.finish_reason is not None and aborted.finish_reason.value == "abort"
    finished = {}
    while fast.has_unfinished:
        finished.update({o.request_id: o for o in fast.step() if o.finished})
    comparison = compare_traces(trace_from_output(finished[keep]), hf_traces(MIXED_PROMPTS[3]))
    assert comparison.agree, comparison
    snapshot = fast.scheduler.allocator.snapshot()
    assert not snapshot.block_tables and all(block.ref_count == 0 for block in snapshot.blocks)


def test_seeded_sampling_matches_the_reference(twins) -> None:
    fast, reference = twins(block_size=BLOCK_SIZE, num_blocks=64)
    params = [
        SamplingParams(temperature=0.7, seed=11, max_tokens=8, ignore_eos=True, logprobs=2),
        SamplingParams(temperature=1.3, top_k=20, seed=12, max_tokens=8, ignore_eos=True, logprobs=2),
        SamplingParams(temperature=0.9, top_p=0.8, seed=13, max_tokens=8, ignore_eos=True, logprobs=2),
        SamplingParams(temperature=1.0, min_p=0.05, seed=14, max_tokens=8, ignore_eos=True, logprobs=2),
    ]
    prompts = MIXED_PROMPTS
    fast_outputs, reference_outputs = fast.generate(prompts, params), reference.generate(prompts, params)
    for fast_output, reference_output in zip(fast_outputs, reference_outputs, strict=True):
        assert fast_output.token_ids == reference_output.token_ids
        for ours, theirs in zip(fast_output.logprobs, reference_output.logprobs, strict=True):
            assert abs(ours.logprob - theirs.logprob) <= 1e-4


@pytest.mark.parametrize(
    "architecture, shape",
    [
        ("llama", TinyModelShape(tie_word_embeddings=False, attention_bias=True, mlp_bias=True)),
        ("qwen2", TinyModelShape(tie_word_embeddings=False)),
    ],
)
def test_llama_and_qwen2(architecture: str, shape: TinyModelShape, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    checkpoint = write_tiny_model(tmp_path / architecture, seed=3, shape=shape, architecture=architecture)
    config = load_model_config(checkpoint)
    state_dict = load_state_dict(checkpoint, config, torch.float32)
    hf = AutoModelForCausalLM.from_pretrained(str(checkpoint), dtype=torch.float32).eval()
    engine_config = EngineConfig(block_size=BLOCK_SIZE, num_blocks=32)
    fast = build_engine("fast", config, state_dict, engine_config)
    prompts = MIXED_PROMPTS[1:3]
    for prompt, output in zip(prompts, fast.generate(prompts, GREEDY), strict=True):
        comparison = compare_traces(trace_from_output(output), hf_greedy_trace(hf, prompt, MAX_NEW_TOKENS, TOP_K))
        assert comparison.agree, (architecture, len(prompt), comparison)


def test_host_row_keys_equal_the_spec_row_keys() -> None:
    # The sampler computes the row keys on the host (numpy uint32); they must be spec.sampling.row_keys bit for bit.
    from fast.sampler import host_row_keys, seed_key
    from spec.sampling import row_keys
    from spec.sampling_params import MAX_SEED

    rng = random.Random(7)
    seeds = [0, 1, 2**31, 2**32 - 1, 2**32, MAX_SEED] + [rng.randrange(MAX_SEED + 1) for _ in range(500)]
    positions = [0, 1, 2**31, 2**32 - 1, 2**32 + 3, 2**40] + [rng.randrange(2**33) for _ in range(500)]
    expected = row_keys(torch.tensor(seeds), torch.tensor(positions))
    keys = host_row_keys([seed_key(seed) for seed in seeds], positions)
    assert torch.equal(torch.from_numpy(keys.astype("int64")), expected)


def test_sampler_rows_set_the_same_columns_as_the_params() -> None:
    # set_batch goes through Sampler.row / set_sampler_rows; the filters are decided by the sampling rows only.
    from fast.sampler import Sampler
    from spec.sampling import SamplingRow, SamplingTensors

    rows = [
        SamplingRow(SamplingParams(temperature=0.0, top_k=2), seed=3, output_position=0),  # greedy: ignored by filters
        SamplingRow(SamplingParams(temperature=0.7, top_p=0.9), seed=2**40, output_position=5),
        SamplingRow(SamplingParams(temperature=1.3, min_p=0.1, top_k=100), seed=11, output_position=2),
    ]
    sampler = Sampler(max_num_seqs=4, vocab_size=16, device="cpu")
    sampler.set_rows(rows)
    expected = SamplingTensors.from_rows(rows, 16, "cpu")
    tensors = sampler._tensors
    assert tensors is not None
    for name in ("temperature", "top_k", "top_p", "min_p", "seeds", "positions", "is_greedy"):
        assert torch.equal(getattr(tensors, name), getattr(expected, name)), name
    assert sampler._max_top_k == 16 and not sampler._uses_top_k  # the greedy row's top_k=2 does not count
    assert sampler._uses_top_p and sampler._uses_min_p
    with pytest.raises(ValueError, match="positions"):
        sampler.set_sampler_rows([sampler.row(SamplingParams(), 0)], [0, 1])


@pytest.mark.interpreter
def test_programmatic_dependent_launch_is_refused_on_the_cpu_when_asked_for(tiny_weights) -> None:
    config, state_dict = tiny_weights
    settings = EngineConfig(block_size=4, programmatic_dependent_launch=True)
    with pytest.raises(ConfigError, match="programmatic dependent launch needs a CUDA device, not cpu"):
        FastEngine(config, state_dict, settings, torch.float32, "cpu")


@pytest.mark.interpreter
def test_programmatic_dependent_launch_by_default_is_off_where_unsupported(tiny_weights) -> None:
    """The default (None) resolves on the device: off on the CPU, and the engine's config says so."""
    config, state_dict = tiny_weights
    assert EngineConfig().programmatic_dependent_launch is None
    with FastEngine(config, state_dict, EngineConfig(block_size=4), torch.float32, "cpu") as engine:
        assert engine.config.programmatic_dependent_launch is False
        assert engine.runner.model.pdl is False


def test_start_up_phases_are_timed(tiny_weights) -> None:
    """ModelRunner.startup (logged at INFO, kept by the bench records): the weights' packing always; CUDA graph
    capture and the kernels' compilation only on a GPU, where they run (on the CPU their fields stay 0)."""
    config, state_dict = tiny_weights
    runner = build_engine("fast", config, state_dict, EngineConfig()).runner
    timings = runner.startup
    assert timings.weights_s > 0 and timings.total_s >= timings.weights_s + timings.pool_s
    if runner.device.type == "cuda":
        assert timings.num_graphs == runner.graphs.num_graphs > 0
        assert timings.graphs_s > 0 and timings.kernels_s > 0 and timings.pool_s > 0
    else:
        assert (timings.graphs_s, timings.kernels_s, timings.num_graphs) == (0.0, 0.0, 0)
