"""Timing device work replayed from a CUDA graph: the method every microbenchmark here shares.

Both timers call the work once eagerly first (compiling its kernels, and cuBLAS's workspace, outside the
capture), capture it into a graph, replay it untimed to warm up, then time replays between CUDA events:
`median_replay_us` the median replay of one piece of work, `time_in_graph` every replay of `calls`
back-to-back calls, divided by `calls`.
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


def time_in_graph(
    call: Callable[[int], object],
    calls: int,
    warmup_replays: int = 3,
    timed_replays: int = 10,
) -> list[float]:
    """Microseconds per call: `calls` calls (call(i) for i in range(calls)) captured in one CUDA
    graph, replayed warmup_replays times, then timed_replays times each between two CUDA events."""
    call(0)  # compile / load, and cuBLAS's workspace, outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            call(i)
    for _ in range(warmup_replays):
        graph.replay()
    events = [
        (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(timed_replays)
    ]
    for start, end in events:
        start.record()
        graph.replay()
        end.record()
    torch.cuda.synchronize()
    samples = [start.elapsed_time(end) * 1e3 / calls for start, end in events]
    del graph
    return samples
