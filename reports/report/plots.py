"""Plots for the page, drawn by matplotlib and kept as SVG markup to inline (no files, no fetches).

Every function takes the report's JSON data (so a kept report.json renders the same plots) and
returns SVG text. Glyphs are drawn as paths, so the SVG needs no font and holds no text nodes.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any

import matplotlib
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator

PLOT_STYLE = {
    "svg.fonttype": "path",  # glyphs as paths: no font lookup in the browser
    "font.size": 9,
    "axes.grid": True,
    "grid.alpha": 0.3,
}
FIGURE_SIZE = (6.4, 3.4)
PLAIN_NUMBER = FuncFormatter(lambda value, _: f"{value:g}")


def error_histogram_svg(plot_id: str, title: str, cells: Sequence[dict[str, Any]]) -> str:
    """Teacher-forced |logprob error| distributions, one step line per cell (fraction of positions per bin)."""
    figure, axes = _figure()
    for cell in cells:
        distribution = cell["error_distribution"]
        total = max(distribution["count"], 1)
        fractions = [count / total for count in distribution["counts"]]
        label = f"{_cell_label(cell)} (n={distribution['count']}, exact 0: {distribution['zeros']})"
        axes.stairs(fractions, distribution["log10_edges"], label=label, linewidth=1.5)
    axes.set_xlabel("log10 |log-probability error| (teacher-forced, every position)")
    axes.set_ylabel("fraction of positions")
    return _finish(figure, axes, plot_id, title)


def identical_prefix_svg(plot_id: str, title: str, cells: Sequence[dict[str, Any]]) -> str:
    """Free-running: fraction of prompts whose output is still identical after n generated tokens."""
    figure, axes = _figure()
    for cell in cells:
        lengths = cell["identical_prefix_lengths"]
        horizon = max(cell["max_new_tokens"], max(lengths, default=0))
        steps = list(range(horizon + 1))
        fractions = [sum(length >= n for length in lengths) / max(len(lengths), 1) for n in steps]
        axes.step(steps, fractions, where="post", label=f"{_cell_label(cell)} ({len(lengths)} prompts)", linewidth=1.5)
    axes.set_xlabel("generated tokens n")
    axes.set_ylabel("fraction identical after n tokens")
    axes.set_ylim(-0.02, 1.02)
    return _finish(figure, axes, plot_id, title)


def speed_plot_svg(plot: dict[str, Any]) -> str:
    figure, axes = _figure()
    for series in plot["series"]:
        axes.plot(series["x"], series["y"], marker="o", label=series["label"], linewidth=1.5)
    if plot["log_x"]:
        axes.set_xscale("log", base=2)
        axes.xaxis.set_major_formatter(PLAIN_NUMBER)  # batch sizes and lengths read as 32, not 2^5
    if plot.get("log_y"):
        axes.set_yscale("log")
        axes.yaxis.set_minor_locator(LogLocator(subs=(2.0, 5.0)))
        axes.yaxis.set_major_formatter(PLAIN_NUMBER)
        axes.yaxis.set_minor_formatter(PLAIN_NUMBER)
    axes.set_xlabel(plot["x_label"])
    axes.set_ylabel(plot["y_label"])
    return _finish(figure, axes, plot["id"], plot["title"])


def _cell_label(cell: dict[str, Any]) -> str:
    return f"{cell['candidate']} vs {cell['baseline']}, {cell['feature']}"


def _figure() -> tuple[Figure, Any]:
    with matplotlib.rc_context(PLOT_STYLE):
        figure = Figure(figsize=FIGURE_SIZE, layout="constrained")
        axes = figure.subplots()
    return figure, axes


def _finish(figure: Figure, axes: Any, plot_id: str, title: str) -> str:
    axes.set_title(title)
    if axes.get_legend_handles_labels()[0]:
        axes.legend(fontsize=7)
    buffer = io.StringIO()
    # A salt per plot keeps the ids of clip paths and glyphs distinct between the SVGs of one page.
    with matplotlib.rc_context({**PLOT_STYLE, "svg.hashsalt": plot_id}):
        figure.savefig(buffer, format="svg", metadata={"Date": None, "Creator": None})
    text = buffer.getvalue()
    return text[text.index("<svg") :]  # drop the XML declaration and DOCTYPE: the SVG goes inside HTML
