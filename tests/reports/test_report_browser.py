"""The report in a real browser: headless Chromium (Debian's `chromium` package) opens the page; it must
draw something, log no console error, run no script and request nothing but itself; a reader sees a link
to every section in the first screen, and the long lists are folded until opened.

Without Chromium these tests are skipped, unless TWINFER_REQUIRE_BROWSER=1 (set by CI, which installs
it): then a missing browser fails them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from reports.report.browser import PageVisit, find_chromium, pixel_variety, visit_page
from reports.report.comparison import compare_reports
from reports.report.render import render_comparison, render_report
from reports.report.sample import sample_report

MIN_COLOURS = 50  # text, tables, status colours and antialiased plot lines
MIN_INKED_FRACTION = 0.03  # of the pixels differ from the background
FIRST_SCREEN = (1280, 800)  # a laptop's browser window
PUBLISHED = Path(__file__).resolve().parents[2] / "reports" / "published" / "h200" / "report.json"
SECTIONS = ("correctness", "disagreements", "distributions", "speed", "fuzzing", "kernels", "environment", "checks")
# What the browser is asked after the page loaded (through DevTools; the page runs no script): where the
# contents' links are, the window's and the page's height, and the page's height with every <details> open.
CONTENTS_LINKS = (
    "[...document.querySelectorAll('#contents a')].map(a => [a.getAttribute('href'), a.getBoundingClientRect().bottom])"
)
WINDOW_HEIGHT = "window.innerHeight"
PAGE_HEIGHT = "document.documentElement.scrollHeight"
UNFOLDED_HEIGHT = (
    "(document.querySelectorAll('details').forEach(d => { d.open = true; }), document.documentElement.scrollHeight)"
)


@pytest.fixture(scope="module")
def chromium() -> str:
    path = find_chromium()
    if path is None:
        if os.environ.get("TWINFER_REQUIRE_BROWSER") == "1":
            pytest.fail("TWINFER_REQUIRE_BROWSER=1 but no Chromium found (apt-get install -y chromium)")
        pytest.skip("no Chromium installed (apt-get install -y chromium)")
    return path


def assert_clean_visit(
    page: Path, chromium: str, title_words: str, window: tuple[int, int] = (1280, 1800), probes: tuple[str, ...] = ()
) -> PageVisit:
    visit = visit_page(page, chromium, window=window, probes=probes)
    assert visit.errors == (), f"console errors: {visit.errors}"
    assert visit.foreign_requests == (), f"the page requested {visit.foreign_requests}"
    assert visit.requested_urls == (visit.url,)
    assert visit.script_elements == 0
    assert title_words in visit.title
    colours, inked = pixel_variety(visit.screenshot_png)
    assert colours >= MIN_COLOURS and inked >= MIN_INKED_FRACTION, (
        f"blank-looking screenshot: {colours} colours, {inked:.3f} inked"
    )
    return visit


def assert_every_section_in_the_first_screen(links: list[list], window_height: int) -> None:
    shown = {href for href, bottom in links if bottom <= window_height}
    assert {f"#{section}" for section in SECTIONS} <= shown, f"links below the first screen: {links}"


def test_report_page_in_chromium(chromium: str, tmp_path: Path) -> None:
    page = tmp_path / "report.html"
    page.write_text(render_report(sample_report().to_json()), encoding="utf-8")
    visit = assert_clean_visit(
        page, chromium, "twinfer report: 12 passed, 2 failed, 2 not run", FIRST_SCREEN, (CONTENTS_LINKS, WINDOW_HEIGHT)
    )
    links, window_height = visit.probe_values  # the viewport: the window less what the browser draws
    assert_every_section_in_the_first_screen(links, window_height)
    workloads = [bottom for href, bottom in links if href.startswith("#speed-")]
    assert len(workloads) == 6 and max(workloads) <= window_height  # five (workload, shape) groups and the cost


def test_published_report_folds_its_near_ties(chromium: str, tmp_path: Path) -> None:
    """The published H200 report (its report.json rendered by this version): the near-ties the rule allows
    are folded, and so are long tables, the kernel section's failing tests and each mutation survivor's diff,
    so that the page before unfolding is a few screens long, and every section's link is in the first. (At
    commit 9c58d79, with the mutation section and 12 speed records, it is about 8,000 px; at aca7317, with 24 speed
    records (offline-256 beside transformers and decode-bs1 of the final code added), 9,017 px; before folding the
    near-ties, the speed section alone sat below 16,000 px of them.)"""
    document = json.loads(PUBLISHED.read_text())
    page = tmp_path / "report.html"
    page.write_text(render_report(document), encoding="utf-8")
    summary = document["summary"]
    title = f"{summary['passed']} passed, {summary['failed']} failed, {summary['not_run']} not run"
    probes = (CONTENTS_LINKS, WINDOW_HEIGHT, PAGE_HEIGHT, UNFOLDED_HEIGHT)
    links, window_height, height, unfolded = assert_clean_visit(
        page, chromium, title, FIRST_SCREEN, probes
    ).probe_values
    assert_every_section_in_the_first_screen(links, window_height)
    assert height < 10_000, f"the page is {height} px long before unfolding"
    assert unfolded > 3 * height, f"unfolding took it from {height} to only {unfolded} px: what is folded?"


def test_compare_page_in_chromium(chromium: str, tmp_path: Path) -> None:
    old = sample_report().to_json()
    new = json.loads(json.dumps(old))
    new["checks"][0]["status"] = "failed"
    page = tmp_path / "compare.html"
    page.write_text(render_comparison(compare_reports(old, new, "old.json", "new.json")), encoding="utf-8")
    assert_clean_visit(page, chromium, "1 checks changed")


def test_the_browser_check_notices_requests_errors_scripts_and_blank_pages(chromium: str, tmp_path: Path) -> None:
    """The checks above can fail: a page that fetches, logs an error and runs a script is caught."""
    bad = tmp_path / "bad.html"
    bad.write_text(
        "<!DOCTYPE html><html><head><title>bad</title></head><body>"
        '<img src="http://127.0.0.1:9/probe.png"><script>console.error("boom")</script></body></html>'
    )
    visit = visit_page(bad, chromium)
    assert "http://127.0.0.1:9/probe.png" in visit.foreign_requests
    assert any(message.text == "boom" for message in visit.errors)
    assert visit.script_elements == 1
    blank = tmp_path / "blank.html"
    blank.write_text("<!DOCTYPE html><html><head><title>blank</title></head><body></body></html>")
    colours, inked = pixel_variety(visit_page(blank, chromium).screenshot_png)
    assert colours < MIN_COLOURS and inked < MIN_INKED_FRACTION
