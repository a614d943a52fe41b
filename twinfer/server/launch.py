"""Building a server from a checkpoint, and running it in a background thread on a loopback port.

`ServerThread` is what tests, `reports.serving.server_load` and `twinfer diff` fixtures use: uvicorn on a
socket bound before the thread starts (port 0: the OS picks a free port, so parallel runs never
collide), the URL known before the first request.
"""

from __future__ import annotations

import functools
import logging
import socket
import threading
import time
from pathlib import Path
from types import TracebackType

import torch
import uvicorn
from fastapi import FastAPI

from spec.checkpoint import resolve_checkpoint
from spec.engine import Engine
from spec.engine_config import EngineConfig
from twinfer.registry import build_engine, default_engine_name, resolve_device
from twinfer.server.app import create_app
from twinfer.server.detokenize import IdOnlyCodec, TextCodec, TokenizerCodec
from twinfer.server.engine_loop import EngineLoop
from twinfer.server.engine_process import EngineFactory, EngineProcess
from twinfer.server.settings import ServerSettings

logger = logging.getLogger(__name__)

STARTUP_TIMEOUT_S = 60.0


def load_text_support(checkpoint: Path) -> tuple[TextCodec, object | None]:
    """(codec, tokenizer): the checkpoint's tokenizer if it has one, else token ids only."""
    from twinfer.llm import has_tokenizer, load_tokenizer

    if not has_tokenizer(checkpoint):
        logger.warning("%s has no tokenizer: the server takes token-id prompts only and returns no text", checkpoint)
        return IdOnlyCodec(), None
    tokenizer = load_tokenizer(checkpoint)
    return TokenizerCodec(tokenizer), tokenizer


def app_for_engine(
    engine: Engine, checkpoint: str | Path, model_name: str | None = None, settings: ServerSettings | None = None
) -> FastAPI:
    """The app serving an engine already built over `checkpoint` (whose tokenizer gives the text)."""
    path = resolve_checkpoint(checkpoint)
    codec, tokenizer = load_text_support(path)
    return create_app(EngineLoop(engine), codec, tokenizer, model_name or str(checkpoint), settings)


def app_for_checkpoint(
    checkpoint: str | Path,
    engine_name: str | None = None,
    engine_config: EngineConfig | None = None,
    dtype: str | torch.dtype = "auto",
    device: str | torch.device | None = None,
    model_name: str | None = None,
    engine_process: bool = False,
    settings: ServerSettings | None = None,
) -> FastAPI:
    """Build engine `engine_name` (default: fast on CUDA, reference elsewhere) and the app serving it,
    on a thread of this process or (`engine_process`) in a child process."""
    target = resolve_device(device)
    path = resolve_checkpoint(checkpoint)
    factory = checkpoint_engine_factory(engine_name or default_engine_name(target), path, engine_config, dtype, target)
    codec, tokenizer = load_text_support(path)
    driver = EngineProcess(factory) if engine_process else EngineLoop(factory())
    return create_app(driver, codec, tokenizer, model_name or str(checkpoint), settings)


def checkpoint_engine_factory(
    engine_name: str,
    checkpoint: Path,
    engine_config: EngineConfig | None,
    dtype: str | torch.dtype,
    device: torch.device,
) -> EngineFactory:
    """A picklable recipe for the engine, so a child process can build it (see engine_process)."""
    return functools.partial(build_engine, engine_name, checkpoint, engine_config, dtype, device)


class ServerThread:
    """`with ServerThread(app) as server:` serves `app` at `server.base_url` until the block ends."""

    def __init__(self, app: FastAPI, host: str = "127.0.0.1", port: int = 0) -> None:
        self.app = app
        self.host = host
        # IPPROTO_TCP, not 0: asyncio turns Nagle's algorithm off (TCP_NODELAY) only on connections whose
        # socket says TCP. With it on, each stream event after the first waits for the client's delayed
        # ACK (40 ms on Linux) while an earlier one is unacknowledged.
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind((host, port))
        self.port = self._socket.getsockname()[1]
        config = uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=5)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._socket]}, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def __enter__(self) -> ServerThread:
        self._thread.start()
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not self._server.started:
            if not self._thread.is_alive():
                raise RuntimeError("the server thread exited during start-up (see the log)")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the server did not start within {STARTUP_TIMEOUT_S:.0f} s")
            time.sleep(0.01)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=30)
        self._socket.close()
