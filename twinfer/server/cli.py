"""`twinfer serve MODEL`: the OpenAI-compatible server (wired into `twinfer` by twinfer/cli.py)."""

from __future__ import annotations

import argparse
import ipaddress
import logging

from twinfer.engine_options import add_engine_arguments, engine_config_from_args
from twinfer.registry import ENGINE_NAMES
from twinfer.server.settings import (
    API_KEY_ENV,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_REQUEST_CONTEXTS,
    ServerSettings,
    api_key_from,
)

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
        "--api-key",
        default=None,
        metavar="KEY",
        help=(
            "require 'Authorization: Bearer KEY' on every request (401 otherwise) except /health and /metrics; "
            f"default: the {API_KEY_ENV} environment variable if set (preferred: a command line is visible to "
            "other users of the machine), else no key"
        ),
    )
    parser.add_argument(
        "--max-body-bytes",
        type=int,
        metavar="BYTES",
        default=DEFAULT_MAX_BODY_BYTES,
        help=(
            "largest request body accepted; larger ones get HTTP 413 "
            f"(default {DEFAULT_MAX_BODY_BYTES}: {DEFAULT_MAX_BODY_BYTES / 2**20:g} MiB)"
        ),
    )
    parser.add_argument(
        "--max-request-tokens",
        type=int,
        metavar="TOKENS",
        default=None,
        help=(
            "most output tokens one prompt's choices may ask for together, n x max_tokens; more is refused with "
            f"HTTP 400 (default {DEFAULT_REQUEST_CONTEXTS} x max_model_len)"
        ),
    )
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


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to any interface


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from twinfer.server.launch import app_for_checkpoint

    settings = ServerSettings(
        api_key=api_key_from(args.api_key),
        max_body_bytes=args.max_body_bytes,
        max_request_tokens=args.max_request_tokens,
    )
    model = args.model
    if model is None:
        from twinfer.models.tiny_model import ensure_tiny_model

        model = str(ensure_tiny_model())
    app = app_for_checkpoint(
        model,
        engine_name=args.engine,
        engine_config=engine_config_from_args(args),
        dtype=args.dtype,
        device=args.device,
        model_name=args.served_model_name or model,
        engine_process=engine_process_by_default(args.engine_process, args.device),
        settings=settings,
    )
    if settings.api_key is None and not is_loopback(args.host):
        logger.warning(
            "serving on %s without an API key: anyone who can reach the port can use the model (set --api-key or %s)",
            args.host,
            API_KEY_ENV,
        )
    logger.info("serving %s on http://%s:%d/v1", model, args.host, args.port)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
    return 0
