"""The soak (fuzz/soak.py) and its driver (fuzz/random_driver.py, fuzz/fast_draws.py): a short soak
sums its processes' counters into soak.json and reaches what the pytest runs must reach; the driver
catches a planted bug and replays it from its seed."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from fuzz import planted_bugs, stats
from fuzz.allocator_machine import allocator_machine
from fuzz.implementations import ALLOCATORS, AllocatorImplementation
from fuzz.random_driver import run_example
from fuzz.soak import SUMMARY_FILE, SoakOptions, run_soak, soak_process, summarise
from fuzz.test_allocator_fuzz import REQUIRED_SITUATIONS as ALLOCATOR_SITUATIONS
from spec.errors import InvariantViolation

SCHEDULER_SITUATIONS = ("preemptions", "partial_prefill_chunks", "admissions_with_prefix_hit", "finished_stop")


def test_a_soak_process_reaches_the_fuzzers_situations_and_its_counters_are_summed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One process's share, run here (a spawned process costs seconds of imports: see the test below),
    with counters of its own, as a spawned process has."""
    monkeypatch.setattr(stats, "_COUNTERS", defaultdict(Counter))
    options = SoakOptions(processes=1, steps=400, out=tmp_path, time_limit_s=60.0)
    soak_process(0, 7, options.steps, options)
    summary = summarise(options, "pytest", started=0.0, finished=True)
    assert summary["result"] == "passed" and not summary["failures"]
    assert summary["steps"] >= 400 and summary["examples"] >= 8
    allocator, scheduler = (summary["machines"][label] for label in sorted(summary["machines"]))
    assert allocator["examples"] + scheduler["examples"] == summary["examples"]
    assert all(allocator.get(name) for name in ALLOCATOR_SITUATIONS), allocator
    assert all(scheduler.get(name) for name in SCHEDULER_SITUATIONS), scheduler
    assert scheduler["twin_comparisons"] and scheduler["implementation_comparisons"]


def test_a_soak_in_two_processes_writes_its_summary(tmp_path: Path) -> None:
    options = SoakOptions(processes=2, steps=600, out=tmp_path, time_limit_s=120.0, seed=7)
    summary = run_soak(options, "pytest")
    assert json.loads((tmp_path / SUMMARY_FILE).read_text()) == summary
    assert summary["result"] == "passed" and summary["finished"] and summary["steps"] >= 600
    assert len(summary["seeds"]) == 2 and summary["totals"]["steps"] == summary["steps"]


def test_the_driver_catches_a_planted_bug_and_replays_it_from_its_seed() -> None:
    buggy = AllocatorImplementation("frees blocks still held", planted_bugs.FreesBlocksStillHeld)
    machine = allocator_machine((ALLOCATORS["reference"], buggy), stats_label="planted/soak driver")
    for seed in range(200):
        try:
            run_example(machine, seed, 50)
        except InvariantViolation as failure:
            first = failure
            break
    else:
        pytest.fail(f"200 examples never caught the planted bug: {stats.counters('planted/soak driver')}")
    with pytest.raises(InvariantViolation) as again:
        run_example(machine, seed, 50)
    assert again.value.invariant == first.invariant and again.value.trace.steps == first.trace.steps  # type: ignore[attr-defined]
