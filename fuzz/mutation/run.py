"""A mutation run: each target's baseline, then its mutants, in N worker processes, the record
rewritten after every mutant.

Baselines first: a selection that fails unmutated would kill every mutant and prove nothing, so its
module is recorded as not run. Each mutant's time limit is TIMEOUT_FACTOR x its baseline's time plus
TIMEOUT_SLACK_S (a mutant that makes the tests loop is killed by it, and counts as killed). Mutants
are queued module by module, so a run stopped early leaves whole modules rather than a little of each.
"""

from __future__ import annotations

import logging
import multiprocessing
import subprocess
import time
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from concurrent.futures import TimeoutError as FuturesTimeout
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from fuzz.mutation.equivalent import load_equivalents
from fuzz.mutation.mutant_file import load_mutants
from fuzz.mutation.mutants import Mutant, mutants_of
from fuzz.mutation.record import RunRecord
from fuzz.mutation.targets import Target, load_targets, select
from fuzz.mutation.worker import SURVIVED, SelectionRun, preload, run_tests

logger = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_FACTOR = 3.0
TIMEOUT_SLACK_S = 15.0
BASELINE_TIMEOUT_S = 900.0


@dataclass(frozen=True)
class RunOptions:
    out: Path
    workers: int
    command: str
    modules: list[str] | None = None  # None: every target
    max_mutants: int | None = None  # per module, evenly spread (None: all of them)
    mutants_file: Path | None = None  # mutants saved by --save-mutants (None: made now, with cosmic-ray)
    time_limit_s: float | None = None  # stop queueing and write the record after this long
    root: Path = REPO_ROOT

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ValueError(f"workers must be at least 1, got {self.workers}")
        if self.max_mutants is not None and self.max_mutants < 1:
            raise ValueError(f"max_mutants must be at least 1, got {self.max_mutants}")


def run_mutation(options: RunOptions) -> RunRecord:
    targets = select(load_targets(options.root), options.modules)
    equivalents = load_equivalents()
    saved = None if options.mutants_file is None else load_mutants(options.mutants_file, options.root)
    record = RunRecord(options.out, options.command, *_git_state(options.root), workers=options.workers)
    deadline = None if options.time_limit_s is None else time.monotonic() + options.time_limit_s
    context = multiprocessing.get_context("spawn")  # workers start bare: no first-party module inherited
    with ProcessPoolExecutor(options.workers, mp_context=context, initializer=preload) as pool:
        root = str(options.root)
        baselines = {t.module: pool.submit(run_tests, root, t.tests, None, None, BASELINE_TIMEOUT_S) for t in targets}
        queued: dict[Future[SelectionRun], Mutant] = {}
        for target in targets:  # mutants are made while the baselines run
            made = mutants_of(options.root, target.module) if saved is None else saved.get(target.module)
            if made is None:
                raise ValueError(f"{options.mutants_file} holds no mutants of {target.module}")
            mutants = spread(made, options.max_mutants)
            baseline = baselines[target.module].result()
            record.add_module(target, baseline, len(mutants))
            record.write()
            if baseline.outcome == SURVIVED:
                queued.update(_queue(pool, root, target, baseline, mutants))
            else:
                logger.warning("%s: %s", target.module, record.modules[target.module].baseline)
        note = _collect(record, queued, equivalents, deadline)
        if note:
            for future in queued:
                future.cancel()
    record.write(complete=not note, note=note)
    return record


def _queue(
    pool: ProcessPoolExecutor, root: str, target: Target, baseline: SelectionRun, mutants: list[Mutant]
) -> dict[Future[SelectionRun], Mutant]:
    limit = TIMEOUT_FACTOR * baseline.seconds + TIMEOUT_SLACK_S
    return {pool.submit(run_tests, root, target.tests, m.module, m.source, limit): m for m in mutants}


def _collect(record: RunRecord, queued: dict, equivalents: dict, deadline: float | None) -> str:
    """Record each result as it comes; the note of an early stop ("" when every mutant ran)."""
    remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
    try:
        for future in tqdm(as_completed(queued, timeout=remaining), total=len(queued), desc="mutants"):
            mutant = queued[future]
            record.add(mutant, future.result(), equivalents.get(mutant.key))
            record.write()
    except FuturesTimeout:
        return "stopped at the run's time limit: the modules' counts cover the mutants done by then"
    return ""


def spread(mutants: list[Mutant], limit: int | None) -> list[Mutant]:
    """At most `limit` of `mutants`, evenly spread over the module (every operator and region alike)."""
    if limit is None or len(mutants) <= limit:
        return mutants
    step = len(mutants) / limit
    return [mutants[int(index * step)] for index in range(limit)]


def _git_state(root: Path) -> tuple[str | None, bool | None]:
    def git(*arguments: str) -> str | None:
        try:
            result = subprocess.run(["git", "-C", str(root), *arguments], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            return None
        return result.stdout.strip() if result.returncode == 0 else None

    status = git("status", "--porcelain", "--untracked-files=no")
    return git("rev-parse", "HEAD"), None if status is None else bool(status)
