"""One step's inputs: from the scheduler's plan into persistent device buffers with one copy.

The host side fills a flat int32 staging buffer (pinned on CUDA) with the step's sections packed
back to back, then one non-blocking copy moves the used prefix to a device staging buffer, and
small device copies place each section into its persistent, typed buffer:

    section        device buffer                                        dtype
    token ids      token_ids[:T]                                        int64
    positions      positions[:T]                                        int64
    slots          slots[:T] (-1: padding row, nothing stored)          int64
    logit rows     logit_indices[:R]                                    int64
    seq lens       seq_lens[:S] (keys per sequence, new ones included)  int32
    query offsets  cu_seqlens_q[:S + 1]                                 int32
    block tables   block_tables[:S, :W] (W: widest table this step)     int32

Worked example, block_size 4: request A prefills tokens 0..5 (table [7, 2]), request B decodes
its token 9 (table [0, 5, 3]). T = 7, S = 2, W = 3:
    positions 0 1 2 3 4 5 9;  slots 28 29 30 31 8 9 13  (B: block 3 -> id 3 * 4 + 9 % 4 = 13)
    seq_lens [6, 10];  cu_seqlens_q [0, 6, 7];  block_tables [[7, 2, ?], [0, 5, 3]]
Columns past a sequence's own blocks keep stale values: the kernels never read past seq_lens.

Buffers are allocated once, for the largest step (max_num_batched_tokens tokens, max_num_seqs
sequences, max_model_len keys each), so CUDA graphs can capture views of them.

The host buffer is rewritten only after the previous upload from it has run on the device
(`wait_for_upload`): a step that samples nothing ends without a device sync, so the next step may
be packed while the device still has the last copy queued.

Under tensor parallelism rank 0 packs and uploads as above, then sends the same packed words
(`host`, `packed_words`) to the other ranks, which upload them with `load_received`: packing
happens once, and every rank's device buffers hold the same step. A step loaded ahead carries its
pending tokens' (token row, source row) pairs after the packed words (`words_to_send`); the
other ranks fill those rows from the sampled tokens rank 0 shared with them on the device
(`apply_received_pending`), so no rank waits for the host to learn a token before its next step.
"""

from __future__ import annotations

import itertools
import operator
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch
import triton

from fast.row_upload import RowUpload

_C_INT_IS_32_BITS = array("i").itemsize == 4  # array typecode "i" is C int: int32 on every platform torch supports


class SequenceInput(NamedTuple):
    """One scheduled chunk: `token_ids` at positions start.., its request's whole block table.

    A NamedTuple, immutable like a frozen dataclass but built in under half the time: the engine
    builds one per running request every step."""

    token_ids: Sequence[int]
    start: int
    block_table: Sequence[int]
    logit_offsets: Sequence[int]  # chunk-relative rows whose logits are wanted, in order


# SequenceInput's fields as getters for map() over a step's sequences (C calls, no frame per sequence).
_TOKEN_IDS, _START, _BLOCK_TABLE, _LOGIT_OFFSETS = (operator.itemgetter(index) for index in range(4))


@dataclass(frozen=True)
class StepShape:
    """Host-known facts of a loaded step."""

    num_tokens: int
    num_seqs: int
    num_logit_rows: int
    max_query_len: int
    is_decode: bool  # every sequence has exactly one query token
    max_seq_len: int  # keys of the longest sequence, its new ones included (padding rows: 1)
    padded_query_len: int = 0  # every chunk padded to this many tokens (a verify graph's step); 0: not padded


class InputBatch:
    def __init__(
        self,
        max_num_tokens: int,
        max_num_seqs: int,
        max_blocks_per_seq: int,
        block_size: int,
        padding_block: int,
        device: torch.device,
        max_seq_len: int | None = None,
    ) -> None:
        """max_seq_len: the longest sequence a step may hold, padded chunks included (the model's context);
        None: what the block-table columns hold."""
        self.block_size = block_size
        self.padding_block = padding_block
        self.max_blocks_per_seq = max_blocks_per_seq
        self.max_seq_len = max_blocks_per_seq * block_size if max_seq_len is None else max_seq_len
        self.max_num_tokens = max_num_tokens
        self.max_num_seqs = max_num_seqs
        # The packed sections at their largest, then room for the pending pairs sent after them.
        capacity = 4 * max_num_tokens + 4 * max_num_seqs + 1 + max_num_seqs * max_blocks_per_seq
        pin = device.type == "cuda"
        self._host = torch.zeros(capacity, dtype=torch.int32, pin_memory=pin)
        self._host_view = self._host.numpy()
        self._staging = torch.zeros(capacity, dtype=torch.int32, device=device)
        self.token_ids = torch.zeros(max_num_tokens, dtype=torch.int64, device=device)
        self.positions = torch.zeros(max_num_tokens, dtype=torch.int64, device=device)
        self.slots = torch.full((max_num_tokens,), -1, dtype=torch.int64, device=device)
        self.logit_indices = torch.zeros(max_num_tokens, dtype=torch.int64, device=device)
        self.seq_lens = torch.ones(max_num_seqs, dtype=torch.int32, device=device)
        self.cu_seqlens_q = torch.zeros(max_num_seqs + 1, dtype=torch.int32, device=device)
        self.block_tables = torch.full(
            (max_num_seqs, max_blocks_per_seq), padding_block, dtype=torch.int32, device=device
        )
        self.table_width = 1  # block-table columns of the last step loaded
        self._uploaded = torch.cuda.Event() if device.type == "cuda" else None
        # Pending tokens (set_pending_tokens): P destination token rows then P source rows, back to back so
        # that one contiguous slice of the pinned buffer is copied (a strided one would be staged first).
        self._pending_rows = RowUpload(2 * max_num_seqs, device)
        self._pending_taken = torch.zeros(max_num_seqs, dtype=torch.int64, device=device)  # gathered tokens
        self._num_pending = 0  # pending token rows of the step loaded last
        self._packed_words = 0  # words of the step loaded last (its packed section)
        self._padded_chunks = False  # whether the step loaded last padded its chunks (a verify graph's shape)

    @property
    def host(self) -> torch.Tensor:
        """The flat int32 host buffer: the packed sections of the last step, back to back."""
        return self._host

    @staticmethod
    def packed_words(num_tokens: int, num_logit_rows: int, num_seqs: int, table_width: int) -> int:
        """Words of the packed section: token ids, positions, slots (T each), logit rows (R), seq lens
        (S), query offsets (S + 1), block tables (S x W)."""
        return 3 * num_tokens + num_logit_rows + 2 * num_seqs + 1 + num_seqs * table_width

    def wait_for_upload(self) -> None:
        """Until the last upload from the host buffer has run; then the buffer may be rewritten."""
        if self._uploaded is not None:
            self._uploaded.synchronize()

    def load_received(self, num_tokens: int, num_logit_rows: int, num_seqs: int, table_width: int) -> None:
        """Upload a packed section received into `host` (from rank 0) into the device buffers."""
        self._upload(num_tokens, num_logit_rows, num_seqs, table_width)

    @property
    def num_pending(self) -> int:
        """Token rows of the step loaded last that set_pending_tokens fills in on the device."""
        return self._num_pending

    def words_to_send(self) -> int:
        """Rank 0, before sending the loaded step: its pending (token row, source row) pairs into `host`
        after the packed section (P token rows, then P source rows); the words of `host` to send."""
        count = self._num_pending
        if count:
            pairs = self._pending_rows.uploaded(2 * count)
            self._host_view[self._packed_words : self._packed_words + 2 * count] = pairs
        return self._packed_words + 2 * count

    def apply_received_pending(self, num_pending: int, source: torch.Tensor) -> None:
        """The other ranks, after `load_received`: fill the pending rows received after the packed
        section from `source`, the tokens rank 0 shared after the step that sampled them."""
        if num_pending:
            pairs = self._host_view[self._packed_words : self._packed_words + 2 * num_pending].tolist()
            self.set_pending_tokens(pairs[:num_pending], source, pairs[num_pending:])

    def load(
        self, sequences: Sequence[SequenceInput], pad_to: int | None = None, query_len: int | None = None
    ) -> StepShape:
        """Fill the buffers for these sequences; with pad_to, append decode padding rows up to that many
        sequences (token 0 at position 0, slot -1, seq_len 1, block table -> the padding block). With
        query_len, every chunk is padded to query_len tokens instead (`_load_padded_chunks`)."""
        if query_len is not None:
            return self._load_padded_chunks(sequences, pad_to if pad_to is not None else len(sequences), query_len)
        self._padded_chunks = False
        num_real = len(sequences)
        num_seqs = pad_to if pad_to is not None else num_real
        # Per-sequence counts through map and the fields' getters (no Python frame per sequence: at 256
        # sequences ~15 us where list comprehensions took ~40 us).
        block_tables = list(map(_BLOCK_TABLE, sequences))
        table_lengths = list(map(len, block_tables))
        real_query_lens = list(map(len, map(_TOKEN_IDS, sequences)))
        logit_counts = list(map(len, map(_LOGIT_OFFSETS, sequences)))
        # Every sequence has one token and one logit row (list.count: no Python loop per sequence).
        is_decode = real_query_lens.count(1) == num_real and logit_counts.count(1) == num_real
        query_lens = real_query_lens + [1] * (num_seqs - num_real)
        num_tokens = sum(query_lens)
        num_logits = sum(logit_counts)
        width = max(table_lengths, default=1)
        self._check_fits(num_tokens, num_seqs, width)
        self.wait_for_upload()
        self.table_width = width

        host = self._host_view
        tokens, positions, slots, logits, seq_lens, cu_seqlens, tables = self._sections(
            host, num_tokens, num_logits, num_seqs, width
        )
        tables[:] = self.padding_block
        if is_decode:
            _fill_tables(tables[:num_real], block_tables, table_lengths)
            self._fill_decode(sequences, table_lengths, tokens, positions, slots, logits, seq_lens, cu_seqlens, tables)
            self._upload(num_tokens, num_logits, num_seqs, width)
            return StepShape(num_tokens, num_seqs, num_logits, 1, True, int(seq_lens.max(initial=1)))
        cursor, logit_cursor = 0, 0
        cu_seqlens[0] = 0
        for index, seq in enumerate(sequences):
            length = len(seq.token_ids)
            span = slice(cursor, cursor + length)
            tokens[span] = seq.token_ids
            chunk_positions = np.arange(seq.start, seq.start + length, dtype=np.int32)
            positions[span] = chunk_positions
            table = np.asarray(seq.block_table, dtype=np.int32)
            slots[span] = (
                table[chunk_positions // self.block_size] * self.block_size + chunk_positions % self.block_size
            )
            tables[index, : len(table)] = table
            seq_lens[index] = seq.start + length
            for offset in seq.logit_offsets:
                logits[logit_cursor] = cursor + offset
                logit_cursor += 1
            cursor += length
            cu_seqlens[index + 1] = cursor
        padding = slice(cursor, num_tokens)
        tokens[padding], positions[padding], slots[padding] = 0, 0, -1
        seq_lens[num_real:] = 1
        cu_seqlens[num_real + 1 :] = np.arange(cursor + 1, num_tokens + 1, dtype=np.int32)
        self._upload(num_tokens, num_logits, num_seqs, width)
        longest_query = max(query_lens, default=0)
        return StepShape(
            num_tokens, num_seqs, num_logits, longest_query, longest_query == 1, int(seq_lens.max(initial=1))
        )

    def _load_padded_chunks(self, sequences: Sequence[SequenceInput], num_seqs: int, query_len: int) -> StepShape:
        """The fixed shape of a verify graph (fast.cuda_graphs.load_step): num_seqs chunks of query_len
        tokens each, T = num_seqs * query_len, and T logit rows.

        A chunk's padding tokens (token 0) follow its real ones at the next positions, with slot -1 so
        nothing is stored; its seq_len counts them, so each real row keeps its own position and causal
        mask, while a padding row attends to whatever the next key slots hold (its logits are never
        read; block-table columns past the chunk's own blocks are the padding block). Padding sequences
        after the real ones: query_len tokens at positions 0.., slot -1, over the padding block. Logit
        rows: the real ones in order, then row 0 up to T (the graph gathers a fixed count).

        Worked example, block_size 4, query_len 3: A verifies [9, 5] at positions 6, 7 (table [7, 2]),
        padded to 2 sequences: T = 6, logit rows of A at chunk offsets 0, 1:
            tokens 9 5 0 0 0 0;  positions 6 7 8 0 1 2;  slots 10 11 -1 -1 -1 -1
            seq_lens [9, 3];  cu_seqlens_q [0, 3, 6];  logit rows 0 1 0 0 0 0
        """
        num_real = len(sequences)
        num_tokens = num_seqs * query_len
        block_size = self.block_size
        if num_real > num_seqs or any(len(seq.token_ids) > query_len for seq in sequences):
            raise ValueError(f"{num_real} chunks do not fit {num_seqs} padded chunks of {query_len} tokens")
        # Columns for every padded position's block, and every table.
        ends = [triton.cdiv(seq.start + query_len, block_size) for seq in sequences]
        width = max([triton.cdiv(query_len, block_size), *ends, *map(len, map(_BLOCK_TABLE, sequences))])
        self._check_fits(num_tokens, num_seqs, width)
        self.wait_for_upload()
        self.table_width = width
        self._padded_chunks = True
        tokens, positions, slots, logits, seq_lens, cu_seqlens, tables = self._sections(
            self._host_view, num_tokens, num_tokens, num_seqs, width
        )
        tables[:] = self.padding_block
        tokens[:], slots[:], logits[:] = 0, -1, 0
        positions[:] = np.tile(np.arange(query_len, dtype=np.int32), num_seqs)
        seq_lens[:] = query_len
        cu_seqlens[:] = np.arange(0, num_tokens + 1, query_len, dtype=np.int32)
        logit_cursor = 0
        for index, seq in enumerate(sequences):
            row, length = index * query_len, len(seq.token_ids)
            tokens[row : row + length] = seq.token_ids
            positions[row : row + query_len] += seq.start
            table = np.asarray(seq.block_table, dtype=np.int32)
            real_positions = positions[row : row + length]
            slots[row : row + length] = table[real_positions // block_size] * block_size + real_positions % block_size
            tables[index, : len(table)] = table
            seq_lens[index] = seq.start + query_len
            for offset in seq.logit_offsets:
                logits[logit_cursor] = row + offset
                logit_cursor += 1
        self._upload(num_tokens, num_tokens, num_seqs, width)
        return StepShape(num_tokens, num_seqs, num_tokens, query_len, False, int(seq_lens.max(initial=1)), query_len)

    def set_pending_tokens(self, token_rows: Sequence[int], source: torch.Tensor, source_rows: Sequence[int]) -> None:
        """After `load`: token_ids[token_rows[i]] = source[source_rows[i]], queued on the device.

        With async scheduling a step is loaded before the tokens its decode rows take are on the host
        (they were loaded as spec.request.PENDING_TOKEN): `source` is the previous step's sampled tokens
        on the device, and the copy runs after the sampling that writes them (same stream, queued later).
        """
        count = len(token_rows)
        self._num_pending = count
        if count == 0:
            return
        if self._padded_chunks:  # token rows count a step's real tokens back to back; padded chunks move them
            raise ValueError("pending tokens for a step loaded with padded chunks")
        if count > self.max_num_seqs or len(source_rows) != count:
            raise ValueError(f"{count} pending token rows for {len(source_rows)} sources (at most {self.max_num_seqs})")
        if source.dtype != self.token_ids.dtype:
            raise TypeError(f"source must hold {self.token_ids.dtype} token ids, got {source.dtype}")
        rows = self._pending_rows.upload(token_rows, source_rows)
        taken = self._pending_taken[:count]  # gathered into a buffer of the batch: nothing allocated per step
        torch.index_select(source, 0, rows[count:], out=taken)
        # An unsampleable row's code (negative: spec.sampling) must not reach the embedding, where an index
        # out of range is a device-side assert on CUDA: the row's request fails and its results are dropped.
        taken.clamp_(min=0)
        self.token_ids.index_copy_(0, rows[:count], taken)

    def _fill_decode(
        self,
        sequences: Sequence[SequenceInput],
        table_lengths: Sequence[int],
        tokens: np.ndarray,
        positions: np.ndarray,
        slots: np.ndarray,
        logits: np.ndarray,
        seq_lens: np.ndarray,
        cu_seqlens: np.ndarray,
        tables: np.ndarray,
    ) -> None:
        """The sections of a decode step (padding rows after the real ones; `tables` already filled),
        with one numpy write per section instead of several per sequence: at 256 sequences the general
        loop cost ~2 ms of host time per step, which the GPU waited for."""
        num_real, num_seqs, block_size = len(sequences), len(seq_lens), self.block_size
        real_positions = positions[:num_real]
        real_positions[:] = list(map(_START, sequences))
        tokens[:num_real] = [seq.token_ids[0] for seq in sequences]
        # Each token's slot from its block in the table rows just written (numpy, not a Python
        # expression per sequence: ~40 us less at 256 sequences).
        block_indices = real_positions // block_size
        if not (block_indices < np.array(table_lengths)).all():  # the rows' columns past a table are padding
            raise ValueError("a decode sequence's block table does not cover its position")
        blocks = tables[np.arange(num_real), block_indices]
        slots[:num_real] = blocks * block_size + real_positions % block_size
        logits[:] = np.arange(num_real, dtype=np.int32)
        seq_lens[:num_real] = real_positions + 1
        tokens[num_real:], positions[num_real:], slots[num_real:] = 0, 0, -1
        seq_lens[num_real:] = 1
        cu_seqlens[:] = np.arange(num_seqs + 1, dtype=np.int32)

    def _check_fits(self, num_tokens: int, num_seqs: int, width: int) -> None:
        if num_tokens > self.max_num_tokens or num_seqs > self.max_num_seqs or width > self.max_blocks_per_seq:
            raise ValueError(
                f"step of {num_tokens} tokens, {num_seqs} sequences, {width} blocks per table exceeds the input "
                f"buffers ({self.max_num_tokens}, {self.max_num_seqs}, {self.max_blocks_per_seq})"
            )

    @staticmethod
    def _sections(
        flat: np.ndarray, num_tokens: int, num_logits: int, num_seqs: int, width: int
    ) -> tuple[np.ndarray, ...]:
        """Views of the packed sections, in upload order."""
        sizes = (num_tokens, num_tokens, num_tokens, num_logits, num_seqs, num_seqs + 1, num_seqs * width)
        views, offset = [], 0
        for size in sizes:
            views.append(flat[offset : offset + size])
            offset += size
        views[-1] = views[-1].reshape(num_seqs, width)
        return tuple(views)

    def _upload(self, num_tokens: int, num_logits: int, num_seqs: int, width: int) -> None:
        used = self._packed_words = self.packed_words(num_tokens, num_logits, num_seqs, width)
        self._num_pending = 0  # until set_pending_tokens
        self._staging[:used].copy_(self._host[:used], non_blocking=True)
        if self._uploaded is not None:
            self._uploaded.record()
        tokens, positions, slots, logits, seq_lens, cu_seqlens, tables = self._sections(
            self._staging, num_tokens, num_logits, num_seqs, width
        )
        self.token_ids[:num_tokens].copy_(tokens)
        self.positions[:num_tokens].copy_(positions)
        self.slots[:num_tokens].copy_(slots)
        self.logit_indices[:num_logits].copy_(logits)
        self.seq_lens[:num_seqs].copy_(seq_lens)
        self.cu_seqlens_q[: num_seqs + 1].copy_(cu_seqlens)
        self.block_tables[:num_seqs, :width].copy_(tables)


def _fill_tables(rows: np.ndarray, block_tables: Sequence[Sequence[int]], lengths: Sequence[int]) -> None:
    """Write each block table (of lengths[i] entries) at the start of its row of `rows` (int32 [S, W]);
    the rest keeps its values.

    The tables' entries are joined back to back and written with one masked assignment (row-major,
    so each row's leading len(table) columns take its entries in order): at 256 sequences this is
    ~0.05 ms where one write per row, converting each Python int, cost ~0.35 ms.
    """
    counts = np.array(lengths, dtype=np.int64)
    rows[np.arange(rows.shape[1]) < counts[:, None]] = _joined_int32(block_tables, int(counts.sum()))


def _joined_int32(block_tables: Sequence[Sequence[int]], total: int) -> np.ndarray:
    """The tables' entries back to back as int32. The block allocator's tables are int32 arrays, joined
    as raw memory; any other sequences (lists: the runner's start-up steps, tests) are converted."""
    if _C_INT_IS_32_BITS and set(map(type, block_tables)) <= {array} and {t.typecode for t in block_tables} <= {"i"}:
        return np.frombuffer(b"".join(block_tables), dtype=np.int32)
    return np.fromiter(itertools.chain.from_iterable(block_tables), dtype=np.int32, count=total)
