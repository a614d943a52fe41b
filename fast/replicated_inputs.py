"""Step inputs replicated on every tensor-parallel rank from rank 0's packed section.

`InputBatch.load` packs a step into the flat int32 host buffer, uploads its used prefix with one
copy and places each section into the persistent device buffers. Under tensor parallelism rank 0
does exactly that, then sends the same packed words (fast.parallel.StepChannel); every other
rank receives them into its own host buffer and runs the same upload, so all ranks' device
buffers hold the same step. Packing happens once, on rank 0.

The host buffer is rewritten only after the previous step's upload from it has run on the device
(`wait_for_upload`): a step that samples nothing ends without a device sync, so rank 0 may pack,
and a worker receive, the next step while the device still has the last upload queued.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from fast.input_batch import InputBatch, SequenceInput, StepShape


class ReplicatedInputBatch(InputBatch):
    def __init__(
        self,
        max_num_tokens: int,
        max_num_seqs: int,
        max_blocks_per_seq: int,
        block_size: int,
        padding_block: int,
        device: torch.device,
    ) -> None:
        super().__init__(max_num_tokens, max_num_seqs, max_blocks_per_seq, block_size, padding_block, device)
        self.table_width = 1  # block-table columns of the last step loaded on rank 0
        self._uploaded = torch.cuda.Event() if device.type == "cuda" else None

    def wait_for_upload(self) -> None:
        """Until the last upload from the host buffer has run; then the buffer may be rewritten."""
        if self._uploaded is not None:
            self._uploaded.synchronize()

    def _upload(self, num_tokens: int, num_logits: int, num_seqs: int, width: int) -> None:
        super()._upload(num_tokens, num_logits, num_seqs, width)
        if self._uploaded is not None:
            self._uploaded.record()

    def load(self, sequences: Sequence[SequenceInput], pad_to: int | None = None) -> StepShape:
        self.wait_for_upload()
        shape = super().load(sequences, pad_to)
        self.table_width = max((len(s.block_table) for s in sequences), default=1)
        return shape

    @property
    def host(self) -> torch.Tensor:
        """The flat int32 host buffer: the packed sections of the last step, back to back."""
        return self._host

    @staticmethod
    def packed_words(num_tokens: int, num_logit_rows: int, num_seqs: int, table_width: int) -> int:
        """Words of the packed section: token ids, positions, slots (T each), logit rows (R), seq lens
        (S), query offsets (S + 1), block tables (S x W), as InputBatch lays them out."""
        return 3 * num_tokens + num_logit_rows + 2 * num_seqs + 1 + num_seqs * table_width

    def load_received(self, num_tokens: int, num_logit_rows: int, num_seqs: int, table_width: int) -> None:
        """Upload a packed section received into `host` into the device buffers, as rank 0 did."""
        self._upload(num_tokens, num_logit_rows, num_seqs, table_width)
