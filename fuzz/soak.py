"""`python -m fuzz.soak`: the allocator and scheduler state machines at scale, in N processes.

Each process runs both machines (every registered implementation side by side, the scheduler's
oracle twin included) example after example, alternating, with random seeds drawn from its own
seed, until its share of `--steps` or its own time limit; it rewrites its statistics file
(`process-<i>.json`: fuzz/stats.py's counters, examples, steps, seconds, failures) after every
example. The parent sums the process files into `soak.json` every few seconds and at the end, so a
killed run still reports. A failure (a check that raised) is recorded with its seed and the rules run,
which replay it (fuzz/random_driver.py), and ends that process.

Examples are driven by fuzz/random_driver.py, not hypothesis's engine: the same rules and checks, without
shrinking (the pytest runs of the same machines keep it), at 4.3 times the steps per second on the allocator
machine and 1.1 times on the scheduler machine, whose own checks are most of its cost
(reports/results/fuzz/soak_local_2core/COMMAND.txt). Those checks cost less since, with the same verdicts
(fuzz/shared_checks.py): before and after in reports/results/fuzz/speed/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing
import os
import random
import shlex
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

MACHINES = ("allocator", "scheduler")
SUMMARY_EVERY_S = 5.0
PROCESS_FILE = "process-{index}.json"
SUMMARY_FILE = "soak.json"
FAILURE_STEPS_KEPT = 60


@dataclass(frozen=True)
class SoakOptions:
    processes: int
    steps: int  # rules run, summed over processes
    out: Path
    time_limit_s: float  # each process's own limit
    steps_per_example: int = 50
    seed: int | None = None  # None: drawn from the OS

    def __post_init__(self) -> None:
        if self.processes < 1 or self.steps < 1 or self.steps_per_example < 1:
            raise ValueError(f"processes, steps and steps_per_example must be positive: {self}")
        if self.time_limit_s <= 0:
            raise ValueError(f"time_limit_s must be positive, got {self.time_limit_s}")


def machine_classes() -> dict[str, type]:
    """The machines a soak runs, built as the pytest runs build them (so their counters' labels match)."""
    from fuzz.allocator_machine import allocator_machine
    from fuzz.implementations import ALLOCATORS, SCHEDULERS
    from fuzz.scheduler_machine import scheduler_machine

    return {
        "allocator": allocator_machine(tuple(ALLOCATORS.values())),
        "scheduler": scheduler_machine(tuple(SCHEDULERS.values()), twin_check=True),
    }


def soak_process(index: int, seed: int, steps: int, options: SoakOptions) -> None:
    """One process's share: examples until `steps` rules ran or its time ran out."""
    from fuzz import stats
    from fuzz.random_driver import run_example

    machines = machine_classes()
    rng = random.Random(seed)
    started = time.monotonic()
    state: dict[str, Any] = {"index": index, "seed": seed, "target_steps": steps, "failures": [], "examples": 0}
    state["seconds_by_machine"] = {name: 0.0 for name in MACHINES}  # where the time goes: steps/s per machine
    path = options.out / PROCESS_FILE.format(index=index)
    done = 0
    while done < steps and time.monotonic() - started < options.time_limit_s:
        name = MACHINES[state["examples"] % len(MACHINES)]
        example_seed = rng.getrandbits(64)
        before = stats.counters(machines[name].stats_label).get("steps", 0)
        example_started = time.monotonic()
        try:
            run_example(machines[name], example_seed, options.steps_per_example)
        except Exception as failure:  # a check failed: record how to replay it, stop this process
            state["failures"].append(_failure(name, example_seed, failure))
            break
        finally:
            state["seconds_by_machine"][name] += time.monotonic() - example_started
            done += stats.counters(machines[name].stats_label).get("steps", 0) - before
            state["examples"] += 1
            _write(path, {**state, "steps": done, "seconds": round(time.monotonic() - started, 2),
                          "machines": stats.all_counters()})  # fmt: skip


def _failure(machine: str, seed: int, failure: Exception) -> dict[str, Any]:
    trace = getattr(failure, "trace", None)
    return {
        "machine": machine,
        "seed": seed,
        "invariant": getattr(failure, "invariant", None),
        "error": "".join(traceback.format_exception_only(failure)).strip()[-2000:],
        "steps": trace.steps[-FAILURE_STEPS_KEPT:] if trace else [],
        "replay": f"fuzz.random_driver.run_example(fuzz.soak.machine_classes()[{machine!r}], {seed}, ...)",
    }


def summarise(options: SoakOptions, command: str, started: float, finished: bool) -> dict[str, Any]:
    """The process files summed: counters per machine, steps, examples, failures."""
    from fuzz import stats_report

    processes = []
    for path in sorted(options.out.glob(PROCESS_FILE.format(index="*"))):
        try:
            processes.append(json.loads(path.read_text()))
        except (OSError, json.JSONDecodeError):
            continue  # being replaced right now: the next summary reads it
    machines: dict[str, dict[str, int]] = {}
    for process in processes:
        for label, counters in process.get("machines", {}).items():
            summed = machines.setdefault(label, {})
            for counter, value in counters.items():
                summed[counter] = summed.get(counter, 0) + value
    failures = [failure for process in processes for failure in process.get("failures", [])]
    labels = {name: machine.stats_label for name, machine in machine_classes().items()}
    busy = {name: sum(p.get("seconds_by_machine", {}).get(name, 0.0) for p in processes) for name in MACHINES}
    wall = time.monotonic() - started
    steps = sum(process.get("steps", 0) for process in processes)
    return {
        "kind": "twinfer-soak",
        "command": command,
        "git_commit": stats_report._git_commit(),
        "host_cpus": os.cpu_count(),
        "processes": options.processes,
        "target_steps": options.steps,
        "steps_per_example": options.steps_per_example,
        "time_limit_s": options.time_limit_s,
        "finished": finished,
        "result": "failed" if failures else ("passed" if finished else "running"),
        "wall_time_s": round(wall, 1),
        "steps": steps,
        "examples": sum(process.get("examples", 0) for process in processes),
        "steps_per_second": round(steps / wall, 1) if wall > 0 else None,
        "steps_per_second_per_process": [round(p["steps"] / p["seconds"], 1) for p in processes if p.get("seconds")],
        "steps_per_busy_second_by_machine": {
            name: round(machines.get(labels[name], {}).get("steps", 0) / busy[name], 1) if busy[name] else None
            for name in MACHINES
        },
        "totals": stats_report.totals(machines),
        "machines": dict(sorted(machines.items())),
        "failures": failures,
        "seeds": [process.get("seed") for process in processes],
    }


def run_soak(options: SoakOptions, command: str, progress: Callable[[int], None] | None = None) -> dict[str, Any]:
    options.out.mkdir(parents=True, exist_ok=True)
    for stale in options.out.glob(PROCESS_FILE.format(index="*")):
        stale.unlink()
    master = random.Random(options.seed)
    shares = [
        options.steps // options.processes + (i < options.steps % options.processes) for i in range(options.processes)
    ]
    context = multiprocessing.get_context("spawn")
    workers = [
        context.Process(target=soak_process, args=(i, master.getrandbits(64), share, options), daemon=True)
        for i, share in enumerate(shares)
    ]
    started = time.monotonic()
    for worker in workers:
        worker.start()
    while any(worker.is_alive() for worker in workers):
        for worker in workers:
            worker.join(timeout=SUMMARY_EVERY_S / len(workers))
        summary = summarise(options, command, started, finished=False)
        _write(options.out / SUMMARY_FILE, summary)
        if progress is not None:
            progress(summary["steps"])
    summary = summarise(options, command, started, finished=True)
    _write(options.out / SUMMARY_FILE, summary)
    return summary


def _write(path: Path, content: dict[str, Any]) -> None:
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(content, indent=1) + "\n")
    os.replace(partial, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fuzz.soak", description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=os.cpu_count() or 1, help="processes (default: cores)")
    parser.add_argument("--steps", type=int, required=True, help="rules to run, summed over processes")
    parser.add_argument("--out", type=Path, required=True, help="directory for soak.json and the process files")
    parser.add_argument("--time-limit-s", type=float, default=600.0, help="each process's limit (default 600)")
    parser.add_argument("--steps-per-example", type=int, default=50, help="rules per example (default 50)")
    parser.add_argument("--seed", type=int, help="seed of the processes' seeds (default: random)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    options = SoakOptions(args.processes, args.steps, args.out, args.time_limit_s, args.steps_per_example, args.seed)
    command = shlex.join(["python", "-m", "fuzz.soak", *(argv if argv is not None else sys.argv[1:])])
    from tqdm import tqdm

    with tqdm(total=options.steps, desc="soak steps", unit="step") as bar:
        summary = run_soak(options, command, lambda steps: bar.update(steps - bar.n))
    print(
        f"{summary['result']}: {summary['steps']:,} steps, {summary['examples']:,} examples "
        f"in {summary['wall_time_s']} s "
        f"({summary['steps_per_second']} steps/s over {options.processes} processes), "
        f"{len(summary['failures'])} failures: {options.out / SUMMARY_FILE}"
    )
    return 1 if summary["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
