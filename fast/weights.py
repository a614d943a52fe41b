"""The checkpoint's tensors packed for the fast model: fused qkv and gate_up projections.

Input is the checked state dict of `spec.checkpoint.load_state_dict` (Hugging Face names,
shapes verified there). Fusing turns three (q, k, v) and two (gate, up) matmuls per layer into
one each; rows are stacked in the order [q; k; v] and [gate; up], so a fused output splits
into contiguous column ranges. A tensor-parallel loader slices these same row ranges per rank.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from spec.errors import CheckpointError
from spec.model_config import ModelConfig


@dataclass(frozen=True)
class LayerWeights:
    input_norm: torch.Tensor  # [hidden]
    qkv: torch.Tensor  # [(num_heads + 2 * num_kv_heads) * head_dim, hidden]
    qkv_bias: torch.Tensor | None  # [(num_heads + 2 * num_kv_heads) * head_dim] (Qwen2, biased Qwen3/Llama)
    q_norm: torch.Tensor | None  # [head_dim] (Qwen3)
    k_norm: torch.Tensor | None
    o_proj: torch.Tensor  # [hidden, num_heads * head_dim]
    o_proj_bias: torch.Tensor | None  # [hidden]
    post_attention_norm: torch.Tensor  # [hidden]
    gate_up: torch.Tensor  # [2 * intermediate, hidden]
    gate_up_bias: torch.Tensor | None  # [2 * intermediate] (Llama with mlp_bias)
    down: torch.Tensor  # [hidden, intermediate]
    down_bias: torch.Tensor | None  # [hidden]


@dataclass(frozen=True)
class ModelWeights:
    embed_tokens: torch.Tensor  # [vocab, hidden]
    layers: tuple[LayerWeights, ...]
    final_norm: torch.Tensor  # [hidden]
    lm_head: torch.Tensor  # [vocab, hidden]; the embedding itself when tied


def pack_weights(
    config: ModelConfig, state_dict: dict[str, torch.Tensor], dtype: torch.dtype, device: torch.device
) -> ModelWeights:
    """Fuse and move the state dict's tensors; raises CheckpointError naming a missing tensor."""

    def take(name: str) -> torch.Tensor:
        tensor = state_dict.get(name)
        if tensor is None:
            raise CheckpointError(f"state dict is missing tensor {name!r}")
        return tensor.to(device=device, dtype=dtype)

    def take_optional(name: str, present: bool) -> torch.Tensor | None:
        return take(name) if present else None

    def fuse(names: list[str]) -> torch.Tensor:
        return torch.cat([take(name) for name in names], dim=0).contiguous()

    traits = config.traits
    layers = []
    for index in range(config.num_hidden_layers):
        prefix = f"model.layers.{index}"
        attn, mlp = f"{prefix}.self_attn", f"{prefix}.mlp"
        layers.append(
            LayerWeights(
                input_norm=take(f"{prefix}.input_layernorm.weight"),
                qkv=fuse([f"{attn}.q_proj.weight", f"{attn}.k_proj.weight", f"{attn}.v_proj.weight"]),
                qkv_bias=fuse([f"{attn}.{p}_proj.bias" for p in "qkv"]) if traits.qkv_bias else None,
                q_norm=take_optional(f"{attn}.q_norm.weight", traits.use_qk_norm),
                k_norm=take_optional(f"{attn}.k_norm.weight", traits.use_qk_norm),
                o_proj=take(f"{attn}.o_proj.weight"),
                o_proj_bias=take_optional(f"{attn}.o_proj.bias", traits.o_proj_bias),
                post_attention_norm=take(f"{prefix}.post_attention_layernorm.weight"),
                gate_up=fuse([f"{mlp}.gate_proj.weight", f"{mlp}.up_proj.weight"]),
                gate_up_bias=fuse([f"{mlp}.gate_proj.bias", f"{mlp}.up_proj.bias"]) if traits.mlp_bias else None,
                down=take(f"{mlp}.down_proj.weight"),
                down_bias=take_optional(f"{mlp}.down_proj.bias", traits.mlp_bias),
            )
        )
    embed = take("model.embed_tokens.weight")
    lm_head = embed if config.tie_word_embeddings else take("lm_head.weight")
    return ModelWeights(embed_tokens=embed, layers=tuple(layers), final_norm=take("model.norm.weight"), lm_head=lm_head)
