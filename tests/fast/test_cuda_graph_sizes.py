"""Which decode batch sizes the fast engine captures, and the limit on them (host-side logic, no GPU)."""

from __future__ import annotations

import pytest

from fast.cuda_graphs import MAX_GRAPH_BATCH, DecodeGraphs, graph_batch_sizes
from spec.errors import ConfigError


def test_sizes_are_powers_of_two_to_8_then_every_8_and_the_maximum() -> None:
    assert graph_batch_sizes(1) == [1]
    assert graph_batch_sizes(5) == [1, 2, 4, 5]
    assert graph_batch_sizes(17) == [1, 2, 4, 8, 16, 17]
    assert graph_batch_sizes(40) == [1, 2, 4, 8, 16, 24, 32, 40]


def test_a_batch_replays_the_smallest_size_that_holds_it() -> None:
    graphs = DecodeGraphs(17)
    assert [graphs.size_for(n) for n in (1, 3, 5, 8, 9, 16, 17)] == [1, 4, 8, 8, 16, 16, 17]


def test_a_decode_batch_past_the_capture_limit_is_a_clear_error() -> None:
    DecodeGraphs(MAX_GRAPH_BATCH)
    with pytest.raises(ConfigError, match="lower max_num_seqs, or turn CUDA graphs off"):
        DecodeGraphs(MAX_GRAPH_BATCH + 1)
