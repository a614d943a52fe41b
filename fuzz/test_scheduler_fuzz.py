"""Fuzz every registered scheduler: spec invariants, conservation, liveness, and the twin check
against the oracle written from spec.scheduling."""

from __future__ import annotations

from hypothesis.stateful import run_state_machine_as_test

from fuzz import stats
from fuzz.implementations import SCHEDULERS
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


def test_registered_schedulers_side_by_side_with_oracle_twin() -> None:
    """Every registered scheduler is fed the same operations and held, step by step, to the
    oracle's decisions (so also to each other's). A failure names the implementation. The fast
    engine's scheduler joins this run by registering in fuzz/implementations.py."""
    assert SCHEDULERS, "no scheduler registered"
    machine = scheduler_machine(tuple(SCHEDULERS.values()), twin_check=True)
    run_state_machine_as_test(machine)

    seen = stats.counters(machine.stats_label)
    missing = [situation for situation in REQUIRED_SITUATIONS if not seen.get(situation)]
    assert not missing, f"the scheduler fuzzer never reached {missing}: {seen}"
