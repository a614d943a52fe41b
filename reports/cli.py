"""The `twinfer` command: generate, tiny-model, diff, bench."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from reports import kernel_bench
from reports.tiny_model import TINY_ARCHITECTURES
from spec.engine_config import EngineConfig
from spec.errors import TwinferError
from spec.sampling_params import SamplingParams

logger = logging.getLogger("twinfer")

DIFF_TEXT_PROMPTS = (
    "The quick brown fox",
    "Once upon a time there was a small model with random weights.",
    "Hello world!",
    "A verified inference engine computes the same tokens as its reference, token by token. "
    "Attention reads keys and values from a paged cache; blocks that hold a shared prefix are reused.",
)
DIFF_TOKEN_PROMPTS = ((7,), (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17))


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
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
    commands = parser.add_subparsers(dest="command", required=True)

    generate = commands.add_parser("generate", help="generate text or token ids from a prompt")
    _add_model_arguments(generate)
    generate.add_argument("--engine", default="reference", choices=["reference"], help="which engine runs (default: reference)")
    source = generate.add_mutually_exclusive_group()
    source.add_argument("--prompt", action="append", help="a text prompt (repeat for a batch)")
    source.add_argument("--token-ids", action="append", help="a prompt as comma-separated token ids (repeat for a batch)")
    _add_sampling_arguments(generate)
    _add_engine_arguments(generate)
    generate.add_argument("--json", action="store_true", help="print outputs as JSON lines")
    generate.set_defaults(handler=_run_generate)

    tiny = commands.add_parser("tiny-model", help="write a built-in tiny checkpoint (random weights; Qwen3 by default) to DIR")
    tiny.add_argument("directory", type=Path, help="where to write config.json, model.safetensors and the tokenizer")
    tiny.add_argument("--seed", type=int, default=0, help="weights are deterministic for a seed (default 0)")
    tiny.add_argument("--architecture", default="qwen3", choices=sorted(TINY_ARCHITECTURES), help="model family (default qwen3)")
    tiny.set_defaults(handler=_run_tiny_model)

    diff = commands.add_parser("diff", help="run a fixed prompt set through two engines and compare token by token")
    _add_model_arguments(diff)
    diff.add_argument("--engines", default="reference,hf", help="two engines, comma-separated; supported: reference,hf")
    diff.add_argument("--max-new-tokens", type=int, default=64, help="greedy tokens per prompt (default 64)")
    diff.add_argument("--top-k", type=int, default=5, help="top log-probabilities compared per token (default 5)")
    diff.add_argument("--logprob-tolerance", type=float, default=1e-4, help="largest allowed logprob difference in fp32")
    diff.add_argument("--json", type=Path, help="write the comparison record as JSON to this file")
    diff.set_defaults(handler=_run_diff)

    bench = commands.add_parser("bench", help="benchmarks (need a CUDA GPU)")
    bench_commands = bench.add_subparsers(dest="bench_command", required=True)
    kernels = bench_commands.add_parser("kernels", help="time each Triton kernel beside torch's implementation")
    kernel_bench.configure_parser(kernels)
    kernels.set_defaults(handler=kernel_bench.run)
    return parser


def _add_model_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        default=None,
        help="checkpoint directory or Hugging Face hub id (default: the built-in tiny model, created on first use)",
    )
    parser.add_argument("--dtype", default="float32", choices=["auto", "float32", "float16", "bfloat16"], help="weight and activation dtype (default float32)")
    parser.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")


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


def _add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = EngineConfig()
    parser.add_argument("--block-size", type=int, default=defaults.block_size, help=f"tokens per KV block (default {defaults.block_size})")
    parser.add_argument("--num-blocks", type=int, default=defaults.num_blocks, help=f"KV blocks in the pool (default {defaults.num_blocks})")
    parser.add_argument("--max-num-seqs", type=int, default=defaults.max_num_seqs, help=f"requests running at once (default {defaults.max_num_seqs})")
    parser.add_argument("--max-num-batched-tokens", type=int, default=defaults.max_num_batched_tokens, help=f"tokens per step (default {defaults.max_num_batched_tokens})")
    parser.add_argument("--max-model-len", type=int, default=None, help="longest sequence (default: the model's)")
    parser.add_argument("--no-prefix-caching", action="store_true", help="disable the prefix cache")


def _parse_ids(text: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError as error:
        raise SystemExit(f"twinfer: error: token ids must be comma-separated integers: {text!r}") from error


def _model_path(args: argparse.Namespace) -> str:
    if args.model is not None:
        return args.model
    from reports.tiny_model import ensure_tiny_model

    return str(ensure_tiny_model())


def _run_generate(args: argparse.Namespace) -> int:
    from reference.llm import LLM

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
    engine_config = EngineConfig(
        block_size=args.block_size,
        num_blocks=args.num_blocks,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=args.max_model_len,
        enable_prefix_caching=not args.no_prefix_caching,
    )
    llm = LLM(_model_path(args), engine=args.engine, dtype=args.dtype, device=args.device, engine_config=engine_config)
    if args.token_ids:
        prompts: list = [_parse_ids(text) for text in args.token_ids]
    else:
        prompts = args.prompt or ["Once upon a time"]
    for output in llm.generate(prompts, params):
        if args.json:
            record = {
                "request_id": output.request_id,
                "prompt_token_ids": list(output.prompt_token_ids),
                "token_ids": list(output.token_ids),
                "text": output.text,
                "finish_reason": output.finish_reason.value if output.finish_reason else None,
                "num_cached_prompt_tokens": output.num_cached_prompt_tokens,
                "logprobs": [
                    {"token_id": e.token_id, "logprob": e.logprob, "top": [list(t) for t in e.top]}
                    for e in output.logprobs
                ] if output.logprobs else None,
            }
            print(json.dumps(record))
        else:
            print(f"[{output.request_id}] finish={output.finish_reason.value if output.finish_reason else None} "
                  f"tokens={list(output.token_ids)}")
            if output.text is not None:
                print(output.text)
    return 0


def _run_tiny_model(args: argparse.Namespace) -> int:
    from reports.tiny_model import write_tiny_model

    path = write_tiny_model(args.directory, seed=args.seed, architecture=args.architecture)
    print(f"wrote tiny {args.architecture} checkpoint (seed {args.seed}) to {path}")
    return 0


def _run_diff(args: argparse.Namespace) -> int:
    from reports.diff_run import run_diff

    engines = [name.strip() for name in args.engines.split(",")]
    record = run_diff(
        model=_model_path(args),
        engines=engines,
        dtype=args.dtype,
        device=args.device,
        max_new_tokens=args.max_new_tokens,
        top_k=args.top_k,
        logprob_tolerance=args.logprob_tolerance,
        text_prompts=DIFF_TEXT_PROMPTS,
        token_prompts=DIFF_TOKEN_PROMPTS,
    )
    for entry in record.prompts:
        status = "agree" if entry["agree"] else "DISAGREE"
        divergence = entry["first_divergence"]
        where = "identical" if divergence is None else f"first divergence at token {divergence}"
        print(f"{status:9} prompt {entry['index']} ({entry['num_prompt_tokens']} tokens): {where}, "
              f"max |dlogprob| {entry['max_logprob_error']:.2e}")
    print(f"{'full agreement' if record.all_agree else 'DISAGREEMENT'}: {len(record.prompts)} prompts, "
          f"{record.max_new_tokens} tokens each, engines {' vs '.join(record.engines)}")
    if args.json:
        args.json.write_text(json.dumps(record.to_dict(), indent=2))
    return 0 if record.all_agree else 1


if __name__ == "__main__":
    sys.exit(main())
