"""Command-line options naming the model a command runs, in which dtype and on which device, shared by
`twinfer generate` and `twinfer diff`: `--model` defaults to the built-in stdlib-tiny model."""

from __future__ import annotations

import argparse


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        default=None,
        help="checkpoint directory or Hugging Face hub id (default: the built-in stdlib-tiny model)",
    )
    parser.add_argument(
        "--dtype",
        default="float32",
        choices=["auto", "float32", "float16", "bfloat16"],
        help="weight and activation dtype (default float32)",
    )
    parser.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")


def model_path(args: argparse.Namespace) -> str:
    """The checkpoint named by --model, else the built-in model's directory."""
    if args.model is not None:
        return args.model
    from twinfer.default_model import default_model

    return str(default_model())
