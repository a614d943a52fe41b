"""The sections of a run, put together as a Report: the flat list of checks the summary counts and
--compare matches, the figures --compare follows, the environment and the commit."""

from __future__ import annotations

import platform
import statistics
from dataclasses import replace
from datetime import UTC, datetime

import torch

from reports.report.mutation_section import current_modules
from reports.report.records import (
    Cell,
    Check,
    CorrectnessSection,
    Figure,
    FuzzRun,
    FuzzSection,
    KernelSection,
    MutationSection,
    Report,
    RunSettings,
    SpeedSection,
    Status,
)


def assemble_report(
    settings: RunSettings,
    correctness: CorrectnessSection,
    fuzz: FuzzSection,
    kernels: KernelSection,
    speed: SpeedSection,
    device: torch.device,
    mutation: MutationSection | None = None,
    commit: str | None = None,
) -> Report:
    """commit: the commit under test, where git here cannot say (a device's copy of the tree carries stale git
    metadata); whether the tree differs from it is then unknown. None: `git rev-parse HEAD` and `git status`."""
    from reports.bench import device as bench_device

    return report_of_sections(
        created=datetime.now(UTC).isoformat(timespec="seconds"),
        commit=commit or bench_device.git_commit(),
        commit_dirty=None if commit else bench_device.git_has_uncommitted_changes(),
        settings=settings,
        environment=environment(device),
        correctness=correctness,
        fuzz=fuzz,
        kernels=kernels,
        speed=speed,
        mutation=mutation,
    )


def report_of_sections(
    created: str,
    commit: str | None,
    commit_dirty: bool | None,
    settings: RunSettings,
    environment: dict[str, str],
    correctness: CorrectnessSection,
    fuzz: FuzzSection,
    kernels: KernelSection,
    speed: SpeedSection,
    mutation: MutationSection | None = None,
) -> Report:
    """The Report of these sections, with the checks and figures they give (the one place that derives them)."""
    return Report(
        created=created,
        commit=commit,
        commit_dirty=commit_dirty,
        settings=settings,
        environment=environment,
        checks=(
            *correctness_checks(correctness),
            *fuzz_checks(fuzz),
            *mutation_checks(mutation),
            *kernel_checks(kernels),
            *speed_checks(speed),
        ),
        figures=(
            *correctness_figures(correctness),
            *fuzz_figures(fuzz),
            *mutation_figures(mutation),
            *speed_figures(speed),
        ),
        correctness=correctness,
        fuzz=fuzz,
        kernels=kernels,
        speed=speed,
        mutation=mutation or MutationSection(Status.NOT_RUN, "not run"),
    )


def environment(device: torch.device) -> dict[str, str]:
    """Versions, host and device as text (the commit and the command are kept beside it)."""
    from reports.bench import device as bench_device

    record = bench_device.environment(device, commit=None)
    shown = {
        key: value
        for key, value in record.items()
        if key not in ("command", "recorded_at", "commit", "uncommitted_changes")
    }
    shown["platform"] = platform.platform()
    shown["cpu_threads"] = str(torch.get_num_threads())
    return {key: "none" if value is None else str(value) for key, value in shown.items()}


# -- checks --------------------------------------------------------------------------------


def correctness_checks(section: CorrectnessSection) -> list[Check]:
    if not section.cells:
        return [Check("correctness", "correctness", "differential matrix", section.status, section.detail)]
    return [
        Check(f"correctness/{cell.id}", "correctness", _cell_title(cell), cell.status, cell.detail)
        for cell in section.cells
    ]


def fuzz_checks(section: FuzzSection) -> list[Check]:
    if not section.runs:
        return [Check("fuzz", "fuzz", "fuzz suite", section.status, section.detail)]
    checks = []
    for run in section.runs:
        prefix = f"fuzz/{_run_key(run)}"
        checks.append(Check(f"{prefix}/suite", "fuzz", f"fuzz {run.source} {run.path}", run.status, run.detail))
        for bug in run.planted_bugs:
            status = {True: Status.PASSED, False: Status.FAILED, None: Status.NOT_RUN}[bug.caught]
            detail = {True: "caught", False: "not caught", None: "the record does not say"}[bug.caught]
            checks.append(
                Check(f"{prefix}/planted/{bug.name}", "fuzz", f"planted bug caught: {bug.name}", status, detail)
            )
    return checks


def mutation_checks(section: MutationSection | None) -> list[Check]:
    """A check per module, from the newest record that judged it (mutation_section.current_modules): passed at
    the target score or above; and one per record that holds no module (an unreadable one)."""
    if section is None:
        return []
    if not section.runs:
        return [Check("mutation", "mutation", "mutation testing", section.status, section.detail)]
    checks = [
        Check(f"mutation/{_record_key(run.path)}", "mutation", f"mutation record {run.path}", run.status, run.detail)
        for run in section.runs
        if not run.modules
    ]
    for run, module in current_modules(section.runs):
        if module.score is None:
            why = "the run stopped before them" if module.baseline == "passed" else module.baseline
            status, detail = Status.NOT_RUN, f"not run: none of its {module.mutants} mutants judged ({why})"
        else:
            status = Status.PASSED if module.score >= section.target_score else Status.FAILED
            detail = (
                f"{module.score:.1%} killed ({module.killed} killed, {module.survived} survived, "
                f"{module.equivalent} equivalent, {module.errors} errors; {module.done} of {module.mutants} run; "
                f"{run.path})"
            )
        check_id = f"mutation/{_record_key(run.path)}/{module.module}"
        checks.append(Check(check_id, "mutation", f"mutants killed: {module.module}", status, detail))
    return checks


def kernel_checks(section: KernelSection) -> list[Check]:
    if not section.files:
        return [Check("kernels", "kernels", "kernel checks", section.status, section.detail)]
    checks = []
    for summary in section.files:
        counts = f"{summary.passed} passed, {summary.failed + summary.errors} failed, {summary.skipped} skipped"
        if summary.failed or summary.errors:
            status = Status.FAILED
        elif summary.passed:
            status = Status.PASSED
        else:
            status, counts = Status.NOT_RUN, f"not run: every test skipped ({counts})"
        checks.append(Check(f"kernels/{summary.file}", "kernels", f"kernel tests in {summary.file}", status, counts))
    return checks


def speed_checks(section: SpeedSection) -> list[Check]:
    if not section.tables:
        return [Check("speed", "speed", "standard workloads", section.status, section.detail)]
    return [
        Check(
            _joined("speed", table.workload, table.shape, table.metric),
            "speed",
            f"{table.workload}{f' ({table.shape})' if table.shape else ''}: {table.metric}",
            table.status,
            table.note or "measured",
        )
        for table in section.tables
    ]


# -- figures -------------------------------------------------------------------------------


def correctness_figures(section: CorrectnessSection) -> list[Figure]:
    figures = []
    for cell in section.cells:
        if cell.status is Status.NOT_RUN or cell.max_logprob_error is None:
            continue
        prefix, title = f"correctness/{cell.id}", _cell_title(cell)
        figures.append(
            Figure(
                f"{prefix}/max-logprob-error",
                "correctness",
                f"{title}: max |Δlogprob|",
                cell.max_logprob_error,
                "nats",
                better="lower",
            )
        )
        figures.append(
            Figure(
                f"{prefix}/mean-logprob-error",
                "correctness",
                f"{title}: mean |Δlogprob|",
                cell.mean_logprob_error or 0.0,
                "nats",
                better="lower",
            )
        )
        if cell.identical_prefix_lengths and cell.rule != "exact":
            lengths = cell.identical_prefix_lengths
            figures.append(
                Figure(
                    f"{prefix}/min-identical-tokens",
                    "correctness",
                    f"{title}: fewest identical tokens",
                    float(min(lengths)),
                    "tokens",
                    better="higher",
                )
            )
            figures.append(
                Figure(
                    f"{prefix}/median-identical-tokens",
                    "correctness",
                    f"{title}: median identical tokens",
                    float(statistics.median(lengths)),
                    "tokens",
                    better="higher",
                )
            )
        if cell.error_distribution is not None:
            figures.append(
                Figure(
                    f"{prefix}/p99-logprob-error",
                    "correctness",
                    f"{title}: p99 |Δlogprob|",
                    cell.error_distribution.p99,
                    "nats",
                    better="lower",
                )
            )
    return figures


def fuzz_figures(section: FuzzSection) -> list[Figure]:
    figures = []
    for run in section.runs:
        for name, value in run.totals.items():
            figures.append(
                Figure(
                    f"fuzz/{_run_key(run)}/{name}",
                    "fuzz",
                    f"fuzz {run.path}: {name.replace('_', ' ')}",
                    float(value),
                    "count",
                )
            )
    return figures


def mutation_figures(section: MutationSection | None) -> list[Figure]:
    if section is None:
        return []
    return [
        Figure(
            f"mutation/{_record_key(run.path)}/{module.module}/score",
            "mutation",
            f"mutation score {module.module}",
            100.0 * module.score,
            "%",
            better="higher",
        )
        for run in section.runs
        for module in run.modules
        if module.score is not None
    ]


def speed_figures(section: SpeedSection) -> list[Figure]:
    """A figure per row (its id names workload, shape, metric, phase, settings and engine: stable
    across runs for --compare) and per setting cost."""
    figures = []
    for table in section.tables:
        for row in table.rows:
            names = (table.workload, table.shape, table.metric, row.phase, row.settings, row.engine)
            title = " ".join(name for name in (table.workload, table.shape, row.phase, table.metric) if name)
            title += f": {row.engine}" + (f", {row.settings}" if row.settings else "")
            figures.append(
                Figure(_joined("speed", *names), "speed", title, row.value, table.unit, row.spread, table.better)
            )
    for cost in section.costs:
        names = ("speed", "cost", cost.setting, cost.workload, cost.shape, cost.phase, cost.metric, cost.settings)
        title = f"{cost.setting} cost: {cost.workload} {cost.shape} {cost.phase} {cost.metric}, {cost.settings}"
        figures.append(Figure(_joined(*names), "speed", title, cost.cost_percent, "%", better="lower"))
    return _unique_ids(figures)


def _joined(*names: str | None) -> str:
    return "/".join(name for name in names if name)


def _unique_ids(figures: list[Figure]) -> list[Figure]:
    """Two records with the same labels (the same run kept twice) give their figures ids #2, #3, ...,
    so --compare never merges two figures into one."""
    seen: dict[str, int] = {}
    unique = []
    for figure in figures:
        seen[figure.id] = seen.get(figure.id, 0) + 1
        count = seen[figure.id]
        unique.append(figure if count == 1 else replace(figure, id=f"{figure.id}#{count}"))
    return unique


def _cell_title(cell: Cell) -> str:
    return f"{cell.candidate} vs {cell.baseline}, {cell.dtype}, {cell.feature}, {cell.mode}"


def _record_key(path: str) -> str:
    return path.rsplit("/", 1)[-1].removesuffix(".json")


def _run_key(run: FuzzRun) -> str:
    return "ci" if run.source == "ci run" else run.path.rsplit("/", 1)[-1].removesuffix(".json")
