"""`twinfer report --compare OLD.json NEW.json`: two runs side by side, every check whose status
changed and every figure that moved by more than its run-to-run spread.

A figure's threshold is the larger of the two runs' spreads; when neither run measured a spread
(deterministic counts, single-run throughputs), any change at all is marked, and the page says so.
"""

from __future__ import annotations

from typing import Any

from reports.report.records import Status

REGRESSED, FIXED, CHANGED, ADDED, REMOVED, SAME = "regressed", "fixed", "changed", "added", "removed", "same"


def compare_reports(old: dict[str, Any], new: dict[str, Any], old_name: str, new_name: str) -> dict[str, Any]:
    checks = _compare_checks(old["checks"], new["checks"])
    figures = _compare_figures(old["figures"], new["figures"])
    return {
        "old": _run_summary(old, old_name),
        "new": _run_summary(new, new_name),
        "checks": checks,
        "figures": figures,
        "counts": {
            "checks": len(checks),
            "checks_changed": sum(c["change"] != SAME for c in checks),
            "regressions": sum(c["change"] == REGRESSED for c in checks),
            "figures": len(figures),
            "figures_moved": sum(f["moved"] for f in figures),
        },
    }


def _run_summary(report: dict[str, Any], name: str) -> dict[str, Any]:
    return {
        "name": name,
        "summary": report["summary"],
        "commit": report["commit"],
        "commit_dirty": report["commit_dirty"],
        "created": report["created"],
        "settings": report["settings"],
        "environment": report["environment"],
    }


def _compare_checks(old: list[dict[str, Any]], new: list[dict[str, Any]]) -> list[dict[str, Any]]:
    old_by_id = {check["id"]: check for check in old}
    new_by_id = {check["id"]: check for check in new}
    rows = []
    for check_id in _ordered_ids(old, new):
        before, after = old_by_id.get(check_id), new_by_id.get(check_id)
        shown = after or before
        rows.append(
            {
                "id": check_id,
                "title": shown["title"],
                "section": shown["section"],
                "old": before["status"] if before else None,
                "new": after["status"] if after else None,
                "old_detail": before["detail"] if before else "",
                "new_detail": after["detail"] if after else "",
                "change": _check_change(before, after),
            }
        )
    return rows


def _check_change(before: dict[str, Any] | None, after: dict[str, Any] | None) -> str:
    if before is None:
        return ADDED
    if after is None:
        return REMOVED
    if before["status"] == after["status"]:
        return SAME
    if after["status"] == Status.FAILED:
        return REGRESSED
    if before["status"] == Status.FAILED and after["status"] == Status.PASSED:
        return FIXED
    return CHANGED


def _compare_figures(old: list[dict[str, Any]], new: list[dict[str, Any]]) -> list[dict[str, Any]]:
    old_by_id = {figure["id"]: figure for figure in old}
    new_by_id = {figure["id"]: figure for figure in new}
    rows = []
    for figure_id in _ordered_ids(old, new):
        before, after = old_by_id.get(figure_id), new_by_id.get(figure_id)
        shown = after or before
        row = {
            "id": figure_id,
            "title": shown["title"],
            "section": shown["section"],
            "unit": shown["unit"],
            "old": before["value"] if before else None,
            "new": after["value"] if after else None,
            "delta": None,
            "threshold": None,
            "spread_measured": False,
            "moved": False,
            "direction": None,
        }
        if before is not None and after is not None:
            spreads = [s for s in (before["spread"], after["spread"]) if s is not None]
            delta = after["value"] - before["value"]
            row["delta"] = delta
            row["threshold"] = max(spreads, default=0.0)
            row["spread_measured"] = bool(spreads)
            row["moved"] = abs(delta) > row["threshold"]
            if row["moved"] and shown["better"] is not None:
                improved = delta > 0 if shown["better"] == "higher" else delta < 0
                row["direction"] = "better" if improved else "worse"
        rows.append(row)
    return rows


def _ordered_ids(old: list[dict[str, Any]], new: list[dict[str, Any]]) -> list[str]:
    """Ids in the new run's order, then those only the old run has."""
    seen = [item["id"] for item in new]
    known = set(seen)
    return seen + [item["id"] for item in old if item["id"] not in known]
