"""Speculative decoding cannot change a bit: with drafts (prompt lookup, or planted ones with wrong
tokens where the test wants them) a request's output is its output without, token for token and
logprob for logprob, for greedy and seeded sampling, filters, prefix hits, chunked prefill,
preemption and every finishing rule (spec.speculative).

The reference engine carries the breadth (fp32 on the CPU: positions computed in a chunk and alone
agree to rounding, so logprobs within the fp32 rule's 1e-4); the fast engine runs in batch-invariant
mode, where they must be bitwise equal, on a couple of cases (the Triton interpreter is slow)."""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from fast.block_allocator import BlockAllocator as FastBlockAllocator
from reference.block_allocator import BlockAllocator as ReferenceBlockAllocator
from spec.engine_config import BatchDefaults, EngineConfig
from spec.errors import ConfigError
from spec.request import FinishReason
from spec.sampling_params import SamplingParams
from spec.speculative import SpeculativeConfig, accepted_tokens, draft_limit, propose_ngram
from tests.engines import ENGINE_NAMES, build_engine, record_plans
from tests.spec.speculation import PlantedDrafts, assert_same_outputs, spy_verifies
from twinfer.models.tiny_model import TinyModelShape, write_tiny_model

FP32_RULE = 1e-4


def prompt_maker(seed: int):
    """Random prompts from a generator of the test's own (the same whatever order the tests run in)."""
    rng = random.Random(seed)
    return lambda length: [rng.randrange(384) for _ in range(length)]


def make_engine(name: str, tiny_weights, speculative: SpeculativeConfig | None = None, **settings: object):
    config, state_dict = tiny_weights
    settings.setdefault("check_invariants", True)
    settings.setdefault("block_size", 4)
    settings.setdefault("num_blocks", 64)
    return build_engine(name, config, state_dict, EngineConfig(speculative=speculative, **settings), torch.float32)


def run_both(name, tiny_weights, prompts, params, k=4, planted=True, **settings):
    """(speculative outputs, plain outputs, the verify log, the speculative run's plans)."""
    plain = make_engine(name, tiny_weights, **settings).generate(prompts, params)
    engine = make_engine(name, tiny_weights, SpeculativeConfig("ngram", k), **settings)
    if planted:
        engine.scheduler.proposer = PlantedDrafts(plain, tiny_weights[0].vocab_size)
    log, plans = spy_verifies(engine), record_plans(engine)
    outputs = engine.generate(prompts, params)
    timings = getattr(engine, "step_timings", None)
    if timings is not None:  # the fast engine counts what the bench records report as acceptance
        drafted = sum(num_drafted for num_drafted, _ in log.verifies)
        kept = sum(appended - 1 for _, appended in log.verifies)  # the draft tokens kept before the model's own
        counted = (timings.verify_chunks, timings.draft_tokens, timings.accepted_draft_tokens)
        assert counted == (len(log.verifies), drafted, kept), log.verifies
    return outputs, plain, log, plans


# -- the rule ------------------------------------------------------------------------------------


def test_prompt_lookup_proposes_what_followed_the_earliest_longest_match() -> None:
    assert propose_ngram([1, 2, 3, 4, 1, 2, 3], 2, 1, 3) == (4, 1)  # "1 2 3" recurs: what followed it
    assert propose_ngram([5, 1, 9, 9, 7, 1], 3, 1, 3) == (9, 9, 7)  # only "1" recurs
    assert propose_ngram([7, 7, 7, 7], 4, 1, 3) == (7,)  # the earliest "7 7 7" is followed by one token
    assert propose_ngram([1, 2, 3], 4, 1, 3) == ()  # nothing recurs
    assert propose_ngram([1, 2, 1], 0, 1, 3) == ()
    # 256 = bytes 00 01 00 ..: a byte match across token boundaries is not a token match
    assert propose_ngram([1, 256, 0, 0, 1 << 8, 4, 1 << 8], 2, 1, 1) == (0, 0)


def test_acceptance_keeps_the_agreeing_prefix_and_the_models_token() -> None:
    assert accepted_tokens((5, 6, 7), (5, 6, 7, 8)) == (5, 6, 7, 8)  # all agree: the bonus token too
    assert accepted_tokens((5, 6, 7), (5, 9, 7, 8)) == (5, 9)  # first disagreement: the model's token
    assert accepted_tokens((5, 6, 7), (4, 6, 7, 8)) == (4,)
    assert accepted_tokens((), (3,)) == (3,)
    assert accepted_tokens((5, 6, 7), (5, 6, 7, 8), frozenset({6})) == (5, 6)  # a stop token ends it
    with pytest.raises(ValueError, match="samples 3"):
        accepted_tokens((1, 2), (1, 2))
    assert draft_limit(4, num_outputs=3, max_outputs=6) == 2  # 3 + (2 + 1) = 6: never past the limit
    assert draft_limit(4, num_outputs=5, max_outputs=6) == 0


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"method": "lookahead", "num_speculative_tokens": 2}, "method must be one of ngram, draft-model"),
        ({"method": "ngram", "num_speculative_tokens": 0}, "'num_speculative_tokens' must be a positive integer"),
        ({"method": "ngram", "num_speculative_tokens": True}, "'num_speculative_tokens' must be a positive integer"),
        ({"method": "ngram", "num_speculative_tokens": 2, "ngram_min": 3, "ngram_max": 2}, "ngram_min 3 exceeds"),
        ({"method": "draft-model", "num_speculative_tokens": 2}, "needs draft_model"),
        ({"method": "ngram", "num_speculative_tokens": 2, "draft_model": "x"}, "is for speculative method"),
    ],
)
def test_bad_speculative_settings_are_named(settings: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        SpeculativeConfig(**settings)


def test_engine_config_checks_speculative(tiny_weights) -> None:
    with pytest.raises(ConfigError, match="'speculative' must be a SpeculativeConfig"):
        EngineConfig(speculative="ngram")  # type: ignore[arg-type]
    # Async scheduling goes ahead where speculation cannot change a plan (tests/fast/test_async_speculative.py).
    config = EngineConfig(speculative=SpeculativeConfig("ngram", 2))
    defaults = BatchDefaults(max_num_seqs=8, max_num_batched_tokens=64, async_scheduling=True)
    assert config.resolved(tiny_weights[0], batches=defaults).async_scheduling is True
    assert replace(config, async_scheduling=True).async_scheduling is True


# -- engines: speculative == plain -------------------------------------------------------------


@pytest.mark.differential
@pytest.mark.parametrize("engine_name", ENGINE_NAMES)
def test_speculation_changes_no_token_or_logprob(engine_name: str, tiny_weights) -> None:
    """Greedy and seeded sampling with drafts accepted whole, cut midway and rejected at once. The fast
    engine in batch-invariant mode: bitwise."""
    random_prompt = prompt_maker(1)
    fast = engine_name == "fast"
    prompts = [random_prompt(5), random_prompt(11)]
    params = [
        SamplingParams(temperature=0.0, max_tokens=6 if fast else 16, ignore_eos=True, logprobs=2),
        SamplingParams(temperature=0.9, top_k=40, seed=7, max_tokens=6 if fast else 16, ignore_eos=True, logprobs=1),
    ]
    settings = {"batch_invariant": True} if fast else {}
    speculative, plain, log, plans = run_both(engine_name, tiny_weights, prompts, params, **settings)
    assert_same_outputs(speculative, plain, tolerance=0.0 if fast else FP32_RULE)
    assert log.accepted_whole and log.rejected_at_once and log.cut_midway, log.verifies
    assert len(plans) < sum(p.max_tokens for p in params), "speculation saved no step"


@pytest.mark.differential
def test_sampling_settings_are_unchanged_by_speculation(tiny_weights) -> None:
    random_prompt = prompt_maker(2)
    temperatures = [0.0, 0.5, 1.0, 1.5, 1.0, 0.8]
    filters = [{}, {}, {"top_k": 12}, {"top_p": 0.7}, {"min_p": 0.2}, {"top_k": 30, "top_p": 0.9}]
    params = [
        SamplingParams(temperature=t, seed=100 + i, max_tokens=14, ignore_eos=True, logprobs=3, **f)
        for i, (t, f) in enumerate(zip(temperatures, filters, strict=True))
    ]
    prompts = [random_prompt(n) for n in (2, 6, 9, 13, 4, 17)]
    speculative, plain, log, _ = run_both("reference", tiny_weights, prompts, params, k=3)
    assert_same_outputs(speculative, plain, FP32_RULE)
    assert log.accepted_whole and log.rejected_at_once and log.cut_midway


@pytest.mark.differential
def test_prefix_hits_chunking_and_preemption_with_speculation(tiny_weights) -> None:
    """A small pool (preemption), a small budget (chunked prompts, drafts cut to the budget) and prompts
    sharing a prefix (cache hits) give the plain run's outputs."""
    random_prompt = prompt_maker(3)
    shared = random_prompt(12)
    prompts = [shared + random_prompt(n) for n in (3, 9, 5)] + [random_prompt(14)]
    params = [
        SamplingParams(temperature=0.0 if i % 2 else 1.1, seed=i, max_tokens=12, ignore_eos=True, logprobs=1)
        for i in range(len(prompts))
    ]
    settings = {"num_blocks": 10, "max_num_batched_tokens": 10}
    speculative, plain, log, plans = run_both("reference", tiny_weights, prompts, params, k=4, **settings)
    assert_same_outputs(speculative, plain, FP32_RULE)
    assert any(plan.preempted for plan in plans), "the pool never ran short"
    assert any(output.num_cached_prompt_tokens for output in speculative), "no prefix-cache hit"
    starts = [c.start for plan in plans for c in plan.chunks if c.request_id == speculative[1].request_id]
    assert len([s for s in starts if s < len(prompts[1])]) >= 2, "the prompt was not chunked"
    budget_cut = [
        plan for plan in plans if plan.num_batched_tokens == 10 and any(c.draft_token_ids for c in plan.chunks)
    ]
    assert budget_cut and log.verifies, "no draft met the token budget"


@pytest.mark.differential
def test_finishing_rules_are_never_overshot(tiny_weights) -> None:
    """max_tokens, max_model_len and stop tokens end a request where the plain run ends it, though the
    drafts run past them."""
    random_prompt = prompt_maker(4)
    prompts = [random_prompt(6), random_prompt(8), random_prompt(3)]
    probe = make_engine("reference", tiny_weights).generate(
        prompts[2:], SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    )[0]
    stop = probe.token_ids[5]
    params = [
        SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True, logprobs=1),  # max_tokens
        SamplingParams(temperature=0.7, seed=3, max_tokens=40, ignore_eos=True),  # max_model_len 20
        SamplingParams(temperature=0.0, max_tokens=12, stop_token_ids=[stop], logprobs=2),  # a stop token
    ]
    speculative, plain, log, _ = run_both("reference", tiny_weights, prompts, params, k=4, max_model_len=20)
    assert_same_outputs(speculative, plain, FP32_RULE)
    assert [len(o.token_ids) for o in speculative] == [5, 12, probe.token_ids.index(stop) + 1]
    assert [o.finish_reason for o in speculative] == [FinishReason.LENGTH, FinishReason.LENGTH, FinishReason.STOP]
    assert log.verifies


@pytest.mark.differential
def test_prompt_lookup_end_to_end(tiny_weights) -> None:
    """The ngram method itself (no planted drafts) on prompts that repeat themselves."""
    random_prompt = prompt_maker(5)
    phrase = random_prompt(5)
    prompts = [phrase * 4, random_prompt(3) + phrase * 2]
    params = [
        SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True, logprobs=1),
        SamplingParams(temperature=0.6, seed=11, max_tokens=16, ignore_eos=True),
    ]
    speculative, plain, log, _ = run_both("reference", tiny_weights, prompts, params, k=3, planted=False)
    assert_same_outputs(speculative, plain, FP32_RULE)
    assert log.verifies, "prompt lookup proposed nothing"


# -- draft models ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def draft_checkpoints(tmp_path_factory: pytest.TempPathFactory, tiny_checkpoint: Path) -> dict[str, Path]:
    """Drafts of the test model's family: the model itself (its greedy drafts agree where the target is
    greedy), a smaller one of another seed (mostly wrong), and one with another vocabulary (refused)."""
    root = tmp_path_factory.mktemp("drafts")
    return {
        "itself": tiny_checkpoint,
        "smaller": write_tiny_model(root / "small", seed=1, shape=TinyModelShape(num_hidden_layers=1)),
        "other-vocabulary": write_tiny_model(
            root / "vocab", seed=1, shape=TinyModelShape(num_hidden_layers=1, tokenizer_vocab_size=256)
        ),
    }


@pytest.mark.differential
@pytest.mark.parametrize("draft", ["itself", "smaller"])
def test_draft_model_changes_no_output(tiny_weights, draft_checkpoints, draft: str) -> None:
    random_prompt = prompt_maker(6)
    prompts = [random_prompt(7), random_prompt(12)]
    params = [
        SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=2),
        SamplingParams(temperature=1.0, top_p=0.9, seed=4, max_tokens=12, ignore_eos=True, logprobs=1),
    ]
    plain = make_engine("reference", tiny_weights).generate(prompts, params)
    speculative_config = SpeculativeConfig("draft-model", 3, draft_model=str(draft_checkpoints[draft]))
    engine = make_engine("reference", tiny_weights, speculative_config)
    log = spy_verifies(engine)
    assert_same_outputs(engine.generate(prompts, params), plain, FP32_RULE)
    assert log.verifies
    if draft == "itself":  # the greedy request's drafts are the target's own tokens
        assert log.accepted_whole


@pytest.mark.differential
def test_fast_engine_draft_model_changes_no_output(tiny_weights, draft_checkpoints) -> None:
    """The fast engine's draft-model path (a second fast engine over the draft checkpoint), through the
    interpreter, kept to a few steps: the test model drafting for itself, so the greedy request's draft of
    2 is accepted whole (1 output after the prompt, then 1 + 2 + 1), then a plain last step. In
    batch-invariant mode: bitwise."""
    prompt_ids = [prompt_maker(7)(6)]
    params = [SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True, logprobs=2)]
    plain = make_engine("fast", tiny_weights, batch_invariant=True).generate(prompt_ids, params)
    speculative_config = SpeculativeConfig("draft-model", 2, draft_model=str(draft_checkpoints["itself"]))
    engine = make_engine("fast", tiny_weights, speculative_config, batch_invariant=True)
    assert type(engine.scheduler.proposer.engine) is type(engine), "the draft runs in an engine of the target's kind"
    log = spy_verifies(engine)
    assert_same_outputs(engine.generate(prompt_ids, params), plain, tolerance=0.0)
    assert log.verifies == [(2, 3)], log.verifies


def test_a_draft_model_of_another_vocabulary_is_refused(tiny_weights, draft_checkpoints) -> None:
    path = str(draft_checkpoints["other-vocabulary"])
    with pytest.raises(ConfigError, match="must share the target's tokenizer"):
        make_engine("reference", tiny_weights, SpeculativeConfig("draft-model", 2, draft_model=path))


@pytest.mark.parametrize("allocator_class", [ReferenceBlockAllocator, FastBlockAllocator], ids=["reference", "fast"])
def test_rolled_back_blocks_go_to_the_head_of_the_free_queue(allocator_class) -> None:
    allocator = allocator_class(num_blocks=8, block_size=2)
    allocator.admit("a", [])
    assert allocator.allocate_slots("a", 7)  # blocks 0..3
    allocator.commit_tokens("a", [1, 2, 3, 4, 5, 6, 7], 0, 3)  # block 0 is full and registered
    allocator.truncate("a", 3)  # tokens 3.. were rejected drafts: blocks 2 and 3 go back
    snapshot = allocator.snapshot()
    assert snapshot.block_tables["a"] == (0, 1)
    assert snapshot.free_block_ids == (2, 3, 4, 5, 6, 7), "rolled-back blocks are reused first"
    assert allocator.allocate_slots("a", 6) and allocator.block_table("a")[2] == 2
