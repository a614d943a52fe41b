"""Fuzz EngineConfig.async_scheduling against the step-by-step fast engine: random arrivals, steps and
aborts, requests that only their length can finish and requests a stop id can end, small pools (so
preemption) and small budgets (so chunked prefill).

Both engines are reports.serving.host_overhead.HostOnlyFastEngine: the real FastEngine host path (scheduler,
allocator, input packing, sampler rows, the scheduled-ahead path) over a stub model whose sampled
token depends only on a request's seed and output position. So whatever the batches, each request's
tokens are a function of the request alone. The two engines must execute equal plans on equal
inputs (tokens loaded ahead as pending, filled in on the device, included) and return equal outputs
after every rule, except after an abort of a request that had a chunk in the plan
made ahead (fast.scheduler.Scheduler.drop_from_plan says why), or an arrival while a step is launched
ahead (requests that ask no logprobs: the arrival joins the step after it): from then on the plans
may differ, and each request's final output must still be equal. The spec's invariants are checked after every
step (check_invariants), and the pool must be empty at the end.

Speculative mode (drawn per example): prompt lookup with small acceptance gates and large steps of 2 or 3
decoding chunks, so that steps verify drafts, gated-off and large steps go ahead, and steps whose next one
may propose wait for their tokens (fast.scheduler.Scheduler.may_propose_next). The stub's token at an
output position is the same whether sampled plain or in a verify chunk, so drafts are accepted at times.
The proposer must never see a pending token: a plan made ahead proposes nothing.
"""

from __future__ import annotations

from dataclasses import replace

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.reporting import with_reporter
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from fast.engine import FastEngine
from fast.input_batch import InputBatch
from fast.scheduler import Scheduler
from fuzz import stats
from fuzz.strategies import ignore
from reports.serving.host_overhead import SHAPES, HostOnlyFastEngine, StepDigest
from spec.engine_config import EngineConfig
from spec.errors import InvalidRequestError
from spec.request import PENDING_TOKEN, RequestOutput
from spec.sampling_params import SamplingParams
from spec.scheduling import StepPlan
from spec.speculative import DraftProposer, SpeculativeConfig

SAMPLER_VOCAB = 16  # small: drawn stop ids are often sampled
MODEL_CONFIG = SHAPES["qwen3-0.6b"].model_config()
STATS_LABEL = "async scheduling"
SPECULATIVE_STATS_LABEL = "async scheduling, speculative"
# Small gates: judged on 2 verify chunks, paused for 2 outputs, then 4 (requests here have at most 8 outputs).
GATE = {"acceptance_window": 2, "min_acceptance_rate": 0.5, "backoff_outputs": 2, "max_backoff_outputs": 4}


class NoPendingTokens:
    """The engine's proposer, asserting that it is never asked about a request with a pending token."""

    def __init__(self, proposer: DraftProposer) -> None:
        self.proposer = proposer
        self.calls = 0

    def propose(self, token_ids, max_tokens) -> list[tuple[int, ...]]:
        assert all(PENDING_TOKEN not in tokens for tokens in token_ids), "a plan made ahead asked for drafts"
        self.calls += 1
        return self.proposer.propose(token_ids, max_tokens)


def check_the_ahead_predicate(scheduler: Scheduler, proposer: NoPendingTokens) -> None:
    """Wrap scheduler.schedule: Scheduler.may_propose_next, asked first, must say whether the proposer is asked,
    exactly, but in a step that preempts (nothing proposes there; the predicate may say it might)."""
    schedule = scheduler.schedule

    def checking_schedule() -> StepPlan:
        predicted, before = scheduler.may_propose_next(), proposer.calls
        plan = schedule()
        asked = proposer.calls > before
        assert asked == predicted or (predicted and plan.preempted), (predicted, asked, plan)
        return plan

    scheduler.schedule = checking_schedule  # type: ignore[method-assign]


class Recorded:
    """An engine and the plans it executes, in order."""

    def __init__(self, config: EngineConfig) -> None:
        self.engine = HostOnlyFastEngine(MODEL_CONFIG, config, SAMPLER_VOCAB)
        # Every step's runner inputs, tokens loaded as pending included once filled in on the "device".
        self.inputs = self.engine.runner.input_digest = StepDigest()
        self.plans: list[StepPlan] = []
        scheduler = self.engine.scheduler
        if scheduler.proposer is not None:
            scheduler.proposer = NoPendingTokens(scheduler.proposer)
            check_the_ahead_predicate(scheduler, scheduler.proposer)
        execute = self.engine.execute

        def recording_execute(plan: StepPlan, meanwhile=None):
            self.plans.append(plan)
            return execute(plan, meanwhile)

        self.engine.execute = recording_execute  # type: ignore[method-assign]


class AsyncSchedulingMachine(RuleBasedStateMachine):
    stats_label = STATS_LABEL
    speculative_mode = False

    @initialize(
        block_size=st.sampled_from((2, 4)),
        num_blocks=st.integers(6, 24),
        max_num_seqs=st.integers(1, 4),
        max_num_batched_tokens=st.integers(3, 24),
        data=st.data(),
    )
    def build(
        self, block_size: int, num_blocks: int, max_num_seqs: int, max_num_batched_tokens: int, data: st.DataObject
    ) -> None:
        base = EngineConfig(
            block_size=block_size,
            num_blocks=num_blocks,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            max_model_len=64,
            check_invariants=True,
            enable_cuda_graphs=False,
            speculative=self._speculative(data),
        )
        self.step_by_step = Recorded(replace(base, async_scheduling=False))  # the fast engine's default is on
        self.ahead = Recorded(replace(base, async_scheduling=True))
        self.added: list[str] = []
        self.aborted_apart: set[str] = set()  # aborted once the plans may differ
        self.next_id = 0
        self.plans_comparable = True
        stats.bump(self.stats_label, "examples")
        self.last_outputs: tuple[dict[str, RequestOutput], dict[str, RequestOutput]] = ({}, {})

    def _speculative(self, data: st.DataObject) -> SpeculativeConfig | None:
        """Speculative mode only (drawn here, so that the plain machine's examples stay as they were)."""
        if not self.speculative_mode:
            return None
        k = data.draw(st.sampled_from((1, 3)), label="num_speculative_tokens")
        large_batch_rows = data.draw(st.sampled_from((None, 2, 3)), label="large_batch_rows")
        return SpeculativeConfig("ngram", k, large_batch_rows=large_batch_rows, **GATE)

    @rule(
        prompt_len=st.integers(1, 12),
        max_tokens=st.integers(1, 8),
        stop=st.one_of(st.just(()), st.tuples(st.integers(0, SAMPLER_VOCAB - 1))),
        seed=st.integers(0, 1000),
        logprobs=st.sampled_from((0, 1)),
    )
    def add(self, prompt_len: int, max_tokens: int, stop: tuple[int, ...], seed: int, logprobs: int) -> None:
        request_id = f"r{self.next_id}"
        self.next_id += 1
        prompt = [(7 * self.next_id + j) % 97 + 1 for j in range(prompt_len)]
        params = SamplingParams(
            temperature=1.0, max_tokens=max_tokens, ignore_eos=True, stop_token_ids=stop, seed=seed, logprobs=logprobs
        )
        if self.ahead.engine._in_flight is not None:  # the second documented departure
            self.plans_comparable = False
            stats.bump(self.stats_label, "arrivals_while_a_step_is_launched")
        accepted = []
        for side in (self.step_by_step, self.ahead):
            try:
                side.engine.add_request(prompt, params, request_id)
                accepted.append(True)
            except InvalidRequestError:  # a request the pool can never hold: both must refuse it
                accepted.append(False)
        assert accepted[0] == accepted[1], accepted
        if not accepted[0]:
            return
        self.added.append(request_id)
        stats.bump(self.stats_label, "requests_with_stop_ids" if stop else "requests_by_length")

    @rule(steps=st.integers(1, 3))
    def step(self, steps: int) -> None:
        for _ in range(steps):
            self._compare(self.step_by_step.engine.step(), self.ahead.engine.step())

    @precondition(lambda self: bool(self._abortable()))
    @rule(data=st.data())
    def abort(self, data: st.DataObject) -> None:
        request_id = data.draw(st.sampled_from(self._abortable()), label="request to abort")
        pending = self.ahead.engine._next_plan
        if pending is not None and any(chunk.request_id == request_id for chunk in pending.chunks):
            self.plans_comparable = False  # the one documented departure from step-by-step plans
            stats.bump(self.stats_label, "aborts_with_a_chunk_ahead")
        if not self.plans_comparable:
            self.aborted_apart.add(request_id)
        self._compare([self.step_by_step.engine.abort(request_id)], [self.ahead.engine.abort(request_id)])

    @invariant()
    def same_plans_and_inputs(self) -> None:
        if self.plans_comparable:
            assert self.ahead.plans == self.step_by_step.plans
            # A step launched ahead has loaded its inputs a step() call before the step-by-step engine
            # does: the inputs are compared whenever none is (teardown ends with none).
            if self.ahead.engine._in_flight is None:
                assert self.ahead.inputs.record() == self.step_by_step.inputs.record()

    def teardown(self) -> None:
        if not hasattr(self, "ahead"):
            return
        while self.step_by_step.engine.has_unfinished or self.ahead.engine.has_unfinished:
            self._compare(self.step_by_step.engine.step(), self.ahead.engine.step())
        self.same_plans_and_inputs()
        step_by_step, ahead = self.last_outputs
        assert step_by_step.keys() == ahead.keys()
        for request_id, output in step_by_step.items():
            other = ahead[request_id]
            assert output.finished and other.finished
            if request_id in self.aborted_apart:  # aborted at whatever point each engine had reached
                shorter, longer = sorted((output.token_ids, other.token_ids), key=len)
                assert longer[: len(shorter)] == shorter, (output, other)
            else:
                assert output == other
        for side in (self.step_by_step, self.ahead):
            allocator = side.engine.scheduler.allocator
            assert allocator.num_free_blocks == side.engine.config.pool_blocks
        stats.bump(self.stats_label, "steps_ahead", self.ahead.engine.step_timings.ahead_steps)
        stats.bump(self.stats_label, "steps", self.ahead.engine.step_timings.num_steps)
        stats.bump(self.stats_label, "steps_launched_ahead", self.ahead.engine.step_timings.launched_ahead_steps)
        if self.ahead.engine.config.speculative is not None:
            verify_steps = sum(any(c.draft_token_ids for c in plan.chunks) for plan in self.ahead.plans)
            stats.bump(self.stats_label, "verify_steps", verify_steps)
            stats.bump(self.stats_label, "steps_ahead_speculative", self.ahead.engine.step_timings.ahead_steps)

    def _compare(self, step_by_step: list[RequestOutput], ahead: list[RequestOutput]) -> None:
        """Equal outputs while the plans are the step-by-step ones; each request's latest output kept."""
        for latest, outputs in zip(self.last_outputs, (step_by_step, ahead), strict=True):
            latest.update((output.request_id, output) for output in outputs)
        if self.plans_comparable:
            assert sorted(step_by_step, key=_request_id) == sorted(ahead, key=_request_id)
            stats.bump(self.stats_label, "twin_comparisons")

    def _abortable(self) -> list[str]:
        """Requests unfinished on both engines (once the plans differ, one may finish a request first)."""
        return [request_id for request_id in self.added if self._unfinished(request_id)]

    def _unfinished(self, request_id: str) -> bool:
        try:
            self.step_by_step.engine.request(request_id)
            self.ahead.engine.request(request_id)
        except KeyError:
            return False
        return True


def _request_id(output: RequestOutput) -> str:
    return output.request_id


def test_async_scheduling_matches_step_by_step() -> None:
    run_state_machine_as_test(AsyncSchedulingMachine, settings=settings.default)
    seen = stats.counters(STATS_LABEL)
    for situation in (
        "requests_with_stop_ids",
        "requests_by_length",
        "aborts_with_a_chunk_ahead",
        "steps_ahead",
        "steps_launched_ahead",
        "arrivals_while_a_step_is_launched",
    ):
        assert seen.get(situation), f"the fuzzer never reached {situation}: {seen}"


class AsyncSpeculativeMachine(AsyncSchedulingMachine):
    stats_label = SPECULATIVE_STATS_LABEL
    speculative_mode = True


def test_async_scheduling_with_speculation_matches_step_by_step() -> None:
    run_state_machine_as_test(AsyncSpeculativeMachine, settings=settings.default)
    seen = stats.counters(SPECULATIVE_STATS_LABEL)
    for situation in ("steps_ahead_speculative", "steps_launched_ahead", "verify_steps", "aborts_with_a_chunk_ahead"):
        assert seen.get(situation), f"the fuzzer never reached {situation}: {seen}"


_drop_from_plan = Scheduler.drop_from_plan


def _drop_and_admit(scheduler: Scheduler, request_id: str) -> StepPlan:
    return _drop_from_plan(scheduler, request_id, admit=True)


SPECULATION_BUGS = ("may_propose_next", "_verifies")


@pytest.mark.parametrize(
    ("owner", "planted", "replacement"),
    [
        # Arrivals ignored by the plan made ahead: the step-by-step engine admits them a step earlier.
        (Scheduler, "admit_more", lambda scheduler: scheduler._scheduled_plan()),
        # Steps where a stop id can end a request scheduled ahead anyway: it runs a step too long.
        (Scheduler, "finishes_by_length_only", lambda scheduler, request_ids: True),
        # Inputs loaded ahead whose pending tokens are never filled in.
        (InputBatch, "set_pending_tokens", lambda batch, token_rows, source, source_rows: None),
        # A step launched ahead that takes admissions after its launch: the device never runs them.
        (Scheduler, "drop_from_plan", lambda scheduler, request_id, admit=True: _drop_and_admit(scheduler, request_id)),
        # Speculation: steps whose next one may propose scheduled ahead (drafts from pending tokens) ...
        (Scheduler, "may_propose_next", lambda scheduler: False),
        # ... and the step after a verify step planned before its accepted count is known.
        (FastEngine, "_verifies", lambda engine, plan: False),
    ],
    ids=[
        "arrivals-not-admitted",
        "stop-ids-scheduled-ahead",
        "pending-tokens-not-filled-in",
        "admitted-after-launch",
        "proposals-ahead",
        "ahead-of-a-verify-step",
    ],
)
def test_the_fuzzer_catches_planted_bugs(
    owner: type, planted: str, replacement, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(owner, planted, replacement)
    # The speculation bugs only show with speculation on: the speculative machine hunts them.
    machine = AsyncSpeculativeMachine if planted in SPECULATION_BUGS else AsyncSchedulingMachine
    monkeypatch.setattr(machine, "stats_label", f"planted/async scheduling {planted}")
    # Hypothesis mixes literal constants of the modules imported so far into what it draws, so the examples
    # depend on which tests ran before this one: collected after a tests/ module (its conftest imports
    # twinfer.models.tiny_model), the arrivals bug took more than 150 examples to show, alone 14. Its budget has room.
    planted_settings = settings(
        settings.default, max_examples=600, phases=(Phase.generate,), suppress_health_check=list(HealthCheck)
    )
    with with_reporter(ignore), pytest.raises(AssertionError):
        run_state_machine_as_test(machine, settings=planted_settings)
