"""Each spec invariant check raises, naming the invariant, on a snapshot that breaks it.

The snapshots start from a real engine state (two requests sharing a cached prefix, mid-run)
and change one thing; fuzz/ drives the same checks through random operation sequences.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from spec import invariants as inv
from spec.errors import InvariantViolation
from spec.invariants import InvariantMonitor, SchedulerSnapshot, check_allocator, check_scheduler
from spec.sampling_params import SamplingParams


@pytest.fixture
def snapshot(make_engine) -> SchedulerSnapshot:
    engine = make_engine(block_size=4, num_blocks=32, max_num_batched_tokens=64)
    prefix = list(range(1, 13))
    params = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
    engine.generate([prefix + [50]], SamplingParams(temperature=0.0, max_tokens=2))  # leaves the prefix cached
    engine.add_request(prefix + [60, 61], params, request_id="a")
    engine.add_request([7, 8, 9, 10, 11], params, request_id="b")
    engine.step()
    engine.step()
    state = engine.scheduler.snapshot()
    check_scheduler(state)  # the unchanged snapshot is valid
    assert any(block.block_hash is not None for block in state.allocator.blocks)
    return state


def violated(invariant: str, snapshot: SchedulerSnapshot) -> None:
    with pytest.raises(InvariantViolation) as error:
        check_scheduler(snapshot)
    assert error.value.invariant == invariant


def with_allocator(snapshot: SchedulerSnapshot, **changes) -> SchedulerSnapshot:
    return replace(snapshot, allocator=replace(snapshot.allocator, **changes))


def test_free_block_still_referenced(snapshot: SchedulerSnapshot) -> None:
    used = snapshot.allocator.block_tables["a"][0]
    violated(
        inv.BLOCKS_PARTITIONED, with_allocator(snapshot, free_block_ids=(*snapshot.allocator.free_block_ids, used))
    )


def test_block_neither_free_nor_used(snapshot: SchedulerSnapshot) -> None:
    violated(inv.BLOCKS_PARTITIONED, with_allocator(snapshot, free_block_ids=snapshot.allocator.free_block_ids[1:]))


def test_ref_count_off_by_one(snapshot: SchedulerSnapshot) -> None:
    blocks = list(snapshot.allocator.blocks)
    target = snapshot.allocator.block_tables["b"][0]
    blocks[target] = replace(blocks[target], ref_count=2)
    violated(inv.REF_COUNT_MATCHES_TABLES, with_allocator(snapshot, blocks=tuple(blocks)))


def test_hashed_block_whose_content_changed(snapshot: SchedulerSnapshot) -> None:
    blocks = list(snapshot.allocator.blocks)
    index = next(b.block_id for b in blocks if b.block_hash is not None)
    content = blocks[index].token_ids
    assert content is not None
    blocks[index] = replace(blocks[index], token_ids=(content[0] + 1, *content[1:]))
    violated(inv.HASH_MAP_MATCHES_CONTENT, with_allocator(snapshot, blocks=tuple(blocks)))


def test_block_table_too_short(snapshot: SchedulerSnapshot) -> None:
    tables = dict(snapshot.allocator.block_tables)
    dropped = tables["b"][-1]
    tables["b"] = tables["b"][:-1]
    blocks = list(snapshot.allocator.blocks)
    blocks[dropped] = replace(blocks[dropped], ref_count=0)
    free = (*snapshot.allocator.free_block_ids, dropped)
    violated(
        inv.BLOCK_TABLE_COVERS_TOKENS,
        with_allocator(snapshot, block_tables=tables, blocks=tuple(blocks), free_block_ids=free),
    )


def test_prefix_hit_not_block_aligned(snapshot: SchedulerSnapshot) -> None:
    requests = dict(snapshot.requests)
    requests["a"] = replace(requests["a"], cached_tokens_at_admission=6)
    violated(inv.PREFIX_HIT_WHOLE_BLOCKS, replace(snapshot, requests=requests))


def test_prefix_hit_leaving_nothing_to_compute(snapshot: SchedulerSnapshot) -> None:
    requests = dict(snapshot.requests)
    requests["a"] = replace(requests["a"], cached_tokens_at_admission=16, tokens_at_admission=16)
    violated(inv.PREFIX_HIT_WHOLE_BLOCKS, replace(snapshot, requests=requests))


def test_request_in_two_queues(snapshot: SchedulerSnapshot) -> None:
    violated(inv.ONE_QUEUE_PER_REQUEST, replace(snapshot, waiting=("a",)))


def test_request_lost_from_both_queues(snapshot: SchedulerSnapshot) -> None:
    violated(inv.ONE_QUEUE_PER_REQUEST, replace(snapshot, running=("a",)))


def test_too_many_running(snapshot: SchedulerSnapshot) -> None:
    violated(inv.RUNNING_WITHIN_MAX_NUM_SEQS, replace(snapshot, config=replace(snapshot.config, max_num_seqs=1)))


def test_step_over_token_budget(snapshot: SchedulerSnapshot) -> None:
    requests = {rid: replace(state, num_scheduled_tokens=1) for rid, state in snapshot.requests.items()}
    tight = replace(snapshot.config, max_num_batched_tokens=1)
    violated(inv.STEP_WITHIN_TOKEN_BUDGET, replace(snapshot, requests=requests, config=tight))


def test_idle_engine_holding_blocks(snapshot: SchedulerSnapshot) -> None:
    idle = replace(snapshot, waiting=(), running=(), requests={})
    with pytest.raises(InvariantViolation) as error:
        check_scheduler(idle)
    assert error.value.invariant in (inv.IDLE_HOLDS_ONLY_CACHE, inv.BLOCK_TABLE_COVERS_TOKENS)


def test_monitor_catches_changed_hashed_block_and_double_finish(snapshot: SchedulerSnapshot) -> None:
    monitor = InvariantMonitor()
    monitor.observe_allocator(snapshot.allocator)
    blocks = list(snapshot.allocator.blocks)
    index = next(b.block_id for b in blocks if b.block_hash is not None)
    content = blocks[index].token_ids
    assert content is not None
    blocks[index] = replace(blocks[index], token_ids=tuple(reversed(content)))
    with pytest.raises(InvariantViolation):
        monitor.observe_allocator(replace(snapshot.allocator, blocks=tuple(blocks)))
    monitor.finished(["x"])
    with pytest.raises(InvariantViolation) as error:
        monitor.finished(["x"])
    assert error.value.invariant == inv.FINISHES_EXACTLY_ONCE


def test_allocator_check_alone(snapshot: SchedulerSnapshot) -> None:
    check_allocator(snapshot.allocator)
    with pytest.raises(InvariantViolation):
        check_allocator(replace(snapshot.allocator, cached_blocks={12345: 0}))
