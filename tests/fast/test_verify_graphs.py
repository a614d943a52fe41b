"""Verify steps of speculative decoding in CUDA graphs (fast.model_runner.load_step): which steps replay a
verify graph, and that padding every chunk to 1 + K tokens changes no real row's logits.

The padded forward is the forward a verify graph captures (ModelRunner._verify_forward); here it runs
eagerly as well, so the CPU (Triton's interpreter) checks the padding itself, and on a GPU the graph's
replay is held to the same unpadded step: bit for bit in batch-invariant mode, within the fp32 rule
(1e-4) outside it, where the padded step's row counts may pick other kernel tiles.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from fast.cuda_graphs import DecodeGraphs
from fast.input_batch import InputBatch, SequenceInput
from fast.logits import StepLogits
from fast.model_runner import MAX_VERIFY_GRAPH_BATCH, ModelRunner, PreparedStep, load_step, verify_graph_batch
from spec.engine_config import EngineConfig
from spec.speculative import SpeculativeConfig
from tests.engines import FAST_DEVICE

BLOCK_SIZE, PADDING_BLOCK = 4, 99
DRAFTS = 3
QUERY_LEN = 1 + DRAFTS


def _batch(max_blocks_per_seq: int = 4) -> InputBatch:
    return InputBatch(64, 8, max_blocks_per_seq, BLOCK_SIZE, PADDING_BLOCK, torch.device("cpu"))


def _sections(batch: InputBatch, shape) -> tuple[np.ndarray, ...]:
    return InputBatch._sections(
        batch.host.numpy(), shape.num_tokens, shape.num_logit_rows, shape.num_seqs, batch.table_width
    )


def test_padded_chunks_layout() -> None:
    """The worked example of InputBatch._load_padded_chunks, then a decode row beside it whose padded
    positions run past its own block into the padding block."""
    batch = _batch()
    sequences = [SequenceInput([9, 5], 6, [7, 2], [0, 1]), SequenceInput([4], 3, [5], [0])]
    shape = batch.load(sequences, pad_to=3, query_len=3)
    assert (shape.num_tokens, shape.num_seqs, shape.num_logit_rows, shape.max_query_len, shape.is_decode) == (
        9,
        3,
        9,
        3,
        False,
    )
    tokens, positions, slots, logits, seq_lens, cu_seqlens, tables = _sections(batch, shape)
    assert tokens.tolist() == [9, 5, 0, 4, 0, 0, 0, 0, 0]
    assert positions.tolist() == [6, 7, 8, 3, 4, 5, 0, 1, 2]
    assert slots.tolist() == [2 * 4 + 2, 2 * 4 + 3, -1, 5 * 4 + 3, -1, -1, -1, -1, -1]
    assert logits.tolist() == [0, 1, 3, 0, 0, 0, 0, 0, 0]
    assert seq_lens.tolist() == [9, 6, 3] and cu_seqlens.tolist() == [0, 3, 6, 9]
    # Columns for every padded position: the second chunk's positions 4, 5 lie in its second block.
    assert tables.tolist() == [[7, 2, PADDING_BLOCK], [5, PADDING_BLOCK, PADDING_BLOCK], [PADDING_BLOCK] * 3]


def test_padded_chunks_refuse_what_they_cannot_hold() -> None:
    batch = _batch()
    with pytest.raises(ValueError, match="do not fit 2 padded chunks of 3 tokens"):
        batch.load([SequenceInput([1, 2, 3, 4], 0, [0], [3])], pad_to=2, query_len=3)
    with pytest.raises(ValueError, match="do not fit 1 padded chunks"):
        batch.load([SequenceInput([1], 0, [0], [0])] * 2, pad_to=1, query_len=3)
    # Token rows of a padded step are not its real tokens back to back: pending tokens cannot be placed.
    batch.load([SequenceInput([1], 0, [0], [0])], pad_to=2, query_len=3)
    with pytest.raises(ValueError, match="padded chunks"):
        batch.set_pending_tokens([0], torch.tensor([5]), [0])
    batch.load([SequenceInput([1], 0, [0], [0])])  # unpadded again: pending tokens are placed
    batch.set_pending_tokens([0], torch.tensor([5]), [0])
    assert batch.token_ids[0].item() == 5


def test_which_steps_replay_a_verify_graph() -> None:
    """Decode steps keep the decode graphs; steps whose chunks fit 1 + K tokens take a verify graph (the
    rows returned: the real logit rows); longer chunks, chunks whose padding would pass max_model_len, and
    batches past the largest verify graph run eagerly."""
    batch = _batch(max_blocks_per_seq=4)  # max_model_len 16
    decode, verify = DecodeGraphs(8), DecodeGraphs(8, query_len=QUERY_LEN)
    decode_step = load_step(batch, [SequenceInput([1], 5, [0, 1], [0])] * 3, decode, verify)
    assert (decode_step.graph_size, decode_step.num_rows, decode_step.verify) == (4, 3, False)
    chunks = [SequenceInput([1, 2, 3], 5, [0, 1], [0, 1, 2]), SequenceInput([4], 2, [2], [0])] * 2 + [
        SequenceInput([5], 9, [3, 4, 5], [0])
    ]
    step = load_step(batch, chunks, decode, verify)
    assert (step.graph_size, step.num_rows, step.verify, step.shape.num_tokens) == (8, 9, True, 8 * QUERY_LEN)
    assert load_step(batch, chunks, decode, None).graph_size == 0  # no verify graphs captured
    too_long = load_step(batch, [SequenceInput([1] * (QUERY_LEN + 1), 0, [0, 1], [QUERY_LEN])], decode, verify)
    assert (too_long.graph_size, too_long.verify, too_long.num_rows) == (0, False, 1)
    at_the_end = load_step(batch, [SequenceInput([1, 2], 13, [0, 1, 2, 3], [0, 1])], decode, verify)
    assert at_the_end.graph_size == 0  # positions 13..16 padded would pass max_model_len 16
    too_many = load_step(batch, [SequenceInput([1, 2], 0, [0], [0, 1])] * 5, DecodeGraphs(8), DecodeGraphs(4, 2))
    assert (too_many.graph_size, too_many.num_rows) == (0, 5 * 2)


def test_verify_graph_sizes_follow_the_budget() -> None:
    assert verify_graph_batch(256, 16384, 0) == 0  # no speculation: no verify graph
    assert verify_graph_batch(256, 16384, 4) == MAX_VERIFY_GRAPH_BATCH
    assert verify_graph_batch(8, 16384, 4) == 8
    assert verify_graph_batch(256, 60, 4) == 12  # 12 chunks of 5 tokens fill a 60-token budget


def _runner(tiny_weights, batch_invariant: bool) -> ModelRunner:
    config, state_dict = tiny_weights
    settings = EngineConfig(
        block_size=BLOCK_SIZE,
        num_blocks=32,
        max_num_seqs=4,
        max_num_batched_tokens=64,
        max_model_len=64,
        batch_invariant=batch_invariant,
        speculative=SpeculativeConfig("ngram", DRAFTS),
    )
    return ModelRunner(config, state_dict, settings, torch.float32, torch.device(FAST_DEVICE))


def _steps() -> tuple[list[SequenceInput], list[SequenceInput]]:
    """Three prompts' prefills, then a step of two verify chunks (3 and 1 drafts) beside a decode row:
    the second verify chunk's padding runs into a block its table does not have yet."""
    tables = [[0, 1, 2, 8], [3, 4], [5]]  # each covers its prompt and its verify chunk's real tokens
    prompts = [[(11 * i + 5 * t) % 384 for t in range(n)] for i, n in enumerate((9, 6, 3))]
    prefills = [SequenceInput(p, 0, t, [len(p) - 1]) for p, t in zip(prompts, tables, strict=True)]
    verify = [
        SequenceInput([17, 40, 41, 42], 9, tables[0], [0, 1, 2, 3]),
        SequenceInput([23, 50], 6, tables[1], [0, 1]),  # padded positions 8, 9: a block it does not have
        SequenceInput([31], 3, tables[2], [0]),
    ]
    return prefills, verify


def _checked_logits(step: StepLogits) -> torch.Tensor:
    """A copy of the step's logits, its head max (where the head computed one: on a GPU, the GEMV on) checked to
    be torch.max of them: the padded step's rows sliced with its logits."""
    if step.head_max is not None:
        maxima, argmax = torch.max(step.logits, dim=-1)
        assert torch.equal(step.head_max.values, maxima) and torch.equal(step.head_max.indices, argmax)
    return step.logits.clone()


@pytest.mark.parametrize("batch_invariant", [True, False], ids=["batch-invariant", "default"])
def test_a_padded_verify_step_computes_the_unpadded_logits(tiny_weights, batch_invariant: bool) -> None:
    runner = _runner(tiny_weights, batch_invariant)
    prefills, verify = _steps()
    runner.run(prefills)
    plain = _checked_logits(runner.launch(load_step(runner.inputs, verify, None)))
    padded_step = load_step(runner.inputs, verify, None, DecodeGraphs(4, query_len=QUERY_LEN))
    assert padded_step.verify and padded_step.graph_size == 4 and padded_step.num_rows == 7
    # Its attention: the split decode kernel over each chunk's rows, the packed prefill kernel when invariant.
    assert runner.attention.runs_decode_kernel(4, QUERY_LEN) is not batch_invariant
    # The padded forward run eagerly: what the verify graph captures.
    results = {"padded eager": _checked_logits(runner.launch(replace(padded_step, graph_size=0, verify=False)))}
    if runner.verify_graphs is not None:  # on a GPU: the captured graph, replayed
        assert runner.verify_graphs.sizes == [1, 2, 4]
        results["verify graph"] = _checked_logits(runner.run(verify))
    assert plain.shape == (7, runner.model_config.vocab_size)
    for name, logits in results.items():
        if batch_invariant:
            assert torch.equal(logits, plain), name
        else:
            torch.testing.assert_close(logits, plain, rtol=0, atol=1e-4, msg=lambda m, n=name: f"{n}: {m}")


def test_prepared_steps_name_their_rows() -> None:
    """launch returns PreparedStep.num_rows rows: the real logit rows, never a graph's padding."""
    batch = _batch()
    step = load_step(batch, [SequenceInput([1, 2], 0, [0], [1])], None)
    assert step == PreparedStep(step.shape, 0, 1, False)
