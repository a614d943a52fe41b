"""Checks made before a request reaches a route: its API key, then the size of its body.

An ASGI middleware, so a refused request costs no body parsing: a request without the key gets HTTP 401
before its body is read, and a body larger than the limit gets HTTP 413 as soon as its declared length
(or, for a chunked body, its bytes so far) passes the limit. Both answers are in OpenAI's error shape.
`/health` and `/metrics` stay open without a key, so probes and scrapers need no secret.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from twinfer.server.errors import ApiError
from twinfer.server.metrics import ServerMetrics

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

OPEN_PATHS = frozenset({"/health", "/metrics"})


class RequestGuard:
    """`app.add_middleware(RequestGuard, api_key=..., max_body_bytes=..., metrics=...)`."""

    def __init__(self, app: ASGIApp, api_key: str | None, max_body_bytes: int, metrics: ServerMetrics) -> None:
        self.app = app
        self.api_key = api_key.encode() if api_key is not None else None
        self.max_body_bytes = max_body_bytes
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = _headers(scope)
        refusal = self._key_refusal(scope, headers) or self._declared_size_refusal(headers)
        if refusal is None and "content-length" not in headers:
            body = await _read_at_most(receive, self.max_body_bytes)
            if body is None:
                refusal = self._too_large()
            else:
                receive = _replaying(body, receive)
        if refusal is not None:
            self.metrics.record_rejected()
            await refusal.response()(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _key_refusal(self, scope: Scope, headers: dict[str, str]) -> _Refusal | None:
        if self.api_key is None or scope.get("path") in OPEN_PATHS:
            return None
        scheme, _, token = headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            message = "no API key: this server needs one, sent as the header 'Authorization: Bearer KEY'"
            return _Refusal(ApiError(message, status=401, code="invalid_api_key"), {"www-authenticate": "Bearer"})
        # compare_digest: the time taken says nothing about how much of the key was right.
        if not hmac.compare_digest(token.strip().encode(), self.api_key):
            message = "incorrect API key in the Authorization header"
            return _Refusal(ApiError(message, status=401, code="invalid_api_key"), {"www-authenticate": "Bearer"})
        return None

    def _declared_size_refusal(self, headers: dict[str, str]) -> _Refusal | None:
        declared = headers.get("content-length")
        if declared is None:
            return None
        if not declared.isdigit():
            return _Refusal(ApiError(f"the Content-Length header {declared!r} is not a number"))
        return self._too_large() if int(declared) > self.max_body_bytes else None

    def _too_large(self) -> _Refusal:
        message = (
            f"the request body is larger than this server's limit of {self.max_body_bytes} bytes "
            "(twinfer serve --max-body-bytes)"
        )
        return _Refusal(ApiError(message, status=413, code="request_too_large"))


class _Refusal:
    """An error answered by the middleware itself, with any extra headers (WWW-Authenticate for 401)."""

    def __init__(self, error: ApiError, headers: dict[str, str] | None = None) -> None:
        self.error = error
        self.headers = headers or {}

    def response(self) -> ASGIApp:
        response = self.error.response()
        response.headers.update(self.headers)
        return response


def _headers(scope: Scope) -> dict[str, str]:
    return {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in scope.get("headers", ())}


async def _read_at_most(receive: Receive, limit: int) -> list[Message] | None:
    """The body's messages (a chunked body has no declared length), or None once it passes `limit` bytes."""
    messages: list[Message] = []
    size = 0
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request":
            return messages  # the client left: let the app see it
        size += len(message.get("body", b""))
        if size > limit:
            return None
        if not message.get("more_body", False):
            return messages


def _replaying(messages: list[Message], receive: Receive) -> Receive:
    """`receive` that gives the body already read, then whatever the connection sends next (a disconnect)."""
    pending = list(messages)

    async def replay() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()

    return replay
