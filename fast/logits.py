"""A step's logits as the model hands them to the sampler: the fp32 rows, and each row's max and argmax where the
LM head computed them in the same launch (fast.kernels.lm_head_argmax).

    step = runner.launch(prepared)            # StepLogits: logits fp32 [R, V], head_max RowMax | None
    tokens = sampler.sample(step.logits, step.head_max)

head_max, when present, is torch.max(logits, dim=-1) of exactly these logits (the kernel reduces the values it
stored), so the sampler may take it instead of its own pass over [R, V]. Whoever changes logits rows after the
head (a test planting a NaN) must drop it.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class RowMax(NamedTuple):
    """Each row's largest logit, fp32 [R] (NaN where the row holds a NaN), and the index of its first occurrence,
    int64 [R] (the first NaN's where there is one): torch.max(logits, dim=-1), spec.sampling's row_max and
    greedy_tokens."""

    values: torch.Tensor
    indices: torch.Tensor

    def rows(self, index: slice | torch.Tensor) -> RowMax:
        """The rows picked by `index` (a slice, or an int64 tensor of row indices), as the logits' rows are."""
        return RowMax(self.values[index], self.indices[index])


class StepLogits(NamedTuple):
    """fp32 logits [R, V] of a step's logit rows, and head_max: their RowMax when the LM head computed it, else
    None (the sampler then reduces the logits itself)."""

    logits: torch.Tensor
    head_max: RowMax | None = None

    def rows(self, index: slice | torch.Tensor) -> StepLogits:
        """The rows picked by `index` (a slice, or an int64 tensor of row indices), head_max's with them."""
        head_max = self.head_max.rows(index) if self.head_max is not None else None
        return StepLogits(self.logits[index], head_max)
