"""The fuzzers have teeth: each planted bug is found and named; a few, one per machine, are shrunk to a short
counterexample too (SHRUNK_BUGS), which shows the shrinker works on each machine.

Every test runs a state machine over a buggy subclass of a real implementation (reference or
fast) and expects it to fail with the invariant or property the bug breaks. Property checks are
tested with the twin check off, so each shows what the invariants and properties catch on their
own; the twin check is tested on a policy deviation that breaks no invariant, and the check that
the implementations agree on a fast-implementation slip that only changes block ids.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.reporting import with_reporter
from hypothesis.stateful import RuleBasedStateMachine, run_state_machine_as_test

from fuzz import planted_bugs as bugs
from fuzz import planted_bugs_fast as fast_bugs
from fuzz import properties
from fuzz.allocator_machine import allocator_machine
from fuzz.implementations import (
    SCHEDULERS,
    AllocatorFactory,
    AllocatorImplementation,
    SchedulerFactory,
    SchedulerImplementation,
)
from fuzz.scheduler_machine import scheduler_machine
from fuzz.strategies import ignore
from spec import invariants
from spec.errors import InvariantViolation

MAX_SHRUNK_STEPS = 12

# Fixed, whatever the profile: deterministic and small enough for the ci time budget. Most of a
# test's time is shrinking (hundreds of replays of the failing run), so runs are kept short: 20 steps
# find every bug here (the slowest, "cached block reused after its content changed", after about 200
# examples) and the shorter the failing run, the fewer replays the shrinker makes.
PLANTED_BUG_SETTINGS = settings(
    max_examples=300,
    stateful_step_count=20,
    derandomize=True,
    database=None,
    deadline=None,
    print_blob=False,
    report_multiple_bugs=False,
    phases=(Phase.explicit, Phase.generate, Phase.shrink),  # no explain phase: it traces every line, slowly
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)
# Whether the fuzzer finds a bug is decided before shrinking starts: shrinking only shortens the failing run it
# found. It was 89 of the slowest test's 92 s (profiled), so only these bugs, one on each machine and cheap to
# shrink, are shrunk; the others stop at the first failing run, found by the same search (same examples, same
# settings: the generate phase is unchanged).
SHRUNK_BUGS = {
    "block table one block short",  # allocator machine, reference allocator
    "fast free queue pops its tail",  # allocator machine, fast allocator
    "prompt truncated by the token budget",  # scheduler machine, reference scheduler
    "fast hash chain extended from scratch",  # scheduler machine, fast scheduler
}
UNSHRUNK_SETTINGS = settings(PLANTED_BUG_SETTINGS, phases=(Phase.explicit, Phase.generate))


@dataclass(frozen=True)
class PlantedBug:
    name: str
    machine: Callable[[str], type[RuleBasedStateMachine]]  # stats label -> machine class
    expected: str  # the invariant or property that must catch it


def on_allocator(allocator_class: type) -> Callable[[str], type[RuleBasedStateMachine]]:
    build: AllocatorFactory = allocator_class
    implementation = AllocatorImplementation(allocator_class.__name__, build)
    return lambda label: allocator_machine((implementation,), stats_label=label)


def on_scheduler(scheduler_class: type, twin_check: bool = False) -> Callable[[str], type[RuleBasedStateMachine]]:
    build: SchedulerFactory = scheduler_class
    implementation = SchedulerImplementation(scheduler_class.__name__, build)
    return lambda label: scheduler_machine((implementation,), twin_check=twin_check, stats_label=label)


def beside_reference_scheduler(scheduler_class: type) -> Callable[[str], type[RuleBasedStateMachine]]:
    """The buggy scheduler side by side with the reference one, twin check off: only the check
    that the implementations agree can catch it."""
    build: SchedulerFactory = scheduler_class
    implementations = (SCHEDULERS["reference"], SchedulerImplementation(scheduler_class.__name__, build))
    return lambda label: scheduler_machine(implementations, twin_check=False, stats_label=label)


PLANTED_BUGS = (
    # allocator invariants, on the allocator machine
    PlantedBug(
        "block freed while still referenced", on_allocator(bugs.FreesBlocksStillHeld), invariants.BLOCKS_PARTITIONED
    ),
    PlantedBug(
        "ref count decremented twice", on_allocator(bugs.ReleasesSharedBlocksTwice), invariants.REF_COUNT_MATCHES_TABLES
    ),
    PlantedBug(
        "cached block reused after its content changed",
        on_allocator(bugs.ReusesCachedBlockWithoutEvicting),
        invariants.HASH_MAP_MATCHES_CONTENT,
    ),
    PlantedBug("prefix hit covering every token", on_allocator(bugs.HitsTheLastBlockToo), properties.MODEL_AGREEMENT),
    # scheduler invariants, on the scheduler machine
    PlantedBug(
        "cached block reused after its content changed (scheduler)",
        on_scheduler(bugs.scheduler_over(bugs.ReusesCachedBlockWithoutEvicting)),
        invariants.HASH_MAP_MATCHES_CONTENT,
    ),
    PlantedBug(
        "prefix hit not block-aligned", on_scheduler(bugs.NotBlockAlignedPrefixHit), invariants.PREFIX_HIT_WHOLE_BLOCKS
    ),
    PlantedBug(
        "sequence admitted past max_num_seqs",
        on_scheduler(bugs.AdmitsOnePastMaxNumSeqs),
        invariants.RUNNING_WITHIN_MAX_NUM_SEQS,
    ),
    PlantedBug(
        "token budget ignored for the last prompt",
        on_scheduler(bugs.IgnoresBudgetForLastPrompt),
        invariants.STEP_WITHIN_TOKEN_BUDGET,
    ),
    PlantedBug(
        "computed count kept on preemption",
        on_scheduler(bugs.KeepsComputedTokensOnPreemption),
        invariants.COMPUTED_WITHIN_TOKENS,
    ),
    PlantedBug(
        "block table one block short",
        on_scheduler(bugs.scheduler_over(bugs.FloorsBlockCount)),
        invariants.BLOCK_TABLE_COVERS_TOKENS,
    ),
    PlantedBug(
        "block registered without the hash chain",
        on_scheduler(bugs.scheduler_over(bugs.RegistersUnchainedHashes)),
        invariants.TABLE_CONTENT_MATCHES_REQUEST,
    ),
    PlantedBug(
        "finished requests reported again",
        on_scheduler(bugs.ReportsFinishedRequestsAgain),
        invariants.FINISHES_EXACTLY_ONCE,
    ),
    PlantedBug(
        "preempted request dropped from both queues",
        on_scheduler(bugs.DropsPreemptedRequests),
        invariants.ONE_QUEUE_PER_REQUEST,
    ),
    PlantedBug(
        "sequence lost when the running set exceeds max_num_seqs",
        on_scheduler(bugs.LosesSequencesPastMaxNumSeqs),
        invariants.ONE_QUEUE_PER_REQUEST,
    ),
    # properties beyond the spec invariants
    PlantedBug(
        "prompt truncated by the token budget", on_scheduler(bugs.TruncatesPromptToBudget), properties.CONSERVATION
    ),
    PlantedBug("long prompts never chunked", on_scheduler(bugs.NeverChunksNewPrompts), properties.LIVENESS),
    PlantedBug(
        "head of the waiting queue skipped",
        on_scheduler(bugs.SkipsHeadOfQueue, twin_check=True),
        properties.TWIN_DECISIONS,
    ),
    # the fast implementations' own structures
    PlantedBug(
        "fast free-queue unlink leaves a back link",
        on_allocator(fast_bugs.allocator_with_queue(fast_bugs.UnlinkLeavesBackLink)),
        invariants.BLOCKS_PARTITIONED,
    ),
    PlantedBug(
        "fast cached block reused without eviction",
        on_allocator(fast_bugs.KeepsCacheEntryOnReuse),
        properties.MODEL_AGREEMENT,
    ),
    PlantedBug(
        "fast hash chain extended from scratch",
        on_scheduler(fast_bugs.ChainsRestartWhenExtended),
        invariants.HASH_MAP_MATCHES_CONTENT,
    ),
    PlantedBug("fast oldest running request preempted", on_scheduler(fast_bugs.PreemptsTheOldest), properties.LIVENESS),
    PlantedBug(
        "fast free queue pops its tail",
        beside_reference_scheduler(
            fast_bugs.fast_scheduler_over(fast_bugs.allocator_with_queue(fast_bugs.PopsTheTail))
        ),
        properties.IMPLEMENTATIONS_AGREE,
    ),
)


def falsifying_steps(error: BaseException) -> int:
    """Steps of the counterexample hypothesis reports (its 'state.<rule>(...)' lines, teardown excluded)."""
    notes = "\n".join(getattr(error, "__notes__", []))
    return sum(1 for line in notes.splitlines() if line.startswith("state.") and not line.startswith("state.teardown"))


@pytest.mark.parametrize("bug", PLANTED_BUGS, ids=[bug.name.replace(" ", "-") for bug in PLANTED_BUGS])
def test_fuzzer_finds_planted_bug(bug: PlantedBug) -> None:
    machine = bug.machine(f"planted/{bug.name}")
    machine.expected_failure = bug.expected  # the search and the shrinker hold to this check's failures
    shrunk = bug.name in SHRUNK_BUGS
    with with_reporter(ignore), pytest.raises(InvariantViolation) as caught:
        run_state_machine_as_test(machine, settings=PLANTED_BUG_SETTINGS if shrunk else UNSHRUNK_SETTINGS)

    assert caught.value.invariant == bug.expected, f"caught by {caught.value.invariant!r}: {caught.value}"
    reported_steps = falsifying_steps(caught.value)
    most_steps = MAX_SHRUNK_STEPS if shrunk else PLANTED_BUG_SETTINGS.stateful_step_count
    assert 0 < reported_steps <= most_steps, f"counterexample of {reported_steps} steps:\n{caught.value.__notes__}"
    # The machine's own count of the last run (the final replay of the shrunk example) agrees.
    assert machine.last_run_steps == reported_steps
