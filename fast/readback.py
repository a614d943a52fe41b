"""Sampled tokens copied to the host without waiting for device work queued after them.

`Tensor.tolist()` on a CUDA tensor copies on the current stream, so it waits for everything queued
before the copy: with async scheduling that includes the next step, launched before this step's
tokens are read. So the copy is queued right after sampling, into a pinned buffer, and read once its
event has passed. Two buffers are used in turn: a step's tokens are read before the step after the
next one is launched, so the buffer a copy goes into was read (or abandoned) a step ago.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class HostTokens:
    """One step's sampled tokens on their way to the host."""

    buffer: torch.Tensor  # int64 [n], pinned on CUDA
    copied: torch.cuda.Event | None  # None on the CPU, where the copy ran at once

    def values(self) -> list[int]:
        """The tokens, waiting for their copy only (not for later device work)."""
        if self.copied is not None:
            self.copied.synchronize()
        return self.buffer.tolist()


class TokenReadback:
    def __init__(self, max_rows: int, device: torch.device) -> None:
        on_cuda = device.type == "cuda"
        self._buffers = [torch.zeros(max_rows, dtype=torch.int64, pin_memory=on_cuda) for _ in range(2)]
        self._events = [torch.cuda.Event() if on_cuda else None for _ in range(2)]
        self._turn = 0

    def copy(self, tokens: torch.Tensor) -> HostTokens:
        """Queue the copy of int64 tokens [n] to the host."""
        self._turn ^= 1
        buffer = self._buffers[self._turn][: tokens.shape[0]]
        buffer.copy_(tokens, non_blocking=True)
        event = self._events[self._turn]
        if event is not None:
            event.record()
        return HostTokens(buffer, event)
