"""Qwen3 / Llama / Qwen2 decoder on the fast engine's Triton kernels plus torch matmuls.

One forward pass over a flattened batch of T tokens (prefill chunks and decode tokens mixed):

    hidden [T, hidden] = embed(token_ids)
    per layer:  x, residual = add_rmsnorm(hidden, residual)          (residual carried, fused add)
                qkv [T, (H + 2 Hkv) * D] = x @ W_qkv^T (+ bias)       (one fused matmul)
                q [T, H, D], k, v [T, Hkv, D] = views into qkv
                q, k <- (per-head RMSNorm, Qwen3) + RoPE, in place, and
                k, v -> paged cache at slots                          (one kernel: qk_norm_rope_store_kv_)
                attn [T, H, D] = paged attention (prefill kernel, or the decode kernel when every
                                 sequence has one query)
                hidden = attn @ W_o^T;  x, residual = add_rmsnorm(hidden, residual)
                hidden = silu_and_mul(x @ W_gate_up^T) @ W_down^T
    logits [R, vocab] fp32 = final_norm(hidden + residual)[logit rows] @ W_lm_head^T
    (and, where the head is fast.kernels.lm_head_argmax, each row's max and argmax: fast.logits.StepLogits)

With small_batch_gemv, one rank and a hidden size of at most ADD_NORM_FUSION_MAX_HIDDEN, a step of at most
SMALL_BATCH_ROWS rows runs o_proj and the next add_rmsnorm,
and down and the next layer's input add_rmsnorm, as one launch each (fast.kernels.gemv.linear_add_rmsnorm: the
GEMV's last program adds and normalises): so the down projection of layer i is made where layer i + 1's input norm
is (`_project_add_norm`), the last layer's before the final norm as before.

The architectures differ only by `ModelConfig.traits` (q/k norm; which projections carry biases).

Which kernel multiplies (decided once, at construction; then per call from shapes only):
    - batch_invariant: every projection and the LM head through fast.kernels.matmul.invariant_linear.
    - small_batch_gemv (the runner turns it on for CUDA, never with batch_invariant): the four
      projections (qkv, o_proj, gate_up, down) of a step with T <= SMALL_BATCH_ROWS rows through
      fast.kernels.gemv.small_batch_linear, larger steps through torch's linear (cuBLAS). The LM
      head of a step of <= HEAD_ARGMAX_MAX_ROWS logit rows, with one rank, a contiguous head weight and
      HEAD_WITH_ROW_MAX on, through fast.kernels.lm_head_argmax: the same GEMV tiles writing fp32
      logits, and each row's max and first argmax (torch.max's) reduced in the same launch, which the
      sampler takes instead of its own pass over the logits (StepLogits.head_max). Other heads, and
      every head under tensor parallelism (the vocabulary is split across ranks), through torch's
      linear, the logits then cast to fp32, head_max None.
    - otherwise torch's linear everywhere (the default on the CPU, where Triton only interprets).
The choice reads x.shape[0] and the weight's layout, never a tensor's values, so it needs no host
sync and is fixed inside a captured CUDA graph (each graph has one static batch size).

Under tensor parallelism (fast.weights.ShardLayout, fast.parallel.Collectives) each rank runs the
same pass over its shard: its heads in qkv and attention, its intermediate rows in gate_up; the
row-parallel o_proj and down products are summed by one all-reduce each, their bias added once
after it. Each rank's term travels as a RankTerm to the add + RMSNorm that consumes it, which
fast.parallel.Collectives.all_reduce_add_rmsnorm may run in one kernel with the all-reduce. The
embedding is a masked lookup of the rank's vocabulary rows summed by an all-reduce (exactly one
rank contributes each token's row, the others zeros); the LM head gives the rank's vocabulary
columns and one gather assembles the logits. With one rank none of this runs.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
from torch.nn import functional

from fast.attention import StepAttention
from fast.kernels.add_rmsnorm import add_rmsnorm, rmsnorm
from fast.kernels.gemv import MAX_GEMV_ROWS, gemv_counter, linear_add_rmsnorm, small_batch_linear
from fast.kernels.lm_head_argmax import lm_head_argmax, lm_head_workspace
from fast.kernels.matmul import invariant_linear, matmul_counters
from fast.kernels.qk_norm_rope import qk_norm_rope_store_kv_
from fast.kernels.silu_and_mul import silu_and_mul
from fast.kv_cache import KVCache
from fast.logits import RowMax, StepLogits
from fast.parallel import ATTENTION_REGION, MLP_REGION, Collectives
from fast.weights import LayerWeights, ModelWeights, ShardLayout
from spec.model_config import ModelConfig
from spec.rope import cos_sin_cache

# Steps of at most this many rows run their projections through small_batch_linear (when the model's
# small_batch_gemv is on). From reports/results/kernels/gemv_dev/gemv_bench.json (one H200, bf16,
# back-to-back calls in a CUDA graph, weights from HBM), one layer's qkv + o_proj + gate_up + down
# in us, cuBLAS -> small_batch_linear (default configuration), at M = 1, 2, 4, 8, 16 rows:
#     Qwen3-0.6B  30.2 -> 18.0,  30.6 -> 20.6,  26.1 -> 22.8,  23.8 -> 21.8,  24.0 -> 22.3
#     Qwen3-8B   106.6 -> 105.9, 107.9 -> 103.7, 107.3 -> 108.3, 111.9 -> 104.2, 107.0 -> 105.9
# so the GEMV is faster per layer at every measured row count up to the kernel's limit of 16, except
# 8B at M=4 (1% slower, within one run's spread; the largest single loss is 8B qkv at M=4, 0.93x).
# Rows 9..15 were not measured; they use the same BLOCK_M=16 tiles as M=16 (the weight is read once
# whatever M is). Decode graphs are captured at 1, 2, 4, 8, 16, 24, ..., so a graphed decode step
# meets only measured sizes. The silu_mul_linear fusion is not used: it was slower at every M.
SMALL_BATCH_ROWS = MAX_GEMV_ROWS

# o_proj and down take their add + RMSNorm into the same launch (linear_add_rmsnorm) only up to this hidden size:
# the GEMV's last program then reads, adds and normalises the whole row alone while the GPU waits. On one H200,
# decode-bs1, bf16, no flags: at Qwen3-0.6B (1024) the last-program fusions together took a step from 1.064 to
# 1.032 ms (reports/results/fast_gpu/suite_and_report/run_5b6cd25/); at Qwen3-8B (4096) this one cost 0.30 ms a
# step, 5.075 against 4.774 ms without it (reports/results/bench/landing_ab_session13/), and taking the row in
# 1024-column passes (72 registers a thread instead of 128) made it 1% slower still.
ADD_NORM_FUSION_MAX_HIDDEN = 1024

# With small_batch_gemv and one rank, the LM head of a step of at most HEAD_ARGMAX_MAX_ROWS logit rows runs as
# fast.kernels.lm_head_argmax (fp32 logits and each row's max and argmax in one launch) instead of cuBLAS, a cast
# to fp32 and the sampler's max pass. Off: the head as before. On one H200, bf16, per call in a CUDA graph with the
# weight read from HBM (reports/results/kernels/lm_head_argmax/), the three launches -> lm_head_argmax, in us:
#     Qwen3-0.6B (151936 x 1024)  M=1 88.5 -> 82.5,  2 90.2 -> 85.3,  4 91.6 -> 90.5,  8 96.2 -> 100.1,
#                                 16 103.3 -> 112.0
#     Qwen3-8B   (151936 x 4096)  M=1 299.2 -> 287.4, 2 300.5 -> 286.7, 4 302.2 -> 292.8, 8 307.0 -> 303.9,
#                                 16 315.0 -> 317.0
# so it pays up to 4 rows at both heads (the last program's reduction of M rows of partials grows with M; the GEMV
# alone is at the floor: 72.8 us against 73.2 at 0.6b). In the engine, decode-bs1 A/B alternating in one call
# (reports/results/bench/targets_session16/, with prefill attention's PDL): 0.9718 against 0.9772 ms at qwen3-0.6b,
# 4.467 against 4.476 at qwen3-8b.
HEAD_WITH_ROW_MAX = True
HEAD_ARGMAX_MAX_ROWS = 4


def small_batch_dispatch_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *, pdl: bool = False
) -> torch.Tensor:
    """x @ weight^T (+ bias): small_batch_linear for decode-sized x, torch's linear (cuBLAS) otherwise.

    Decided from x's row count and the weight's layout only (no host sync, nothing read from a
    tensor's values), so the choice is static inside a captured CUDA graph.
    """
    # The GEMV needs a contiguous weight; the packed weights always are (fast.weights), but a
    # strided one from a caller's state dict still gets a correct product from torch.
    if x.shape[0] <= SMALL_BATCH_ROWS and weight.is_contiguous():
        return small_batch_linear(x, weight, bias, pdl=pdl)
    return functional.linear(x, weight, bias)


class RankTerm(NamedTuple):
    """This rank's term of a row-parallel product (o_proj, down) and the bias to add once to the sum."""

    term: torch.Tensor
    bias: torch.Tensor | None


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
        *,
        small_batch_gemv: bool = False,
        pdl: bool = False,
    ) -> None:
        """small_batch_gemv: projections of steps of <= SMALL_BATCH_ROWS rows through the GEMV kernel
        (fast.model_runner turns it on for CUDA; on the CPU Triton only interprets, so it is off
        there unless a test forces it). Not with batch_invariant: the GEMV's reduction order
        depends on the row count. pdl: the Triton kernels launch with programmatic dependent launch
        (fast/kernels/pdl.py), each waiting for the one before it; results are the same bits."""
        layout = layout if layout is not None else ShardLayout.single(config)
        if layout.is_sharded != (collectives is not None):
            raise ValueError("a sharded layout needs collectives, and only a sharded one")
        if batch_invariant and small_batch_gemv:
            raise ValueError("small_batch_gemv is not batch-invariant; it cannot be combined with batch_invariant")
        self.config = config
        self.small_batch_gemv = small_batch_gemv
        self.pdl = pdl
        # Batch-invariant mode: every projection and the LM head through our fixed-order matmul
        # (a vendor GEMM picks its reduction order from the number of rows).
        if batch_invariant:
            # A decode-sized projection takes the split path; its tiles sum their chunks in their last program
            # (one launch, not two) with these counters, which its calls share (one after another on the stream).
            self.linear = functools.partial(invariant_linear, counters=matmul_counters(device), pdl=pdl)
        elif small_batch_gemv:
            self.linear = functools.partial(small_batch_dispatch_linear, pdl=pdl)
        else:
            self.linear = functional.linear
        # The head of a decode-sized step through lm_head_argmax (see HEAD_WITH_ROW_MAX), with its workspace made
        # once here (sized for HEAD_ARGMAX_MAX_ROWS rows; its calls follow one another on the stream, so they share
        # it). None: every head through head_linear. A sharded head gives only this rank's vocabulary columns,
        # whose max is not the row's, so tensor parallelism keeps head_linear.
        head = weights.lm_head
        takes_argmax_head = HEAD_WITH_ROW_MAX and small_batch_gemv and collectives is None and head.is_contiguous()
        self.head_workspace = (
            lm_head_workspace(HEAD_ARGMAX_MAX_ROWS, head.shape[0], head.shape[1], head.dtype, device)
            if takes_argmax_head
            else None
        )
        self.head_linear = functools.partial(invariant_linear, pdl=pdl) if batch_invariant else functional.linear
        self.weights = weights
        self.eps = float(config.rms_norm_eps)
        self.num_heads = layout.num_heads  # this rank's
        self.num_kv_heads = layout.num_kv_heads
        self.head_dim = config.head_dim
        self.layout = layout
        self.collectives = collectives
        # linear_add_rmsnorm's arrival counter: its calls follow one another on the step's stream, so they share it.
        # None: the fusion is off (no GEMV, or a hidden size where it costs).
        fuses_add_norm = small_batch_gemv and config.hidden_size <= ADD_NORM_FUSION_MAX_HIDDEN
        self.gemv_counter = gemv_counter(device) if fuses_add_norm else None
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
    ) -> StepLogits:
        """fp32 logits [R, vocab] for the rows in logit_indices (all rows when None), with their RowMax where the
        head computed it (see the module docstring).

        token_ids, positions, slots: int64 [T]; slots < 0 are padding rows (nothing stored).
        """
        residual = self._embed(token_ids)  # the residual stream starts as the embedding
        # Each layer's MLP activation is projected by its down weight where the product joins the residual
        # stream: in the next layer's input norm, the last one's below. ModelConfig guarantees at least one layer.
        activated: torch.Tensor | None = None
        previous: LayerWeights | None = None
        for index, layer in enumerate(self.weights.layers):
            if activated is None:
                normed = rmsnorm(residual, layer.input_norm, self.eps, pdl=self.pdl)
            else:
                normed, residual = self._project_add_norm(
                    activated, previous.down, previous.down_bias, residual, layer.input_norm, MLP_REGION
                )
            activated, residual = self._layer(index, layer, normed, residual, positions, slots, attention, cache)
            previous = layer
        hidden = self._summed(self._row_parallel(activated, previous.down, previous.down_bias))
        if logit_indices is not None:
            hidden, residual = hidden[logit_indices], residual[logit_indices]
        normed, _ = add_rmsnorm(hidden, residual, self.weights.final_norm, self.eps, pdl=self.pdl)
        return self._head(normed)

    def _head(self, normed: torch.Tensor) -> StepLogits:
        """The LM head over the final normed rows: lm_head_argmax for a decode-sized step where it is on, else
        head_linear (gathered across ranks under tensor parallelism) and a cast to fp32."""
        if self.head_workspace is not None and normed.shape[0] <= HEAD_ARGMAX_MAX_ROWS:
            logits, row_max, row_argmax = lm_head_argmax(
                normed, self.weights.lm_head, workspace=self.head_workspace, pdl=self.pdl
            )
            return StepLogits(logits, RowMax(row_max, row_argmax))
        logits = self.head_linear(normed, self.weights.lm_head)
        if self.collectives is not None:
            logits = self.collectives.gather_vocab(logits)
        return StepLogits(logits.to(torch.float32))

    def _embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        if self.collectives is None:
            return functional.embedding(token_ids, self.weights.embed_tokens)
        local = token_ids - self.layout.vocab_start
        outside = (local < 0) | (local >= self.layout.vocab_rows)
        rows = functional.embedding(local.masked_fill(outside, 0), self.weights.embed_tokens)
        return self.collectives.all_reduce(rows.masked_fill_(outside.unsqueeze(1), 0))

    def _row_parallel(
        self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
    ) -> torch.Tensor | RankTerm:
        """x @ weight^T (+ bias) with one rank; under tensor parallelism (weight's input columns split
        across ranks) this rank's term, summed where it is consumed (_add_norm, _summed)."""
        if self.collectives is None:
            return self.linear(x, weight, bias)
        return RankTerm(self.linear(x, weight), bias)

    def _add_norm(
        self, hidden: torch.Tensor | RankTerm, residual: torch.Tensor, weight: torch.Tensor, region: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(rmsnorm(hidden + residual) * weight, hidden + residual); a rank's term is all-reduced first,
        in one kernel with the norm where fast.parallel's fused path is on."""
        if isinstance(hidden, RankTerm):
            return self.collectives.all_reduce_add_rmsnorm(
                hidden.term, hidden.bias, residual, weight, self.eps, region=region, pdl=self.pdl
            )
        return add_rmsnorm(hidden, residual, weight, self.eps, pdl=self.pdl)

    def _project_add_norm(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        residual: torch.Tensor,
        norm_weight: torch.Tensor,
        region: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """_add_norm(x @ weight^T (+ bias), residual, norm_weight): in one launch where the GEMV takes the product
        (one rank, a decode-sized step), else the row-parallel product and then the add + norm."""
        if (
            self.gemv_counter is not None
            and self.collectives is None
            and x.shape[0] <= SMALL_BATCH_ROWS
            and weight.is_contiguous()
        ):
            return linear_add_rmsnorm(x, weight, bias, residual, norm_weight, self.eps, self.gemv_counter, pdl=self.pdl)
        return self._add_norm(self._row_parallel(x, weight, bias), residual, norm_weight, region)

    def _summed(self, hidden: torch.Tensor | RankTerm) -> torch.Tensor:
        if not isinstance(hidden, RankTerm):
            return hidden
        out = self.collectives.all_reduce(hidden.term)
        return out if hidden.bias is None else out + hidden.bias

    def _layer(
        self,
        index: int,
        layer: LayerWeights,
        normed: torch.Tensor,
        residual: torch.Tensor,
        positions: torch.Tensor,
        slots: torch.Tensor,
        attention: StepAttention,
        cache: KVCache,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """normed: the layer's input, normalised. Returns the MLP's activation (silu(gate) * up, not yet
        projected by the layer's down weight) and the residual stream after the attention block."""
        attn_out = self._attention(index, layer, normed, positions, slots, attention, cache)
        normed, residual = self._project_add_norm(
            attn_out, layer.o_proj, layer.o_proj_bias, residual, layer.post_attention_norm, ATTENTION_REGION
        )
        gate_up = self.linear(normed, layer.gate_up, layer.gate_up_bias)
        return silu_and_mul(gate_up, pdl=self.pdl), residual

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
        k_cache, v_cache = cache.layer(index)
        qk_norm_rope_store_kv_(
            q, k, v, layer.q_norm, layer.k_norm, self.cos_sin, positions, self.eps, k_cache, v_cache, slots,
            pdl=self.pdl,
        )  # fmt: skip
        out = attention.attend(q, k_cache, v_cache)
        return out.view(num_tokens, q_width)
