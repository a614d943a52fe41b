"""Qwen3 / Llama / Qwen2 decoder written from scratch in plain PyTorch: the executable specification.

Parameter names follow the Hugging Face checkpoint layout, so loading is a strict name match.
Attention reads and writes K/V through the paged cache and computes in fp32.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from reference.kv_cache import PagedKVCache
from spec.model_config import ModelConfig
from spec.rope import rope_cos_sin, rope_parameters


@dataclass(frozen=True)
class SequenceSlice:
    """One request's part of a flattened batch: queries [query_start, query_start + query_len)
    attend to the request's first `context_len` cached tokens (the new ones included)."""

    query_start: int
    query_len: int
    context_len: int
    block_table: torch.Tensor  # int64 [num_blocks_of_request]


@dataclass(frozen=True)
class ForwardBatch:
    """Everything one forward pass needs besides the token ids; built per step, then dropped."""

    positions: torch.Tensor  # int64 [num_tokens]
    slots: torch.Tensor  # int64 [num_tokens], where each token's K/V is written
    sequences: tuple[SequenceSlice, ...]
    logit_indices: torch.Tensor  # int64 [num_sampled], rows whose logits are wanted


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.to(torch.float32)
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * normed.to(x.dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, layer_index: int) -> None:
        super().__init__()
        self.layer_index = layer_index
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.scale = config.head_dim**-0.5
        traits = config.traits
        self.q_proj = nn.Linear(config.hidden_size, self.num_heads * self.head_dim, bias=traits.qkv_bias)
        self.k_proj = nn.Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=traits.qkv_bias)
        self.v_proj = nn.Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=traits.qkv_bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, config.hidden_size, bias=traits.o_proj_bias)
        self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps) if traits.use_qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps) if traits.use_qk_norm else None

    def forward(
        self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, batch: ForwardBatch, cache: PagedKVCache
    ) -> torch.Tensor:
        num_tokens = hidden.shape[0]
        q = self.q_proj(hidden).view(num_tokens, self.num_heads, self.head_dim)
        k = self.k_proj(hidden).view(num_tokens, self.num_kv_heads, self.head_dim)
        v = self.v_proj(hidden).view(num_tokens, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        cos, sin = cos[:, None, :].to(q.dtype), sin[:, None, :].to(q.dtype)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        cache.write(self.layer_index, batch.slots, k, v)
        out = torch.empty_like(q)
        for seq in batch.sequences:
            queries = q[seq.query_start : seq.query_start + seq.query_len]
            keys, values = cache.gather(self.layer_index, seq.block_table, seq.context_len)
            out[seq.query_start : seq.query_start + seq.query_len] = self._attend(queries, keys, values)
        return self.o_proj(out.view(num_tokens, self.num_heads * self.head_dim))

    def _attend(self, queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        """Causal attention in fp32. queries [q_len, H, D] are the last q_len of keys [ctx, Hkv, D]."""
        query_len, context_len = queries.shape[0], keys.shape[0]
        group = self.num_heads // self.num_kv_heads
        q32 = queries.to(torch.float32).transpose(0, 1)  # [H, q_len, D]
        k32 = keys.to(torch.float32).repeat_interleave(group, dim=1).transpose(0, 1)  # [H, ctx, D]
        v32 = values.to(torch.float32).repeat_interleave(group, dim=1).transpose(0, 1)
        scores = torch.matmul(q32, k32.transpose(1, 2)) * self.scale  # [H, q_len, ctx]
        query_positions = torch.arange(context_len - query_len, context_len, device=queries.device)
        key_positions = torch.arange(context_len, device=queries.device)
        future = key_positions[None, :] > query_positions[:, None]  # [q_len, ctx]
        scores = scores.masked_fill(future, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        return torch.matmul(probs, v32).transpose(0, 1).to(queries.dtype)  # [q_len, H, D]


class MLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        bias = config.traits.mlp_bias
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=bias)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=bias)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer_index: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config, layer_index)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)

    def forward(
        self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, batch: ForwardBatch, cache: PagedKVCache
    ) -> torch.Tensor:
        hidden = hidden + self.self_attn(self.input_layernorm(hidden), cos, sin, batch, cache)
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class DecoderModel(nn.Module):
    """The transformer body (`model.*` in checkpoints)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, index) for index in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class CausalLM(nn.Module):
    """Decoder plus LM head. `forward` returns fp32 logits for the rows in batch.logit_indices."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.model = DecoderModel(config)
        self.lm_head = (
            None if config.tie_word_embeddings else nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        )
        inv_freq, attention_scaling = rope_parameters(config)
        # RoPE frequencies stay fp32 whatever dtype the model is cast to: `.to(dtype)` casts only
        # floating-point buffers, so they are kept as their int32 bit pattern (which still follows
        # the model across devices) and read back through the `inv_freq` property.
        self.register_buffer("inv_freq_bits", inv_freq.view(torch.int32), persistent=False)
        self.attention_scaling = attention_scaling

    @property
    def inv_freq(self) -> torch.Tensor:
        """RoPE inverse frequencies, fp32 [head_dim // 2]."""
        return self.inv_freq_bits.view(torch.float32)

    def load_weights(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Copy a checked state dict (spec.checkpoint.load_state_dict) into the parameters, strictly."""
        parameters = dict(self.named_parameters())
        missing = sorted(set(parameters) - set(state_dict))
        extra = sorted(set(state_dict) - set(parameters))
        if missing or extra:
            raise KeyError(f"state dict does not match the model: missing {missing[:5]}, unexpected {extra[:5]}")
        with torch.no_grad():
            for name, parameter in parameters.items():
                parameter.copy_(state_dict[name])

    def forward(self, token_ids: torch.Tensor, batch: ForwardBatch, cache: PagedKVCache) -> torch.Tensor:
        hidden = self.model.embed_tokens(token_ids)
        cos, sin = rope_cos_sin(self.inv_freq, self.attention_scaling, batch.positions)
        for layer in self.model.layers:
            hidden = layer(hidden, cos, sin, batch, cache)
        hidden = self.model.norm(hidden[batch.logit_indices])
        head = self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return nn.functional.linear(hidden, head).to(torch.float32)
