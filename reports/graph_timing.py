"""Timing device work replayed from a CUDA graph: the method every microbenchmark here shares.

`run` is called once eagerly (compiling its kernels), captured into a graph, replayed `warmup` times
untimed, then `replays` times between CUDA events; the median replay in microseconds is returned.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

import torch


def median_replay_us(run: Callable[[], None], replays: int, warmup: int = 3) -> float:
    run()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    for _ in range(warmup):
        graph.replay()
    samples_ms = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        samples_ms.append(start.elapsed_time(end))
    return statistics.median(samples_ms) * 1000
