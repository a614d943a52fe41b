"""Fuzz every registered block allocator against the spec invariants and the pool model."""

from __future__ import annotations

import pytest
from hypothesis.stateful import run_state_machine_as_test

from fuzz import stats
from fuzz.allocator_machine import allocator_machine
from fuzz.implementations import ALLOCATORS, AllocatorImplementation


@pytest.mark.parametrize("implementation", list(ALLOCATORS.values()), ids=list(ALLOCATORS))
def test_allocator_state_machine(implementation: AllocatorImplementation) -> None:
    machine = allocator_machine(implementation)
    run_state_machine_as_test(machine)

    # The run must have reached the situations the fuzzer exists for, or passing means little.
    seen = stats.counters(machine.stats_label)
    for situation in ("prefix_hit_blocks", "evictions", "admissions_refused", "growths_refused", "frees"):
        assert seen.get(situation, 0) > 0, f"the allocator fuzzer never reached {situation}: {seen}"
