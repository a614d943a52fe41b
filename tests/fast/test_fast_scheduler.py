"""The fast scheduler's own structures: the linked free queue, the incremental hash chains, the
in-place token view, and decisions equal to the reference scheduler's on a fixed workload.
(fuzz/ drives both schedulers and allocators side by side through random operations.)"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace

import pytest

from fast.block_allocator import BlockHashChain, FreeBlockQueue
from fast.scheduler import RequestTokens
from fast.scheduler import Scheduler as FastScheduler
from reference.scheduler import Scheduler as ReferenceScheduler
from spec.block_hash import hash_block, hash_full_blocks
from spec.engine_config import EngineConfig
from spec.request import Request
from spec.sampling_params import SamplingParams
from spec.scheduling import StepPlan
from spec.speculative import SpeculativeConfig


def test_free_queue_keeps_freeing_order_through_removals_from_anywhere() -> None:
    queue = FreeBlockQueue(6)
    model = list(range(6))
    assert list(queue) == model and len(queue) == 6
    for block_id in (0, 5, 3):  # head, tail, middle
        queue.remove(block_id)
        model.remove(block_id)
        assert list(queue) == model and len(queue) == len(model)
    assert queue.pop_head() == model.pop(0)
    for block_id in (3, 1, 0):
        queue.append(block_id)
        model.append(block_id)
    assert list(queue) == model == [2, 4, 3, 1, 0]
    assert 4 in queue and 5 not in queue
    while model:
        assert queue.pop_head() == model.pop(0)
    assert list(queue) == [] and len(queue) == 0
    queue.append(5)
    assert list(queue) == [5]


def test_free_queue_refuses_double_append_and_removal_of_a_held_block() -> None:
    queue = FreeBlockQueue(3)
    with pytest.raises(RuntimeError, match="already in the free queue"):
        queue.append(1)
    queue.remove(1)
    with pytest.raises(RuntimeError, match="not in the free queue"):
        queue.remove(1)


def test_hash_chain_extends_from_its_last_hash() -> None:
    tokens = list(range(10))
    chain = BlockHashChain(3)
    chain.extend(tokens, 1)
    chain.extend(tokens, 3)
    assert chain.hashes == hash_full_blocks(tokens, 3)


def test_request_tokens_reads_prompt_then_output_in_place() -> None:
    request = Request("r", (1, 2, 3), SamplingParams(), seed=0, arrival_index=0)
    request.output_token_ids.extend([4, 5])  # as append_token would, without the lifecycle
    view = RequestTokens(request)
    expected = request.all_token_ids
    assert len(view) == 5 and list(view) == expected
    for start in range(6):
        for stop in range(start, 7):
            assert list(view[start:stop]) == expected[start:stop]
    assert view[::2] == (1, 3, 5) and view[-1] == 5 and view[3] == 4
    with pytest.raises(IndexError):
        view[5]
    request.output_token_ids.append(6)
    assert view[5] == 6 and len(view) == 6  # a view, not a copy


class CountingHash:
    """The spec's hash, counting how often each (parent, block) is hashed."""

    def __init__(self) -> None:
        self.calls: Counter[tuple[int, tuple[int, ...]]] = Counter()

    def __call__(self, parent_hash: int, token_ids: Sequence[int]) -> int:
        self.calls[(parent_hash, tuple(token_ids))] += 1
        return hash_block(parent_hash, token_ids)


CONFIG = EngineConfig(block_size=2, num_blocks=4, max_num_seqs=4, max_num_batched_tokens=64, max_model_len=64)


def run_until_idle(scheduler, prompts: list[tuple[int, ...]], max_tokens: int = 4) -> list[tuple]:
    """Add the prompts, step to the end with a fake model; every plan and state along the way."""
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    for number, prompt in enumerate(prompts):
        scheduler.add(Request(f"r{number}", prompt, params, seed=0, arrival_index=number))
    trace = []
    for _ in range(100):
        if not scheduler.has_unfinished:
            return trace
        plan = scheduler.schedule()
        state = scheduler.snapshot()
        sampled = {c.request_id: 10 + c.start % 7 for c in plan.chunks if c.samples}
        finished = [request.request_id for request in scheduler.update(plan, sampled)]
        trace.append((plan, state, finished, scheduler.snapshot()))
    raise AssertionError("the workload did not finish")


def test_a_waiting_request_is_not_rehashed_while_it_waits() -> None:
    # r0 fills the pool; r1 (three blocks) waits at the head of the queue until r0 finishes.
    prompts = [(1, 2, 3, 4), (5, 6, 7, 8, 9)]
    fast_hash, reference_hash = CountingHash(), CountingHash()
    fast_trace = run_until_idle(FastScheduler(CONFIG, (), fast_hash), prompts)
    run_until_idle(ReferenceScheduler(CONFIG, (), reference_hash), prompts)
    waited = sum(1 for plan, *_ in fast_trace if "r1" not in {c.request_id for c in plan.chunks})
    assert waited >= 3  # the scenario really makes r1 wait
    assert max(fast_hash.calls.values()) == 1, fast_hash.calls
    assert reference_hash.calls[(0, (5, 6))] >= waited  # the reference re-hashes at every attempt


def test_decisions_and_state_equal_the_reference_schedulers() -> None:
    config = EngineConfig(block_size=2, num_blocks=6, max_num_seqs=3, max_num_batched_tokens=5, max_model_len=64)
    stem = (1, 2, 3, 4, 5)
    prompts = [stem + (6,), stem + (7, 8), (9,) * 7, stem, stem + (6,), (3, 3, 3)]
    fast_trace = run_until_idle(FastScheduler(config), prompts, max_tokens=5)
    reference_trace = run_until_idle(ReferenceScheduler(config), prompts, max_tokens=5)
    assert fast_trace == reference_trace
    plans = [plan for plan, *_ in fast_trace]
    assert any(plan.preempted for plan in plans)
    hits = [state.requests[r].cached_tokens_at_admission for plan, state, *_ in fast_trace for r in plan.admitted]
    assert any(hits)


def test_schedule_and_update_build_no_snapshot() -> None:
    scheduler = FastScheduler(CONFIG)

    def refuse() -> None:
        raise AssertionError("snapshot built without being asked for")

    scheduler.snapshot = refuse  # type: ignore[method-assign]
    scheduler.allocator.snapshot = refuse  # type: ignore[method-assign]
    scheduler.add(Request("r", (1, 2, 3), SamplingParams(temperature=0.0, max_tokens=3), seed=0, arrival_index=0))
    while scheduler.has_unfinished:
        plan = scheduler.schedule()
        scheduler.update(plan, {c.request_id: 4 for c in plan.chunks if c.samples})


def test_finish_limits_flag_exactly_the_tokens_finish_reason_finishes_on() -> None:
    # update finishes a request by the FinishLimits its _Admitted keeps from admission (spec.request, where
    # finish_reason uses them too): they must give the finishing rule, written out here independently.
    from array import array

    from fast.scheduler import _Admitted
    from spec.request import FinishReason, finish_reason

    def expected(params: SamplingParams, token: int, num_outputs: int, num_tokens: int) -> FinishReason | None:
        if (not params.ignore_eos and token in eos) or token in params.stop_token_ids:
            return FinishReason.STOP
        return FinishReason.LENGTH if num_outputs >= params.max_tokens or num_tokens >= model_len else None

    eos, model_len = frozenset({0, 1}), 12
    for ignore_eos in (False, True):
        for stop in ((), (2,), (1, 5)):
            for max_tokens in (1, 3, 20):
                params = SamplingParams(max_tokens=max_tokens, ignore_eos=ignore_eos, stop_token_ids=stop)
                request = Request("r", (7, 8, 9), params, seed=0, arrival_index=0)
                state = _Admitted(request, array("i"), eos, model_len)
                for token in range(7):
                    for num_outputs in range(1, model_len - 2):
                        request.output_token_ids[:] = [3] * (num_outputs - 1) + [token]
                        want = expected(params, token, num_outputs, request.num_tokens)
                        assert state.limits.reason(token, num_outputs) == want
                        assert finish_reason(request, eos, model_len) == want


def test_snapshot_counts_the_tokens_scheduled_until_the_update() -> None:
    scheduler = FastScheduler(CONFIG)
    scheduler.add(Request("r", (1, 2, 3), SamplingParams(temperature=0.0, max_tokens=3), seed=0, arrival_index=0))
    plan = scheduler.schedule()
    assert scheduler.snapshot().requests["r"].num_scheduled_tokens == 3
    scheduler.update(plan, {"r": 4})
    assert scheduler.snapshot().requests["r"].num_scheduled_tokens == 0


class ShortProposer:
    """A broken draft proposer: one proposal fewer than it was asked for."""

    def propose(self, token_ids, max_tokens) -> list[tuple[int, ...]]:
        return [(1,)] * (len(token_ids) - 1)


@pytest.mark.parametrize("scheduler_class", [ReferenceScheduler, FastScheduler], ids=["reference", "fast"])
def test_a_proposer_that_answers_too_few_requests_is_an_error(scheduler_class: type) -> None:
    """Drafts are matched to their requests by position: a proposer that drops one must fail the step, not
    shift every later request's drafts or leave one undrafted unseen (found missing by the mutation run)."""
    config = replace(CONFIG, num_blocks=16, speculative=SpeculativeConfig("ngram", 2))
    scheduler = scheduler_class(config, (), proposer=ShortProposer())
    scheduler.add(Request("r0", (1, 2, 3), SamplingParams(temperature=0.0, max_tokens=8), seed=0, arrival_index=0))
    plan = scheduler.schedule()  # the prefill: no drafts yet
    scheduler.update(plan, {"r0": 4})
    with pytest.raises(ValueError, match="zip"):
        scheduler.schedule()  # r0 decodes: the proposer is asked for one request and answers none


class ShortProposerForThree:
    """A broken draft proposer: asked for three requests, it answers the first two (a draft of K each)."""

    def propose(self, token_ids, max_tokens) -> list[tuple[int, ...]]:
        assert len(token_ids) == 3
        return [(1,) * max_tokens[0], (1,) * max_tokens[1]]


@pytest.mark.parametrize("scheduler_class", [ReferenceScheduler, FastScheduler], ids=["reference", "fast"])
def test_a_proposer_that_answers_too_few_requests_is_an_error_even_when_the_budget_ends_first(
    scheduler_class: type,
) -> None:
    """Three running requests decode, leaving 1 token of the budget of 4: the first request's draft takes it, so
    the drafting pass stops at the second request, before it could find the third one's missing proposal. The
    answer's length is checked before any draft is placed."""
    config = replace(CONFIG, num_blocks=16, max_num_batched_tokens=4, speculative=SpeculativeConfig("ngram", 2))
    scheduler = scheduler_class(config, (), proposer=ShortProposerForThree())
    for number in range(3):
        params = SamplingParams(temperature=0.0, max_tokens=8)
        scheduler.add(Request(f"r{number}", (5 + number,), params, seed=0, arrival_index=number))
    plan = scheduler.schedule()  # the three prefills (drafts are proposed for running requests only)
    assert plan.admitted == ("r0", "r1", "r2")
    scheduler.update(plan, {"r0": 4, "r1": 4, "r2": 4})
    with pytest.raises(ValueError, match="zip"):
        scheduler.schedule()


class OneShotProposer:
    """A broken draft proposer: its answer is an iterator (readable once), not the list DraftProposer returns."""

    def propose(self, token_ids, max_tokens):
        return iter([(1,) * count for count in max_tokens])


@pytest.mark.parametrize("scheduler_class", [ReferenceScheduler, FastScheduler], ids=["reference", "fast"])
def test_a_proposer_whose_answer_can_be_read_only_once_is_an_error(scheduler_class: type) -> None:
    """The drafts are read twice (empty proposals first, then placement): an answer used up by the first read
    fails the step instead of leaving every request undrafted, as if it had proposed nothing."""
    config = replace(CONFIG, num_blocks=16, speculative=SpeculativeConfig("ngram", 2))
    scheduler = scheduler_class(config, (), proposer=OneShotProposer())
    scheduler.add(Request("r0", (1, 2, 3), SamplingParams(temperature=0.0, max_tokens=8), seed=0, arrival_index=0))
    plan = scheduler.schedule()  # the prefill: no drafts yet
    scheduler.update(plan, {"r0": 4})
    with pytest.raises(ValueError, match="zip"):
        scheduler.schedule()


def test_request_tokens_refuses_an_index_past_either_end() -> None:
    """An index one past the last token or one before the first (negative, from the end) is an IndexError that
    names the index and the token count (prompt and output together), not a token read from the other end."""
    request = Request("r", (1, 2, 3), SamplingParams(), seed=0, arrival_index=0)
    request.output_token_ids.extend([4, 5])
    view = RequestTokens(request)
    assert view[-5] == 1 and view[4] == 5
    with pytest.raises(IndexError, match="token index 5 out of range for 5 tokens"):
        view[5]
    with pytest.raises(IndexError, match="token index -6 out of range for 5 tokens"):
        view[-6]


def fake_step(scheduler: FastScheduler, plan: StepPlan, accept: bool = True) -> None:
    """Update with a fake model: token 7 for each sampling chunk; a verify chunk's draft accepted whole
    (then token 9) or rejected at once (token 8)."""
    sampled: dict[str, int | list[int]] = {}
    for chunk in plan.chunks:
        if chunk.draft_token_ids:
            drafted = len(chunk.draft_token_ids)
            sampled[chunk.request_id] = [*chunk.draft_token_ids, 9] if accept else [8] * (drafted + 1)
        elif chunk.samples:
            sampled[chunk.request_id] = 7
    scheduler.update(plan, sampled)


def test_admit_more_admits_what_schedule_would_with_the_budget_left() -> None:
    """A request added after the plan was made is admitted by admit_more as schedule() would have admitted it:
    with the budget the running chunks left, here 4 of 5 tokens of its prompt of 8."""
    config = replace(CONFIG, num_blocks=16, max_num_batched_tokens=5)
    params = SamplingParams(temperature=0.0, max_tokens=8)
    schedulers = [FastScheduler(config), FastScheduler(config)]
    for scheduler in schedulers:
        scheduler.add(Request("r0", (1, 2, 3), params, seed=0, arrival_index=0))
        fake_step(scheduler, scheduler.schedule())  # r0's prefill: it decodes from now on
    late, early = schedulers
    late.schedule()
    late.add(Request("r1", tuple(range(10, 18)), params, seed=0, arrival_index=1))
    early.add(Request("r1", tuple(range(10, 18)), params, seed=0, arrival_index=1))
    plan = late.admit_more()
    assert plan == early.schedule()
    assert plan.admitted == ("r1",) and [chunk.num_tokens for chunk in plan.chunks] == [1, 4]


def test_dropping_a_request_that_is_not_in_the_plan_leaves_the_plan_as_it_was() -> None:
    """An aborted request with no chunk in the plan made ahead leaves it whole: its admissions (the plan that
    admitted two while the third waits for max_num_seqs) and its preemptions (the plan that preempted r1 to grow
    r0 admits nothing: the queue's head is the preempted request)."""
    params = SamplingParams(temperature=0.0, max_tokens=12)
    admitting = FastScheduler(replace(CONFIG, num_blocks=16, max_num_seqs=2))
    waiting = [Request(f"r{n}", (1 + n, 2, 3), params, seed=0, arrival_index=n) for n in range(3)]
    for request in waiting:
        admitting.add(request)
    plan = admitting.schedule()
    assert plan.admitted == ("r0", "r1")
    admitting.abort(waiting[2])
    assert admitting.drop_from_plan("r2", admit=False) == plan
    assert admitting.drop_from_plan("r2", admit=True) == plan

    preempting = FastScheduler(replace(CONFIG, num_blocks=3, max_num_seqs=2))
    requests = [
        Request("r0", (1, 2, 3), params, 0, 0),
        Request("r1", (4,), params, 0, 1),
        Request("x", (5,), params, 0, 2),
    ]
    for request in requests:
        preempting.add(request)
    plan = preempting.schedule()
    while not plan.preempted:
        fake_step(preempting, plan)
        plan = preempting.schedule()
    assert plan.preempted == ("r1",) and plan.admitted == ()
    preempting.abort(requests[2])
    assert preempting.drop_from_plan("x", admit=True) == plan


class EagerProposer:
    """A draft proposer that proposes all it may (token 7 throughout), counting the calls."""

    def __init__(self) -> None:
        self.calls = 0

    def propose(self, token_ids: Sequence[Sequence[int]], max_tokens: Sequence[int]) -> list[tuple[int, ...]]:
        self.calls += 1
        return [(7,) * count for count in max_tokens]


@pytest.mark.parametrize("large_batch_rows", [None, 2, 3])
def test_may_propose_next_says_exactly_whether_the_next_step_asks_for_drafts(large_batch_rows: int | None) -> None:
    """may_propose_next (told from counts before the step's tokens are known) is True exactly when the next
    schedule() asks the proposer, in every step that preempts no one (async scheduling plans ahead only when it
    is False, and a proposer then would read pending tokens): over budgets that run out at or just before the
    decoding requests, draft limits of 0, 1 and more (max_tokens), steps at and around large_batch_rows, and
    gates that pause requests whose drafts were rejected."""
    gate = {"acceptance_window": 2, "min_acceptance_rate": 0.5, "backoff_outputs": 2, "max_backoff_outputs": 4}
    outcomes: Counter[tuple[bool, bool]] = Counter()
    for budget, num_requests, num_speculative in itertools.product(range(1, 8), range(1, 5), (1, 3)):
        speculative = SpeculativeConfig("ngram", num_speculative, large_batch_rows=large_batch_rows, **gate)
        config = replace(CONFIG, num_blocks=64, max_num_batched_tokens=budget, speculative=speculative)
        proposer = EagerProposer()
        scheduler = FastScheduler(config, (), proposer=proposer)
        for number in range(num_requests):
            prompt = tuple(range(1, 2 + number % 3))
            params = SamplingParams(temperature=0.0, max_tokens=2 + 2 * number, ignore_eos=True)
            scheduler.add(Request(f"r{number}", prompt, params, seed=0, arrival_index=number))
        for step in itertools.count():
            if not scheduler.has_unfinished:
                break
            assert step < 200, "the workload did not finish"
            predicted, before = scheduler.may_propose_next(), proposer.calls
            plan = scheduler.schedule()
            asked = proposer.calls > before
            assert predicted or not asked, (budget, num_requests, step, plan)
            if not plan.preempted:
                assert predicted == asked, (budget, num_requests, num_speculative, step, plan)
                outcomes[(predicted, asked)] += 1
            fake_step(scheduler, plan, accept=step % 5 < 2)
    assert outcomes[(True, True)] > 0 and outcomes[(False, False)] > 0, outcomes


class EmptyProposer:
    """A draft proposer that never has a draft, counting the calls."""

    def __init__(self) -> None:
        self.calls = 0

    def propose(self, token_ids: Sequence[Sequence[int]], max_tokens: Sequence[int]) -> list[tuple[int, ...]]:
        self.calls += 1
        return [() for _ in token_ids]


def test_after_an_abort_from_the_plan_made_ahead_the_budget_may_end_before_the_newest_request() -> None:
    """An abort from the plan made ahead (drop_from_plan, then admit_more) admits w2 with the aborted request's
    budget behind w1, whose prefill the plan had cut: in the next step w1's prefill takes the whole budget left
    before w2, which then gets no chunk (not an empty one), and may_propose_next says no draft is asked for."""
    speculative = SpeculativeConfig("ngram", 2, large_batch_rows=None)
    config = replace(CONFIG, num_blocks=64, max_num_seqs=8, max_num_batched_tokens=10, speculative=speculative)
    proposer = EmptyProposer()
    scheduler = FastScheduler(config, (), proposer=proposer)
    params = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    prompts = {"r1": (1, 2), "r2": (3, 4), "w1": tuple(range(10, 30)), "w2": tuple(range(30, 35))}
    requests = {name: Request(name, prompt, params, 0, number) for number, (name, prompt) in enumerate(prompts.items())}
    scheduler.add(requests["r1"])
    scheduler.add(requests["r2"])
    fake_step(scheduler, scheduler.schedule())  # both prefilled: they decode from now on
    scheduler.add(requests["w1"])
    scheduler.add(requests["w2"])
    plan = scheduler.schedule()
    assert [(chunk.request_id, chunk.num_tokens) for chunk in plan.chunks] == [("r1", 1), ("r2", 1), ("w1", 8)]
    scheduler.abort(requests["r2"])
    plan = scheduler.drop_from_plan("r2", admit=True)
    assert [(chunk.request_id, chunk.num_tokens) for chunk in plan.chunks] == [("r1", 1), ("w1", 8), ("w2", 1)]
    fake_step(scheduler, plan)
    predicted, before = scheduler.may_propose_next(), proposer.calls
    plan = scheduler.schedule()
    assert [(chunk.request_id, chunk.num_tokens) for chunk in plan.chunks] == [("r1", 1), ("w1", 9)]
    assert not predicted and proposer.calls == before
