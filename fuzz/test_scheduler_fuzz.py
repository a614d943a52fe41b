"""Fuzz every registered scheduler side by side: spec invariants, conservation, liveness, the
same decisions and state from every implementation, and the twin check against the oracle
written from spec.scheduling."""

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
    "implementation_comparisons",
    "verify_chunks",
    "draft_tokens_accepted",
    "draft_tokens_rejected",
)


def test_registered_schedulers_side_by_side_with_oracle_twin() -> None:
    """Every registered scheduler (reference and fast) is fed the same operations and held, step
    by step, to the oracle's decisions and to each other's (plans, prefix hits, preemptions and
    block ids). A failure names the implementation."""
    assert len(SCHEDULERS) >= 2, f"the reference and fast schedulers should both be registered: {list(SCHEDULERS)}"
    machine = scheduler_machine(tuple(SCHEDULERS.values()), twin_check=True)
    run_state_machine_as_test(machine)

    seen = stats.counters(machine.stats_label)
    missing = [situation for situation in REQUIRED_SITUATIONS if not seen.get(situation)]
    assert not missing, f"the scheduler fuzzer never reached {missing}: {seen}"
