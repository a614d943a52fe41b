"""The mutation-testing section: the committed records of `python -m fuzz.mutation`
(reports/results/mutation/*.json), each module's score against the target and every survivor's diff.

A module passes when at least TARGET_SCORE of its non-equivalent mutants were killed; a record that
stopped early (its time limit, or killed) says so, and its modules' counts cover what it did. The records
are kept in the order they were made (their `started` time), and a module is judged by the newest record
that judged it (`current_modules`): a re-run after new tests supersedes the run before, which stays listed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from reports.report.pytest_runs import REPO_ROOT
from reports.report.records import (
    MutationModule,
    MutationRun,
    MutationSection,
    MutationSurvivor,
    Status,
    combined_status,
)

COMMITTED_GLOB = "reports/results/mutation/*.json"
RECORD_KIND = "twinfer-mutation"
TARGET_SCORE = 0.95


def committed_mutation_section(root: Path = REPO_ROOT) -> MutationSection:
    paths = sorted(root.glob(COMMITTED_GLOB))
    if not paths:
        return MutationSection(Status.NOT_RUN, f"not run: no committed mutation record ({COMMITTED_GLOB})")
    runs: list[tuple[str, MutationRun]] = []  # (started, run): an unreadable record sorts first
    for path in paths:
        relative = str(path.relative_to(root))
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as error:
            runs.append(("", MutationRun(relative, Status.NOT_RUN, f"not run: unreadable record: {error}")))
            continue
        if record.get("kind") != RECORD_KIND:
            continue  # another record kept beside them
        runs.append((str(record.get("started") or ""), mutation_run_from_record(record, relative)))
    runs.sort(key=lambda started_run: (started_run[0], started_run[1].path))
    return _section(tuple(run for _, run in runs))


def mutation_run_from_record(record: dict[str, Any], path: str) -> MutationRun:
    modules = tuple(_module(entry) for entry in record.get("modules", []))
    survivors = tuple(
        MutationSurvivor(
            key=str(entry["key"]),
            module=str(entry["module"]),
            operator=str(entry["operator"]).removeprefix("core/"),
            line=int(entry["line"]),
            diff=str(entry["diff"]),
            equivalent=entry.get("equivalent"),
        )
        for entry in record.get("survivors", [])
    )
    return MutationRun(
        path=path,
        status=module_status(modules),
        detail=_detail(record, modules),
        command=str(record.get("command", "")),
        commit=str(record.get("git_commit") or ""),
        complete=bool(record.get("complete")),
        workers=int(record.get("workers") or 0),
        wall_time_s=record.get("wall_time_s"),
        totals={name: value for name, value in record.get("totals", {}).items() if value is not None},
        modules=modules,
        survivors=survivors,
    )


def module_passed(module: MutationModule) -> bool | None:
    """Whether the module meets the target (None: no mutant judged)."""
    return None if module.score is None else module.score >= TARGET_SCORE


def current_modules(runs: tuple[MutationRun, ...]) -> list[tuple[MutationRun, MutationModule]]:
    """Each module once, from the newest run (runs are oldest first) that judged it, else the newest that
    holds it; in the order the modules first appear."""
    current: dict[str, tuple[MutationRun, MutationModule]] = {}
    for run in runs:
        for module in run.modules:
            held = current.get(module.module)
            if held is None or module.score is not None or held[1].score is None:
                current[module.module] = (run, module)
    return list(current.values())


def module_status(modules: tuple[MutationModule, ...]) -> Status:
    verdicts = {True: Status.PASSED, False: Status.FAILED, None: Status.NOT_RUN}
    return combined_status(verdicts[module_passed(module)] for module in modules)


def _module(entry: dict[str, Any]) -> MutationModule:
    return MutationModule(
        module=str(entry["module"]),
        score=entry.get("score"),
        mutants=int(entry.get("mutants", 0)),
        done=int(entry.get("done", 0)),
        killed=int(entry.get("killed", 0)),
        survived=int(entry.get("survived", 0)),
        equivalent=int(entry.get("equivalent", 0)),
        errors=int(entry.get("errors", 0)),
        seconds=float(entry.get("seconds", 0.0)),
        baseline=str(entry.get("baseline", "")),
    )


def _detail(record: dict[str, Any], modules: tuple[MutationModule, ...]) -> str:
    totals = record.get("totals", {})
    below = [module.module for module in modules if module_passed(module) is False]
    parts = [
        f"{totals.get('killed', 0)} of {totals.get('killed', 0) + totals.get('survived', 0)} non-equivalent mutants "
        f"killed in {len(modules)} modules",
        f"{totals.get('equivalent', 0)} equivalent",
        f"{len(below)} below the {TARGET_SCORE:.0%} target" + (f" ({', '.join(below)})" if below else ""),
    ]
    if not record.get("complete"):
        parts.append(f"incomplete: {record.get('note') or 'the run was stopped'}")
    return "; ".join(parts)


def _section(runs: tuple[MutationRun, ...]) -> MutationSection:
    detail = "; ".join(f"{run.path}: {run.detail}" for run in runs) or "no mutation record"
    unread = [run.status for run in runs if not run.modules]  # unreadable records, records of no module
    current = module_status(tuple(module for _, module in current_modules(runs)))
    return MutationSection(combined_status([*unread, current]), detail, TARGET_SCORE, runs)
