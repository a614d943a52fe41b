"""The checkpoint's tensors packed for the fast model: fused qkv and gate_up projections, and under
tensor parallelism the slice of each that one rank holds.

Input is either the checked state dict of `spec.checkpoint.load_state_dict` (Hugging Face names,
shapes verified there) or a `TensorReader` that returns a slice of a named tensor (the sharded
safetensors loader, fast.sharded_loading). Fusing turns three (q, k, v) and two (gate, up) matmuls
per layer into one each; rows are stacked in the order [q; k; v] and [gate; up], so a fused output
splits into contiguous column ranges.

Tensor parallelism over N ranks (`ShardLayout`), Megatron style:

    column-parallel  qkv, gate_up      rank r holds its heads' rows of q, k, v (and biases), and its
                                       intermediate_size / N rows of gate and of up
    row-parallel     o_proj, down      rank r holds the matching input columns; the partial products
                                       are summed by one all-reduce; the bias (whole) is added once,
                                       after it
    vocab-parallel   embed, lm_head    rank r holds vocabulary rows [r * S, (r + 1) * S), S = ceil(V / N),
                                       the last shard padded with zero rows
    replicated       norms, q/k norm

KV heads: with num_kv_heads >= N each rank holds num_kv_heads / N of them; with fewer KV heads than
ranks, each rank holds the one KV head its query heads read (replicated across N / num_kv_heads
ranks). Worked example, 32 query heads, 8 KV heads, N = 2: rank 1 computes query heads 16..31 and
stores KV heads 4..7. With 4 query heads, 1 KV head, N = 2: ranks 0 and 1 compute query heads 0..1
and 2..3 and both store KV head 0.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

import torch

from spec.errors import CheckpointError, ConfigError
from spec.model_config import ModelConfig


@dataclass(frozen=True)
class LayerWeights:
    input_norm: torch.Tensor  # [hidden]
    qkv: torch.Tensor  # [(num_heads + 2 * num_kv_heads) * head_dim, hidden] (this rank's heads)
    qkv_bias: torch.Tensor | None  # [(num_heads + 2 * num_kv_heads) * head_dim] (Qwen2, biased Qwen3/Llama)
    q_norm: torch.Tensor | None  # [head_dim] (Qwen3)
    k_norm: torch.Tensor | None
    o_proj: torch.Tensor  # [hidden, num_heads * head_dim]
    o_proj_bias: torch.Tensor | None  # [hidden] (whole on every rank)
    post_attention_norm: torch.Tensor  # [hidden]
    gate_up: torch.Tensor  # [2 * intermediate, hidden] (this rank's intermediate rows)
    gate_up_bias: torch.Tensor | None  # [2 * intermediate] (Llama with mlp_bias)
    down: torch.Tensor  # [hidden, intermediate]
    down_bias: torch.Tensor | None  # [hidden] (whole on every rank)


@dataclass(frozen=True)
class ModelWeights:
    embed_tokens: torch.Tensor  # [vocab, hidden] (this rank's vocabulary shard, padded)
    layers: tuple[LayerWeights, ...]
    final_norm: torch.Tensor  # [hidden]
    lm_head: torch.Tensor  # [vocab, hidden]; the embedding itself when tied


@dataclass(frozen=True)
class ShardLayout:
    """What one rank of `world_size` holds: ranges of query heads, KV heads, intermediate rows and
    vocabulary rows. A single process holds everything (`ShardLayout.single`)."""

    rank: int
    world_size: int
    head_start: int
    num_heads: int
    kv_head_start: int
    num_kv_heads: int
    intermediate_start: int
    intermediate_size: int
    vocab_start: int
    vocab_rows: int  # real vocabulary rows held (the last rank may hold fewer than vocab_shard_size)
    vocab_shard_size: int  # rows of this rank's embedding and LM head, zero padding included

    @classmethod
    def single(cls, config: ModelConfig) -> ShardLayout:
        return cls.for_rank(config, 0, 1)

    @classmethod
    def for_rank(cls, config: ModelConfig, rank: int, world_size: int) -> ShardLayout:
        check_tensor_parallel_size(config, world_size)
        if not 0 <= rank < world_size:
            raise ConfigError(f"rank {rank} is outside a tensor-parallel group of {world_size}")
        heads = config.num_attention_heads // world_size
        kv_heads = max(1, config.num_key_value_heads // world_size)
        head_start = rank * heads
        # The KV head of this rank's first query head; its other query heads share it or the next ones.
        kv_head_start = head_start // (config.num_attention_heads // config.num_key_value_heads)
        intermediate = config.intermediate_size // world_size
        shard = -(-config.vocab_size // world_size)
        vocab_start = rank * shard
        return cls(
            rank=rank,
            world_size=world_size,
            head_start=head_start,
            num_heads=heads,
            kv_head_start=kv_head_start,
            num_kv_heads=kv_heads,
            intermediate_start=rank * intermediate,
            intermediate_size=intermediate,
            vocab_start=vocab_start,
            vocab_rows=max(0, min(shard, config.vocab_size - vocab_start)),
            vocab_shard_size=shard,
        )

    @property
    def is_sharded(self) -> bool:
        return self.world_size > 1


def check_tensor_parallel_size(config: ModelConfig, world_size: int) -> None:
    """ConfigError unless the model splits evenly over `world_size` ranks."""
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ConfigError(f"tensor_parallel_size must be a positive integer, got {world_size!r}")
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    if heads % world_size:
        raise ConfigError(
            f"tensor_parallel_size {world_size} does not divide the model's {heads} attention heads; "
            f"use a divisor of {heads}"
        )
    if config.intermediate_size % world_size:
        raise ConfigError(
            f"tensor_parallel_size {world_size} does not divide the model's intermediate_size "
            f"{config.intermediate_size}"
        )
    if kv_heads % world_size and world_size % kv_heads:
        raise ConfigError(
            f"tensor_parallel_size {world_size} cannot share the model's {kv_heads} KV heads: it must divide them "
            f"or be a multiple of them"
        )


class TensorReader(Protocol):
    """Returns tensor `name`, or its rows (dim 0) or columns (dim 1) [start, stop) when span is given."""

    def __call__(self, name: str, dim: int, span: tuple[int, int] | None) -> torch.Tensor: ...


def state_dict_reader(state_dict: Mapping[str, torch.Tensor]) -> TensorReader:
    def read(name: str, dim: int, span: tuple[int, int] | None) -> torch.Tensor:
        tensor = state_dict.get(name)
        if tensor is None:
            raise CheckpointError(f"state dict is missing tensor {name!r}")
        if span is None:
            return tensor
        return tensor.narrow(dim, span[0], span[1] - span[0])

    return read


def pack_weights(
    config: ModelConfig,
    source: Mapping[str, torch.Tensor] | TensorReader,
    dtype: torch.dtype,
    device: torch.device,
    layout: ShardLayout | None = None,
) -> ModelWeights:
    """Fuse, slice (for `layout`'s rank) and move the tensors; CheckpointError names a missing tensor."""
    read = state_dict_reader(source) if isinstance(source, Mapping) else source
    layout = layout if layout is not None else ShardLayout.single(config)
    sharded = layout.is_sharded
    head_dim = config.head_dim
    q_rows = (layout.head_start * head_dim, (layout.head_start + layout.num_heads) * head_dim)
    kv_rows = (layout.kv_head_start * head_dim, (layout.kv_head_start + layout.num_kv_heads) * head_dim)
    ffn_rows = (layout.intermediate_start, layout.intermediate_start + layout.intermediate_size)
    vocab_rows = (layout.vocab_start, layout.vocab_start + layout.vocab_rows)

    def take(name: str, dim: int = 0, span: tuple[int, int] | None = None) -> torch.Tensor:
        # A single process reads every tensor whole, exactly as before tensor parallelism existed.
        return read(name, dim, span if sharded else None).to(device=device, dtype=dtype)

    def take_optional(name: str, present: bool, span: tuple[int, int] | None = None) -> torch.Tensor | None:
        return take(name, 0, span) if present else None

    def fuse(parts: list[tuple[str, tuple[int, int]]]) -> torch.Tensor:
        return torch.cat([take(name, 0, span) for name, span in parts], dim=0).contiguous()

    def vocabulary(name: str) -> torch.Tensor:
        rows = take(name, 0, vocab_rows)
        missing = layout.vocab_shard_size - rows.shape[0]
        if sharded and missing:  # the last shard of a vocabulary that N does not divide
            rows = torch.cat([rows, rows.new_zeros((missing, rows.shape[1]))], dim=0)
        return rows.contiguous() if sharded else rows

    traits = config.traits
    layers = []
    for index in range(config.num_hidden_layers):
        prefix = f"model.layers.{index}"
        attn, mlp = f"{prefix}.self_attn", f"{prefix}.mlp"
        qkv_parts = [(f"{attn}.q_proj", q_rows), (f"{attn}.k_proj", kv_rows), (f"{attn}.v_proj", kv_rows)]
        gate_up_parts = [(f"{mlp}.gate_proj", ffn_rows), (f"{mlp}.up_proj", ffn_rows)]
        layers.append(
            LayerWeights(
                input_norm=take(f"{prefix}.input_layernorm.weight"),
                qkv=fuse([(f"{name}.weight", span) for name, span in qkv_parts]),
                qkv_bias=fuse([(f"{name}.bias", span) for name, span in qkv_parts]) if traits.qkv_bias else None,
                q_norm=take_optional(f"{attn}.q_norm.weight", traits.use_qk_norm),
                k_norm=take_optional(f"{attn}.k_norm.weight", traits.use_qk_norm),
                o_proj=_dense(take(f"{attn}.o_proj.weight", 1, q_rows), sharded),
                o_proj_bias=take_optional(f"{attn}.o_proj.bias", traits.o_proj_bias),
                post_attention_norm=take(f"{prefix}.post_attention_layernorm.weight"),
                gate_up=fuse([(f"{name}.weight", span) for name, span in gate_up_parts]),
                gate_up_bias=fuse([(f"{name}.bias", span) for name, span in gate_up_parts])
                if traits.mlp_bias
                else None,
                down=_dense(take(f"{mlp}.down_proj.weight", 1, ffn_rows), sharded),
                down_bias=take_optional(f"{mlp}.down_proj.bias", traits.mlp_bias),
            )
        )
    embed = vocabulary("model.embed_tokens.weight")
    lm_head = embed if config.tie_word_embeddings else vocabulary("lm_head.weight")
    return ModelWeights(embed_tokens=embed, layers=tuple(layers), final_norm=take("model.norm.weight"), lm_head=lm_head)


def _dense(tensor: torch.Tensor, sharded: bool) -> torch.Tensor:
    """A column slice of a row-major matrix is strided; the matmuls want the weight contiguous."""
    return tensor.contiguous() if sharded else tensor
