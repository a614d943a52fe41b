"""reports.bench.ab: trees alternate A B, B A; each run is a real `twinfer bench` process in its tree; failures are
recorded and left out of the medians; bad arguments are refused by name."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from reports.bench.ab import Tree, headline, main, run_order, run_process
from reports.bench.plan import TIMED_OUT

REPO = Path(__file__).resolve().parents[2]
TINY_DECODE = ["decode-bs1", "--shape", "tiny", "--dtype", "float32", "--engine", "reference", "--scale", "0.05",
               "--repeats", "1"]  # fmt: skip


def _tree(root: Path, name: str, commit: str | None) -> Path:
    """A tree as the device calls make them (a copy of the packages, its sha in COMMIT), here of links."""
    tree = root / name
    tree.mkdir()
    for package in ("fast", "spec", "twinfer", "reports", "reference"):
        (tree / package).symlink_to(REPO / package)
    if commit is not None:
        (tree / "COMMIT").write_text(commit + "\n")
    return tree


def test_the_trees_alternate_as_given_then_reversed() -> None:
    a, b, c = Tree("a", Path("x")), Tree("b", Path("y")), Tree("c", Path("z"))
    order = [(round_, tree.name) for round_, tree in run_order([a, b, c], 3)]
    assert order == [(1, "a"), (1, "b"), (1, "c"), (2, "c"), (2, "b"), (2, "a"), (3, "a"), (3, "b"), (3, "c")]


def test_a_real_ab_runs_each_tree_s_own_code_in_its_own_process(tmp_path: Path, capsys) -> None:
    """Two trees on the CPU, the reference engine on the tiny shape: each run's record names its tree's commit,
    and the summary has both trees' medians and the second's difference from the first."""
    new = _tree(tmp_path, "new", "1" * 40)
    old = _tree(tmp_path, "old", None)
    out = tmp_path / "out"
    code = main([str(out), "--tree", f"new={new}", "--tree", f"old={old}", "--rounds", "1", "--", *TINY_DECODE])
    assert code == 0
    summary = json.loads((out / "ab.json").read_text())
    assert summary["trees"]["new"]["commit"] == "1" * 40 and summary["trees"]["old"]["commit"] == "unknown"
    record = json.loads((out / "new-1.json").read_text())
    assert record["environment"]["commit"] == "1" * 40 + "-new"
    assert record["workload"]["name"] == "decode-bs1" and record["results"][0]["engine"] == "reference"
    assert [run["tree"] for run in summary["runs"]] == ["new", "old"]
    assert all(run["status"] == 0 and run["headline"]["batch-1"] > 0 for run in summary["runs"])
    tpot = {run["tree"]: run["headline"]["batch-1"] for run in summary["runs"]}
    assert summary["medians"] == {"new": {"batch-1": tpot["new"]}, "old": {"batch-1": tpot["old"]}}
    assert summary["difference_from_first"]["old"]["batch-1"] == pytest.approx(tpot["old"] / tpot["new"] - 1)
    assert "median old batch-1" in capsys.readouterr().out


def _record(workload: str, figures: dict[str, float], key: str) -> dict[str, object]:
    """The parts of a `twinfer bench` record the A/B reads; the engine under test first, a baseline after."""
    phases = [{"phase": phase, "metrics": {key: value}} for phase, value in figures.items()]
    baseline = {"engine": "hf", "phases": [{"phase": phase, "metrics": {key: -1.0}} for phase in figures]}
    return {"workload": {"name": workload}, "results": [{"engine": "fast", "phases": phases}, baseline]}


def test_the_headline_is_the_workload_s_metric_of_the_engine_under_test() -> None:
    assert headline(_record("decode-bs1", {"batch-1": 0.001}, "tpot_s")) == {"batch-1": 0.001}
    assert headline(_record("offline-256", {"offline": 23000.0}, "output_tokens_per_s")) == {"offline": 23000.0}


def test_failed_and_timed_out_runs_are_recorded_and_left_out_of_the_medians(tmp_path: Path) -> None:
    statuses = iter([0, 1, 124, 0])  # a round 1, b round 1, b round 2, a round 2
    figures = iter([0.002, 0.004])

    def runner(command: Sequence[str], cwd: Path, log: Path, limit_s: float) -> int:
        status = next(statuses)
        if status == 0:
            record = _record("decode-bs1", {"batch-1": next(figures)}, "tpot_s")
            Path(command[command.index("--json") + 1]).write_text(json.dumps(record))
        return status

    trees = [f"--tree=a={_tree(tmp_path, 'a', None)}", f"--tree=b={_tree(tmp_path, 'b', None)}"]
    out = tmp_path / "out"
    assert main([str(out), *trees, "--", "decode-bs1"], runner=runner) == 1
    summary = json.loads((out / "ab.json").read_text())
    assert [(run["tree"], run["round"], run["status"]) for run in summary["runs"]] == [
        ("a", 1, 0), ("b", 1, 1), ("b", 2, 124), ("a", 2, 0)
    ]  # fmt: skip
    assert summary["medians"] == {"a": {"batch-1": pytest.approx(0.003)}, "b": {}}
    assert summary["difference_from_first"] == {"b": {}}


def test_a_run_past_its_limit_is_stopped(tmp_path: Path) -> None:
    status = run_process([sys.executable, "-c", "import time; time.sleep(60)"], tmp_path, tmp_path / "log", 0.5)
    assert status == TIMED_OUT


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--tree", "a=TREE", "--", "decode-bs1"], "two or more trees"),
        (["--tree", "a=TREE", "--tree", "a=TREE", "--", "decode-bs1"], "distinct names"),
        (["--tree", "a=TREE", "--tree", "b=TREE"], "no workload"),
        (["--tree", "a=TREE", "--tree", "b=TREE", "--"], "no workload after"),
        (["--tree", "a=TREE", "--tree", "b=/no/such/dir", "--", "decode-bs1"], "is not a directory"),
        (["--tree", "TREE", "--tree", "b=TREE", "--", "decode-bs1"], "a tree is NAME=DIR"),
        (["--tree", "a=TREE", "--tree", "b=TREE", "--rounds", "0", "--", "decode-bs1"], "at least 1"),
    ],
)
def test_bad_arguments_are_refused_by_name(tmp_path: Path, capsys, arguments: list[str], message: str) -> None:
    arguments = [argument.replace("TREE", str(tmp_path)) for argument in arguments]
    with pytest.raises(SystemExit) as exit_info:
        main([str(tmp_path / "out"), *arguments])
    assert exit_info.value.code == 2 and message in capsys.readouterr().err
