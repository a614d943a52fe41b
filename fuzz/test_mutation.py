"""The mutation run's machinery (fuzz/mutation): the data files are valid; a mutant is made outside
annotations and named stably; a forked run of a selection kills a mutant its test sees, lets through
one it does not, and a mutant that hangs is killed by its time limit. Nothing is written to the tree."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fuzz.mutation.equivalent import load_equivalents
from fuzz.mutation.run import REPO_ROOT
from fuzz.mutation.targets import load_targets

MODULE = """from __future__ import annotations


def clamp(value: int, low: int | None = 0) -> int:
    if value < low:
        return low
    return value


def spin(steps: int) -> int:
    total = 0
    while steps > 0:
        steps -= 1
        total += 1
    return total
"""
TEST = """from toy.maths import clamp, spin


def test_clamp():
    assert clamp(-3) == 0 and clamp(5) == 5


def test_spin():
    assert spin(3) == 3
"""


def test_the_targets_and_equivalents_files_are_valid() -> None:
    targets = load_targets(REPO_ROOT)
    assert {"spec/scheduling.py", "fast/scheduler.py", "reference/block_allocator.py"} <= {t.module for t in targets}
    assert all(entry.reason for entry in load_equivalents().values())


@pytest.fixture
def toy_tree(tmp_path: Path) -> Path:
    (tmp_path / "toy").mkdir()
    (tmp_path / "toy" / "__init__.py").write_text("")
    (tmp_path / "toy" / "maths.py").write_text(MODULE)
    (tmp_path / "test_toy.py").write_text(TEST)
    return tmp_path


def test_mutants_skip_annotations_and_are_named_by_their_change(toy_tree: Path) -> None:
    pytest.importorskip("cosmic_ray", reason="cosmic-ray is installed by the optional extra [mutation]")
    from fuzz.mutation.mutants import mutants_of

    mutants = mutants_of(toy_tree, "toy/maths.py")
    assert mutants and not [m for m in mutants if "int & None" in m.source or "int ^ None" in m.source]
    boundary = [m for m in mutants if m.mutated == "if value <= low:"]
    assert len(boundary) == 1 and boundary[0].definition == "clamp" and boundary[0].line == 5
    assert len({m.key for m in mutants}) == len(mutants)
    assert mutants_of(toy_tree, "toy/maths.py")[0].key == mutants[0].key  # the same change, the same name


def test_a_forked_run_kills_survives_and_times_out(toy_tree: Path) -> None:
    """In a fresh interpreter with CUDA hidden, as the mutation command runs: this pytest worker may hold a CUDA
    context (a GPU machine), and a fork of such a process aborts."""
    pytest.importorskip("cosmic_ray", reason="cosmic-ray is installed by the optional extra [mutation]")
    environment = os.environ | {"CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(REPO_ROOT)}
    code = f"from fuzz.test_mutation import forked_runs; forked_runs({str(toy_tree)!r})"
    run = subprocess.run([sys.executable, "-c", code], env=environment, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]


def test_the_runner_refuses_a_process_holding_a_cuda_context(toy_tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fuzz.mutation.worker import run_tests

    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    with pytest.raises(RuntimeError, match="CUDA_VISIBLE_DEVICES="):
        run_tests(str(toy_tree), ("test_toy.py",), None, None, 60)


def forked_runs(tree: str) -> None:
    """The runner's four outcomes on the toy tree (run by the test above in its own interpreter)."""
    from fuzz.mutation.worker import KILLED, SURVIVED, TIMEOUT, run_tests

    toy_tree = Path(tree)
    root, tests = str(toy_tree), ("test_toy.py",)
    unmutated = run_tests(root, tests, None, None, 60)
    assert unmutated.outcome == SURVIVED, unmutated
    assert "passed" in unmutated.output_tail  # the child's pytest output reaches its log
    assert run_tests(root, tests, "toy/maths.py", MODULE.replace("value < low", "value > low"), 60).outcome == KILLED
    unseen = MODULE.replace("value < low", "value <= low")  # equal values are never tried
    assert run_tests(root, tests, "toy/maths.py", unseen, 60).outcome == SURVIVED
    hangs = MODULE.replace("steps -= 1", "steps -= 0")
    assert run_tests(root, tests, "toy/maths.py", hangs, 3).outcome == TIMEOUT
    assert (toy_tree / "toy" / "maths.py").read_text() == MODULE  # served from memory only


def test_saved_mutants_load_back_as_made_and_only_against_the_same_module(toy_tree: Path) -> None:
    pytest.importorskip("cosmic_ray", reason="cosmic-ray is installed by the optional extra [mutation]")
    from fuzz.mutation.mutant_file import load_mutants, save_mutants
    from fuzz.mutation.mutants import mutants_of

    made = mutants_of(toy_tree, "toy/maths.py")
    save_mutants(toy_tree / "mutants.json", toy_tree, made)
    assert load_mutants(toy_tree / "mutants.json", toy_tree) == {"toy/maths.py": made}
    (toy_tree / "toy" / "maths.py").write_text(MODULE + "\n# edited\n")
    with pytest.raises(ValueError, match="differs from the one"):
        load_mutants(toy_tree / "mutants.json", toy_tree)
