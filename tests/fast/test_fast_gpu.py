"""The fast engine on a GPU: fp32 exactness at the qwen3-0.6b shape, bf16 by the spec's near-tie
rule (free-running) and teacher-forced, CUDA graphs and prefix caching on against off, KV canaries,
and the memory errors at start.

Measurements (how far identical output reaches, logprob-error distributions, excused near-ties)
are written as JSON under $TWINFER_RESULTS_DIR when it is set, so a GPU run can commit them.
"""

from __future__ import annotations

import statistics
from dataclasses import replace

import pytest
import torch

from fast.engine import FastEngine
from reports.bench.shapes import SHAPES, build_hf_model, random_state_dict
from reports.diff.differential import hf_greedy_trace, trace_from_output
from spec.agreement import compare_traces
from spec.engine_config import EngineConfig
from spec.errors import ConfigError
from spec.sampling_params import SamplingParams
from tests.engines import build_engine
from tests.gpu_checks import compare_fp32, prompts_of, record

pytestmark = [pytest.mark.gpu, pytest.mark.large_gpu, pytest.mark.differential]

SHAPE = SHAPES["qwen3-0.6b"]
SEED = 0
BLOCK_SIZE = 16


@pytest.fixture(scope="module")
def fp32_weights():
    config = SHAPE.model_config()
    return config, random_state_dict(config, torch.float32, torch.device("cuda"), SEED)


@pytest.fixture(scope="module")
def hf_fp32():
    return build_hf_model(SHAPE, torch.float32, torch.device("cuda"), SEED, "eager")


def engine(name: str, weights, dtype=torch.float32, **settings):
    """Batch limits no larger than these tests' batches (32 sequences, 2048 tokens a step): at the CUDA
    defaults (256 and 16384) each engine's start-up captures 35 graph sizes and sizes its pool with a
    16384-token warm-up whose logits alone take 10 GB in fp32, for some thirty engines in this module. The
    fp32 "mixed" case gives None to run the defaults users get."""
    config, state_dict = weights
    settings.setdefault("block_size", BLOCK_SIZE)
    settings.setdefault("num_blocks", 1024)
    settings.setdefault("max_model_len", 4096)
    settings.setdefault("max_num_seqs", 32)
    settings.setdefault("max_num_batched_tokens", 2048)
    return build_engine(name, config, state_dict, EngineConfig(**settings), dtype, "cuda")


GREEDY_32 = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True, logprobs=5)
CASE_PROMPTS = prompts_of([1, 16, 17, 100, 300], seed=1)


def test_fp32_cases_against_reference_and_transformers(fp32_weights, hf_fp32) -> None:
    shared = prompts_of([3 * BLOCK_SIZE + 5], seed=2)[0]
    prefix_prompts = [shared + tail for tail in prompts_of([4, 9, 30], seed=3)]
    cases = {
        "mixed": ({"max_num_seqs": None, "max_num_batched_tokens": None}, CASE_PROMPTS),  # the CUDA defaults
        "prefix-shared": ({"max_num_seqs": 1}, prefix_prompts),
        "chunked": ({"max_num_batched_tokens": 64}, CASE_PROMPTS),
        "preemption": ({"num_blocks": 30}, CASE_PROMPTS[:4]),
    }
    results: dict[str, object] = {}
    for name, (settings, prompts) in cases.items():
        fast = engine("fast", fp32_weights, **settings).generate(prompts, GREEDY_32)
        reference = engine("reference", fp32_weights, **settings).generate(prompts, GREEDY_32)
        rows = []
        for prompt, ours, theirs in zip(prompts, fast, reference, strict=True):
            assert ours.num_cached_prompt_tokens == theirs.num_cached_prompt_tokens
            rows.append(
                {
                    "prompt_len": len(prompt),
                    "vs_reference": compare_fp32(trace_from_output(ours), trace_from_output(theirs)),
                    "vs_hf": compare_fp32(trace_from_output(ours), hf_greedy_trace(hf_fp32, prompt, 32, 5)),
                    "cached_prompt_tokens": ours.num_cached_prompt_tokens,
                }
            )
        if name == "prefix-shared":
            assert [row["cached_prompt_tokens"] for row in rows] == [0, 3 * BLOCK_SIZE, 3 * BLOCK_SIZE]
        results[name] = rows
    record("fp32_qwen3_0.6b", results)


def test_cuda_graphs_on_and_off_give_identical_fp32_tokens(fp32_weights) -> None:
    graphs = engine("fast", fp32_weights, enable_cuda_graphs=True)
    eager = engine("fast", fp32_weights, enable_cuda_graphs=False)
    assert graphs.runner.graphs is not None and eager.runner.graphs is None
    for batch in (3, 5, 17):
        prompts = prompts_of([20 + i for i in range(batch)], seed=batch)
        ours, theirs = graphs.generate(prompts, GREEDY_32), eager.generate(prompts, GREEDY_32)
        assert [o.token_ids for o in ours] == [t.token_ids for t in theirs], f"batch {batch}"
        assert (
            max(
                abs(a.logprob - b.logprob)
                for o, t in zip(ours, theirs, strict=True)
                for a, b in zip(o.logprobs, t.logprobs, strict=True)
            )
            <= 1e-4
        )


def test_decode_context_buckets_at_the_default_context_give_the_eager_bits(fp32_weights) -> None:
    """At the model's default 40,960-token context, decode steps replay the graph of their context bucket
    (512, 4096, 8192 here: a step's longest sequence picks it) and give the bits of the eager engine,
    which launches the decode kernel over the same buckets, and of an engine at max_model_len 8192 (only
    the grid differs: the split count; one sequence under the 512-key bound takes 32-key splits in all three).
    Batches of 1-3 run the decode kernel (not the packed rows)."""
    # 512 blocks hold the largest batch here (7,224 tokens in 452 blocks). The three engines' pools live side by side:
    # at 2048 blocks each they held 22 GiB in fp32, and a worker beside them left this one too little (run_b6e0169/).
    settings = {"max_model_len": None, "num_blocks": 512}
    graphs = engine("fast", fp32_weights, **settings)
    eager = engine("fast", fp32_weights, enable_cuda_graphs=False, **settings)
    short = engine("fast", fp32_weights, enable_cuda_graphs=False, num_blocks=512, max_model_len=8192)
    assert graphs.config.max_model_len == 40960 and graphs.runner.graphs.num_graphs > len(graphs.runner.graphs.sizes)
    attention = graphs.runner.attention
    assert [attention.decode_context(1, n) for n in (300, 3000, 5000)] == [512, 4096, 8192]
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, logprobs=2)
    for lengths in ([300], [300, 3000], [100, 2100, 5000]):
        prompts = prompts_of(lengths, seed=len(lengths))
        ours, eager_out, short_out = (e.generate(prompts, params) for e in (graphs, eager, short))
        for other in (eager_out, short_out):
            assert [(o.token_ids, o.logprobs) for o in ours] == [(t.token_ids, t.logprobs) for t in other], lengths


def test_async_scheduling_gives_the_step_by_step_outputs_bit_for_bit(fp32_weights) -> None:
    """EngineConfig.async_scheduling on a GPU, CUDA graphs on: the next plan is made while the device
    runs (the sampled tokens are read after it), with the same plans, so the same bits come out."""
    prompts = prompts_of([20 + 7 * i for i in range(24)], seed=11)
    params = [GREEDY_32, SamplingParams(temperature=0.8, max_tokens=32, ignore_eos=True, seed=3, logprobs=2)]
    ahead = engine("fast", fp32_weights, async_scheduling=True, max_num_batched_tokens=256)
    step_by_step = engine("fast", fp32_weights, async_scheduling=False, max_num_batched_tokens=256)
    for sampling in params:
        ours, theirs = ahead.generate(prompts, sampling), step_by_step.generate(prompts, sampling)
        assert [(o.token_ids, o.logprobs) for o in ours] == [(t.token_ids, t.logprobs) for t in theirs]
    assert ahead.step_timings.ahead_steps == ahead.step_timings.num_steps > 0
    # Without logprobs each step is launched before the last one's tokens are read (read from pinned
    # copies queued right after sampling): the same tokens still.
    for sampling in params:
        tokens_only = replace(sampling, logprobs=0)
        ours, theirs = ahead.generate(prompts, tokens_only), step_by_step.generate(prompts, tokens_only)
        assert [o.token_ids for o in ours] == [t.token_ids for t in theirs]
    assert ahead.step_timings.launched_ahead_steps > 32


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_programmatic_dependent_launch_gives_the_same_bits(fp32_weights, dtype: torch.dtype) -> None:
    """EngineConfig.programmatic_dependent_launch: the same kernels, each waiting for the one before it
    before it touches memory, so the same tokens and logprobs bit for bit: decode steps from CUDA graphs
    (batches that need padding rows), eager mixed steps with chunked prefill, and async scheduling."""
    config, state_dict = fp32_weights
    weights = (config, {name: tensor.to(dtype) for name, tensor in state_dict.items()})
    prompts = prompts_of([1, 16, 17, 100, 300], seed=12)
    step_by_step = {"async_scheduling": False}
    for settings in (step_by_step, step_by_step | {"max_num_batched_tokens": 64}, {"async_scheduling": True}):
        with_pdl = engine("fast", weights, dtype, programmatic_dependent_launch=True, **settings)
        without = engine("fast", weights, dtype, programmatic_dependent_launch=False, **settings)
        ours, theirs = with_pdl.generate(prompts, GREEDY_32), without.generate(prompts, GREEDY_32)
        assert [(o.token_ids, o.logprobs) for o in ours] == [(t.token_ids, t.logprobs) for t in theirs], settings


def test_stale_padding_rows_do_not_leak(fp32_weights) -> None:
    """Replay a batch of 8, then a batch of 3 in a larger captured size: the 3 equal a fresh run."""
    used = engine("fast", fp32_weights)
    assert used.runner.graphs.size_for(3) == 4
    eight = prompts_of([30 + i for i in range(8)], seed=8)
    three = prompts_of([40, 41, 42], seed=9)
    used.generate(eight, GREEDY_32)
    after = used.generate(three, GREEDY_32)
    fresh = engine("fast", fp32_weights).generate(three, GREEDY_32)
    assert [o.token_ids for o in after] == [o.token_ids for o in fresh]
    assert [o.logprobs for o in after] == [o.logprobs for o in fresh]


def test_prefix_caching_on_and_off_give_identical_fp32_tokens(fp32_weights) -> None:
    shared = prompts_of([200], seed=5)[0]
    prompts = [shared + tail for tail in prompts_of([3, 17, 40], seed=6)]
    on = engine("fast", fp32_weights, enable_prefix_caching=True, max_num_seqs=1).generate(prompts, GREEDY_32)
    off = engine("fast", fp32_weights, enable_prefix_caching=False, max_num_seqs=1).generate(prompts, GREEDY_32)
    assert [o.token_ids for o in on] == [o.token_ids for o in off]
    assert [o.num_cached_prompt_tokens for o in on][1:] == [192, 192]


def test_kv_cache_canaries_survive_a_graph_step(fp32_weights) -> None:
    """Only the slots a step addresses change; the padding block and every other slot keep a canary. Step by
    step: with async scheduling a step() returns while the next one is already launched, which would write
    its KV before the canaries are laid."""
    fast = engine("fast", fp32_weights, num_blocks=64, async_scheduling=False)
    cache = fast.runner.cache
    prompts = prompts_of([5, 9, 21], seed=7)
    for prompt in prompts:
        fast.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
    fast.step()  # the prefill
    cache.keys.fill_(1234.5)
    cache.values.fill_(1234.5)
    tables = {r: list(fast.scheduler.allocator.block_table(r)) for r in ("request-0", "request-1", "request-2")}
    positions = {r: fast.request(r).num_tokens - 1 for r in tables}
    fast.step()  # a decode of 3 rows, replayed in the size-4 graph with one padding row
    written = torch.zeros(cache.keys.shape[1] * BLOCK_SIZE, dtype=torch.bool, device="cuda")
    for request_id, table in tables.items():
        position = positions[request_id]
        written[table[position // BLOCK_SIZE] * BLOCK_SIZE + position % BLOCK_SIZE] = True
    for pool in (cache.keys, cache.values):
        flat = pool.view(pool.shape[0], -1, *pool.shape[3:])  # [layers, slots, heads, dim]
        changed = (flat != 1234.5).any(dim=-1).any(dim=-1)  # [layers, slots]
        assert torch.equal(changed, written[None, :].expand_as(changed)), "a slot outside the step changed"


def test_bf16_free_running_near_tie_rule(fp32_weights) -> None:
    config = SHAPE.model_config()
    weights = (config, random_state_dict(config, torch.bfloat16, torch.device("cuda"), SEED))
    hf = build_hf_model(SHAPE, torch.bfloat16, torch.device("cuda"), SEED, "sdpa")
    prompts = prompts_of([128] * 32, seed=11)
    params = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True, logprobs=5)
    fast = engine("fast", weights, torch.bfloat16, max_num_seqs=32).generate(prompts, params)
    reference = engine("reference", weights, torch.bfloat16, max_num_seqs=32).generate(prompts, params)
    summary: dict[str, list[int]] = {"vs_hf": [], "vs_reference": []}
    for prompt, ours, theirs in zip(prompts, fast, reference, strict=True):
        for key, baseline in (
            ("vs_hf", hf_greedy_trace(hf, prompt, 64, 5)),
            ("vs_reference", trace_from_output(theirs)),
        ):
            comparison = compare_traces(trace_from_output(ours), baseline, rule="near-tie")
            assert comparison.agree, (key, comparison)
            reach = comparison.first_divergence if comparison.first_divergence is not None else 64
            summary[key].append(reach)
    record(
        "bf16_free_running_qwen3_0.6b",
        {
            key: {"identical_tokens_per_prompt": reach, "median": statistics.median(reach), "min": min(reach)}
            for key, reach in summary.items()
        },
    )


def test_bf16_teacher_forced_against_fp32(fp32_weights) -> None:
    """The reference's fp32 output run back as a prompt: every position compared on the same prefix."""
    prompts = prompts_of([64] * 8, seed=12)
    fp32_reference = engine("reference", fp32_weights)
    generated = fp32_reference.generate(prompts, SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True))
    sequences = [list(o.prompt_token_ids) + list(o.token_ids) for o in generated]
    scoring = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=2)
    truth = fp32_reference.generate(sequences, scoring)
    config = SHAPE.model_config()
    bf16_weights = (config, random_state_dict(config, torch.bfloat16, torch.device("cuda"), SEED))
    results = {}
    for name in ("fast", "reference"):
        scored = engine(name, bf16_weights, torch.bfloat16).generate(sequences, scoring)
        errors, confident, agree = [], 0, 0
        for ours, exact in zip(scored, truth, strict=True):
            for mine, true in zip(ours.prompt_logprobs[1:], exact.prompt_logprobs[1:], strict=True):
                errors.append(abs(mine.logprob - true.logprob))
                if true.top[0][1] - true.top[1][1] > 0.25:
                    confident += 1
                    agree += mine.top[0][0] == true.top[0][0]
        assert agree == confident, f"{name}: top-1 differs on {confident - agree} of {confident} confident positions"
        results[name] = {
            "positions": len(errors),
            "mean_abs_logprob_error": statistics.fmean(errors),
            "p50": statistics.median(errors),
            "p99": sorted(errors)[int(0.99 * len(errors))],
            "max": max(errors),
            "confident_positions": confident,
            "top1_agreement_on_confident": agree,
        }
    record("bf16_teacher_forced_qwen3_0.6b", results)


def test_memory_errors_at_start(fp32_weights) -> None:
    config, state_dict = fp32_weights
    # FastEngine itself: tests.engines.build_engine would give the first one a fixed pool.
    # A 2048-token budget: the pool is sized after a warm-up forward of the whole budget.
    small = EngineConfig(max_num_batched_tokens=2048)
    with pytest.raises(ConfigError, match="less than one request of max_model_len"):
        FastEngine(
            config, state_dict, replace(small, gpu_memory_utilization=0.05, max_model_len=40960), torch.float32, "cuda"
        )
    with pytest.raises(ConfigError, match="does not fit in GPU memory: the free memory after weights"):
        FastEngine(config, state_dict, replace(small, num_blocks=10**8), torch.float32, "cuda")
    # A pool given explicitly is not held to gpu_memory_utilization (it sizes only the pool the engine chooses):
    # 1% of an H200 is less than the fp32 weights alone, yet 64 blocks fit in the free memory.
    engine = FastEngine(
        config, state_dict, replace(small, num_blocks=64, gpu_memory_utilization=0.01), torch.float32, "cuda"
    )
    assert engine.config.num_blocks == 64
