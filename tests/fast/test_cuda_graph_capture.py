"""Capturing the decode graphs with Python's automatic garbage collection off (fast.cuda_graphs.no_automatic_gc).

An engine dropped in a reference cycle destroys its CUDA graphs when the collector reaches it; a graph destroyed
while a stream captures invalidates that capture. The H200 engine fuzzer found it: an engine's build failed with
"operation failed due to a previous error during capture" (reports/results/fuzz/engine_fuzz_100k/).
"""

from __future__ import annotations

import contextlib
import gc

import pytest
import torch

from fast import cuda_graphs
from fast.cuda_graphs import DecodeGraphs, no_automatic_gc


class FakeGraph:
    """Stands in for torch.cuda.CUDAGraph on a CPU machine."""

    def pool(self) -> None:
        return None


def capture_on_cpu(monkeypatch: pytest.MonkeyPatch, graphs: DecodeGraphs, forward) -> None:
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *args: None)
    monkeypatch.setattr(torch.cuda, "CUDAGraph", FakeGraph)
    monkeypatch.setattr(torch.cuda, "graph", lambda graph, pool=None: contextlib.nullcontext())
    graphs.capture(lambda size: None, forward, lambda size: (16, 64))


def test_the_collector_is_off_during_each_capture_only(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[bool] = []

    def forward(size: int, context: int) -> torch.Tensor:
        seen.append(gc.isenabled())
        return torch.zeros(size, 4)

    assert gc.isenabled()
    capture_on_cpu(monkeypatch, DecodeGraphs(2), forward)
    # Per (size, context), largest first: the warm-up call with the collector on, then the captured one off.
    assert seen == [True, False] * 4
    assert gc.isenabled()


def test_the_collector_is_restored_when_a_capture_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = 0

    def forward(size: int, context: int) -> torch.Tensor:
        nonlocal calls
        calls += 1
        if calls == 2:  # the first captured call
            raise RuntimeError("capture failed")
        return torch.zeros(size, 4)

    with pytest.raises(RuntimeError, match="capture failed"):
        capture_on_cpu(monkeypatch, DecodeGraphs(1), forward)
    assert gc.isenabled()


def test_a_collector_switched_off_by_the_caller_stays_off() -> None:
    gc.disable()
    try:
        with no_automatic_gc():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()


def capture_while_a_dead_graph_waits_in_a_cycle() -> torch.Tensor:
    """Capture a graph while an earlier one, held only by a fresh reference cycle, can be collected at any
    allocation (the collector's first threshold lowered to make that certain); its replayed output."""
    x = torch.arange(4.0, device="cuda")
    old = DecodeGraphs(1)
    old.capture(lambda size: None, lambda size, context: x + 1, lambda size: (16,))
    waiting = [old]
    del old

    def forward(size: int, context: int) -> torch.Tensor:
        if torch.cuda.is_current_stream_capturing() and waiting:
            cycle: dict = {"graphs": waiting.pop()}
            cycle["self"] = cycle  # garbage from here on, until the collector finds the cycle
            del cycle
            # Tracked objects kept alive: the collector's count grows, and every 10 starts a collection.
            kept = [[] for _ in range(10_000)]
            del kept
        return x * 2

    new = DecodeGraphs(1)
    threshold = gc.get_threshold()
    gc.set_threshold(10, *threshold[1:])
    try:
        new.capture(lambda size: None, forward, lambda size: (16,))
    finally:
        gc.set_threshold(*threshold)
    torch.cuda.synchronize()
    return new.replay(1, 16)


@pytest.mark.gpu
def test_a_dead_engines_graphs_collected_during_a_capture_cannot_break_it() -> None:
    output = capture_while_a_dead_graph_waits_in_a_cycle()
    assert torch.equal(output, torch.arange(4.0, device="cuda") * 2)


@pytest.mark.gpu
def test_without_the_collector_off_the_same_capture_breaks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Teeth: the scenario above does reach the failure it guards against."""
    monkeypatch.setattr(cuda_graphs, "no_automatic_gc", contextlib.nullcontext)
    with pytest.raises((RuntimeError, torch.AcceleratorError), match="capture"):
        capture_while_a_dead_graph_waits_in_a_cycle()
