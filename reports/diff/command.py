"""`twinfer diff`: its options, the fixed prompt set, and the summary it prints.

`configure_parser(parser)` and `run(args) -> int` are what the `twinfer` command wires in; it imports
this module only when `twinfer diff` runs. The comparison itself is reports.diff.diff_run.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from reports.diff.diff_run import DIFF_ENGINES, check_diff_engines, run_diff
from reports.diff.differential import DiffRecord
from twinfer.engine_options import add_engine_arguments, engine_config_from_args
from twinfer.model_options import add_model_arguments, model_path

DIFF_TEXT_PROMPTS = (
    "def ",
    "import os\nimport sys\n\n\ndef main(argv):\n    ",
    "class Queue:\n    def __init__(self, maxsize=0):\n        self.",
    "The quick brown fox",
    "A verified inference engine computes the same tokens as its reference, token by token. "
    "Attention reads keys and values from a paged cache; blocks that hold a shared prefix are reused.",
)
DIFF_TOKEN_PROMPTS = ((7,), (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17))


def configure_parser(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    parser.add_argument(
        "--engines",
        default="reference,hf",
        help=f"two or more engines, comma-separated, every pair compared; of {', '.join(DIFF_ENGINES)}, or an "
        "OpenAI-compatible server as openai:http://HOST:PORT/v1 (checked free-running, and teacher-forced through "
        "echo where the server supports it; give --dtype the server's dtype) (default reference,hf)",
    )
    parser.add_argument("--max-new-tokens", type=int, default=64, help="greedy tokens per prompt (default 64)")
    parser.add_argument("--top-k", type=int, default=5, help="top log-probabilities compared per token (default 5)")
    parser.add_argument(
        "--logprob-tolerance", type=float, default=1e-4, help="largest allowed logprob difference in fp32"
    )
    parser.add_argument("--json", type=Path, help="write the comparison record as JSON to this file")
    add_engine_arguments(parser)


def run(args: argparse.Namespace) -> int:
    engines = [name.strip() for name in args.engines.split(",") if name.strip()]
    check_diff_engines(engines)  # before anything loads
    record = run_diff(
        model=model_path(args),
        engines=engines,
        dtype=args.dtype,
        device=args.device,
        max_new_tokens=args.max_new_tokens,
        top_k=args.top_k,
        logprob_tolerance=args.logprob_tolerance,
        text_prompts=DIFF_TEXT_PROMPTS,
        token_prompts=DIFF_TOKEN_PROMPTS,
        engine_config=engine_config_from_args(args),
    )
    print(summary_text(record))
    if args.json:
        args.json.write_text(json.dumps(record.to_dict(), indent=2))
    return 0 if record.all_agree else 1


def summary_text(record: DiffRecord) -> str:
    """Per pair and prompt whether they agree and where they first diverge; the endpoints' notes and
    teacher-forced checks; then the verdict."""
    lines = []
    for comparison in record.comparisons:
        lines.append(f"{comparison.candidate} vs {comparison.baseline}:")
        for entry in comparison.prompts:
            status = "agree" if entry["agree"] else "DISAGREE"
            divergence = entry["first_divergence"]
            where = "identical" if divergence is None else f"first divergence at token {divergence}"
            lines.append(
                f"  {status:9} prompt {entry['index']} ({entry['num_prompt_tokens']} tokens): {where}, "
                f"max |dlogprob| {entry['max_logprob_error']:.2e}"
            )
    for endpoint, notes in record.endpoints.items():
        lines.extend(f"{endpoint}: note: {note}" for note in notes.get("notes", []))
    for endpoint, check in record.teacher_forced.items():
        if not check["supported"]:
            lines.append(f"{endpoint} teacher-forced: not run: {check['note']}")
        else:
            status = "agree" if check["all_agree"] else "DISAGREE"
            lines.append(f"{endpoint} teacher-forced on {check['baseline']}'s tokens: {status}")
    pairs = ", ".join(f"{c.candidate} vs {c.baseline}" for c in record.comparisons)
    num_prompts = len(DIFF_TEXT_PROMPTS) + len(DIFF_TOKEN_PROMPTS)
    verdict = "full agreement" if record.all_agree else "DISAGREEMENT"
    lines.append(f"{verdict}: {num_prompts} prompts, {record.max_new_tokens} tokens each, {pairs}")
    return "\n".join(lines)
