"""fuzz/shared_checks.py gives the spec checks' verdicts exactly: its monitor keeps InvariantMonitor's history,
a snapshot unequal to the one that passed is checked in full, and the memoized hash is the hash."""

from __future__ import annotations

from dataclasses import replace

import pytest

from fuzz.shared_checks import CheckedMonitor, memoized_hash_block, scheduler_with_memoized_hash, with_memoized_hash
from fuzz.workload import EOS_TOKEN_IDS, RequestScript, fake_model_step
from reference.scheduler import Scheduler
from spec import invariants as inv
from spec.block_hash import hash_block
from spec.engine_config import EngineConfig
from spec.errors import InvariantViolation
from spec.invariants import InvariantMonitor, SchedulerSnapshot


def scheduler_snapshots() -> list[SchedulerSnapshot]:
    """A real run's snapshots after every schedule and update: shared prefixes (cached blocks), preemptions."""
    config = EngineConfig(block_size=2, num_blocks=8, max_num_seqs=3, max_num_batched_tokens=6, max_model_len=64)
    scheduler = Scheduler(config, EOS_TOKEN_IDS)
    scripts = {
        f"r{index}": RequestScript(f"r{index}", (1, 2, 3, 1, 2, index % 4), max_tokens=6, ignore_eos=True)
        for index in range(4)
    }
    for arrival, script in enumerate(scripts.values()):
        scheduler.add(script.new_request(arrival))
    snapshots = []
    while scheduler.has_unfinished:
        plan = scheduler.schedule()
        snapshots.append(scheduler.snapshot())
        scheduler.update(plan, fake_model_step(plan, scripts))
        snapshots.append(scheduler.snapshot())
    assert any(block.block_hash is not None for snapshot in snapshots for block in snapshot.allocator.blocks)
    return snapshots


def test_shared_verdicts_keep_the_monitors_history() -> None:
    """Fed the same snapshots, checked in full or sharing a verdict, the monitor ends as InvariantMonitor does."""
    snapshots = scheduler_snapshots()
    plain, full, shared = InvariantMonitor(), CheckedMonitor(), CheckedMonitor()
    allocator_plain, allocator_shared = InvariantMonitor(), CheckedMonitor()
    for snapshot in snapshots:
        plain.observe(snapshot)
        assert full.observe_like(snapshot, None)
        assert not shared.observe_like(snapshot, replace(snapshot))  # equal, not the same object
        allocator_plain.observe_allocator(snapshot.allocator)
        assert not allocator_shared.observe_allocator_like(snapshot.allocator, replace(snapshot.allocator))
    assert vars(full) == vars(plain) and vars(shared) == vars(plain)
    assert vars(allocator_shared) == vars(allocator_plain)


def test_a_changed_hashed_block_is_caught_with_a_shared_verdict() -> None:
    snapshot = next(s for s in scheduler_snapshots() if any(b.block_hash is not None for b in s.allocator.blocks))
    blocks = list(snapshot.allocator.blocks)
    index = next(block.block_id for block in blocks if block.block_hash is not None)
    blocks[index] = replace(blocks[index], token_ids=tuple(reversed(blocks[index].token_ids or ())) + (99,))
    changed = replace(snapshot, allocator=replace(snapshot.allocator, blocks=tuple(blocks)))
    for observe in (
        lambda monitor: monitor.observe_like(changed, changed),
        lambda monitor: monitor.observe_allocator_like(changed.allocator, changed.allocator),
    ):
        monitor = CheckedMonitor()
        monitor.observe_like(snapshot, None)
        with pytest.raises(InvariantViolation) as error:
            observe(monitor)
        assert error.value.invariant == inv.HASHED_BLOCK_IMMUTABLE


def test_a_snapshot_unlike_the_one_that_passed_is_checked_in_full() -> None:
    snapshot = scheduler_snapshots()[0]
    blocks = list(snapshot.allocator.blocks)
    held = snapshot.allocator.block_tables[snapshot.running[0]][0]
    blocks[held] = replace(blocks[held], ref_count=blocks[held].ref_count + 1)
    broken = replace(snapshot, allocator=replace(snapshot.allocator, blocks=tuple(blocks)))
    with pytest.raises(InvariantViolation) as error:
        CheckedMonitor().observe_like(broken, snapshot)
    assert error.value.invariant == inv.REF_COUNT_MATCHES_TABLES
    with pytest.raises(InvariantViolation):
        CheckedMonitor().observe_allocator_like(broken.allocator, snapshot.allocator)


def test_the_memoized_hash_is_the_hash_and_only_replaces_it() -> None:
    for parent in (0, 1, 2**64 - 1):
        for tokens in ((), (0,), (1, 2, 3, 4), [5, 6]):
            assert memoized_hash_block(parent, tokens) == hash_block(parent, tokens)
            assert memoized_hash_block(parent, tokens) == hash_block(parent, tokens)  # from the memo
    snapshot = scheduler_snapshots()[-1]
    memoized = scheduler_with_memoized_hash(snapshot)
    assert memoized.allocator.hash_function is memoized_hash_block
    assert memoized == replace(snapshot, allocator=replace(snapshot.allocator, hash_function=memoized_hash_block))
    assert snapshot.allocator.hash_function is hash_block  # the original is left alone

    def colliding(parent: int, tokens: object) -> int:
        return 7

    other = replace(snapshot.allocator, hash_function=colliding)
    assert with_memoized_hash(other) is other
