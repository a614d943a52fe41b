"""The `twinfer` command: generate, tiny-model, train-tiny, serve, and the harness's commands.

Layers point one way: spec <- reference, fast <- twinfer <- reports (tests/test_imports.py). This module is
the one exception, and only lazily: the harness's commands (`diff`, `bench`, `report`, `memory-check`, whose
code is in reports/) are registered here by name and help text alone, and each one's module is imported when
its command is parsed (`CommandParser`), never at `import twinfer`, `import twinfer.cli` or `twinfer --help`.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from spec.errors import TwinferError
from spec.request import RequestOutput
from spec.sampling_params import SamplingParams
from twinfer.engine_options import add_engine_arguments, engine_config_from_args
from twinfer.model_options import add_model_arguments, model_path
from twinfer.models.tiny_model import TINY_ARCHITECTURES
from twinfer.registry import ENGINE_NAMES, ENGINES


@dataclass(frozen=True)
class ModuleCommand:
    """A subcommand whose options and code live in a module offering configure_parser(parser) and
    run(args) -> int."""

    name: str
    module: str
    help: str
    # reports/ (the harness): imported only when the command is parsed. Otherwise (twinfer's own modules)
    # imported when the parser is built, and the command is left out where the module is not in this checkout.
    harness: bool = False


MODULE_COMMANDS = (
    ModuleCommand(
        "diff",
        "reports.diff.command",
        "run a fixed prompt set through two or more engines and compare every pair token by token",
        harness=True,
    ),
    ModuleCommand(
        "bench", "reports.bench.command", "benchmarks: the standard workloads, or the Triton kernels", harness=True
    ),
    ModuleCommand(
        "train-tiny", "twinfer.models.train_tiny", "train a tiny model so differential runs see peaked distributions"
    ),
    ModuleCommand("report", "reports.report", "build the HTML report of committed measurements", harness=True),
    ModuleCommand("serve", "twinfer.server.cli", "serve an OpenAI-compatible HTTP API"),
    ModuleCommand(
        "memory-check",
        "reports.serving.memory_check",
        "KV pool share of GPU memory, and repeated runs checked for leaks",
        harness=True,
    ),
)


class CommandParser(argparse.ArgumentParser):
    """A subcommand's parser. Given `module`, it holds no options until it parses: then it imports the module,
    which adds its options (configure_parser) and its handler (run). So the module is imported only when its
    command runs, and the command's --help and errors read as if its options had been there all along."""

    def __init__(self, *args: Any, module: str | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._unloaded_module = module

    def parse_known_args(
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        if self._unloaded_module is not None:
            _configure(self, importlib.import_module(self._unloaded_module))
            self._unloaded_module = None
        return super().parse_known_args(args, namespace)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    try:
        return int(args.handler(args))
    except TwinferError as error:
        print(f"twinfer: error: {error}", file=sys.stderr)
        return 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="twinfer",
        description="twinfer: a verified twin of a reference and a fast LLM inference engine.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress at INFO level")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=CommandParser)
    _add_generate_command(commands)
    _add_tiny_model_command(commands)
    for command in MODULE_COMMANDS:
        if command.harness:
            commands.add_parser(command.name, help=command.help, module=command.module)
            continue
        module = _optional_module(command.module)
        if module is not None:
            _configure(commands.add_parser(command.name, help=command.help), module)
    return parser


def _configure(parser: argparse.ArgumentParser, module: ModuleType) -> None:
    module.configure_parser(parser)
    parser.set_defaults(handler=module.run)


def _add_generate_command(commands: argparse._SubParsersAction) -> None:
    generate = commands.add_parser("generate", help="generate text or token ids from a prompt")
    add_model_arguments(generate)
    generate.add_argument(
        "--engine",
        default=None,
        choices=ENGINE_NAMES,
        help="which engine runs (default: fast on CUDA, reference on the CPU): "
        + "; ".join(f"{entry.name}: {entry.summary}" for entry in ENGINES.values()),
    )
    source = generate.add_mutually_exclusive_group()
    source.add_argument("--prompt", action="append", help="a text prompt (repeat for a batch)")
    source.add_argument(
        "--token-ids", action="append", help="a prompt as comma-separated token ids (repeat for a batch)"
    )
    _add_sampling_arguments(generate)
    add_engine_arguments(generate)
    generate.add_argument("--json", action="store_true", help="print outputs as JSON lines")
    generate.set_defaults(handler=_run_generate)


def _add_tiny_model_command(commands: argparse._SubParsersAction) -> None:
    tiny = commands.add_parser(
        "tiny-model", help="write a built-in tiny checkpoint (random weights; Qwen3 by default) to DIR"
    )
    tiny.add_argument("directory", type=Path, help="where to write config.json, model.safetensors and the tokenizer")
    tiny.add_argument("--seed", type=int, default=0, help="weights are deterministic for a seed (default 0)")
    tiny.add_argument(
        "--architecture", default="qwen3", choices=sorted(TINY_ARCHITECTURES), help="model family (default qwen3)"
    )
    tiny.set_defaults(handler=_run_tiny_model)


def _optional_module(module_name: str) -> ModuleType | None:
    """The module, or None when it (or its package) is not part of this checkout or does not offer
    configure_parser and run yet."""
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        missing = error.name or ""
        if module_name == missing or module_name.startswith(missing + "."):
            return None
        raise
    return module if hasattr(module, "configure_parser") and hasattr(module, "run") else None


def _add_sampling_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--temperature", type=float, default=0.0, help="0 is greedy (default 0)")
    parser.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens (0: off)")
    parser.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (1: off)")
    parser.add_argument("--min-p", type=float, default=0.0, help="relative probability floor (0: off)")
    parser.add_argument("--max-tokens", type=int, default=32, help="tokens to generate at most (default 32)")
    parser.add_argument("--ignore-eos", action="store_true", help="keep generating past end-of-sequence tokens")
    parser.add_argument("--stop-token-ids", default="", help="comma-separated extra stop token ids")
    parser.add_argument("--seed", type=int, default=None, help="sampling seed (default: drawn per request)")
    parser.add_argument("--logprobs", type=int, default=0, help="top log-probabilities to return per token (0-20)")


def _parse_ids(text: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError as error:
        raise SystemExit(f"twinfer: error: token ids must be comma-separated integers: {text!r}") from error


def _run_generate(args: argparse.Namespace) -> int:
    from twinfer.llm import LLM

    params = SamplingParams(
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        min_p=args.min_p,
        max_tokens=args.max_tokens,
        ignore_eos=args.ignore_eos,
        stop_token_ids=tuple(_parse_ids(args.stop_token_ids)),
        seed=args.seed,
        logprobs=args.logprobs,
    )
    llm = LLM(
        model_path(args),
        engine=args.engine,
        dtype=args.dtype,
        device=args.device,
        engine_config=engine_config_from_args(args),
    )
    if args.token_ids:
        prompts: list = [_parse_ids(text) for text in args.token_ids]
    else:
        prompts = args.prompt or ["Once upon a time"]
    for output in llm.generate(prompts, params):
        if args.json:
            print(json.dumps(_output_record(output)))
        else:
            finish = output.finish_reason.value if output.finish_reason else None
            print(f"[{output.request_id}] finish={finish} tokens={list(output.token_ids)}")
            if output.error is not None:
                print(f"[{output.request_id}] error: {output.error}")
            if output.text is not None:
                print(output.text)
    return 0


def _output_record(output: RequestOutput) -> dict[str, object]:
    logprobs = None
    if output.logprobs:
        logprobs = [
            {"token_id": entry.token_id, "logprob": entry.logprob, "top": [list(pair) for pair in entry.top]}
            for entry in output.logprobs
        ]
    return {
        "request_id": output.request_id,
        "prompt_token_ids": list(output.prompt_token_ids),
        "token_ids": list(output.token_ids),
        "text": output.text,
        "finish_reason": output.finish_reason.value if output.finish_reason else None,
        "num_cached_prompt_tokens": output.num_cached_prompt_tokens,
        "logprobs": logprobs,
        "error": output.error,
    }


def _run_tiny_model(args: argparse.Namespace) -> int:
    from twinfer.models.tiny_model import write_tiny_model

    path = write_tiny_model(args.directory, seed=args.seed, architecture=args.architecture)
    print(f"wrote tiny {args.architecture} checkpoint (seed {args.seed}) to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
