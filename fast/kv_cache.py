"""Paged KV cache of the fast engine: per-layer K and V pools with one extra padding block.

    keys, values   [num_layers, num_blocks + 1, block_size, num_kv_heads, head_dim]

Blocks 0 .. num_blocks - 1 are the allocator's, exactly as in the reference engine, so both
engines make the same scheduling decisions. Block `num_blocks` (the last) lies outside the
allocator: the rows that pad a CUDA-graph batch point their block tables at it (with seq_len 1
and slot -1, so they read one harmless key and write nothing).
"""

from __future__ import annotations

import torch


class KVCache:
    def __init__(
        self,
        num_layers: int,
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        shape = (num_layers, num_blocks + 1, block_size, num_kv_heads, head_dim)
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.padding_block = num_blocks
        self.keys = torch.zeros(shape, dtype=dtype, device=device)
        self.values = torch.zeros(shape, dtype=dtype, device=device)

    def layer(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V pools of one layer: [num_blocks + 1, block_size, num_kv_heads, head_dim] each."""
        return self.keys[index], self.values[index]

    @staticmethod
    def bytes_per_block(num_layers: int, block_size: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        """K and V of one block across all layers."""
        element_size = torch.empty((), dtype=dtype).element_size()
        return 2 * num_layers * block_size * num_kv_heads * head_dim * element_size
