"""The report's mutation section: read from committed `python -m fuzz.mutation` records, a check per
module against the target score, every survivor's diff on the page (escaped), and reports made before
the section existed still validate and render."""

from __future__ import annotations

import json
from pathlib import Path

from reports.report.assemble import mutation_checks, report_of_sections
from reports.report.mutation_section import TARGET_SCORE, committed_mutation_section
from reports.report.records import Status
from reports.report.render import render_report
from reports.report.sample import sample_report
from reports.report.schema import validate_report

HOSTILE_DIFF = "-    return a < b\n+    return a <= b  # </pre><script>alert(1)</script>"


def _module(module: str, killed: int, survived: int, equivalent: int = 0) -> dict[str, object]:
    judged = killed + survived
    return {
        "module": module,
        "tests": ["tests/test_x.py"],
        "baseline": "passed",
        "baseline_s": 1.0,
        "mutants": judged + equivalent,
        "done": judged + equivalent,
        "killed": killed,
        "timeout": 0,
        "survived": survived,
        "equivalent": equivalent,
        "errors": 0,
        "seconds": 12.5,
        "score": round(killed / judged, 4) if judged else None,
    }


def _record() -> dict[str, object]:
    return {
        "kind": "twinfer-mutation",
        "command": "python -m fuzz.mutation --workers 1",
        "git_commit": "abc123",
        "workers": 1,
        "wall_time_s": 99.0,
        "complete": False,
        "note": "stopped at the run's time limit",
        "totals": {"killed": 58, "survived": 2, "equivalent": 1, "score": 0.9667},
        "modules": [_module("spec/good.py", 40, 0, equivalent=1), _module("spec/weak.py", 18, 2)],
        "survivors": [
            {"key": "k1", "module": "spec/weak.py", "operator": "core/ReplaceComparisonOperator_Lt_LtE", "line": 7,
             "definition": "f", "diff": HOSTILE_DIFF, "seconds": 1.0, "equivalent": None},
            {"key": "k2", "module": "spec/good.py", "operator": "core/NumberReplacer", "line": 3,
             "definition": "g", "diff": "-x = 1\n+x = 2", "seconds": 1.0, "equivalent": "only a cache size"},
        ],
    }  # fmt: skip


def _write_record(root: Path, record: dict[str, object]) -> None:
    directory = root / "reports" / "results" / "mutation"
    directory.mkdir(parents=True)
    (directory / "local.json").write_text(json.dumps(record))
    (directory / "notes.json").write_text(json.dumps({"kind": "something else"}))  # not a mutation record


def report_with(section):
    """The sample report with `section` as its mutation section."""
    base = sample_report()
    return report_of_sections(
        created=base.created,
        commit=base.commit,
        commit_dirty=base.commit_dirty,
        settings=base.settings,
        environment=base.environment,
        correctness=base.correctness,
        fuzz=base.fuzz,
        kernels=base.kernels,
        speed=base.speed,
        mutation=section,
    )


def test_each_module_is_held_to_the_target_and_survivors_are_shown(tmp_path: Path) -> None:
    _write_record(tmp_path, _record())
    section = committed_mutation_section(tmp_path)
    [run] = section.runs
    assert section.status is Status.FAILED and run.status is Status.FAILED  # spec/weak.py: 90% < 95%
    assert "incomplete: stopped at the run's time limit" in run.detail and "spec/weak.py" in run.detail

    report = report_with(section)
    checks = {check.id: check.status for check in report.checks if check.section == "mutation"}
    assert checks == {"mutation/local/spec/good.py": Status.PASSED, "mutation/local/spec/weak.py": Status.FAILED}
    scores = {figure.id: figure.value for figure in report.figures if figure.section == "mutation"}
    assert scores["mutation/local/spec/weak.py/score"] == 90.0 and TARGET_SCORE == 0.95

    document = report.to_json()
    validate_report(document, "a report with a mutation section")
    page = render_report(_without_plots(document))
    assert 'id="mutation"' in page and "spec/weak.py" in page and "90.0%" in page
    assert "only a cache size" in page  # the equivalent mutant's reason
    assert "&lt;/pre&gt;&lt;script&gt;" in page and "<script>alert(1)" not in page  # the diff, escaped


def test_a_module_is_judged_by_its_newest_record(tmp_path: Path) -> None:
    """A re-run after new tests supersedes the run before: spec/weak.py is judged by a_new.json (started later,
    though it sorts first by name), spec/good.py still by b_old.json, and both records stay listed, oldest first."""
    old, new = _record(), _record()
    old["started"], new["started"] = "2026-12-01T10:00:00+00:00", "2026-12-02T10:00:00+00:00"
    new["modules"] = [_module("spec/weak.py", 20, 0)]
    directory = tmp_path / "reports" / "results" / "mutation"
    directory.mkdir(parents=True)
    (directory / "b_old.json").write_text(json.dumps(old))
    (directory / "a_new.json").write_text(json.dumps(new))
    section = committed_mutation_section(tmp_path)
    assert [run.path.rsplit("/", 1)[1] for run in section.runs] == ["b_old.json", "a_new.json"]
    assert section.runs[0].status is Status.FAILED  # the old record, as it was
    assert section.status is Status.PASSED
    checks = {check.id: check.status for check in mutation_checks(section)}
    assert checks == {"mutation/b_old/spec/good.py": Status.PASSED, "mutation/a_new/spec/weak.py": Status.PASSED}


def test_the_records_fold_unless_a_modules_newest_record_misses_the_target(tmp_path: Path) -> None:
    """The page stays short: the records one click away, a record no module is judged by any more folded whole,
    an old record's survivors closed; open only where a module's newest record misses the target."""

    def page(new_modules: list) -> str:
        old, new = _record(), _record()
        old["started"], new["started"] = "2026-12-01T10:00:00+00:00", "2026-12-02T10:00:00+00:00"
        new["modules"] = new_modules
        if not any(module["survived"] for module in new_modules):
            new["survivors"] = []  # the re-run killed them
        directory = tmp_path / str(len(new_modules)) / "reports" / "results" / "mutation"
        directory.mkdir(parents=True)
        (directory / "old.json").write_text(json.dumps(old))
        (directory / "new.json").write_text(json.dumps(new))
        report = report_with(committed_mutation_section(directory.parents[2]))
        return render_report(_without_plots(report.to_json()))

    passing = page([_module("spec/weak.py", 20, 0), _module("spec/good.py", 20, 0)])
    assert "2 records, each module judged by its newest" in passing
    assert "superseded by later records of all its modules" in passing  # old.json: both modules re-run
    assert '<details class="fold" open>' not in passing.split('id="mutation"')[1].split("</section>")[0]
    failing = page([_module("spec/weak.py", 18, 2)])
    assert '<details class="fold" open><summary><strong>2 records' in failing


def test_no_record_leaves_the_section_not_run(tmp_path: Path) -> None:
    section = committed_mutation_section(tmp_path)
    assert section.status is Status.NOT_RUN and "no committed mutation record" in section.detail


def test_a_report_from_before_the_section_still_validates_and_renders() -> None:
    document = sample_report().to_json()
    del document["mutation"]
    validate_report(document, "an older report")
    assert 'id="mutation"' not in render_report(_without_plots(document))


def _without_plots(document: dict) -> dict:
    """The page without the speed plots, which take matplotlib seconds and show nothing of this section."""
    return {**document, "speed": {**document["speed"], "plots": []}}
