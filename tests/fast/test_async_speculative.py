"""EngineConfig.async_scheduling with speculative decoding: a step goes ahead only when it verifies no draft
and no request can propose in the next one (fast.scheduler.Scheduler.may_propose_next, from counts alone),
so the plans, and hence the outputs (token and logprob), are those of the step-by-step engine.

The cases make steps go ahead (requests gated off by always-wrong drafts, large steps where no request has
a proven record) beside verify steps (drafts accepted, cut and rejected), and check that the ahead predicate
says exactly whether the proposer is asked, but in a step that preempts (there it may say "might propose").
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pytest

from fast.engine import FastEngine
from spec.engine_config import EngineConfig
from spec.sampling_params import SamplingParams
from spec.scheduling import StepPlan
from spec.speculative import DraftProposer, SpeculativeConfig
from tests.engines import build_engine, record_executed_plans
from tests.spec.speculation import PlantedDrafts, periodically_wrong, spy_verifies

# Small gates (tests/spec/test_speculative_gate.py): judged on 2 verify chunks, paused for 3 outputs, then 4.
GATE = {"acceptance_window": 2, "min_acceptance_rate": 0.25, "backoff_outputs": 3, "max_backoff_outputs": 4}


def always_wrong(request: int, index: int) -> bool:
    return True


def fast_engine(tiny_weights, async_scheduling: bool, speculative: SpeculativeConfig | None, **settings) -> FastEngine:
    config, state_dict = tiny_weights
    settings.setdefault("num_blocks", 64)
    engine_config = EngineConfig(
        block_size=4, check_invariants=True, async_scheduling=async_scheduling, speculative=speculative, **settings
    )
    return build_engine("fast", config, state_dict, engine_config)  # type: ignore[return-value]


def check_the_predicate(engine: FastEngine) -> list[tuple[bool, bool, bool]]:
    """Before every schedule(): may_propose_next(); after it: whether the proposer was asked and whether the
    plan preempted. Asserts that a step told "no proposal" asks none (what going ahead relies on)."""
    scheduler, seen = engine.scheduler, []
    schedule = scheduler.schedule
    proposer = scheduler.proposer = CountingProposer(scheduler.proposer)

    def checking_schedule() -> StepPlan:
        predicted, before = scheduler.may_propose_next(), proposer.calls
        plan = schedule()
        seen.append((predicted, proposer.calls > before, bool(plan.preempted)))
        assert predicted or proposer.calls == before, "a step told ahead that no request proposes asked for a draft"
        return plan

    scheduler.schedule = checking_schedule  # type: ignore[method-assign]
    return seen


@dataclass
class CountingProposer:
    """A proposer that counts the calls to the one it wraps."""

    proposer: DraftProposer
    calls: int = 0

    def propose(self, token_ids: Sequence[Sequence[int]], max_tokens: Sequence[int]) -> list[tuple[int, ...]]:
        self.calls += 1
        return self.proposer.propose(token_ids, max_tokens)


def run(tiny_weights, async_scheduling: bool, speculative: SpeculativeConfig, proposer, prompts, params, **settings):
    """(outputs, executed plans, verify log, predicate checks, engine) of one speculative run."""
    engine = fast_engine(tiny_weights, async_scheduling, speculative, **settings)
    if proposer is not None:
        engine.scheduler.proposer = proposer
    plans, log, predictions = record_executed_plans(engine), spy_verifies(engine), check_the_predicate(engine)
    return engine.generate(prompts, params), plans, log, predictions, engine


def random_prompts(seed: int, *lengths: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(384) for _ in range(length)] for length in lengths]


def planted(wrong: Callable[[int, int], bool]):
    return lambda plain, vocab_size: PlantedDrafts(plain, vocab_size, wrong)


CASES = {
    # Every draft rejected: each request pauses after 2 verify chunks, then probes; the paused steps go
    # ahead, and (no logprobs) are launched ahead.
    "gated-off": (
        SpeculativeConfig("ngram", 2, large_batch_rows=None, **GATE),
        planted(always_wrong),
        random_prompts(1, 5, 9, 3),
        [SamplingParams(temperature=0.0, max_tokens=14, ignore_eos=True)] * 2
        + [SamplingParams(temperature=0.8, seed=5, max_tokens=10, ignore_eos=True)],
        {},
    ),
    # Drafts accepted whole, cut and rejected. While three decode together the step is large and no
    # request has a proven record: those steps go ahead; once one finishes the others propose.
    "accepted": (
        SpeculativeConfig("ngram", 3, large_batch_rows=3, **GATE),
        planted(periodically_wrong),
        random_prompts(2, 6, 4, 8),
        [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, logprobs=2) for n in (5, 16, 14)],
        {},
    ),
    # Prompt lookup itself on repeating prompts, with a pool small enough to preempt and a small budget.
    "ngram-preempting": (
        SpeculativeConfig("ngram", 2, large_batch_rows=None, **GATE),
        None,
        [phrase * 3 for phrase in random_prompts(3, 4, 3)] + random_prompts(4, 7),
        [SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=1)]
        + [SamplingParams(temperature=0.7, seed=9, max_tokens=12, ignore_eos=True)] * 2,
        {"num_blocks": 11, "max_num_batched_tokens": 12},
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_async_speculation_makes_the_step_by_step_plans_and_outputs(tiny_weights, case: str) -> None:
    speculative, make_proposer, prompts, params, settings = CASES[case]
    plain = fast_engine(tiny_weights, False, None, **settings).generate(prompts, params)
    runs = {}
    for ahead in (False, True):
        proposer = make_proposer(plain, tiny_weights[0].vocab_size) if make_proposer else None
        runs[ahead] = run(tiny_weights, ahead, speculative, proposer, prompts, params, **settings)
    (outputs, plans, log, predictions, _), (ahead_outputs, ahead_plans, ahead_log, _, engine) = runs[False], runs[True]
    assert ahead_plans == plans
    assert ahead_outputs == outputs  # tokens, logprobs and finishes, bit for bit: the same steps ran
    assert ahead_log.verifies == log.verifies and log.verifies, "no verify step ran"
    assert [o.token_ids for o in outputs] == [o.token_ids for o in plain]  # speculation changed no token
    timings = engine.step_timings
    assert 0 < timings.ahead_steps < len(plans), timings
    assert timings.prepared_ahead_steps > 0, timings
    # Without preemption the predicate is exact: "might propose" exactly where the proposer was asked.
    assert all(predicted == asked for predicted, asked, preempted in predictions if not preempted), predictions
    if case == "gated-off":
        assert timings.launched_ahead_steps > 0, timings
    if case == "accepted":
        assert any(appended == drafted + 1 for drafted, appended in log.verifies), "no draft accepted whole"
    if case == "ngram-preempting":
        assert any(plan.preempted for plan in plans), "the pool never ran short"
