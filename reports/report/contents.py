"""The contents at the top of the page: a line per section, linking to it, with its status and what
it holds, so that a reader sees every section, and reaches it, from the first screen."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Entry:
    anchor: str
    title: str
    status: str | None  # a section's "passed", "failed" or "not_run"; None where it has none
    summary: str
    links: tuple[tuple[str, str], ...] = field(default=())  # (anchor, text) of its parts


def contents(report: dict[str, Any], speed: dict[str, Any]) -> list[Entry]:
    """`speed` is the speed section arranged for the page (reports.report.speed_view)."""
    correctness, counts = report["correctness"], report["summary"]
    return [
        Entry("correctness", "Correctness", correctness["status"], correctness["detail"]),
        Entry("disagreements", "Disagreements", None, _disagreements(correctness["cells"])),
        Entry("distributions", "Reduced precision", None, _reduced_precision(correctness["cells"])),
        Entry("speed", "Speed", report["speed"]["status"], report["speed"]["detail"], _speed_links(speed)),
        Entry("fuzzing", "Fuzzing", report["fuzz"]["status"], report["fuzz"]["detail"]),
        *_mutation(report),
        Entry("kernels", "Kernels", report["kernels"]["status"], report["kernels"]["detail"]),
        Entry("environment", "Environment", None, "versions, host and device of this run"),
        Entry(
            "checks",
            "All checks",
            None,
            f"{counts['passed']} passed, {counts['failed']} failed, {counts['not_run']} not run",
        ),
    ]


def _mutation(report: dict[str, Any]) -> list[Entry]:
    """Reports made before the section existed have none."""
    section = report.get("mutation")
    if section is None:
        return []
    return [Entry("mutation", "Mutation testing", section["status"], section["detail"])]


def _disagreements(cells: list[dict[str, Any]]) -> str:
    if not any(cell["status"] != "not_run" for cell in cells):
        return "no cell ran"
    failed = [cell for cell in cells if cell["disagreements"] and cell["status"] == "failed"]
    passed = [cell for cell in cells if cell["disagreements"] and cell["status"] != "failed"]
    if not failed and not passed:
        return "none: every engine agreed with its baseline at every compared position"
    parts = []
    if failed:
        parts.append(f"{sum(c['num_disagreements'] for c in failed)} in {len(failed)} failed cells (shown)")
    if passed:
        parts.append(
            f"{sum(c['num_disagreements'] for c in passed)} near-ties the rule allows, in {len(passed)} passed "
            "cells (folded)"
        )
    return "; ".join(parts)


def _reduced_precision(cells: list[dict[str, Any]]) -> str:
    reduced = [cell for cell in cells if cell["rule"] in ("near-tie", "top1-above-margin")]
    if not reduced:
        return "no bf16 or fp16 cell ran"
    return f"{len(reduced)} bf16/fp16 cells: error distributions and how long outputs stay identical"


def _speed_links(speed: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    links = [(group.anchor, group.title) for group in speed["groups"]]
    links += [(group.anchor, f"{group.flag} cost") for group in speed["costs"]]
    return tuple(links)
