"""Where a rank's weights come from: a safetensors checkpoint read slice by slice, or a state dict in memory.

Under tensor parallelism each rank packs only its own shard (fast.weights.ShardLayout). From a
checkpoint it reads only those slices, through `safe_open(...).get_slice(name)[rows]` (or
`[:, columns]`): the other ranks' rows are never read, so no rank ever holds the whole model.
Before reading, every tensor the files hold is checked against the model's configuration as
`spec.checkpoint.load_state_dict` checks it (names from `expected_weight_shapes`, shapes, a float
dtype; unknown tensors refused), using only the files' headers.

Both sources are picklable, so the engine hands them to the worker processes it starts
(fast.tp_launch): a checkpoint as its path, a state dict through torch.multiprocessing's tensor
sharing (shared memory on the CPU, CUDA IPC on a GPU), never as the tensors' bytes.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from fast.weights import ModelWeights, ShardLayout, TensorReader, pack_weights
from spec.checkpoint import check_tensor, check_tensor_names, expected_weight_shapes, is_ignored_tensor, weight_files
from spec.errors import CheckpointError
from spec.model_config import ModelConfig

logger = logging.getLogger(__name__)

# safetensors dtype names of floating-point tensors (what `Tensor.is_floating_point` accepts).
FLOAT_DTYPE_NAMES = frozenset({"F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2"})


@dataclass(frozen=True)
class CheckpointWeights:
    """A safetensors checkpoint directory; each rank reads only its slices."""

    checkpoint: Path

    def pack(self, config: ModelConfig, dtype: torch.dtype, device: torch.device, layout: ShardLayout) -> ModelWeights:
        with open_checkpoint_slices(self.checkpoint, config) as read:
            weights = pack_weights(config, read, dtype, device, layout)
        logger.info("rank %d of %d read its shard of %s", layout.rank, layout.world_size, self.checkpoint)
        return weights

    def release(self) -> None:
        """Nothing is held between packs."""


class StateDictWeights:
    """Tensors already in memory (the checked state dict of spec.checkpoint.load_state_dict)."""

    def __init__(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        self.state_dict: Mapping[str, torch.Tensor] = state_dict

    def pack(self, config: ModelConfig, dtype: torch.dtype, device: torch.device, layout: ShardLayout) -> ModelWeights:
        return pack_weights(config, self.state_dict, dtype, device, layout)

    def release(self) -> None:
        """Drop this holder's reference (never the caller's tensors), so a worker that received the
        tensors from another process stops mapping that process's memory once it has its shard."""
        self.state_dict = {}


WeightSource = CheckpointWeights | StateDictWeights


@contextmanager
def open_checkpoint_slices(checkpoint: Path, config: ModelConfig) -> Iterator[TensorReader]:
    """A TensorReader over the checkpoint's files, open for the duration of the block, after
    checking every tensor's name, shape and dtype against `config` (headers only)."""
    from safetensors import SafetensorError, safe_open

    expected = expected_weight_shapes(config)
    with ExitStack() as stack:
        located: dict[str, Any] = {}  # name -> the open file that holds it
        unexpected: list[str] = []
        for file in weight_files(checkpoint):
            try:
                handle = stack.enter_context(safe_open(str(file), framework="pt", device="cpu"))
                for name in handle.keys():
                    if is_ignored_tensor(name, config):
                        continue
                    if name not in expected:
                        unexpected.append(name)
                        continue
                    piece = handle.get_slice(name)
                    dtype_name = piece.get_dtype()
                    stored = tuple(piece.get_shape())
                    check_tensor(name, stored, dtype_name in FLOAT_DTYPE_NAMES, dtype_name, expected, checkpoint)
                    located[name] = handle
            except (SafetensorError, OSError, ValueError, RuntimeError) as error:
                raise CheckpointError(f"cannot read {file} (truncated or corrupt safetensors?): {error}") from error
        check_tensor_names(checkpoint, config, expected, located, unexpected)

        def read(name: str, dim: int, span: tuple[int, int] | None) -> torch.Tensor:
            handle = located[name]
            try:
                if span is None:
                    return handle.get_tensor(name)
                rows = slice(span[0], span[1])
                piece = handle.get_slice(name)
                return piece[rows] if dim == 0 else piece[:, rows]
            except (SafetensorError, OSError, ValueError, RuntimeError) as error:
                raise CheckpointError(f"cannot read tensor {name!r} of {checkpoint}: {error}") from error

        yield read
