"""report.json -> report.html (and two reports -> compare.html) through jinja2 with autoescaping.

The page is one self-contained file: the stylesheet is inlined, plots are inline SVG from
matplotlib, nothing is fetched, and a Content-Security-Policy forbids scripts and every network
load, so even a mistake could not make the page reach out. Every piece of text from the run
(prompts, generated text, model names, test messages) is escaped by jinja2's autoescaping.
"""

from __future__ import annotations

import math
from importlib import resources
from typing import Any

import jinja2
from markupsafe import Markup

from reports.report import plots
from reports.report.contents import contents
from reports.report.speed_view import speed_view

TEMPLATE_PACKAGE = "reports.report"
# No script, no fetch of any kind: only the inline stylesheet and inline SVG.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'; form-action 'none'"
)
DISTRIBUTION_FEATURE_PREFERENCE = ("prefix-cache-off", "prefix-cache-on", "chunked-prefill", "preemption")


def render_report(report: dict[str, Any]) -> str:
    speed = speed_view(report["speed"])
    return (
        _environment()
        .get_template("report.html.j2")
        .render(
            report=report,
            css=_stylesheet(),
            csp=CONTENT_SECURITY_POLICY,
            contents=contents(report, speed),
            matrix=correctness_matrix(report["correctness"]),
            distribution_plots=_distribution_plots(report["correctness"]),
            speed=speed,
            speed_plots={plot["id"]: Markup(plots.speed_plot_svg(plot)) for plot in report["speed"]["plots"]},
        )
    )


def render_comparison(comparison: dict[str, Any]) -> str:
    return (
        _environment()
        .get_template("compare.html.j2")
        .render(comparison=comparison, css=_stylesheet(), csp=CONTENT_SECURITY_POLICY)
    )


def correctness_matrix(section: dict[str, Any]) -> dict[str, Any]:
    """Rows (pair, dtype) x columns (feature, mode) of cells; a missing combination is None."""
    by_key = {(c["pair"], c["dtype"], c["feature"], c["mode"]): c for c in section["cells"]}
    columns = [(f, m) for f in section["features"] for m in section["modes"]]
    rows = [
        {"pair": pair, "dtype": dtype, "cells": [by_key.get((pair, dtype, f, m)) for f, m in columns]}
        for pair in section["pairs"]
        for dtype in section["dtypes"]
    ]
    return {"features": section["features"], "modes": section["modes"], "rows": rows}


def _distribution_plots(section: dict[str, Any]) -> list[dict[str, Any]]:
    """For each reduced-precision dtype: the teacher-forced error distribution and how long
    free-running outputs stay identical, one line per pair (on the plainest feature that ran)."""
    figures = []
    for dtype in section["dtypes"]:
        if dtype == "float32":
            continue
        teacher = _one_cell_per_pair(section, dtype, "teacher-forced", lambda c: c["error_distribution"] is not None)
        free = _one_cell_per_pair(section, dtype, "free-running", lambda c: bool(c["identical_prefix_lengths"]))
        if teacher:
            title = f"{dtype}: teacher-forced log-probability error"
            figures.append(
                {"title": title, "svg": Markup(plots.error_histogram_svg(f"errors-{dtype}", title, teacher))}
            )
        if free:
            title = f"{dtype}: how long free-running outputs stay identical"
            figures.append(
                {"title": title, "svg": Markup(plots.identical_prefix_svg(f"identical-{dtype}", title, free))}
            )
    return figures


def _one_cell_per_pair(section: dict[str, Any], dtype: str, mode: str, has_data) -> list[dict[str, Any]]:
    chosen = []
    for pair in section["pairs"]:
        candidates = [
            c
            for c in section["cells"]
            if c["pair"] == pair and c["dtype"] == dtype and c["mode"] == mode and has_data(c)
        ]
        candidates.sort(key=lambda c: _preference(c["feature"]))
        chosen.extend(candidates[:1])
    return chosen


def _preference(feature: str) -> int:
    order = DISTRIBUTION_FEATURE_PREFERENCE
    return order.index(feature) if feature in order else len(order)


def _environment() -> jinja2.Environment:
    environment = jinja2.Environment(
        loader=jinja2.PackageLoader(TEMPLATE_PACKAGE, "templates"),
        autoescape=True,  # every template is HTML: escape every value unless marked safe
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    environment.filters["number"] = format_number
    environment.filters["figure"] = format_figure
    environment.filters["visible"] = visible_text
    environment.filters["median"] = median
    return environment


def _stylesheet() -> Markup:
    # Our own file from the package, not run data: safe to inline unescaped (">" in selectors must stay).
    return Markup(resources.files(TEMPLATE_PACKAGE).joinpath("templates", "report.css").read_text(encoding="utf-8"))


def format_number(value: float | int | None, digits: int = 3) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if math.isinf(value) or math.isnan(value):
        return str(value)
    if value == 0:
        return "0"
    if abs(value) >= 1e5 or abs(value) < 1e-3:
        return f"{value:.{digits - 1}e}"
    return f"{value:.{digits}g}" if abs(value) < 1 else f"{value:,.{max(digits - 1, 0)}f}".rstrip("0").rstrip(".")


def format_figure(value: float | None) -> str:
    """A measured figure to four significant digits, whole numbers from 1,000 up (9,628 tokens/s, 1.839 ms)."""
    if value is None:
        return "–"
    if abs(value) >= 1000:
        return f"{round(value):,}"
    return f"{value:.4g}"


def visible_text(text: str) -> str:
    """Control characters written as escapes, so whitespace tokens are visible (still escaped for HTML)."""
    replacements = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
    return "".join(replacements.get(ch, ch if ch.isprintable() or ch == " " else f"\\x{ord(ch):02x}") for ch in text)


def median(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2
