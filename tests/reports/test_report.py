"""`twinfer report`: the JSON follows its schema, the HTML parses and holds every section, user text is
escaped, the verdicts follow the agreement rules, and each section reads its source correctly."""

from __future__ import annotations

import copy
import json
import textwrap
from dataclasses import replace
from html.parser import HTMLParser
from pathlib import Path

import pytest
import torch

from reports.bench import harness
from reports.report import command
from reports.report.assemble import assemble_report
from reports.report.bench_records import BenchRecord
from reports.report.comparison import REGRESSED, compare_reports
from reports.report.correctness import CorrectnessOptions, run_correctness
from reports.report.fuzz_section import committed_fuzz_section, fuzz_run_from_record
from reports.report.kernel_section import summarise_kernel_run
from reports.report.pytest_runs import TestOutcome, run_pytest
from reports.report.records import CorrectnessSection, FuzzSection, KernelSection, RunSettings, SpeedSection, Status
from reports.report.render import render_comparison, render_report
from reports.report.sample import (
    HOSTILE_MODEL,
    HOSTILE_PROMPT,
    HOSTILE_TOKEN,
    SAMPLE_BENCH_COMMIT,
    SAMPLE_GPU,
    TUNED,
    bench_record,
    sample_bench_records,
    sample_report,
)
from reports.report.schema import ReportFormatError, validate_report
from reports.report.speed_section import SpeedOptions, speed_from_records, speed_section
from reports.report.traces import FreeRunning, TeacherForced
from reports.report.verdicts import CellKey, error_distribution, free_running_cell, teacher_forced_cell
from spec.agreement import Trace
from spec.engine_config import EngineConfig

REPORT_SECTIONS = (
    "summary",
    "correctness",
    "disagreements",
    "distributions",
    "speed",
    "fuzzing",
    "kernels",
    "environment",
    "checks",
)
COMPARE_SECTIONS = ("summary", "runs", "checks", "figures")
RESULTS = Path(__file__).resolve().parents[2] / "reports" / "results"
TUNED_FLAGS = "--max-num-seqs 256 --max-num-batched-tokens 8192 --async-scheduling"


class PageStructure(HTMLParser):
    """What a self-contained, script-free page must not hold, and what it must; which disagreements sit
    inside a closed <details> (folded), and where the contents at the top link to."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.ids: set[str] = set()
        self.tags: dict[str, int] = {}
        self.urls: list[str] = []
        self.text: list[str] = []
        self.style: list[str] = []
        self.meta: list[dict[str, str | None]] = []
        self.disagreements: list[tuple[bool, bool]] = []  # (allowed, folded) of each listed, in page order
        self.contents_links: list[str] = []
        self.figures_with_svg: set[str] = set()
        self._in_style = False
        self._details_open: list[bool] = []  # the <details> the parser is inside, innermost last
        self._in_contents = False
        self._figure: str | None = None
        self._section: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags[tag] = self.tags.get(tag, 0) + 1
        attributes = dict(attrs)
        if attributes.get("id"):
            self.ids.add(attributes["id"])
        for name in ("src", "href", "xlink:href", "action", "data"):
            if attributes.get(name) is not None and tag not in ("use",):
                self.urls.append(attributes[name])
        if tag == "meta":
            self.meta.append(attributes)
        self._in_style = tag == "style"
        if tag == "details":
            self._details_open.append("open" in attributes)
        elif tag == "nav" and attributes.get("id") == "contents":
            self._in_contents = True
        elif tag == "a" and self._in_contents:
            self.contents_links.append(attributes.get("href") or "")
        elif tag == "figure":
            self._figure = attributes.get("id")
        elif tag == "section":
            self._section = attributes.get("id")
        elif tag == "svg" and self._figure:
            self.figures_with_svg.add(self._figure)
        classes = (attributes.get("class") or "").split()
        if tag == "div" and "disagreement" in classes and self._section == "disagreements":
            self.disagreements.append(("allowed" in classes, not all(self._details_open)))

    def handle_endtag(self, tag: str) -> None:
        self._in_style = False
        if tag == "details":
            self._details_open.pop()
        elif tag == "nav":
            self._in_contents = False
        elif tag == "figure":
            self._figure = None

    def handle_data(self, data: str) -> None:
        (self.style if self._in_style else self.text).append(data)


def parse(html: str) -> PageStructure:
    page = PageStructure()
    page.feed(html)
    page.close()
    return page


def assert_self_contained(page: PageStructure) -> None:
    for tag in ("script", "link", "iframe", "object", "embed", "img", "base", "form"):
        assert page.tags.get(tag, 0) == 0, f"the page holds a <{tag}> element"
    assert all(url.startswith("#") for url in page.urls), f"the page refers outside itself: {page.urls}"
    style = "".join(page.style)
    assert "url(" not in style and "@import" not in style and "@font-face" not in style
    policies = [m.get("content") or "" for m in page.meta if m.get("http-equiv") == "Content-Security-Policy"]
    assert policies and "default-src 'none'" in policies[0] and "script-src" not in policies[0]


def assert_every_section_linked_from_the_top(page: PageStructure) -> None:
    """The contents link to every section (and each link lands on an element of the page)."""
    assert {f"#{section}" for section in REPORT_SECTIONS if section != "summary"} <= set(page.contents_links)
    assert all(link.removeprefix("#") in page.ids for link in page.contents_links), page.contents_links


@pytest.fixture(scope="module")
def sample_html() -> str:
    """The sample report's page, rendered once: drawing its plots takes seconds."""
    return render_report(sample_report().to_json())


# -- the sample report: schema, structure, escaping --------------------------------------------


def test_sample_report_follows_the_schema_and_survives_json() -> None:
    document = sample_report().to_json()
    validate_report(document)
    again = json.loads(json.dumps(document))
    validate_report(again)
    assert document["schema_version"] == 1 and document["kind"] == "twinfer-report"
    assert document["summary"] == {"passed": 12, "failed": 2, "not_run": 2}
    assert sum(document["summary"].values()) == len(document["checks"])


@pytest.mark.parametrize(
    "breakage",
    [
        lambda d: d.pop("correctness"),
        lambda d: d.update(schema_version=2),
        lambda d: d["checks"][0].update(status="ok"),
        lambda d: d["correctness"]["cells"][0].update(surprise=1),
        lambda d: d["speed"]["tables"][0]["rows"][0].update(value="fast"),
        lambda d: d["fuzz"]["runs"][0]["totals"].update(examples=1.5),
        lambda d: d["speed"]["tables"][0]["rows"][0].update(times_baseline=-2.0),
        lambda d: d["speed"]["costs"][0].update(cost_percent="10%"),
        lambda d: d["speed"]["costs"][0].pop("settings"),
    ],
    ids=[
        "missing-section",
        "unknown-version",
        "bad-status",
        "unknown-field",
        "text-for-number",
        "fraction-for-count",
        "negative-speed-up",
        "text-for-cost",
        "cost-without-settings",
    ],
)
def test_schema_refuses_broken_reports(breakage) -> None:
    document = sample_report().to_json()
    breakage(document)
    with pytest.raises(ReportFormatError, match="does not follow the twinfer report schema"):
        validate_report(document, "broken.json")


def test_page_parses_holds_every_section_and_nothing_external(sample_html: str) -> None:
    page = parse(sample_html)
    assert set(REPORT_SECTIONS) <= page.ids
    assert_self_contained(page)
    # bf16 error distribution, bf16 identical prefix, the three decode-sweep plots
    assert page.tags.get("svg", 0) == 5
    text = " ".join(page.text)
    assert "12 passed" in text and "2 failed" in text and "2 not run" in text
    assert "0123456789abcdef0123456789abcdef01234567" in text
    assert "Planted bugs caught: 1 of 2" in text


def test_user_controlled_text_renders_as_text(sample_html: str) -> None:
    page = parse(sample_html)
    assert page.tags.get("script", 0) == 0 and page.tags.get("img", 0) == 0
    assert "<script>" not in sample_html and "<img src=x" not in sample_html and "<b>host</b>" not in sample_html
    text = "".join(page.text)
    for hostile in (HOSTILE_PROMPT, HOSTILE_MODEL, HOSTILE_TOKEN, "<b>host</b>", SAMPLE_GPU):
        assert hostile in text, f"{hostile!r} is not shown as text"


def test_passed_near_ties_are_folded_and_every_section_is_linked_from_the_top(sample_html: str) -> None:
    page = parse(sample_html)
    assert_every_section_linked_from_the_top(page)
    # The sample has a near-tie in a passed cell and a disagreement that fails its cell.
    assert page.disagreements == [(False, False), (True, True)], "failures open, passed near-ties folded"
    for speed_group in ("#speed-offline-256-qwen3-0-6b", "#speed-decode-bs1-qwen3-8b", "#speed-cost-batch-invariant"):
        assert speed_group in page.contents_links


# -- --compare --------------------------------------------------------------------------------


SWEEP_BATCH_8 = f"speed/decode-sweep/qwen3-0.6b/time per output token/batch-8/{TUNED_FLAGS}"


def _changed_copy(document: dict) -> dict:
    new = copy.deepcopy(document)
    checks = {check["id"]: check for check in new["checks"]}
    checks["correctness/reference-hf/float32/prefix-cache-off/free-running"]["status"] = "failed"
    checks["kernels/tests/fast/kernels/test_decode_attention.py"]["status"] = "passed"
    figures = {figure["id"]: figure for figure in new["figures"]}
    figures[f"{SWEEP_BATCH_8}/transformers"]["value"] = 31.0  # 30 ms, spread 0.9: moved
    figures[f"{SWEEP_BATCH_8}/twinfer fast"]["value"] = 1.93  # 1.9 ms, spread 0.057: not moved
    figures["fuzz/deep_run/examples"]["value"] = 3010.0  # no spread measured: any change is marked
    return new


def test_compare_marks_changed_checks_and_figures_beyond_their_spread() -> None:
    old = sample_report().to_json()
    comparison = compare_reports(old, _changed_copy(old), "old.json", "new.json")
    changes = {row["id"]: row["change"] for row in comparison["checks"] if row["change"] != "same"}
    assert changes == {
        "correctness/reference-hf/float32/prefix-cache-off/free-running": REGRESSED,
        "kernels/tests/fast/kernels/test_decode_attention.py": "fixed",
    }
    moved = {row["id"]: row["direction"] for row in comparison["figures"] if row["moved"]}
    assert moved == {
        f"{SWEEP_BATCH_8}/transformers": "worse",
        "fuzz/deep_run/examples": None,
    }
    assert comparison["counts"]["regressions"] == 1
    page = parse(render_comparison(comparison))
    assert set(COMPARE_SECTIONS) <= page.ids
    assert_self_contained(page)


def test_compare_and_render_from_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old = sample_report().to_json()
    old["speed"]["plots"] = []  # drawing them takes seconds and is checked on the sample page
    (tmp_path / "old.json").write_text(json.dumps(old))
    (tmp_path / "new.json").write_text(json.dumps(_changed_copy(old)))
    code = command.main(
        ["--compare", str(tmp_path / "old.json"), str(tmp_path / "new.json"), "--out", str(tmp_path / "cmp")]
    )
    assert code == 1  # a check regressed
    assert "1 regressions" in capsys.readouterr().out
    assert (tmp_path / "cmp" / "compare.html").is_file()
    assert command.main(["--render", str(tmp_path / "old.json"), "--out", str(tmp_path / "again")]) == 0
    assert set(REPORT_SECTIONS) <= parse((tmp_path / "again" / "report.html").read_text()).ids
    (tmp_path / "bad.json").write_text(json.dumps({"schema_version": 1}))
    assert command.main(["--render", str(tmp_path / "bad.json"), "--out", str(tmp_path / "x")]) == 2
    assert "does not follow the twinfer report schema" in capsys.readouterr().err


# -- verdicts ---------------------------------------------------------------------------------


def decode(ids) -> str:
    return "".join(f"<{token}>" for token in ids)


def trace(tokens: tuple[int, ...], tops: list[dict[int, float]]) -> Trace:
    return Trace(tokens, tuple(tops))


SAME_TOPS = [{1: -0.1, 7: -2.5}, {2: -0.2, 7: -2.0}]


def test_fp32_divergence_fails_and_shows_both_tokens_with_context() -> None:
    mine = trace((1, 2, 3), [*SAME_TOPS, {3: -0.5, 4: -1.5}])
    theirs = trace((1, 2, 4), [*SAME_TOPS, {4: -0.4, 3: -1.6}])
    key = CellKey("reference", "hf", "float32", "prefix-cache-off", "free-running")
    cell = free_running_cell(key, FreeRunning((mine,), 0), FreeRunning((theirs,), 0), [(9, 9)], 3, decode, "", 0.1)
    assert cell.status is Status.FAILED and cell.identical_prefix_lengths == (2,)
    (disagreement,) = cell.disagreements
    assert (disagreement.position, disagreement.candidate.token_id, disagreement.baseline.token_id) == (2, 3, 4)
    assert not disagreement.allowed
    assert disagreement.text_before == "<9><9><1><2>"
    assert [c.token_id for c in disagreement.baseline_top] == [4, 3]


def test_bf16_near_tie_passes_but_is_listed() -> None:
    mine = trace((1, 2, 3), [*SAME_TOPS, {3: -0.69, 4: -0.70}])
    theirs = trace((1, 2, 4), [*SAME_TOPS, {4: -0.68, 3: -0.71}])
    key = CellKey("reference", "hf", "bfloat16", "prefix-cache-off", "free-running")
    cell = free_running_cell(key, FreeRunning((mine,), 0), FreeRunning((theirs,), 0), [(9,)], 3, decode, "", 0.1)
    assert cell.status is Status.PASSED and cell.rule == "near-tie"
    assert cell.num_disagreements == 1 and cell.disagreements[0].allowed


def test_fp32_logprob_error_fails_even_with_identical_tokens() -> None:
    mine = trace((1, 2), [{1: -0.1, 7: -2.5}, {2: -0.2, 7: -2.0}])
    theirs = trace((1, 2), [{1: -0.1, 7: -2.5}, {2: -0.2, 7: -2.001}])
    key = CellKey("reference", "hf", "float32", "prefix-cache-off", "free-running")
    cell = free_running_cell(key, FreeRunning((mine,), 0), FreeRunning((theirs,), 0), [(9,)], 2, decode, "", 0.1)
    assert cell.status is Status.FAILED
    assert cell.disagreements[0].kind == "logprob" and cell.disagreements[0].position == 1


@pytest.mark.parametrize(
    ("dtype", "fp32_margin", "expected"),
    [("bfloat16", 0.5, Status.FAILED), ("bfloat16", 0.1, Status.PASSED), ("float32", 0.1, Status.FAILED)],
)
def test_teacher_forced_top1_flip_fails_only_above_the_margin(dtype: str, fp32_margin: float, expected: Status) -> None:
    sequence = (5, 6, 7)
    mine = TeacherForced((sequence,), (({6: -0.1, 8: -3.0}, {7: -0.9, 8: -0.6}),))
    theirs = TeacherForced((sequence,), (({6: -0.1, 8: -3.0}, {7: -0.6, 8: -0.9}),))
    key = CellKey("reference", "hf", dtype, "prefix-cache-off", "teacher-forced")
    cell = teacher_forced_cell(key, mine, theirs, [(5.0, fp32_margin)], decode, "", 0.1)
    assert cell.status is expected
    assert cell.num_positions == 2 and cell.num_disagreements == 1 + (dtype == "float32")
    flip = cell.disagreements[0]
    assert (flip.kind, flip.position, flip.candidate.token_id, flip.baseline.token_id) == ("top1", 2, 8, 7)
    assert cell.error_distribution is not None and cell.error_distribution.max == pytest.approx(0.3)


def test_error_distribution_counts_every_value() -> None:
    errors = [0.0, 0.0, 1e-6, 2e-6, 0.01, 0.5, 20.0]
    distribution = error_distribution(errors)
    assert distribution.zeros == 2 and sum(distribution.counts) + distribution.zeros == len(errors)
    assert distribution.max == 20.0 and distribution.p50 == 2e-6
    assert distribution.mean == pytest.approx(sum(errors) / len(errors))


# -- sections from their sources ----------------------------------------------------------------


def test_committed_fuzz_record_is_read_with_its_planted_bugs() -> None:
    section = committed_fuzz_section()
    assert section.runs, "no committed deep-run record found"
    run = section.runs[0]
    assert run.totals["examples"] > 0 and run.totals["steps"] > 0
    assert len(run.planted_bugs) >= 10
    if run.status is Status.PASSED:
        assert all(bug.caught is True for bug in run.planted_bugs)


def test_fuzz_run_names_a_planted_bug_that_was_not_caught() -> None:
    record = {
        "profile": "ci",
        "result": "failed",
        "test_outcomes": {"passed": 1, "failed": 1},
        "totals": {"examples": 10},
        "machines": {"planted/ref count decremented twice": {"examples": 3}, "planted/other bug": {"examples": 2}},
    }
    outcomes = (
        TestOutcome(
            "fuzz/test_planted_bugs.py", "test_fuzzer_finds_planted_bug[ref-count-decremented-twice]", "failed", "x"
        ),
        TestOutcome("fuzz/test_planted_bugs.py", "test_fuzzer_finds_planted_bug[other-bug]", "passed", ""),
    )
    run = fuzz_run_from_record(record, "ci run", "fuzz/", outcomes)
    assert run.status is Status.FAILED
    assert {bug.name: bug.caught for bug in run.planted_bugs} == {
        "ref count decremented twice": False,
        "other bug": True,
    }


@pytest.mark.parametrize(
    ("result", "failures_counted", "status"),
    [
        ("interrupted", 0, Status.PASSED),
        ("interrupted", 2, Status.FAILED),
        ("interrupted", None, Status.FAILED),  # recorded before the machines counted failures
        ("killed", 0, Status.PASSED),  # the SIGINT did not end it: its last live counters are its verdict
        ("killed", 1, Status.FAILED),
        ("failed", 0, Status.FAILED),
        ("passed", 0, Status.PASSED),
    ],
)
def test_a_soak_stopped_at_its_time_limit_passes_only_with_no_failure_counted(
    result: str, failures_counted: int | None, status: Status
) -> None:
    record = {"profile": "soak", "result": result, "totals": {"examples": 10}, "machines": {"engine[fast]": {}}}
    if failures_counted is not None:
        record["failures_counted"] = failures_counted
    run = fuzz_run_from_record({"run": record}, "committed", "reports/results/fuzz/x.json", None)
    assert run.status is status
    if result == "interrupted":
        assert run.detail.startswith("interrupted at its time limit"), run.detail
    if result == "killed":
        assert run.detail.startswith(f"killed after its time limit, {failures_counted} failures counted"), run.detail


def test_kernel_section_summarises_a_real_pytest_run(tmp_path: Path) -> None:
    module = tmp_path / "test_sample_kernels.py"
    module.write_text(
        textwrap.dedent("""
        import pytest

        def test_passes():
            assert True

        def test_fails():
            assert 1 == 2, "<kernel> mismatch"

        @pytest.mark.skip(reason="needs a GPU")
        def test_skipped():
            pass
    """)
    )
    run = run_pytest([str(module)], tmp_path / "junit.xml", timeout_s=120)
    section = summarise_kernel_run(run)
    assert section.status is Status.FAILED
    ((summary),) = section.files
    assert (summary.passed, summary.failed, summary.skipped) == (1, 1, 1)
    assert "mismatch" in section.failures[0].message and section.failures[0].test.endswith("test_fails")


def test_speed_section_is_not_run_without_a_gpu_and_runs_the_harness_on_the_cpu() -> None:
    cpu = torch.device("cpu")
    assert speed_section(SpeedOptions(cpu, ("decode-bs1",))).detail.startswith("not run: no CUDA device")
    # The harness on the CPU: tiny shape, a scaled-down sweep, the reference engine beside transformers.
    # (Reading what the harness writes is tested on committed records and in tests/reports/test_bench.py.)
    options = SpeedOptions(
        cpu, ("decode-sweep",), shape="tiny", engine="reference", dtype=torch.float32, scale=0.01, repeats=1,
        allow_cpu=True,
    )  # fmt: skip
    section = speed_section(options)
    assert section.status is Status.PASSED, section.detail
    engines = {row.engine for table in section.tables for row in table.rows}
    assert engines == {"twinfer reference", "transformers"}
    assert {plot.id for plot in section.plots} >= {"tpot-vs-batch", "throughput-vs-batch", "fraction-of-floor"}
    assert all("NOT the standard workload" in table.note for table in section.tables)
    assert all(row.settings == "no flags (defaults)" and row.record is None for row in section.tables[0].rows)
    assert "copy bandwidth" in section.environment


def test_speed_section_reads_a_prefix_shared_record_and_its_verdict() -> None:
    """A committed record, as the harness wrote it: prefix-cache hits and the on/off comparison are shown,
    and outputs that differ with prefix caching on and off fail the table."""
    path = RESULTS / "bench" / "prefix-shared.json"
    (table,) = speed_section(SpeedOptions(torch.device("cpu"), (), bench_json=(path,))).tables
    assert table.workload == "prefix-shared" and table.shape == "qwen3-0.6b"
    assert "129,024 served from the prefix cache" in table.note
    assert "outputs with prefix caching on and off DIFFER (3 of 64 requests)" in table.note
    assert table.status is Status.FAILED
    assert [(row.phase, row.engine) for row in table.rows] == [
        ("prefix-caching-on", "twinfer fast"),
        ("prefix-caching-on", "transformers"),
        ("prefix-caching-off", "twinfer fast"),
    ]
    record = json.loads(path.read_text())
    assert table.rows[0].value == record["results"][0]["phases"][0]["metrics"]["output_tokens_per_s"]
    assert table.rows[0].times_baseline == pytest.approx(6607.922280612364 / 275.10748144791245)


def test_speed_section_says_why_a_record_cannot_be_read(tmp_path: Path) -> None:
    (tmp_path / "other.json").write_text(json.dumps({"record": "something else"}))
    (tmp_path / "cut.json").write_text(json.dumps({"record": "twinfer bench", "workload": {}}))
    section = speed_section(
        SpeedOptions(torch.device("cpu"), (), bench_json=(tmp_path / "other.json", tmp_path / "cut.json"))
    )
    assert section.status is Status.NOT_RUN and "other.json: not a `twinfer bench` record" in section.detail
    assert "cut.json: a `twinfer bench` record without shape, dtype, environment, ceilings, results" in section.detail


# -- the speed section of several bench records ----------------------------------------------------


def _bs1(tpot_s: float, hf_tpot_s: float | None = None) -> dict[str, dict[str, tuple[float, float]]]:
    figures = {"fast": {"decode": (1 / tpot_s, tpot_s)}}
    return figures | ({"hf": {"decode": (1 / hf_tpot_s, hf_tpot_s)}} if hf_tpot_s else {})


def _offline(tokens_per_s: float, hf_tokens_per_s: float | None = None) -> dict[str, dict[str, tuple[float, float]]]:
    figures = {"fast": {"offline": (tokens_per_s, 0.01)}}
    return figures | ({"hf": {"offline": (hf_tokens_per_s, 0.26)}} if hf_tokens_per_s else {})


def test_a_checkpoints_record_and_transformers_prompt_lookup_are_named() -> None:
    """A record of `twinfer bench --model CHECKPOINT --hf-prompt-lookup K` says it ran the checkpoint, not random
    weights, and its transformers row says it ran assisted generation by prompt lookup."""
    record = bench_record("decode-bs1", _bs1(0.0005, 0.004), shape="stdlib-tiny")
    record["model"] = "twinfer/models/stdlib-tiny"
    hf = next(result for result in record["results"] if result["engine"] == "hf")
    hf["transformers_settings"]["prompt_lookup_num_tokens"] = 4
    section = speed_from_records([BenchRecord(record, "edit.json")])
    assert "stdlib-tiny (checkpoint twinfer/models/stdlib-tiny)" in section.detail
    assert "random weights" not in section.detail
    rows = {row.engine: row.settings for row in section.tables[0].rows}
    assert rows == {
        "twinfer fast": "no flags (defaults)",
        "transformers": "no flags (defaults) · transformers: prompt lookup, prompt_lookup_num_tokens 4",
    }


def test_speed_section_shows_every_record_with_its_settings_and_baseline(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Records as `twinfer bench --json` writes them, given with --bench-json (twice): each workload, shape and
    settings is shown beside its transformers baseline, the defaults first; the decode-sweep is plotted; two
    records that differ only in batch-invariant mode give its cost (one at another commit does not pair)."""
    invariant = {**TUNED, "batch_invariant": True}
    records = {
        "offline-tuned": bench_record("offline-256", _offline(22000.0, 620.0), TUNED),
        "offline-defaults": bench_record("offline-256", _offline(12500.0, 610.0)),
        "offline-invariant": bench_record("offline-256", _offline(19800.0), invariant),
        "bs1": bench_record("decode-bs1", _bs1(0.001, 0.04)),
        "bs1-invariant": bench_record("decode-bs1", _bs1(0.0015), {"batch_invariant": True}),
        "bs1-elsewhere": bench_record("decode-bs1", _bs1(0.0011), {"batch_invariant": True}, commit="0ther"),
        "bs1-8b": bench_record("decode-bs1", _bs1(0.005, 0.045), shape="qwen3-8b"),
        "sweep": next(r for r in sample_bench_records() if r["workload"]["name"] == "decode-sweep"),
    }
    paths = {}
    for name, record in records.items():
        paths[name] = tmp_path / f"{name}.json"
        paths[name].write_text(json.dumps(record))
    names = list(paths)
    out = tmp_path / "report"
    arguments = ["--sections", "speed", "--out", str(out), "--bench-json", *(str(paths[n]) for n in names[:3])]
    # --commit: the commit under test where the tree's git metadata cannot be trusted (a device's copy).
    arguments += ["--commit", "c0ffee1"]
    assert command.main([*arguments, "--bench-json", *(str(paths[n]) for n in names[3:])]) == 0
    capsys.readouterr()
    document = json.loads((out / "report.json").read_text())
    validate_report(document)
    assert (document["commit"], document["commit_dirty"]) == ("c0ffee1", None)
    speed = document["speed"]
    tables = {(t["workload"], t["shape"], t["metric"]): t for t in speed["tables"]}

    def shown(key: tuple[str, str, str]) -> list[tuple]:
        return [(r["settings"], r["engine"], r["value"], r["times_baseline"], r["record"]) for r in tables[key]["rows"]]

    offline = ("offline-256", "qwen3-0.6b", "output tokens/s")
    assert shown(offline) == [
        ("no flags (defaults)", "twinfer fast", 12500.0, pytest.approx(12500 / 610), str(paths["offline-defaults"])),
        ("no flags (defaults)", "transformers", 610.0, None, str(paths["offline-defaults"])),
        (TUNED_FLAGS, "twinfer fast", 22000.0, pytest.approx(22000 / 620), str(paths["offline-tuned"])),
        (TUNED_FLAGS, "transformers", 620.0, None, str(paths["offline-tuned"])),
        (f"{TUNED_FLAGS} --batch-invariant", "twinfer fast", 19800.0, None, str(paths["offline-invariant"])),
    ]
    assert {(r["commit"], r["gpu"]) for r in tables[offline]["rows"]} == {(SAMPLE_BENCH_COMMIT, SAMPLE_GPU)}
    assert shown(("decode-bs1", "qwen3-0.6b", "time per output token")) == [
        ("no flags (defaults)", "twinfer fast", pytest.approx(1.0), pytest.approx(40.0), str(paths["bs1"])),
        ("no flags (defaults)", "transformers", pytest.approx(40.0), None, str(paths["bs1"])),
        ("--batch-invariant · commit feedc0f", "twinfer fast", pytest.approx(1.5), None, str(paths["bs1-invariant"])),
        ("--batch-invariant · commit 0ther", "twinfer fast", pytest.approx(1.1), None, str(paths["bs1-elsewhere"])),
    ]  # fmt: skip
    assert shown(("decode-bs1", "qwen3-8b", "time per output token"))[0][1:4] == (
        "twinfer fast", pytest.approx(5.0), pytest.approx(9.0)
    )  # fmt: skip
    costs = {(c["workload"], c["settings"]): (c["off"], c["on"], c["cost_percent"]) for c in speed["costs"]}
    # The cost: tokens/s lost (offline-256), time per token added (decode-bs1), in percent of the figure off.
    assert costs == {
        ("offline-256", TUNED_FLAGS): (22000.0, 19800.0, pytest.approx(10.0)),
        ("decode-bs1", "no flags (defaults)"): (pytest.approx(1.0), pytest.approx(1.5), pytest.approx(50.0)),
    }
    (tpot_plot,) = [plot for plot in speed["plots"] if plot["id"] == "tpot-vs-batch"]
    assert {s["label"]: (s["x"], s["y"]) for s in tpot_plot["series"]} == {
        "twinfer fast": ([1, 8, 32], [pytest.approx(1.2), pytest.approx(1.9), pytest.approx(3.1)]),
        "transformers": ([1, 8, 32], [pytest.approx(28.0), pytest.approx(30.0), pytest.approx(24.0)]),
    }
    assert "not measured: prefix-shared, long-context" in speed["detail"]

    page = parse((out / "report.html").read_text())
    assert_every_section_linked_from_the_top(page)
    assert "plot-tpot-vs-batch" in page.figures_with_svg
    text = " ".join(page.text)
    assert text.index("no flags (defaults)") < text.index(TUNED_FLAGS)
    for shown_text in ("12,500", "22,000", "35.5×", "20.5×", "+10.0%", "+50.0%", "qwen3-8b", "feedc0f", SAMPLE_GPU):
        assert shown_text in text, shown_text


def test_batch_invariant_cost_of_the_committed_records() -> None:
    """The README's figures for commit c949ea7: 7.4% on offline-256 (16,536 against 17,866 tok/s) and 48% on
    decode-bs1 (2.021 against 1.368 ms per token), from the four records of that run."""
    run = RESULTS / "batch_invariant" / "run_c949ea7"
    paths = sorted(run.glob("*batch-invariant.json"))
    records = [BenchRecord(json.loads(path.read_text()), str(path)) for path in paths]
    costs = {cost.workload: cost for cost in speed_from_records(records).costs}
    assert set(costs) == {"offline-256", "decode-bs1"}
    assert round(costs["offline-256"].off) == 17867 and round(costs["offline-256"].on) == 16536
    assert costs["offline-256"].cost_percent == pytest.approx(7.4, abs=0.05)
    assert (round(costs["decode-bs1"].off, 3), round(costs["decode-bs1"].on, 3)) == (1.368, 2.021)
    assert costs["decode-bs1"].cost_percent == pytest.approx(47.7, abs=0.05)
    assert costs["offline-256"].settings == "--max-num-seqs 256 --max-num-batched-tokens 8192 --max-model-len 2048"


def test_a_cost_is_taken_against_the_median_of_several_runs_with_the_setting_off() -> None:
    """Two no-flag offline-256 runs of one commit (21,400 and 22,828 tok/s, bench/defaults_f76b950/) beside
    one in batch-invariant mode (20,517): the cost is against their median, 22,114 (7.2%), not either run."""
    run = RESULTS / "bench" / "defaults_f76b950"
    names = ("offline-256-defaults-1.json", "offline-256-defaults-2.json", "offline-256-batch-invariant.json")
    records = [BenchRecord(json.loads((run / name).read_text()), str(run / name)) for name in names]
    (cost,) = speed_from_records(records).costs
    assert round(cost.off) == 22114 and round(cost.on) == 20517
    assert cost.cost_percent == pytest.approx(7.22, abs=0.01)
    assert len(cost.records) == 3


def _key_paths(value: object, prefix: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    """Every key path of a JSON value (list items as "[]"), stopping at the engine settings (given and
    resolved): their keys are EngineConfig's fields, data rather than format."""
    paths = set()
    if isinstance(value, dict):
        for key, item in value.items():
            paths.add((*prefix, key))
            if key not in ("engine_config", "engine_settings_given"):
                paths |= _key_paths(item, (*prefix, key))
    elif isinstance(value, list):
        for item in value:
            paths |= _key_paths(item, (*prefix, "[]"))
    return paths


def test_sample_bench_records_are_in_the_real_record_format() -> None:
    """The synthetic records of the tests and the sample page hold only what real records hold."""
    real: dict[str, set[tuple[str, ...]]] = {}
    for path in RESULTS.glob("bench/*.json"):
        record = json.loads(path.read_text())
        real.setdefault(record["workload"]["name"], set()).update(_key_paths(record))
    for record in sample_bench_records():
        extra = _key_paths(record) - real[record["workload"]["name"]]
        assert not extra, f"{record['workload']['name']}: not in any committed record: {sorted(extra)}"


def test_reports_made_before_speed_rows_were_labelled_still_render() -> None:
    """report.json of an earlier version (no settings, phase, speed-up, commit, GPU or record per row, no
    shape per table, no costs, no log_y per plot) still follows the schema and renders its figures."""
    document = sample_report().to_json()
    speed = document["speed"]
    del speed["costs"]
    for table in speed["tables"]:
        del table["shape"]
        for row in table["rows"]:
            for name in ("settings", "phase", "times_baseline", "commit", "gpu", "record"):
                del row[name]
    speed["plots"] = [{key: value for key, value in speed["plots"][0].items() if key != "log_y"}]
    validate_report(document)
    page = parse(render_report(document))
    assert_every_section_linked_from_the_top(page)
    text = " ".join(page.text)
    assert "12,000" in text and "output tokens/s" in text and "× transformers" not in text


# -- a real run on the tiny model ----------------------------------------------------------------


def test_real_run_on_the_tiny_model_keeps_every_cell(tiny_checkpoint: Path) -> None:
    options = CorrectnessOptions(
        tiny_checkpoint, torch.device("cpu"), (torch.float32, torch.bfloat16), quick=True,
        pairs=(("reference", "hf"),), features=("chunked-prefill",),
    )  # fmt: skip
    correctness = run_correctness(options)
    expected = {
        f"reference-hf/{dtype}/chunked-prefill/{mode}"
        for dtype in ("float32", "bfloat16")
        for mode in ("free-running", "teacher-forced")
    }
    cells = {cell.id: cell for cell in correctness.cells}
    assert set(cells) == expected
    for cell_id in (
        "reference-hf/float32/chunked-prefill/free-running",
        "reference-hf/bfloat16/chunked-prefill/teacher-forced",
    ):
        assert cells[cell_id].status is Status.PASSED, cells[cell_id].detail
    assert "token budget" in cells["reference-hf/float32/chunked-prefill/free-running"].feature_evidence
    assert cells["reference-hf/bfloat16/chunked-prefill/teacher-forced"].error_distribution is not None
    page = parse(render_report(_report_of(correctness).to_json()))
    assert set(REPORT_SECTIONS) <= page.ids
    assert_self_contained(page)


@pytest.mark.interpreter
def test_an_engine_that_cannot_run_keeps_its_cells_with_the_reason(tiny_checkpoint: Path) -> None:
    """The fast engine on the CPU runs Triton's interpreter, which has no bfloat16: its cells are kept, not
    run, with that reason, and the summary counts them. (Its fp32 cells would take the interpreter half a
    minute; the fast engine's agreement with the reference is tested in tests/fast/test_fast_engine.py.)"""
    options = CorrectnessOptions(
        tiny_checkpoint, torch.device("cpu"), (torch.bfloat16,), quick=True, pairs=(("fast", "reference"),),
        features=("chunked-prefill",),
    )  # fmt: skip
    correctness = run_correctness(options)
    assert {cell.id for cell in correctness.cells} == {
        "fast-reference/bfloat16/chunked-prefill/free-running",
        "fast-reference/bfloat16/chunked-prefill/teacher-forced",
    }
    assert all(cell.status is Status.NOT_RUN and "bfloat16" in cell.detail for cell in correctness.cells)
    assert correctness.status is Status.NOT_RUN and correctness.detail == "2 cells: 0 passed, 0 failed, 2 not run"
    document = _report_of(correctness).to_json()
    validate_report(document)
    assert document["summary"]["not_run"] == 3 + 2  # three sections left out, the two fast bf16 cells


def _report_of(correctness: CorrectnessSection):
    settings = RunSettings("tiny", "cpu", ("float32", "bfloat16"), True, "pytest")
    left_out = "not run: left out by --sections"
    return assemble_report(
        settings, correctness, FuzzSection(Status.NOT_RUN, left_out, ()), KernelSection(Status.NOT_RUN, left_out),
        SpeedSection(Status.NOT_RUN, left_out), torch.device("cpu"),
    )  # fmt: skip


# An explicit KV pool for the speed section's fast engine where the suite runs on a GPU: with no flags it sizes its
# pool from gpu_memory_utilization of the whole GPU (what a user gets, and what the published report measures alone
# on the machine), which in a suite of 8 workers on one GPU took 70 GiB and left seven other workers' tests out of
# memory (reports/results/fast_gpu/suite_and_report/run_4b66ce7_oom/). 4096 blocks hold the quick workload.
SUITE_SPEED_POOL_BLOCKS = 4096


def _pool_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    original = harness.bench_engine_config

    def explicit_pool(name: str, settings: harness.BenchSettings, phase: object) -> EngineConfig:
        config = original(name, settings, phase)
        return config if config.num_blocks is not None else replace(config, num_blocks=SUITE_SPEED_POOL_BLOCKS)

    monkeypatch.setattr(harness, "bench_engine_config", explicit_pool)


def test_command_writes_both_files(
    tiny_checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _pool_of_its_own(monkeypatch)
    out = tmp_path / "report"
    code = command.main(["--model", str(tiny_checkpoint), "--quick", "--sections", "fuzz,speed", "--out", str(out)])
    assert code == 0
    document = json.loads((out / "report.json").read_text())
    validate_report(document)
    checks = {check["id"]: check for check in document["checks"]}
    assert checks["correctness"]["status"] == "not_run" and checks["kernels"]["status"] == "not_run"
    assert any(check_id.startswith("fuzz/") and check["status"] == "passed" for check_id, check in checks.items())
    assert str(out / "report.html") in capsys.readouterr().out
    assert set(REPORT_SECTIONS) <= parse((out / "report.html").read_text()).ids
