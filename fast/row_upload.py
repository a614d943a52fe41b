"""Row indices from the host to the device, without a sync and without an allocation per call.

`torch.tensor(rows, device="cuda")` copies from pageable memory, which makes the host wait for the
copy, and so for every kernel queued before it: in the middle of a step that means waiting for the
forward pass, where the host should be queueing sampling. Here the rows go through a pinned host
buffer made once, copied without blocking into a device buffer made once. The copy runs later, in
stream order, so the host buffer may not be rewritten before it has run: an event recorded after each
copy is waited for before the next write (a copy queued a step ago has long run).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch


class RowUpload:
    def __init__(self, capacity: int, device: torch.device) -> None:
        on_cuda = device.type == "cuda"
        self.capacity = capacity
        self._host = torch.zeros(capacity, dtype=torch.int64, pin_memory=on_cuda)
        self._host_view = self._host.numpy()
        self._device = torch.zeros(capacity, dtype=torch.int64, device=device)
        self._copied = torch.cuda.Event() if on_cuda else None

    def upload(self, *parts: Sequence[int]) -> torch.Tensor:
        """The parts back to back, as an int64 device tensor [sum of their lengths] (a view of the
        device buffer: valid until the next upload), queued on the current stream."""
        total = sum(len(part) for part in parts)
        if total > self.capacity:
            raise ValueError(f"{total} rows to upload; the buffer holds {self.capacity}")
        if self._copied is not None:
            self._copied.synchronize()  # the last copy out of the host buffer has run
        start = 0
        for part in parts:
            self._host_view[start : start + len(part)] = part
            start += len(part)
        rows = self._device[:total]
        rows.copy_(self._host[:total], non_blocking=True)
        if self._copied is not None:
            self._copied.record()
        return rows

    def uploaded(self, count: int) -> np.ndarray:
        """The first `count` values of the last upload, as the host wrote them (read-only use)."""
        return self._host_view[:count]
