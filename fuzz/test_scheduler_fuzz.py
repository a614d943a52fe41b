"""Fuzz every registered scheduler: spec invariants, conservation, liveness, and the twin check
against the oracle written from spec.scheduling."""

from __future__ import annotations

import pytest
from hypothesis.stateful import run_state_machine_as_test

from fuzz import stats
from fuzz.implementations import SCHEDULERS, SchedulerImplementation
from fuzz.scheduler_machine import scheduler_machine

# What a run must have exercised for its pass to mean something.
REQUIRED_SITUATIONS = (
    "preemptions",
    "partial_prefill_chunks",
    "admissions_with_prefix_hit",
    "requests_rejected",
    "aborts",
    "drains",
    "finished_stop",
    "finished_length",
    "finished_abort",
)


@pytest.mark.parametrize("implementation", list(SCHEDULERS.values()), ids=list(SCHEDULERS))
def test_scheduler_state_machine_with_oracle_twin(implementation: SchedulerImplementation) -> None:
    machine = scheduler_machine((implementation,), twin_check=True)
    run_state_machine_as_test(machine)

    seen = stats.counters(machine.stats_label)
    missing = [situation for situation in REQUIRED_SITUATIONS if not seen.get(situation)]
    assert not missing, f"the scheduler fuzzer never reached {missing}: {seen}"


@pytest.mark.skipif(len(SCHEDULERS) < 2, reason="one scheduler registered: nothing to run side by side")
def test_all_schedulers_side_by_side() -> None:
    """Every registered scheduler fed the same operations, each held to the oracle's decisions."""
    run_state_machine_as_test(scheduler_machine(tuple(SCHEDULERS.values()), twin_check=True))
