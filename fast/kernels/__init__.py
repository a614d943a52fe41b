"""Triton kernels of the fast engine, one module per kernel (see NOTES.md for measurements).

    kv_store            store_kv: scatter new K/V rows into the paged cache
    prefill_attention   prefill_attention: paged causal attention, packed variable-length queries
    decode_attention    decode_attention: paged split-KV (flash-decoding) attention, one query per sequence
    add_rmsnorm         add_rmsnorm / rmsnorm: fused residual add + RMSNorm
    qk_norm_rope        qk_norm_rope_: Qwen3 per-head q/k RMSNorm + rotate-half RoPE, in place;
                        qk_norm_rope_store_kv_: the same, then k and v into the paged cache (one kernel)
    silu_and_mul        silu_and_mul: SwiGLU activation of a merged gate_up projection
    matmul              invariant_linear: the batch-invariant matmul (fixed tiles and K chunks, one order)
    gumbel_sample       gumbel_sample: spec.sampling's Gumbel-max step fused over the vocabulary
    gemv                small_batch_linear / silu_mul_linear / linear_add_rmsnorm: 1-16 row linear layers
                        (decode-sized projections on CUDA)
    lm_head_argmax      lm_head_argmax: the LM head's GEMV with fp32 logits and each row's (max, argmax) in its epilogue
    arrival             last_to_arrive: the arrival count by which the last of a group of programs finishes
                        the group's work in the same launch (used by decode_attention, gemv, matmul)
    all_reduce_norm     all_reduce_add_rmsnorm: tensor parallelism's one-shot all-reduce (symmetric memory) fused
                        with the residual add + RMSNorm after it

Modules are imported on demand (nothing here imports Triton), so TRITON_INTERPRET can still be
set before the first kernel module is loaded.
"""
