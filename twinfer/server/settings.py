"""What a server operator sets beyond the engine: the API key and the bounds on what one request may ask.

`twinfer serve` fills these from its options (`--api-key` or the TWINFER_API_KEY environment variable,
`--max-body-bytes`, `--max-request-tokens`); `create_app` takes them, with defaults that keep a server
on loopback usable as it always was.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from spec.errors import ConfigError

API_KEY_ENV = "TWINFER_API_KEY"
# A prompt of 128k token ids is about 1 MiB of JSON: 8 MiB leaves room for batches of prompts and long
# chats while a client cannot make the server buffer an unbounded body.
DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024
# By default one prompt's choices may together ask for up to this many whole contexts (n x max_tokens),
# so a chat without max_tokens (the rest of the context) may have n up to 8.
DEFAULT_REQUEST_CONTEXTS = 8


@dataclass(frozen=True)
class ServerSettings:
    """api_key: None serves anyone who can reach the port; else every request but /health and /metrics
    must carry `Authorization: Bearer <api_key>`.
    max_body_bytes: the largest request body accepted (larger ones get HTTP 413).
    max_request_tokens: the most output tokens one prompt's choices may ask for together (n x max_tokens);
    None: DEFAULT_REQUEST_CONTEXTS x max_model_len.
    """

    api_key: str | None = None
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_request_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.api_key is not None and (not isinstance(self.api_key, str) or not self.api_key.strip()):
            raise ConfigError("the API key must be a non-empty string (or None for no key)")
        for name in ("max_body_bytes", "max_request_tokens"):
            value = getattr(self, name)
            if value is None and name == "max_request_tokens":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")

    def request_token_limit(self, model_len: int) -> int:
        if self.max_request_tokens is not None:
            return self.max_request_tokens
        return DEFAULT_REQUEST_CONTEXTS * model_len


def api_key_from(option: str | None, environ: Mapping[str, str] = os.environ) -> str | None:
    """The key given on the command line, else the environment's (an empty variable counts as unset)."""
    if option is not None:
        return option
    return environ.get(API_KEY_ENV) or None
