"""CUDA graphs of the decode step, one per batch size and decode context, replayed instead of launching
each kernel; and, with speculative decoding, of the verify step, one per batch size, every sequence's
chunk padded to 1 + K tokens (fast.model_runner.load_step, fast.input_batch.InputBatch.load).

Sizes: 1, 2, 4, 8, then every 8 up to the largest decode batch (max_num_seqs, or the token
budget if smaller), that largest size included even when it is not a multiple of 8. At each size, one
graph per bound the decode attention kernel's grid is launched with (fast.attention.PagedAttention.
graph_contexts: one, max_model_len, where that grid does not depend on it). They are
captured largest first into one shared memory pool, so smaller graphs reuse the larger ones'
memory. A batch of n requests replays the smallest captured size >= n; rows n.. are padding
(token 0 at position 0, slot -1 so nothing is stored, seq_len 1 over the padding block), which
`InputBatch.load(..., pad_to=size)` writes anew every step, so no stale row of an earlier,
larger batch can leak into a later one.

Python's automatic garbage collection is off while graphs are captured (`no_automatic_gc`): an engine
dropped in a reference cycle destroys its graphs when it is collected, and destroying a graph is not
permitted while a stream captures, which invalidates the capture under way (found by the H200 engine
fuzzer, reports/results/fuzz/engine_fuzz_100k/). torch no longer collects before a capture by default.
"""

from __future__ import annotations

import bisect
import contextlib
import gc
from collections.abc import Callable, Iterator, Sequence

import torch

from fast.logits import StepLogits
from spec.errors import ConfigError

# Captures cost start-up time and graph-pool memory per size; past this many rows a decode step is
# long enough that launching its kernels one by one costs little.
MAX_GRAPH_BATCH = 512

# forward(batch_size, context) -> StepLogits of batch_size rows: the decode forward over the first
# batch_size rows of the persistent input buffers, the decode attention launched for keys up to context.
# The graph's static outputs are the tensors it returns at capture: the logits and, where the LM head
# computed them, each row's max and argmax (StepLogits.head_max), all rewritten by every replay.
DecodeForward = Callable[[int, int], StepLogits]
# contexts(batch_size) -> the decode contexts to capture a graph for at that size.
DecodeContexts = Callable[[int], Sequence[int]]


def graph_batch_sizes(max_batch: int) -> list[int]:
    """1, 2, 4, 8, 16, 24, ... up to max_batch, max_batch included."""
    sizes = {size for size in (1, 2, 4, 8) if size <= max_batch}
    sizes.update(range(16, max_batch + 1, 8))
    sizes.add(max_batch)
    return sorted(sizes)


class DecodeGraphs:
    def __init__(self, max_batch: int, query_len: int = 1) -> None:
        """query_len: tokens per sequence of every captured step (1: decode steps; 1 + K: verify steps of
        speculative decoding, fast.model_runner.load_step)."""
        if max_batch > MAX_GRAPH_BATCH:
            raise ConfigError(
                f"CUDA graphs are captured for decode batches of up to {MAX_GRAPH_BATCH} requests, but max_num_seqs "
                f"and max_num_batched_tokens allow {max_batch}: lower max_num_seqs, or turn CUDA graphs off "
                "(enable_cuda_graphs=False, --no-cuda-graphs)"
            )
        self.sizes = graph_batch_sizes(max_batch)
        self.query_len = query_len
        self._graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}  # by (batch size, context)
        self._outputs: dict[tuple[int, int], StepLogits] = {}

    @property
    def max_batch(self) -> int:
        return self.sizes[-1]

    def size_for(self, num_seqs: int) -> int:
        """The smallest captured batch size that holds num_seqs rows."""
        return self.sizes[bisect.bisect_left(self.sizes, num_seqs)]

    def capture(self, prepare_padding: Callable[[int], None], forward: DecodeForward, contexts: DecodeContexts) -> None:
        """prepare_padding(size) fills the inputs with `size` padding rows; forward runs the step."""
        pool = None
        for size in reversed(self.sizes):
            prepare_padding(size)
            for context in sorted(contexts(size), reverse=True):
                forward(size, context)  # warm-up: Triton compiles and autotunes outside the capture
                torch.cuda.synchronize()
                graph = torch.cuda.CUDAGraph()
                with no_automatic_gc(), torch.cuda.graph(graph, pool=pool):
                    self._outputs[size, context] = forward(size, context)
                pool = graph.pool()
                self._graphs[size, context] = graph
        torch.cuda.synchronize()

    @property
    def num_graphs(self) -> int:
        return len(self._graphs)

    def release(self) -> None:
        """Destroy every captured graph (the caller has synchronised or given up on the device). Under
        tensor parallelism this must come before the process groups go: a graph that captured an NCCL
        collective holds a reference on the communicator until it is destroyed, and NCCL's destroy and
        abort wait for those references (pytorch#115388; on two H200s the shutdown hung forever)."""
        for graph in self._graphs.values():
            graph.reset()
        self._graphs.clear()
        self._outputs.clear()

    def replay(self, size: int, context: int) -> StepLogits:
        """The captured step's StepLogits (logits [size, vocab]), computed from the inputs' current contents."""
        self._graphs[size, context].replay()
        return self._outputs[size, context]


@contextlib.contextmanager
def no_automatic_gc() -> Iterator[None]:
    """Python's automatic garbage collection off for the block (restored as it was, also on error)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
