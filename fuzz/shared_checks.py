"""spec.invariants' checks at less cost, with the same verdicts: the state machines' largest cost is checking.

Two savings, each exact:

- A verdict shared by equal snapshots. `check_scheduler` and `check_allocator` are pure functions of the
  snapshot they are given, and each of their checks is a predicate over the snapshot's fields (the loops
  raise on any bad item, whatever the order of a dict): two equal snapshots (`==`, field by field, block ids,
  tokens and the hash function included) get the same verdict. The machines run every registered
  implementation side by side and require their snapshots to be equal after every call
  (properties.IMPLEMENTATIONS_AGREE), so the second implementation's snapshot is usually equal to the first's,
  which has just passed: `CheckedMonitor.observe_like` then runs only the checks that need history
  (hashed-block-immutable, the record of admitted requests) on its own monitor, and the stateless checks only
  if the snapshot differs. A snapshot that differs is checked in full, as before, so the order in which
  failures show is unchanged too (its invariants first, the disagreement after).
- Block hashes memoized. The checks recompute the chained hash of every registered block and of every running
  request's computed blocks at every snapshot, and the same blocks' hashes over and over. `spec.block_hash.
  hash_block` is a pure function of (parent hash, token ids) (xxh64 over their bytes), so a memo returns what
  the call would. Only that function is memoized: an allocator's snapshot that names any other hash function
  (a test's colliding one) is checked with it as it is. The allocators under test keep hashing for real:
  only the checks' recomputation is memoized, on a copy of the snapshot given to the monitor.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import TypeVar

from spec.block_hash import hash_block
from spec.invariants import AllocatorSnapshot, InvariantMonitor, SchedulerSnapshot, check_scheduler

T = TypeVar("T")

# Memo entries kept at most: cleared when full (a soak runs millions of steps; an example's blocks are few).
MAX_MEMOIZED_HASHES = 1 << 16
_hashes: dict[tuple[int, tuple[int, ...]], int] = {}


def memoized_hash_block(parent_hash: int, token_ids: Sequence[int]) -> int:
    """`hash_block(parent_hash, token_ids)`, computed once per distinct argument (it is a pure function)."""
    key = (parent_hash, token_ids if type(token_ids) is tuple else tuple(token_ids))
    value = _hashes.get(key)
    if value is None:
        if len(_hashes) >= MAX_MEMOIZED_HASHES:
            _hashes.clear()
        value = _hashes[key] = hash_block(parent_hash, token_ids)
    return value


def with_memoized_hash(snapshot: AllocatorSnapshot) -> AllocatorSnapshot:
    """The snapshot, its hash function memoized where that is spec.block_hash.hash_block (see the module)."""
    if snapshot.hash_function is not hash_block:
        return snapshot
    return _with_field(snapshot, "hash_function", memoized_hash_block)


def scheduler_with_memoized_hash(snapshot: SchedulerSnapshot) -> SchedulerSnapshot:
    allocator = with_memoized_hash(snapshot.allocator)
    return snapshot if allocator is snapshot.allocator else _with_field(snapshot, "allocator", allocator)


def _with_field(snapshot: T, name: str, value: object) -> T:
    """`dataclasses.replace(snapshot, name=value)` for the snapshots' frozen dataclasses, without re-running
    `__init__` over every field (replace's cost was a third of what the memo saved). The fields are
    plain attributes (no __post_init__, no slots), so a copy of them with one changed is what replace makes."""
    assert not hasattr(type(snapshot), "__post_init__") and name in _field_names(type(snapshot))
    clone = object.__new__(type(snapshot))
    clone.__dict__.update(snapshot.__dict__)
    object.__setattr__(clone, name, value)
    return clone


@functools.cache
def _field_names(cls: type) -> frozenset[str]:
    return frozenset(field.name for field in dataclasses.fields(cls))


class CheckedMonitor(InvariantMonitor):
    """An InvariantMonitor that can skip the stateless checks for a snapshot equal to one that passed them.

    `observe` is `check_scheduler` then the history checks (`_observe_history` here), and `observe_allocator` is
    `check_allocator` then `_observe_hashed_content`. fuzz/test_shared_checks.py holds this class to that: a
    monitor fed through it ends equal to one fed through `observe`, and a history violation is still raised."""

    def observe_like(self, snapshot: SchedulerSnapshot, passed: SchedulerSnapshot | None) -> bool:
        """`observe(snapshot)`; the stateless checks are skipped where `snapshot == passed`, a snapshot that
        passed them (their verdict is a function of the snapshot). Whether they ran."""
        if passed is not None and snapshot == passed:
            self._observe_history(snapshot)
            return False
        check_scheduler(scheduler_with_memoized_hash(snapshot))
        self._observe_history(snapshot)
        return True

    def observe_allocator_like(self, snapshot: AllocatorSnapshot, passed: AllocatorSnapshot | None) -> bool:
        """`observe_allocator(snapshot)`, skipping the stateless checks as `observe_like` does."""
        if passed is not None and snapshot == passed:
            self._observe_hashed_content(snapshot)
            return False
        super().observe_allocator(with_memoized_hash(snapshot))
        return True

    def _observe_history(self, snapshot: SchedulerSnapshot) -> None:
        """What InvariantMonitor.observe does after check_scheduler."""
        self._observe_hashed_content(snapshot.allocator)
        self._admitted.update(snapshot.running)
