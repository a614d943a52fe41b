"""Errors raised by twinfer. Each names the problem so a user can fix it without reading code."""

from __future__ import annotations


class TwinferError(Exception):
    """Base class of every error twinfer raises on purpose."""


class ConfigError(TwinferError, ValueError):
    """A model or engine configuration is missing a field, has a bad value, or is unsupported."""


class CheckpointError(TwinferError):
    """A checkpoint cannot be found, read, or does not match its configuration."""


class SamplingParamsError(TwinferError, ValueError):
    """A sampling parameter has a value outside its allowed range."""


class InvalidRequestError(TwinferError, ValueError):
    """A request can never be served: empty prompt, unknown token ids, too long, too large."""


class InvariantViolation(TwinferError, AssertionError):
    """An allocator or scheduler invariant does not hold. `invariant` names which one."""

    def __init__(self, invariant: str, detail: str) -> None:
        super().__init__(f"invariant '{invariant}' violated: {detail}")
        self.invariant = invariant
        self.detail = detail
