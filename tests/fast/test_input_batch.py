"""fast.input_batch: what a loaded step puts in the host buffer (and so in the device buffers).

Decode steps take a shorter path than mixed ones; both are checked against the layout written out
here from first principles, padding rows included.
"""

from __future__ import annotations

import random
from array import array

import numpy as np
import pytest
import torch

from fast.input_batch import InputBatch, SequenceInput
from fast.row_upload import RowUpload

BLOCK_SIZE, PADDING_BLOCK = 16, 999


def _batch() -> InputBatch:
    return InputBatch(64, 8, 6, BLOCK_SIZE, PADDING_BLOCK, torch.device("cpu"))


def _sections(batch: InputBatch, num_tokens: int, num_logits: int, num_seqs: int) -> tuple[np.ndarray, ...]:
    return InputBatch._sections(batch.host.numpy(), num_tokens, num_logits, num_seqs, batch.table_width)


def _expected_slot(sequence: SequenceInput, position: int) -> int:
    return sequence.block_table[position // BLOCK_SIZE] * BLOCK_SIZE + position % BLOCK_SIZE


# Block tables as the block allocator keeps them (int32 arrays, copied as raw memory), as lists, and as
# arrays of another width (converted entry by entry, never reinterpreted).
TABLE_KINDS = {"int32 array": lambda ids: array("i", ids), "list": list, "int64 array": lambda ids: array("q", ids)}


@pytest.mark.parametrize("table_kind", TABLE_KINDS)
@pytest.mark.parametrize("pad_to", [None, 8])
def test_decode_step_layout(pad_to: int | None, table_kind: str) -> None:
    rng = random.Random(0)
    sequences = []
    for index in range(5):
        start = rng.randint(0, 90)
        table = TABLE_KINDS[table_kind]([rng.randint(0, 500) for _ in range(start // BLOCK_SIZE + 1)])
        sequences.append(SequenceInput([100 + index], start, table, [0]))
    batch = _batch()
    shape = batch.load(sequences, pad_to=pad_to)
    num_seqs = pad_to or len(sequences)
    assert (shape.num_tokens, shape.num_seqs, shape.num_logit_rows, shape.max_query_len, shape.is_decode) == (
        num_seqs,
        num_seqs,
        len(sequences),
        1,
        True,
    )
    tokens, positions, slots, logits, seq_lens, cu_seqlens, tables = _sections(batch, num_seqs, 5, num_seqs)
    real = range(len(sequences))
    assert tokens[:5].tolist() == [100 + i for i in real] and not tokens[5:].any()
    assert positions[:5].tolist() == [s.start for s in sequences] and not positions[5:].any()
    assert slots[:5].tolist() == [_expected_slot(s, s.start) for s in sequences]
    assert (slots[5:] == -1).all()
    assert logits.tolist() == list(real)
    assert seq_lens.tolist() == [s.start + 1 for s in sequences] + [1] * (num_seqs - 5)
    assert cu_seqlens.tolist() == list(range(num_seqs + 1))
    for index, sequence in enumerate(sequences):
        width = len(sequence.block_table)
        assert tables[index, :width].tolist() == list(sequence.block_table)
        assert (tables[index, width:] == PADDING_BLOCK).all()
    assert (tables[5:] == PADDING_BLOCK).all()


def test_a_decode_row_that_also_scores_is_not_a_decode_step() -> None:
    # One token with two logit rows (a prompt position scored and the sample): the general path.
    sequences = [SequenceInput([7], 3, [4], [0, 0]), SequenceInput([8], 20, [1, 2], [0])]
    batch = _batch()
    shape = batch.load(sequences)
    assert shape.is_decode and shape.num_logit_rows == 3
    tokens, positions, slots, logits, seq_lens, cu_seqlens, _ = _sections(batch, 2, 3, 2)
    assert logits.tolist() == [0, 0, 1]
    assert slots.tolist() == [4 * 16 + 3, 2 * 16 + 4]
    assert seq_lens.tolist() == [4, 21] and cu_seqlens.tolist() == [0, 1, 2]


def test_mixed_step_layout() -> None:
    sequences = [SequenceInput([1, 2, 3], 14, [5, 6], [2]), SequenceInput([9], 40, [7, 8, 9], [0])]
    batch = _batch()
    shape = batch.load(sequences)
    assert (shape.num_tokens, shape.num_seqs, shape.max_query_len, shape.is_decode) == (4, 2, 3, False)
    tokens, positions, slots, logits, seq_lens, cu_seqlens, tables = _sections(batch, 4, 2, 2)
    assert tokens.tolist() == [1, 2, 3, 9] and positions.tolist() == [14, 15, 16, 40]
    assert slots.tolist() == [5 * 16 + 14, 5 * 16 + 15, 6 * 16 + 0, 9 * 16 + 8]
    assert logits.tolist() == [2, 3] and seq_lens.tolist() == [17, 41] and cu_seqlens.tolist() == [0, 3, 4]
    assert tables.tolist() == [[5, 6, PADDING_BLOCK], [7, 8, 9]]


def test_a_decode_position_past_its_block_table_is_refused() -> None:
    # The slot is read from the table's row: a table that does not cover the position must not read padding.
    sequences = [SequenceInput([1], 0, array("i", [3]), [0]), SequenceInput([2], BLOCK_SIZE, array("i", [4]), [0])]
    with pytest.raises(ValueError, match="does not cover"):
        _batch().load(sequences)


def test_pending_tokens_are_filled_in_from_the_sampled_tokens() -> None:
    """A mixed step whose second and third sequences end in a token not yet on the host: their rows
    (1 + 3 = 4 and 5) take the previous step's sampled tokens at source rows 2 and 0."""
    batch = _batch()
    pending = -1  # spec.request.PENDING_TOKEN
    sequences = [
        SequenceInput([11], 7, [3], [0]),
        SequenceInput([12, 13, 14, pending], 0, [4], [3]),
        SequenceInput([pending], 20, [5, 6], [0]),
    ]
    shape = batch.load(sequences)
    batch.set_pending_tokens([4, 5], torch.tensor([70, 71, 72]), [2, 0])
    assert batch.token_ids[: shape.num_tokens].tolist() == [11, 12, 13, 14, 72, 70]
    batch.set_pending_tokens([], torch.tensor([1]), [])  # nothing pending: nothing changes
    assert batch.token_ids[: shape.num_tokens].tolist() == [11, 12, 13, 14, 72, 70]
    with pytest.raises(ValueError, match="pending token rows"):
        batch.set_pending_tokens([4, 5], torch.tensor([70]), [0])
    with pytest.raises(TypeError, match="source must hold torch.int64 token ids"):
        batch.set_pending_tokens([4, 5], torch.tensor([70, 71, 72], dtype=torch.int32), [2, 0])
    batch.set_pending_tokens([5, 4], torch.tensor([80, 81, 82]), [1, 2])  # the gather buffer is reused
    assert batch.token_ids[: shape.num_tokens].tolist() == [11, 12, 13, 14, 82, 81]


def test_row_upload_puts_the_parts_back_to_back_in_one_reused_buffer() -> None:
    """fast.row_upload.RowUpload: the device view holds the parts in order; a later upload reuses the
    same buffers (nothing allocated per call); the host copy of the last upload is readable; too many
    rows are refused by name."""
    upload = RowUpload(6, torch.device("cpu"))
    first = upload.upload([3, 1], [7])
    assert first.tolist() == [3, 1, 7] and first.dtype == torch.int64
    second = upload.upload([5, 4, 2, 0])
    assert second.tolist() == [5, 4, 2, 0]
    assert second.data_ptr() == first.data_ptr(), "the same device buffer"
    assert upload.uploaded(4).tolist() == [5, 4, 2, 0]
    assert upload.upload().numel() == 0
    with pytest.raises(ValueError, match="7 rows to upload; the buffer holds 6"):
        upload.upload([0] * 4, [0] * 3)
