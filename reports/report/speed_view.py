"""The speed section of report.json arranged for the page: tables grouped by workload and shape
(each group with an anchor the contents link to), the decode-sweep plots beside their workload, and
the setting costs. Reports made before rows carried their settings, commit and GPU render too: the
columns nothing fills are left out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from reports.report.bench_records import settings_flags

SWEEP_PLOTS = ("tpot-vs-batch", "throughput-vs-batch", "fraction-of-floor")
FOLDED_ROWS = 8  # a passed table longer than this is folded (its numbers are in the plot above it)
OPTIONAL_COLUMNS = ("settings", "phase", "times_baseline", "commit", "gpu")


@dataclass
class SpeedGroup:
    """The tables of one workload on one shape."""

    anchor: str
    workload: str
    shape: str | None
    tables: list[dict[str, Any]] = field(default_factory=list)
    plots: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def title(self) -> str:
        return self.workload + (f" · {self.shape}" if self.shape else "")


@dataclass
class CostGroup:
    anchor: str
    flag: str  # the setting as its `twinfer bench` flag
    costs: list[dict[str, Any]]


def speed_view(section: dict[str, Any]) -> dict[str, Any]:
    groups: dict[tuple[str, str | None], SpeedGroup] = {}
    for table in section["tables"]:
        key = (table["workload"], table.get("shape"))
        if key not in groups:
            groups[key] = SpeedGroup(anchor("speed", *key), *key)
        group = groups[key]
        group.tables.append(_table_view(table))
        if table["note"] and table["note"] not in group.notes:
            group.notes.append(table["note"])
    sweep = next((group for group in groups.values() if group.workload == "decode-sweep"), None)
    other_plots = []
    for plot in section["plots"]:
        (sweep.plots if sweep is not None and plot["id"] in SWEEP_PLOTS else other_plots).append(plot)
    return {
        "groups": list(groups.values()),
        "plots": other_plots,
        "costs": _cost_groups(section.get("costs", [])),
    }


def _table_view(table: dict[str, Any]) -> dict[str, Any]:
    rows = table["rows"]
    columns = {name for name in OPTIONAL_COLUMNS if any(row.get(name) is not None for row in rows)}
    return {
        **table,
        "columns": columns,
        "folded": len(rows) > FOLDED_ROWS and table["status"] != "failed",
        # A record's rows are consecutive: its settings are written once, on its first row.
        "first_of_record": [
            index == 0 or _record_key(rows[index - 1]) != _record_key(row) for index, row in enumerate(rows)
        ],
    }


def _record_key(row: dict[str, Any]) -> tuple[Any, ...]:
    return (row.get("phase"), row.get("settings"), row.get("record"))


def _cost_groups(costs: list[dict[str, Any]]) -> list[CostGroup]:
    by_setting: dict[str, list[dict[str, Any]]] = {}
    for cost in costs:
        by_setting.setdefault(cost["setting"], []).append(cost)
    return [
        CostGroup(anchor("speed-cost", setting), settings_flags({setting: True}), listed)
        for setting, listed in by_setting.items()
    ]


def anchor(*words: str | None) -> str:
    """An element id from words: lower-case letters, digits and dashes."""
    return re.sub(r"[^a-z0-9]+", "-", " ".join(word for word in words if word).lower()).strip("-")
