"""The mutation run's JSON record, rewritten (atomically) after every mutant, so a run stopped at any
point still reports what it did: per module the mutants run, killed, survived and the score, and
each survivor's diff.

Score of a module: killed / (killed + survived), where a timeout counts as killed (the mutant made
the tests hang: they noticed) and survivors listed in equivalent.toml leave the count. Errors (pytest
could not run the selection: exit codes 3 to 5) are listed apart and count neither way.
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fuzz.mutation.equivalent import Equivalent
from fuzz.mutation.mutants import OPERATORS, Mutant
from fuzz.mutation.targets import Target
from fuzz.mutation.worker import ERROR, KILLED, SURVIVED, TIMEOUT, SelectionRun

RECORD_KIND = "twinfer-mutation"
SCHEMA_VERSION = 1


@dataclass
class ModuleTally:
    module: str
    tests: tuple[str, ...]
    baseline: str = "not run"  # "passed", or why the module's mutants were not run
    baseline_s: float | None = None
    mutants: int = 0  # made for this run
    done: int = 0
    killed: int = 0  # timeouts included
    timeout: int = 0
    survived: int = 0  # equivalent ones excluded
    equivalent: int = 0
    errors: int = 0
    seconds: float = 0.0  # worker time spent on its mutants

    @property
    def score(self) -> float | None:
        judged = self.killed + self.survived
        return round(self.killed / judged, 4) if judged else None

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "tests": list(self.tests), "seconds": round(self.seconds, 1), "score": self.score}


@dataclass(frozen=True)
class Survivor:
    key: str
    module: str
    operator: str
    line: int
    definition: str
    diff: str
    seconds: float
    equivalent: str | None  # the reason, where equivalent.toml lists it


@dataclass
class RunRecord:
    path: Path
    command: str
    commit: str | None
    dirty: bool | None
    workers: int
    modules: dict[str, ModuleTally] = field(default_factory=dict)
    survivors: list[Survivor] = field(default_factory=list)
    errors: list[dict[str, Any]] = field(default_factory=list)
    stale_equivalents: list[str] = field(default_factory=list)  # listed as equivalent, yet killed
    started: str = field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))
    _started_s: float = field(default_factory=time.monotonic)

    def add_module(self, target: Target, baseline: SelectionRun | None, mutants: int) -> None:
        tally = ModuleTally(target.module, target.tests, mutants=mutants)
        if baseline is not None:
            tally.baseline_s = round(baseline.seconds, 2)
            tally.baseline = "passed" if baseline.outcome == SURVIVED else _baseline_failure(baseline)
        self.modules[target.module] = tally

    def add(self, mutant: Mutant, run: SelectionRun, equivalent: Equivalent | None) -> None:
        tally = self.modules[mutant.module]
        tally.done += 1
        tally.seconds += run.seconds
        if run.outcome in (KILLED, TIMEOUT):
            tally.killed += 1
            tally.timeout += run.outcome == TIMEOUT
            if equivalent is not None:
                self.stale_equivalents.append(mutant.key)
        elif run.outcome == SURVIVED:
            if equivalent is None:
                tally.survived += 1
            else:
                tally.equivalent += 1
            reason = None if equivalent is None else equivalent.reason
            self.survivors.append(
                Survivor(
                    mutant.key,
                    mutant.module,
                    mutant.operator,
                    mutant.line,
                    mutant.definition,
                    mutant.diff,
                    run.seconds,
                    reason,
                )
            )
        else:
            tally.errors += 1
            self.errors.append(
                {"key": mutant.key, "module": mutant.module, "diff": mutant.diff, "exit_code": run.exit_code,
                 "output_tail": run.output_tail[-600:]}
            )  # fmt: skip

    def to_json(self, complete: bool, note: str = "") -> dict[str, Any]:
        tallies = list(self.modules.values())
        killed = sum(t.killed for t in tallies)
        survived = sum(t.survived for t in tallies)
        return {
            "kind": RECORD_KIND,
            "schema_version": SCHEMA_VERSION,
            "command": self.command,
            "git_commit": self.commit,
            "uncommitted_changes": self.dirty,
            "host": socket.gethostname(),
            "cpu_count": os.cpu_count(),
            "workers": self.workers,
            "started": self.started,
            "wall_time_s": round(time.monotonic() - self._started_s, 1),
            "complete": complete,
            "note": note,
            "operators": list(OPERATORS),
            "totals": {
                "mutants": sum(t.mutants for t in tallies),
                "done": sum(t.done for t in tallies),
                "killed": killed,
                "timeout": sum(t.timeout for t in tallies),
                "survived": survived,
                "equivalent": sum(t.equivalent for t in tallies),
                "errors": sum(t.errors for t in tallies),
                "score": round(killed / (killed + survived), 4) if killed + survived else None,
            },
            "modules": [tally.to_json() for tally in tallies],
            "survivors": [asdict(survivor) | {"seconds": round(survivor.seconds, 2)} for survivor in self.survivors],
            "errors": self.errors,
            "stale_equivalents": self.stale_equivalents,
        }

    def write(self, complete: bool = False, note: str = "") -> None:
        """Replace the file whole (write a sibling, then rename): a reader never sees half a record."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_name(self.path.name + ".partial")
        partial.write_text(json.dumps(self.to_json(complete, note), indent=1) + "\n", encoding="utf-8")
        os.replace(partial, self.path)


def _baseline_failure(run: SelectionRun) -> str:
    if run.outcome == TIMEOUT:
        return f"baseline did not finish within its limit ({run.seconds:.0f} s)"
    what = "failed" if run.outcome == KILLED else f"could not run (pytest exit code {run.exit_code})"
    assert run.outcome in (KILLED, ERROR)
    return f"baseline {what}: {run.output_tail[-300:]}"
