"""A planted fault for the tensor-parallel tests, in a module of its own: a worker process imports it
to rebuild the weights it receives, and this module imports only torch (not a test module, with its
engines and transformers), so that the worker starts as fast as a real one."""

from __future__ import annotations

import os

import torch


class ExplodingStateDict(dict):
    """A state dict that works in the process that built it and raises in any other (a worker)."""

    def __init__(self, *args: object) -> None:
        super().__init__(*args)
        self.home_pid = os.getpid()

    def get(self, name: str, default: object = None) -> object:
        if os.getpid() != self.home_pid:
            raise RuntimeError("planted failure while reading weights on a worker")
        return super().get(name, default)

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild_exploding, (dict(self), self.home_pid))


def _rebuild_exploding(items: dict[str, torch.Tensor], home_pid: int) -> ExplodingStateDict:
    rebuilt = ExplodingStateDict(items)
    rebuilt.home_pid = home_pid
    return rebuilt
