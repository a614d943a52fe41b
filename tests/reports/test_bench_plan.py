"""reports.bench.plan: a device call's steps run in order under one budget, each logged; a step at its limit
is stopped, one without time left is skipped; the committed plans load."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from reports.bench import plan as plan_runner

ROOT = Path(__file__).resolve().parents[2]


def _python(code: str, *args: str) -> list[str]:
    return [sys.executable, "-c", code, *args]


def _toml_step(name: str, limit_s: float, command: list[str], extra: str = "") -> str:
    # A JSON list of strings is a TOML array of basic strings.
    return f'[[steps]]\nname = "{name}"\nlimit_s = {limit_s}\ncommand = {json.dumps(command)}\n{extra}\n'


def test_a_plan_runs_each_step_logs_it_stops_one_at_its_limit_and_skips_one_without_time(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Budget 33 s: `killed` (limit 3 s) starts with more than 30 s left and is stopped at 3 s, after which
    less than 30 s is left, so `late` is skipped."""
    monkeypatch.setattr(plan_runner, "worktree_tree_id", lambda folder=None: "t")  # not this checkout's .git
    plan_file = tmp_path / "plan.toml"
    plan_file.write_text(
        'budget_s = 33\n[env]\nGREETING = "hello"\n\n'
        + _toml_step(
            "passes",
            20,
            _python(
                "import os, sys; print(os.environ['GREETING'], sys.argv[1]); open(os.environ['RESULT'], 'w')",
                "{commit}",
            ),
            'env = {RESULT = "{out}/passes.json"}\nsummary = "^hello"',
        )
        + _toml_step("fails", 20, _python("import sys; print('failing'); sys.exit(3)"))
        + _toml_step("killed", 3, _python("import time; print('started', flush=True); time.sleep(60)"))
        + _toml_step("late", 20, _python("print('never')"))
    )
    out = tmp_path / "out"
    assert plan_runner.main([str(plan_file), "--out", str(out), "--commit", "abc123"]) == 1

    done = (out / "done.txt").read_text().splitlines()
    assert len(done) == 4
    assert re.fullmatch(r"passes rc=0 at \d+s \(limit 20s\)", done[0])
    assert re.fullmatch(r"fails rc=3 at \d+s \(limit 20s\)", done[1])
    assert re.fullmatch(r"killed rc=124 at [34]s \(limit 3s\)", done[2])
    assert re.fullmatch(r"skipped late: (29|30)s left", done[3])  # under 30 s, shown rounded
    assert (out / "passes.log").read_text() == "hello abc123\n"  # the plan's env, {commit} in the command
    assert (out / "passes.json").exists()  # {out} in the step's env
    assert (out / "fails.log").read_text() == "failing\n"
    assert (out / "killed.log").read_text() == "started\n"
    assert not (out / "late.log").exists()
    assert (out / "commit.txt").read_text() == "abc123\n"
    assert (out / "plan.toml").read_text() == plan_file.read_text()
    summary = capsys.readouterr().out.splitlines()
    assert summary[:4] == done
    assert summary[4:6] == ["== passes", "hello abc123"] and "failing" in summary


def test_a_failed_step_that_stops_the_plan_skips_the_rest(tmp_path: Path) -> None:
    plan = plan_runner.parse_plan(
        {
            "steps": [
                {"name": "setup", "limit_s": 20, "command": _python("raise SystemExit(1)"), "stop_on_failure": True},
                {"name": "measure", "limit_s": 20, "command": _python("print('measured')")},
            ]
        }
    )
    results = plan_runner.run_plan(plan, tmp_path, commit="abc123")
    assert [result.done_line().split(" at ")[0] for result in results] == [
        "setup rc=1",
        "skipped measure: setup failed",
    ]


def test_a_command_that_does_not_exist_is_logged_as_status_127(tmp_path: Path) -> None:
    plan = plan_runner.parse_plan({"steps": [{"name": "missing", "limit_s": 5, "command": ["no-such-program-here"]}]})
    (result,) = plan_runner.run_plan(plan, tmp_path, commit="abc123")
    assert result.returncode == 127 and "no-such-program-here" in (tmp_path / "missing.log").read_text()


@pytest.mark.parametrize(
    ("plan", "message"),
    [
        ({"steps": []}, "non-empty list"),
        ({"steps": [{"name": "a", "limit_s": 1, "command": ["true"]}] * 2}, "unique"),
        ({"steps": [{"name": "a/b", "limit_s": 1, "command": ["true"]}]}, "names a file"),
        ({"steps": [{"name": "a", "limit_s": 0, "command": ["true"]}]}, "positive number"),
        ({"steps": [{"name": "a", "limit_s": 1, "command": "true"}]}, "list of strings"),
        ({"steps": [{"name": "a", "limit_s": 1, "command": ["true"], "timeout": 5}]}, "unknown keys"),
        ({"steps": [{"name": "a", "limit_s": 1, "command": ["true"], "signal": "NOPE"}]}, "name a signal"),
        ({"steps": [{"name": "a", "limit_s": 1, "command": ["true"]}], "env": {"X": 1}}, "map names to strings"),
    ],
)
def test_a_plan_that_cannot_run_as_written_is_refused(plan: dict, message: str) -> None:
    with pytest.raises(plan_runner.PlanError, match=message):
        plan_runner.parse_plan(plan)


def test_json_plans_read_like_toml_plans(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"steps": [{"name": "a", "limit_s": 5, "command": ["true"], "signal": "ABRT"}]}))
    (step,) = plan_runner.load_plan(path).steps
    assert step.limit_signal.name == "SIGABRT"


@pytest.mark.parametrize(
    "path", sorted((ROOT / "reports" / "results").rglob("*.toml")), ids=lambda p: f"{p.parent.name}/{p.name}"
)
def test_every_committed_plan_loads(path: Path) -> None:
    plan = plan_runner.load_plan(path)
    assert plan.steps and plan.description


def _git(folder: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=folder, capture_output=True, text=True, check=True).stdout.strip()


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_the_tree_id_names_the_files_that_ran_whatever_the_checkout_says(tmp_path: Path) -> None:
    """A device's copy of the tree can carry stale git metadata (a call once recorded the commit before the one
    that ran): tree.txt is computed from the files alone, so it equals COMMIT^{tree} exactly for COMMIT's files."""
    repo = tmp_path / "repo"
    (repo / "pkg").mkdir(parents=True)
    _git(repo, "init", "-q")
    _git(repo, "config", "user.email", "t@example.com")
    _git(repo, "config", "user.name", "t")
    (repo / ".gitignore").write_text("/scratch/\n")
    (repo / "pkg" / "code.py").write_text("x = 1\n")
    (repo / "run.sh").write_text("echo\n")
    (repo / "run.sh").chmod(0o755)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "first")
    first = _git(repo, "rev-parse", "HEAD^{tree}")
    (repo / "scratch").mkdir()
    (repo / "scratch" / "log.txt").write_text("ignored\n")
    assert plan_runner.worktree_tree_id(repo / "pkg") == first, "from a subfolder, with ignored files beside"

    (repo / "pkg" / "code.py").write_text("x = 2\n")  # the files move on; the checkout's HEAD and index do not
    (repo / "pkg" / "new.py").write_text("y = 1\n")
    changed = plan_runner.worktree_tree_id(repo)
    assert changed not in (first, "unknown")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "second")
    assert changed == _git(repo, "rev-parse", "HEAD^{tree}")
    _git(repo, "reset", "-q", "--mixed", "HEAD~1")  # stale metadata: HEAD and index say first, the files are second's
    assert plan_runner.worktree_tree_id(repo) == changed
    assert _git(repo, "write-tree") == first, "the checkout's own index is left as it was"

    outside = tmp_path / "not-a-checkout"
    outside.mkdir()
    assert plan_runner.worktree_tree_id(outside) == "unknown"


def test_the_command_records_the_tree_of_its_folder_beside_the_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(plan_runner, "worktree_tree_id", lambda folder=None: "tree-of-the-files")
    plan_file = tmp_path / "plan.toml"
    plan_file.write_text(_toml_step("one", 30, _python("pass")))
    assert plan_runner.main([str(plan_file), "--out", str(tmp_path / "out"), "--commit", "abc1234"]) == 0
    assert (tmp_path / "out" / "commit.txt").read_text() == "abc1234\n"
    assert (tmp_path / "out" / "tree.txt").read_text() == "tree-of-the-files\n"
