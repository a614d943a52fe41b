"""The reason server test modules give when they skip: the server's packages are absent (a bare GPU image).

Each such module calls `pytest.importorskip(package, reason=missing(package))` for every package it needs
before importing anything that needs it, so collection skips the module instead of failing.
"""

from __future__ import annotations

SERVER_PACKAGES = "fastapi uvicorn pydantic httpx openai"


def missing(package: str) -> str:
    return f"the server's packages are not installed ({package} is missing): pip install {SERVER_PACKAGES}"
