"""`python -m reports.bench.ab OUT --tree NAME=DIR --tree NAME=DIR [--rounds R] [--limit-s S] -- WORKLOAD ARGS...`:
an A/B of engine code trees in one device call, one `twinfer bench` process a run, the trees alternating.

Run-to-run noise on the H200 host is 6-10% between calls, and a bandwidth-bound kernel drifts by a few percent from
one call to the next (reports/results/bench/decode_split_ab/README.md), so two commits compare only inside one call,
alternating. Each session wrote that loop as a shell script of its own; this is the loop once, as data:

    python -m reports.bench.ab /tmp/ab --tree new=.clean/new --tree old=.clean/old --rounds 2 -- \\
        decode-bs1 --shape qwen3-8b --dtype bfloat16 --engine fast

- A tree is a directory holding the packages (a `git archive` of a commit: fast, spec, twinfer, reports), with the
  commit's sha in its COMMIT file where it has one. Each run is `python -m twinfer.cli bench ARGS --no-progress
  --commit SHA-NAME --json OUT/NAME-ROUND.json` with the tree as its working directory, so its code is the tree's;
  stdout and stderr go to OUT/NAME-ROUND.log.
- Order: round 1 runs the trees as given, round 2 in reverse, and so on (A B, B A, A B, ...), so that a drift over
  the call weighs on each tree alike.
- Each run gets at most --limit-s seconds (then SIGTERM, and SIGKILL 10 s later); a run that fails or times out is
  recorded with its status and left out of the medians.
- OUT/ab.json: every run (tree, round, status, seconds, the headline figure per phase of the engine under test),
  and per tree and phase the median and, from the second tree on, its difference from the first tree's. The
  headline is the workload's metric: seconds per output token for a latency workload (decode-bs1, decode-sweep,
  decode-bs1-edit, long-context), output tokens per second otherwise. The same summary is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from reports.bench.plan import Step, run_step
from reports.bench.workloads import WORKLOADS


@dataclass(frozen=True)
class Tree:
    name: str
    path: Path

    @property
    def commit(self) -> str:
        """The sha in the tree's COMMIT file (the .clean convention), else "unknown"."""
        marker = self.path / "COMMIT"
        return marker.read_text().strip()[:40] if marker.is_file() else "unknown"


@dataclass(frozen=True)
class RunResult:
    tree: str
    round: int
    status: int
    seconds: float
    headline: dict[str, float] | None  # phase label -> the fast engine's figure; None where the run failed


# (command, working directory, log file, limit in seconds) -> exit status
Runner = Callable[[Sequence[str], Path, Path, float], int]


def run_process(command: Sequence[str], cwd: Path, log: Path, limit_s: float) -> int:
    """The command as reports.bench.plan runs a step: its own process group, output to `log`; at the limit SIGTERM,
    then SIGKILL (status 124, or 137)."""
    step = Step(name=log.stem, command=tuple(command), limit_s=limit_s, cwd=str(cwd))
    return run_step(step, log, limit_s, os.environ, {})


def run_order(trees: Sequence[Tree], rounds: int) -> list[tuple[int, Tree]]:
    """(round, tree) in the order they run: the trees as given in odd rounds, reversed in even ones."""
    return [(r, tree) for r in range(1, rounds + 1) for tree in (trees if r % 2 else list(reversed(trees)))]


def headline(record: dict[str, object]) -> dict[str, float]:
    """Per phase, the headline figure of a `twinfer bench` record's engine under test (its first result; a
    --baseline comes after it): tpot_s for a latency workload, output_tokens_per_s otherwise."""
    name = record["workload"]["name"]  # type: ignore[index]
    key = "tpot_s" if WORKLOADS[name](1.0).latency else "output_tokens_per_s"
    under_test = record["results"][0]  # type: ignore[index]
    return {phase["phase"]: phase["metrics"][key] for phase in under_test["phases"]}


def run_ab(
    out: Path, trees: Sequence[Tree], rounds: int, limit_s: float, bench_args: Sequence[str], runner: Runner
) -> list[RunResult]:
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for round_, tree in run_order(trees, rounds):
        record_path = out / f"{tree.name}-{round_}.json"
        command = [
            sys.executable, "-m", "twinfer.cli", "bench", *bench_args, "--no-progress",
            "--commit", f"{tree.commit}-{tree.name}", "--json", str(record_path),
        ]  # fmt: skip
        start = time.monotonic()
        status = runner(command, tree.path, out / f"{tree.name}-{round_}.log", limit_s)
        seconds = time.monotonic() - start
        figures = headline(json.loads(record_path.read_text())) if status == 0 and record_path.is_file() else None
        results.append(RunResult(tree.name, round_, status, seconds, figures))
    return results


def summarise(trees: Sequence[Tree], results: Sequence[RunResult]) -> dict[str, object]:
    """Per tree and phase the median headline over the runs that succeeded, and each later tree's difference
    from the first tree's median (a fraction: +0.05 is 5% more)."""
    medians: dict[str, dict[str, float]] = {}
    for tree in trees:
        by_phase: dict[str, list[float]] = {}
        for result in results:
            if result.tree == tree.name and result.headline is not None:
                for phase, value in result.headline.items():
                    by_phase.setdefault(phase, []).append(value)
        medians[tree.name] = {phase: statistics.median(values) for phase, values in by_phase.items()}
    first = medians[trees[0].name]
    differences = {
        tree.name: {phase: value / first[phase] - 1 for phase, value in medians[tree.name].items() if first.get(phase)}
        for tree in trees[1:]
    }
    return {
        "trees": {tree.name: {"path": str(tree.path), "commit": tree.commit} for tree in trees},
        "runs": [asdict(result) for result in results],
        "medians": medians,
        "difference_from_first": differences,
    }


def summary_lines(summary: dict[str, object]) -> list[str]:
    lines = []
    for result in summary["runs"]:  # type: ignore[union-attr]
        figures = ", ".join(f"{phase} {value:.6g}" for phase, value in (result["headline"] or {}).items())
        lines.append(f"{result['tree']} round {result['round']}: rc={result['status']} {figures}")
    for tree, by_phase in summary["medians"].items():  # type: ignore[union-attr]
        difference = summary["difference_from_first"].get(tree, {})  # type: ignore[union-attr]
        for phase, value in by_phase.items():
            against = f" ({difference[phase]:+.2%} against the first tree)" if phase in difference else ""
            lines.append(f"median {tree} {phase}: {value:.6g}{against}")
    return lines


def parse_tree(text: str) -> Tree:
    name, separator, path = text.partition("=")
    if not separator or not name or not path:
        raise argparse.ArgumentTypeError(f"a tree is NAME=DIR, got {text!r}")
    if not Path(path).is_dir():
        raise argparse.ArgumentTypeError(f"tree {name!r}: {path} is not a directory")
    return Tree(name, Path(path).resolve())


def main(argv: Sequence[str] | None = None, runner: Runner = run_process) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m reports.bench.ab",
        usage="%(prog)s OUT --tree NAME=DIR --tree NAME=DIR [--rounds R] [--limit-s S] -- WORKLOAD ARGS...",
        description=__doc__.splitlines()[0],
        epilog="After `--`: the `twinfer bench` workload and its arguments, as that command takes them.",
    )
    parser.add_argument("out", type=Path, help="where the records, logs and ab.json go")
    parser.add_argument("--tree", dest="trees", type=parse_tree, action="append", required=True, help="NAME=DIR")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each tree (default 2)")
    parser.add_argument("--limit-s", type=float, default=120.0, help="the most a run may take (default 120)")
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv and not {"-h", "--help"} & set(argv):
        parser.error("no workload: give `-- WORKLOAD ARGS...` after the options")
    cut = argv.index("--") if "--" in argv else len(argv)
    args, bench_args = parser.parse_args(argv[:cut]), argv[cut + 1 :]
    if not bench_args:
        parser.error("no workload after `--`")
    names = [tree.name for tree in args.trees]
    if len(args.trees) < 2 or len(set(names)) != len(names):
        parser.error(f"an A/B needs two or more trees of distinct names, got {names}")
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}")
    results = run_ab(args.out, args.trees, args.rounds, args.limit_s, bench_args, runner)
    summary = summarise(args.trees, results)
    (args.out / "ab.json").write_text(json.dumps(summary, indent=1))
    print("\n".join(summary_lines(summary)))
    return 0 if all(result.status == 0 for result in results) else 1


if __name__ == "__main__":
    sys.exit(main())
