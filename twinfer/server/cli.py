"""`twinfer serve MODEL`: the OpenAI-compatible server (wired into `twinfer` by twinfer/cli.py)."""

from __future__ import annotations

import argparse
import logging

from twinfer.engine_options import add_engine_arguments, engine_config_from_args
from twinfer.registry import ENGINE_NAMES

logger = logging.getLogger(__name__)


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "model",
        nargs="?",
        default=None,
        help="checkpoint directory or Hugging Face hub id (default: the built-in tiny model, created on first use)",
    )
    parser.add_argument(
        "--engine",
        default=None,
        choices=ENGINE_NAMES,
        help="which engine serves (default: fast on CUDA, reference on the CPU)",
    )
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)"
    )
    parser.add_argument("--port", type=int, default=8000, help="port to listen on (default 8000)")
    parser.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", "float32", "float16", "bfloat16"],
        help="weight and activation dtype (default: the checkpoint's)",
    )
    parser.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    parser.add_argument("--served-model-name", default=None, help="the model id clients send (default: MODEL as given)")
    parser.add_argument(
        "--engine-process",
        action=argparse.BooleanOptionalAction,
        default=None,
        help=(
            "run the engine in a child process instead of a thread of the server (default: a process on CUDA, "
            "a thread on the CPU); faster with many concurrent streams: 108%% of offline throughput at 256 "
            "clients on an H200, a thread 57%%"
        ),
    )
    parser.add_argument(
        "--log-level", default="info", choices=["debug", "info", "warning", "error"], help="uvicorn's log level"
    )
    add_engine_arguments(parser)


def engine_process_by_default(asked: bool | None, device: str | None) -> bool:
    """--engine-process as given, else on for a CUDA device (where the measured load favours it: the
    event loop and the engine's host work then do not share one interpreter lock)."""
    if asked is not None:
        return asked
    from twinfer.registry import resolve_device

    return resolve_device(device).type == "cuda"


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from twinfer.server.launch import app_for_checkpoint

    model = args.model
    if model is None:
        from reports.tiny_model import ensure_tiny_model

        model = str(ensure_tiny_model())
    app = app_for_checkpoint(
        model,
        engine_name=args.engine,
        engine_config=engine_config_from_args(args),
        dtype=args.dtype,
        device=args.device,
        model_name=args.served_model_name or model,
        engine_process=engine_process_by_default(args.engine_process, args.device),
    )
    logger.info("serving %s on http://%s:%d/v1", model, args.host, args.port)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
    return 0
