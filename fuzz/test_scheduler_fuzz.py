"""Fuzz every registered scheduler side by side: spec invariants, conservation, liveness, the
same decisions and state from every implementation, and the twin check against the oracle
written from spec.scheduling."""

from __future__ import annotations

from hypothesis import settings
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
)
# ... and a run of the speculative machine (prompt lookup's drafts verified, kept and rolled back).
REQUIRED_SPECULATIVE_SITUATIONS = (
    "verify_chunks",
    "draft_tokens_accepted",
    "draft_tokens_rejected",
    "preemptions",
    "admissions_with_prefix_hit",
    "finished_stop",
    "implementation_comparisons",
    # The acceptance gates (spec.speculative.AcceptanceGate): pauses, probes, paused and large-step requests.
    "gate_pauses",
    "gate_probes",
    "gate_skipped_paused",
    "gate_skipped_large_step",
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


def test_schedulers_with_speculative_decoding_side_by_side_with_oracle_twin() -> None:
    """The same, with every engine configuration speculating (spec.scheduling step 2b, the verify update and
    its roll back): invariants, conservation (speculation changes no output), the same decisions from every
    implementation and the oracle's. A third of the plain run's examples: the CI time budget."""
    machine = scheduler_machine(tuple(SCHEDULERS.values()), twin_check=True, speculative=True)
    current = settings.get_profile(settings.get_current_profile_name())
    run_state_machine_as_test(machine, settings=settings(current, max_examples=max(1, current.max_examples // 3)))

    seen = stats.counters(machine.stats_label)
    missing = [situation for situation in REQUIRED_SPECULATIVE_SITUATIONS if not seen.get(situation)]
    assert not missing, f"the speculative scheduler fuzzer never reached {missing}: {seen}"
