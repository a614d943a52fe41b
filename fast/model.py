"""Qwen3 / Llama / Qwen2 decoder on the fast engine's Triton kernels plus torch matmuls.

One forward pass over a flattened batch of T tokens (prefill chunks and decode tokens mixed):

    hidden [T, hidden] = embed(token_ids)
    per layer:  x, residual = add_rmsnorm(hidden, residual)          (residual carried, fused add)
                qkv [T, (H + 2 Hkv) * D] = x @ W_qkv^T (+ bias)       (one fused matmul)
                q [T, H, D], k, v [T, Hkv, D] = views into qkv
                q, k <- (per-head RMSNorm, Qwen3) + RoPE, in place     (qk_norm_rope_)
                store_kv(k, v -> paged cache at slots)
                attn [T, H, D] = paged attention (prefill kernel, or the decode kernel when every
                                 sequence has one query)
                hidden = attn @ W_o^T;  x, residual = add_rmsnorm(hidden, residual)
                hidden = silu_and_mul(x @ W_gate_up^T) @ W_down^T
    logits [R, vocab] fp32 = final_norm(hidden + residual)[logit rows] @ W_lm_head^T

The architectures differ only by `ModelConfig.traits` (q/k norm; which projections carry biases).

Under tensor parallelism (fast.weights.ShardLayout, fast.parallel.Collectives) each rank runs the
same pass over its shard: its heads in qkv and attention, its intermediate rows in gate_up; the
row-parallel o_proj and down products are summed by one all-reduce each, their bias added once
after it; the embedding is a masked lookup of the rank's vocabulary rows summed by an all-reduce
(exactly one rank contributes each token's row, the others zeros); the LM head gives the rank's
vocabulary columns and one gather assembles the logits. With one rank none of this runs.
"""

from __future__ import annotations

import torch
from torch.nn import functional

from fast.attention import StepAttention
from fast.kernels.add_rmsnorm import add_rmsnorm, rmsnorm
from fast.kernels.kv_store import store_kv
from fast.kernels.matmul import invariant_linear
from fast.kernels.qk_norm_rope import qk_norm_rope_
from fast.kernels.silu_and_mul import silu_and_mul
from fast.kv_cache import KVCache
from fast.parallel import Collectives
from fast.weights import LayerWeights, ModelWeights, ShardLayout
from spec.model_config import ModelConfig
from spec.rope import cos_sin_cache


class FastCausalLM:
    def __init__(
        self,
        config: ModelConfig,
        weights: ModelWeights,
        max_positions: int,
        device: torch.device,
        batch_invariant: bool = False,
        layout: ShardLayout | None = None,
        collectives: Collectives | None = None,
    ) -> None:
        layout = layout if layout is not None else ShardLayout.single(config)
        if layout.is_sharded != (collectives is not None):
            raise ValueError("a sharded layout needs collectives, and only a sharded one")
        self.config = config
        # Batch-invariant mode: every projection and the LM head through our fixed-order matmul
        # (a vendor GEMM picks its reduction order from the number of rows).
        self.linear = invariant_linear if batch_invariant else functional.linear
        self.weights = weights
        self.eps = float(config.rms_norm_eps)
        self.num_heads = layout.num_heads  # this rank's
        self.num_kv_heads = layout.num_kv_heads
        self.head_dim = config.head_dim
        self.layout = layout
        self.collectives = collectives
        # o_proj and down: a plain linear for one rank (nothing added to its per-layer cost).
        self._row_parallel = self.linear if collectives is None else self._sharded_row_parallel
        # fp32 [max_positions, head_dim]: cos | sin halves, RoPE scaling and attention factor applied.
        self.cos_sin = cos_sin_cache(config, max_positions).to(device)

    def forward(
        self,
        token_ids: torch.Tensor,
        positions: torch.Tensor,
        slots: torch.Tensor,
        attention: StepAttention,
        cache: KVCache,
        logit_indices: torch.Tensor | None,
    ) -> torch.Tensor:
        """fp32 logits [R, vocab] for the rows in logit_indices (all rows when None).

        token_ids, positions, slots: int64 [T]; slots < 0 are padding rows (nothing stored).
        """
        hidden = self._embed(token_ids)
        residual: torch.Tensor | None = None
        for index, layer in enumerate(self.weights.layers):
            hidden, residual = self._layer(index, layer, hidden, residual, positions, slots, attention, cache)
        if logit_indices is not None:
            hidden, residual = hidden[logit_indices], residual[logit_indices] if residual is not None else None
        normed, _ = add_rmsnorm(hidden, residual, self.weights.final_norm, self.eps)
        logits = self.linear(normed, self.weights.lm_head)
        if self.collectives is not None:
            logits = self.collectives.gather_vocab(logits)
        return logits.to(torch.float32)

    def _embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        if self.collectives is None:
            return functional.embedding(token_ids, self.weights.embed_tokens)
        local = token_ids - self.layout.vocab_start
        outside = (local < 0) | (local >= self.layout.vocab_rows)
        rows = functional.embedding(local.masked_fill(outside, 0), self.weights.embed_tokens)
        return self.collectives.all_reduce(rows.masked_fill_(outside.unsqueeze(1), 0))

    def _sharded_row_parallel(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """x @ weight^T (+ bias), weight's input columns split across ranks: partial sums all-reduced."""
        out = self.collectives.all_reduce(self.linear(x, weight))
        return out if bias is None else out + bias

    def _layer(
        self,
        index: int,
        layer: LayerWeights,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        positions: torch.Tensor,
        slots: torch.Tensor,
        attention: StepAttention,
        cache: KVCache,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:  # first layer: the residual stream starts as the embedding
            residual = hidden
            normed = rmsnorm(hidden, layer.input_norm, self.eps)
        else:
            normed, residual = add_rmsnorm(hidden, residual, layer.input_norm, self.eps)
        attn_out = self._attention(index, layer, normed, positions, slots, attention, cache)
        hidden = self._row_parallel(attn_out, layer.o_proj, layer.o_proj_bias)
        normed, residual = add_rmsnorm(hidden, residual, layer.post_attention_norm, self.eps)
        gate_up = self.linear(normed, layer.gate_up, layer.gate_up_bias)
        return self._row_parallel(silu_and_mul(gate_up), layer.down, layer.down_bias), residual

    def _attention(
        self,
        index: int,
        layer: LayerWeights,
        normed: torch.Tensor,
        positions: torch.Tensor,
        slots: torch.Tensor,
        attention: StepAttention,
        cache: KVCache,
    ) -> torch.Tensor:
        """[T, H * D]: q/k/v projection, norm + RoPE, KV store, paged attention."""
        num_tokens = normed.shape[0]
        q_width, kv_width = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        qkv = self.linear(normed, layer.qkv, layer.qkv_bias)  # [T, q_width + 2 * kv_width]
        q = qkv[:, :q_width].view(num_tokens, self.num_heads, self.head_dim)
        k = qkv[:, q_width : q_width + kv_width].view(num_tokens, self.num_kv_heads, self.head_dim)
        v = qkv[:, q_width + kv_width :].view(num_tokens, self.num_kv_heads, self.head_dim)
        qk_norm_rope_(q, k, layer.q_norm, layer.k_norm, self.cos_sin, positions, self.eps)
        k_cache, v_cache = cache.layer(index)
        store_kv(k, v, k_cache, v_cache, slots)
        out = attention.attend(q, k_cache, v_cache)
        return out.view(num_tokens, q_width)
