"""The fast scheduler's own structures: the linked free queue, the incremental hash chains, the
in-place token view, and decisions equal to the reference scheduler's on a fixed workload.
(fuzz/ drives both schedulers and allocators side by side through random operations.)"""

from __future__ import annotations

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
