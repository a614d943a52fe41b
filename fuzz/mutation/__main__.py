"""`python -m fuzz.mutation`: mutate the targets of targets.toml, run each mutant's tests, write the record.

On a CPU-only machine run it as `CUDA_VISIBLE_DEVICES= TRITON_INTERPRET=1 python -m fuzz.mutation ...`
(the fast engine's tests then go through Triton's interpreter, as in CI).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shlex
import sys
from pathlib import Path

from tqdm import tqdm

from fuzz.mutation.run import RunOptions, run_mutation

DEFAULT_OUT = Path(".mutation/record.json")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fuzz.mutation", description=__doc__.splitlines()[0])
    parser.add_argument("--modules", help="comma-separated target modules (default: every one of targets.toml)")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="worker processes (default: cores)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"the JSON record (default {DEFAULT_OUT})")
    parser.add_argument("--max-mutants", type=int, help="at most this many mutants per module, evenly spread")
    parser.add_argument("--time-limit-s", type=float, help="stop queueing mutants after this long; the record says so")
    parser.add_argument("--save-mutants", type=Path, help="make the mutants (needs cosmic-ray), save them here, exit")
    parser.add_argument("--mutants", type=Path, help="run the mutants saved by --save-mutants (no cosmic-ray needed)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    modules = [name.strip() for name in args.modules.split(",")] if args.modules else None
    if args.save_mutants:
        return _save(args.save_mutants, modules)
    options = RunOptions(
        out=args.out,
        workers=args.workers,
        command=shlex.join(["python", "-m", "fuzz.mutation", *(argv if argv is not None else sys.argv[1:])]),
        modules=modules,
        max_mutants=args.max_mutants,
        mutants_file=args.mutants,
        time_limit_s=args.time_limit_s,
    )
    run_mutation(options)
    record = json.loads(args.out.read_text())  # as written: complete or not
    for module in record["modules"]:
        score = "-" if module["score"] is None else f"{100 * module['score']:.1f}%"
        print(
            f"{module['module']}: {score} ({module['killed']} killed, {module['survived']} survived, "
            f"{module['equivalent']} equivalent, {module['errors']} errors; "
            f"{module['done']} of {module['mutants']} run, "
            f"{module['seconds']:.0f} s) {'' if module['baseline'] == 'passed' else module['baseline'][:200]}"
        )
    print(f"{'complete' if record['complete'] else 'incomplete: ' + record['note']}; record: {args.out}")
    return 0


def _save(path: Path, modules: list[str] | None) -> int:
    from fuzz.mutation.mutant_file import save_mutants
    from fuzz.mutation.mutants import mutants_of
    from fuzz.mutation.run import REPO_ROOT
    from fuzz.mutation.targets import load_targets, select

    targets = select(load_targets(REPO_ROOT), modules)
    mutants = [mutant for target in tqdm(targets, desc="modules") for mutant in mutants_of(REPO_ROOT, target.module)]
    save_mutants(path, REPO_ROOT, mutants)
    print(f"{len(mutants)} mutants of {len(targets)} modules: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
