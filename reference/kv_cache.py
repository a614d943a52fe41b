"""Paged KV cache: one block pool per layer, addressed through per-request block tables."""

from __future__ import annotations

import torch


class PagedKVCache:
    """K and V pools of shape [num_layers, num_blocks, block_size, num_kv_heads, head_dim].

    A token's slot is block_id * block_size + offset; a request's block table lists the block
    ids holding its tokens in order.
    """

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
        shape = (num_layers, num_blocks, block_size, num_kv_heads, head_dim)
        self.block_size = block_size
        self.keys = torch.zeros(shape, dtype=dtype, device=device)
        self.values = torch.zeros(shape, dtype=dtype, device=device)

    def write(self, layer: int, slots: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Store keys/values [num_tokens, num_kv_heads, head_dim] at slots [num_tokens]."""
        flat_keys = self.keys[layer].view(-1, *self.keys.shape[3:])
        flat_values = self.values[layer].view(-1, *self.values.shape[3:])
        flat_keys[slots] = keys.to(flat_keys.dtype)
        flat_values[slots] = values.to(flat_values.dtype)

    def gather(self, layer: int, block_table: torch.Tensor, num_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The first `num_tokens` keys and values of a request: each [num_tokens, num_kv_heads, head_dim]."""
        keys = self.keys[layer][block_table].flatten(0, 1)[:num_tokens]
        values = self.values[layer][block_table].flatten(0, 1)[:num_tokens]
        return keys, values
