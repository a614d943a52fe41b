"""The FastAPI app: OpenAI's /v1/completions, /v1/chat/completions and /v1/models, plus /health and /metrics.

`create_app(driver, ...)` serves whatever the driver runs: an engine already built, on a thread of
this process (`EngineLoop`; tests hand in any engine, even a deliberately wrong one), or an engine
built in a child process (`EngineProcess`). The app's lifespan starts and stops the driver.
`guard.RequestGuard` checks the API key and the body size before a request reaches a route.
Every response of a completion carries its id in the `x-request-id` header (what the openai
client's `with_raw_response` reads as `request_id`).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass

import anyio
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException

from spec.engine_config import EngineConfig
from twinfer.server import responses, translate
from twinfer.server.choice import ChoiceDelta, ChoiceSpec, ChoiceState
from twinfer.server.detokenize import TextCodec
from twinfer.server.engine_loop import EngineDriver
from twinfer.server.errors import ApiError
from twinfer.server.generation import Generation
from twinfer.server.guard import RequestGuard
from twinfer.server.metrics import ServerMetrics
from twinfer.server.protocol import ChatCompletionRequest, CompletionRequest, ModelCard, ModelList
from twinfer.server.settings import ServerSettings

logger = logging.getLogger(__name__)

DISCONNECT_POLL_S = 0.25  # how often a non-streaming request checks that its client is still there
REQUEST_ID_HEADER = "x-request-id"


@dataclass
class ServerContext:
    driver: EngineDriver
    metrics: ServerMetrics
    codec: TextCodec
    tokenizer: object | None  # transformers tokenizer, for the chat template
    model_name: str
    created: int
    settings: ServerSettings

    @property
    def config(self) -> EngineConfig:
        return self.driver.config

    @property
    def token_limit(self) -> int:
        """The most output tokens one prompt's choices may ask for together (n x max_tokens)."""
        return self.settings.request_token_limit(self.driver.config.model_len)


def create_app(
    driver: EngineDriver,
    codec: TextCodec,
    tokenizer: object | None,
    model_name: str,
    settings: ServerSettings | None = None,
) -> FastAPI:
    metrics = driver.metrics
    settings = settings or ServerSettings()
    context = ServerContext(driver, metrics, codec, tokenizer, model_name, int(time.time()), settings)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        context.driver.start()
        # What exists now (modules, the engine, torch's objects) lives as long as the server: keep it out of
        # the collector's full passes, which otherwise walk it all and stop the event loop (and, holding the
        # interpreter lock, an engine thread) for a tenth of a second or more at a time under load.
        gc.collect()
        gc.freeze()
        try:
            yield
        finally:
            gc.unfreeze()
            context.driver.stop()

    app = FastAPI(title="twinfer", lifespan=lifespan)
    app.state.context = context
    app.add_middleware(RequestGuard, api_key=settings.api_key, max_body_bytes=settings.max_body_bytes, metrics=metrics)
    _add_error_handlers(app, metrics)
    _add_routes(app, context)
    return app


def _add_error_handlers(app: FastAPI, metrics: ServerMetrics) -> None:
    @app.exception_handler(ApiError)
    async def api_error(_: Request, error: ApiError) -> JSONResponse:
        if error.status < 500:
            metrics.record_rejected()
        return error.response()

    @app.exception_handler(Exception)
    async def unexpected_error(_: Request, error: Exception) -> JSONResponse:  # a server bug: still OpenAI's shape
        logger.exception("unexpected error while serving a request")
        return ApiError(f"internal error: {error!r}", status=500, kind="server_error").response()

    @app.exception_handler(HTTPException)
    async def http_error(_: Request, error: HTTPException) -> JSONResponse:  # unknown path, wrong method, ...
        return ApiError(str(error.detail), status=error.status_code).response()

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, error: RequestValidationError) -> JSONResponse:
        metrics.record_rejected()
        return _validation_api_error(error.errors()).response()


def _validation_api_error(errors: Sequence[dict]) -> ApiError:
    """The first pydantic error as one message that names the field."""
    first = errors[0] if errors else {"loc": (), "msg": "invalid request", "type": ""}
    location = [str(part) for part in first.get("loc", ()) if part != "body"]
    if first.get("type") == "json_invalid":
        return ApiError(f"the request body is not valid JSON: {first.get('msg')}")
    if first.get("type") == "model_attributes_type" or not location:
        return ApiError("the request body must be a JSON object")
    param = location[0]
    path = ".".join(location)
    if first.get("type") == "extra_forbidden":
        return ApiError(f"unknown field {path!r}: twinfer does not support it", param=param)
    if first.get("type") == "missing":
        return ApiError(f"field {path!r} is required", param=param)
    return ApiError(f"field {path!r}: {first.get('msg')}", param=param)


def _add_routes(app: FastAPI, context: ServerContext) -> None:
    @app.get("/health")
    async def health() -> JSONResponse:
        if context.driver.alive:
            return JSONResponse({"status": "ok"})
        return JSONResponse({"status": "engine not running"}, status_code=503)

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        text = context.metrics.render(context.driver.stats)
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/v1/models")
    async def models() -> ModelList:
        card = ModelCard(id=context.model_name, created=context.created, max_model_len=context.driver.config.model_len)
        return ModelList(data=[card])

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Response:
        arrival = time.monotonic()
        translate.check_common(body, context.model_name)
        response_id = f"cmpl-{uuid.uuid4().hex}"
        specs = translate.completion_specs(body, context.codec, response_id, context.config, context.token_limit)
        return await _answer(context, COMPLETION_SHAPES, specs, body, request, response_id, arrival)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        arrival = time.monotonic()
        translate.check_common(body, context.model_name)
        response_id = f"chatcmpl-{uuid.uuid4().hex}"
        specs = translate.chat_specs(body, context.tokenizer, response_id, context.config, context.token_limit)
        return await _answer(context, CHAT_SHAPES, specs, body, request, response_id, arrival)


@dataclass(frozen=True)
class _Shapes:
    """One endpoint's response shapes: stream chunks (as text when they can be, else as models), the whole
    response, and whether a stream opens with the assistant's role (chat)."""

    chunk_text: Callable[[str, int, str, bool, bool], Callable[[Sequence[tuple[ChoiceState, ChoiceDelta]]], str | None]]
    chunk: Callable[..., BaseModel]
    response: Callable[..., BaseModel]
    chat: bool


COMPLETION_SHAPES = _Shapes(
    responses.CompletionChunkText, responses.completion_chunk, responses.completion_response, chat=False
)
CHAT_SHAPES = _Shapes(responses.ChatChunkText, responses.chat_chunk, responses.chat_response, chat=True)


async def _answer(
    context: ServerContext,
    shapes: _Shapes,
    specs: Sequence[ChoiceSpec],
    body: CompletionRequest | ChatCompletionRequest,
    request: Request,
    response_id: str,
    arrival: float,
) -> Response:
    """Run a request's choices and answer with a stream of chunks or one response."""
    generation = Generation(context.driver, context.codec, context.metrics, specs, arrival)
    await generation.start()
    created, model, ids = int(time.time()), context.model_name, body.return_token_ids
    headers = {REQUEST_ID_HEADER: response_id}
    if body.stream:
        usage = body.include_usage_in_stream
        text = shapes.chunk_text(response_id, created, model, ids, usage)

        def chunk(advanced: Sequence[tuple[ChoiceState, ChoiceDelta]]) -> str:
            return text(advanced) or _json(shapes.chunk(response_id, created, model, advanced, ids, usage))

        first = (
            [responses.chat_role_chunk(response_id, created, model, generation.choices, usage)] if shapes.chat else []
        )
        return _event_stream(generation, first, chunk, response_id, created, model, usage, shapes.chat, headers)
    if not await _run_unless_disconnected(generation, request):
        return Response(status_code=499)
    whole = shapes.response(response_id, created, model, generation.choices, generation.usage(), ids)
    return JSONResponse(whole.model_dump(mode="json"), headers=headers)


async def _run_unless_disconnected(generation: Generation, request: Request) -> bool:
    """Run a generation to its end; False (and its requests aborted) if the client goes first."""
    task = asyncio.ensure_future(generation.run_to_end())
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
            if done:
                task.result()  # raises the generation's error, if any
                return True
            if await request.is_disconnected():
                logger.debug("client left before its completion finished")
                return False
    finally:
        if not task.done():
            task.cancel()
        generation.close()


def _event_stream(
    generation: Generation,
    first_chunks: Sequence[BaseModel],
    chunk: Callable[[Sequence[tuple[ChoiceState, ChoiceDelta]]], str],
    response_id: str,
    created: int,
    model: str,
    include_usage: bool,
    chat: bool,
    headers: dict[str, str],
) -> Response:
    """Server-sent events: one per group of engine outputs that arrived together (a stream that has fallen
    behind gets the tokens of several steps in one event); with `include_usage`, a last chunk with no
    choices and the whole request's usage, as OpenAI sends it when stream_options.include_usage is set."""

    async def events() -> AsyncIterator[bytes]:
        try:
            for first in first_chunks:
                yield _sse(_json(first))
            async for advanced in generation.updates():
                yield _sse(chunk(advanced))
            if include_usage:
                yield _sse(_json(responses.usage_chunk(response_id, created, model, generation.usage(), chat)))
        except ApiError as error:  # the engine failed mid-stream: say so in the stream, as OpenAI does
            yield _sse(_json(error.body()))
        finally:
            generation.close()
        yield b"data: [DONE]\n\n"

    return _EventStreamResponse(events(), on_close=generation.close, headers=headers)


def _json(payload: BaseModel) -> str:
    return payload.model_dump_json()


def _sse(data: str) -> bytes:
    return f"data: {data}\n\n".encode()


class _EventStreamResponse(StreamingResponse):
    """Server-sent events that notice a client leaving at once, even between tokens.

    Starlette's StreamingResponse only notices (under ASGI >= 2.4) when the next send fails; this
    one listens for the disconnect while it streams and cancels the stream when it comes, then
    `on_close` aborts the engine requests.
    """

    def __init__(self, content: AsyncIterator[str], on_close: Callable[[], None], headers: dict[str, str]) -> None:
        super().__init__(content, media_type="text/event-stream", headers={"Cache-Control": "no-cache", **headers})
        self._on_close = on_close

    async def __call__(self, scope, receive, send) -> None:  # ASGI types
        try:
            async with anyio.create_task_group() as group:

                async def stream_then_stop() -> None:
                    with contextlib.suppress(OSError):
                        await self.stream_response(send)
                    group.cancel_scope.cancel()

                group.start_soon(stream_then_stop)
                await self.listen_for_disconnect(receive)
                group.cancel_scope.cancel()
        finally:
            self._on_close()
