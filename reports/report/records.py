"""The data a report is rendered from: typed, frozen records that become report.json.

Every section produces records; `Report.to_json()` turns them into plain JSON (the same shape
that `schema.json` describes), and the HTML is rendered from that JSON alone, so a kept
report.json can be rendered again or compared with another run.

Status of a check or a cell: "passed", "failed" or "not_run" (with the reason in `detail`).
A cell or section that could not run is always kept, with its reason: nothing silently vanishes.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

SCHEMA_VERSION = 1
REPORT_KIND = "twinfer-report"


class Status(enum.StrEnum):
    PASSED = "passed"
    FAILED = "failed"
    NOT_RUN = "not_run"


def combined_status(statuses: Iterable[Status]) -> Status:
    """Failed if any failed, else passed if any passed, else not run: the status of a group of checks."""
    seen = set(statuses)
    if Status.FAILED in seen:
        return Status.FAILED
    return Status.PASSED if Status.PASSED in seen else Status.NOT_RUN


# -- checks and figures: what the summary counts and what --compare matches across runs ------


@dataclass(frozen=True)
class Check:
    """One pass/fail/not-run verdict. `id` is stable across runs so --compare can match it."""

    id: str
    section: str
    title: str
    status: Status
    detail: str = ""


@dataclass(frozen=True)
class Figure:
    """One measured number. `spread` is its run-to-run spread in the same unit when it was measured
    (None: not measured); --compare marks a figure that moved by more than the larger spread."""

    id: str
    section: str
    title: str
    value: float
    unit: str
    spread: float | None = None
    better: str | None = None  # "higher", "lower" or None (neither is better)


# -- correctness -------------------------------------------------------------------------


@dataclass(frozen=True)
class TokenChoice:
    token_id: int
    text: str
    logprob: float | None


@dataclass(frozen=True)
class Disagreement:
    """Where two engines differ for one prompt: a different token (free-running), a different
    top-1 (teacher-forced), or a log-probability difference above the tolerance (fp32)."""

    prompt_index: int
    position: int  # generated-token index (free-running) or sequence position (teacher-forced)
    kind: str  # "token", "top1" or "logprob"
    allowed: bool  # allowed by the agreement rule (a near-tie in bf16/fp16)
    candidate: TokenChoice
    baseline: TokenChoice
    candidate_top: tuple[TokenChoice, ...]
    baseline_top: tuple[TokenChoice, ...]
    text_before: str
    candidate_text_after: str
    baseline_text_after: str
    logprob_error: float | None = None


@dataclass(frozen=True)
class ErrorDistribution:
    """Absolute log-probability errors over every compared position: quantiles and a histogram
    of log10(error), with errors of exactly 0 counted apart (log10 is undefined there)."""

    count: int
    zeros: int
    mean: float
    p50: float
    p90: float
    p99: float
    max: float
    log10_edges: tuple[float, ...]
    counts: tuple[int, ...]


@dataclass(frozen=True)
class Cell:
    """One cell of the correctness matrix: an engine pair x dtype x feature x mode."""

    id: str
    pair: str  # "candidate-baseline", e.g. "reference-hf"
    candidate: str
    baseline: str
    dtype: str
    feature: str
    mode: str  # "free-running" or "teacher-forced"
    status: Status
    detail: str  # the rule applied and the outcome, or why it did not run
    rule: str = ""
    feature_evidence: str = ""
    num_prompts: int = 0
    num_positions: int = 0
    max_logprob_error: float | None = None
    mean_logprob_error: float | None = None
    identical_prefix_lengths: tuple[int, ...] = ()  # free-running: per prompt, tokens before the first divergence
    max_new_tokens: int = 0
    # teacher-forced: positions where the top-1 had to agree (all in fp32; above the fp32 margin otherwise)
    top1_checked_positions: int | None = None
    error_distribution: ErrorDistribution | None = None  # teacher-forced
    num_disagreements: int = 0
    disagreements: tuple[Disagreement, ...] = ()  # the first few, in prompt order
    seconds: float = 0.0


@dataclass(frozen=True)
class PromptRecord:
    index: int
    kind: str  # "text" (a text prompt, tokenized) or "token ids" (drawn ids, whose decoded bytes are noise)
    text: str  # the text prompt, or the first token ids written out (user-controlled: always escaped in the page)
    num_tokens: int


@dataclass(frozen=True)
class CorrectnessSection:
    status: Status
    detail: str
    model: str
    pairs: tuple[str, ...]
    dtypes: tuple[str, ...]
    features: tuple[str, ...]
    modes: tuple[str, ...]
    prompts: tuple[PromptRecord, ...]
    cells: tuple[Cell, ...]


# -- fuzzing -------------------------------------------------------------------------------


@dataclass(frozen=True)
class PlantedBug:
    name: str
    caught: bool | None  # None: the record does not say


@dataclass(frozen=True)
class FuzzMachine:
    label: str
    counters: dict[str, int]


@dataclass(frozen=True)
class FuzzRun:
    """One fuzz session: run now with the `ci` profile, or a committed deep-run record."""

    source: str  # "ci run" or "committed record"
    path: str  # where the record came from (repository-relative for committed records)
    status: Status
    detail: str
    profile: str = ""
    command: str = ""
    commit: str = ""
    wall_time_s: float | None = None
    totals: dict[str, int] = field(default_factory=dict)
    planted_bugs: tuple[PlantedBug, ...] = ()
    machines: tuple[FuzzMachine, ...] = ()


@dataclass(frozen=True)
class FuzzSection:
    status: Status
    detail: str
    runs: tuple[FuzzRun, ...]


# -- mutation testing ----------------------------------------------------------------------


@dataclass(frozen=True)
class MutationModule:
    """One mutated module of a mutation record: its mutants' outcomes (`python -m fuzz.mutation`)."""

    module: str
    score: float | None  # killed / (killed + survived), equivalent survivors left out; None: none judged
    mutants: int
    done: int
    killed: int
    survived: int
    equivalent: int
    errors: int
    seconds: float  # worker time spent on its mutants
    baseline: str  # "passed", or why its mutants were not run


@dataclass(frozen=True)
class MutationSurvivor:
    key: str
    module: str
    operator: str
    line: int
    diff: str
    equivalent: str | None  # the reason, where the mutant is recorded as equivalent


@dataclass(frozen=True)
class MutationRun:
    """One committed mutation record (reports/results/mutation/*.json)."""

    path: str
    status: Status
    detail: str
    command: str = ""
    commit: str = ""
    complete: bool = False
    workers: int = 0
    wall_time_s: float | None = None
    totals: dict[str, float] = field(default_factory=dict)
    modules: tuple[MutationModule, ...] = ()
    survivors: tuple[MutationSurvivor, ...] = ()


@dataclass(frozen=True)
class MutationSection:
    status: Status
    detail: str
    target_score: float = 0.95
    runs: tuple[MutationRun, ...] = ()


# -- kernels -------------------------------------------------------------------------------


@dataclass(frozen=True)
class PytestFileSummary:
    file: str
    passed: int
    failed: int
    skipped: int
    errors: int


@dataclass(frozen=True)
class PytestFailure:
    test: str
    message: str


@dataclass(frozen=True)
class KernelSection:
    status: Status
    detail: str
    command: str = ""
    wall_time_s: float | None = None
    files: tuple[PytestFileSummary, ...] = ()
    failures: tuple[PytestFailure, ...] = ()


# -- speed ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class SpeedRow:
    """One engine's figure in one bench record. The fields after `fraction_of_limit` say where the
    figure comes from; reports made before they existed lack them (None when read back)."""

    engine: str
    value: float
    spread: float | None = None
    fraction_of_limit: float | None = None  # of the measured bandwidth or matmul ceiling
    # The record's label: its twinfer engine settings as `twinfer bench` flags ("no flags (defaults)"), then
    # what tells it from another record with the same settings in the table (its commit, else its file).
    settings: str | None = None
    phase: str | None = None  # the workload's phase (decode-sweep: "batch-8")
    times_baseline: float | None = None  # how many times faster than transformers in the same record
    commit: str | None = None
    gpu: str | None = None
    record: str | None = None  # the bench JSON file (None: measured by this run)


@dataclass(frozen=True)
class SpeedTable:
    workload: str
    metric: str
    unit: str
    better: str  # "higher" or "lower"
    rows: tuple[SpeedRow, ...]
    note: str = ""
    status: Status = Status.PASSED  # failed where the workload checks something (prefix-shared: identical outputs)
    shape: str | None = None  # the model shape of every row (None in reports made before tables had one)


@dataclass(frozen=True)
class SettingCost:
    """What turning an engine setting on costs on one workload: the same figure from two records of one
    commit, GPU and shape whose engine settings differ only in `setting`. `cost_percent` is how much
    worse the figure is with it on, in percent of the figure with it off: time per token added, or
    tokens/s lost."""

    setting: str  # the EngineConfig field, e.g. "batch_invariant"
    workload: str
    shape: str
    phase: str
    metric: str
    unit: str
    better: str
    engine: str
    settings: str  # the other settings both records share, as flags
    off: float
    on: float
    cost_percent: float
    commit: str | None
    gpu: str | None
    records: tuple[str, ...]  # the bench JSON files (on, off); empty where this run measured them

    def __post_init__(self) -> None:
        if self.off <= 0 or self.on <= 0:
            raise ValueError(f"a setting's cost needs positive figures, got on {self.on}, off {self.off}")


@dataclass(frozen=True)
class Series:
    label: str
    x: tuple[float, ...]
    y: tuple[float, ...]


@dataclass(frozen=True)
class SpeedPlot:
    id: str
    title: str
    x_label: str
    y_label: str
    series: tuple[Series, ...]
    log_x: bool = False
    log_y: bool = False  # absent in reports made before plots had it


@dataclass(frozen=True)
class SpeedSection:
    status: Status
    detail: str
    tables: tuple[SpeedTable, ...] = ()
    plots: tuple[SpeedPlot, ...] = ()
    environment: dict[str, str] = field(default_factory=dict)
    costs: tuple[SettingCost, ...] = ()


# -- the whole report ----------------------------------------------------------------------


@dataclass(frozen=True)
class RunSettings:
    model: str
    device: str
    dtypes: tuple[str, ...]
    quick: bool
    command: str


@dataclass(frozen=True)
class Report:
    created: str  # ISO 8601, UTC
    commit: str | None
    commit_dirty: bool | None
    settings: RunSettings
    environment: dict[str, str]
    checks: tuple[Check, ...]
    figures: tuple[Figure, ...]
    correctness: CorrectnessSection
    fuzz: FuzzSection
    kernels: KernelSection
    speed: SpeedSection
    mutation: MutationSection = MutationSection(Status.NOT_RUN, "not run")

    def summary(self) -> dict[str, int]:
        return count_statuses(self.checks)

    def to_json(self) -> dict[str, Any]:
        body = _plain(self)
        return {"schema_version": SCHEMA_VERSION, "kind": REPORT_KIND, "summary": self.summary(), **body}


def count_statuses(checks: tuple[Check, ...] | list[Check]) -> dict[str, int]:
    counts = {status.value: 0 for status in Status}
    for check in checks:
        counts[Status(check.status).value] += 1
    return counts


def _plain(value: Any) -> Any:
    """Records to JSON values: dataclasses to objects, tuples to lists, enums to their value."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if isinstance(value, dict):
        return {str(key): _plain(item) for key, item in value.items()}
    return value
