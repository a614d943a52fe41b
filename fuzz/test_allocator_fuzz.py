"""Fuzz every registered block allocator, side by side: spec invariants, the pool model, and
the same answers and state (block ids included) from every implementation at every step."""

from __future__ import annotations

from hypothesis.stateful import run_state_machine_as_test

from fuzz import stats
from fuzz.allocator_machine import allocator_machine
from fuzz.implementations import ALLOCATORS

REQUIRED_SITUATIONS = ("prefix_hit_blocks", "evictions", "admissions_refused", "growths_refused", "frees")


def test_registered_allocators_side_by_side() -> None:
    assert len(ALLOCATORS) >= 2, f"the reference and fast allocators should both be registered: {list(ALLOCATORS)}"
    machine = allocator_machine(tuple(ALLOCATORS.values()))
    run_state_machine_as_test(machine)

    # The run must have reached the situations the fuzzer exists for, or passing means little.
    seen = stats.counters(machine.stats_label)
    missing = [situation for situation in REQUIRED_SITUATIONS if not seen.get(situation)]
    assert not missing, f"the allocator fuzzer never reached {missing}: {seen}"
    assert seen.get("implementation_comparisons"), f"the implementations were never compared: {seen}"
