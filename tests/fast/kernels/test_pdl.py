"""Programmatic dependent launch: each Triton kernel launched with pdl=True, in a chain of dependent
launches, gives the bits it gives without (on the H200; PDL needs compute capability 9.0), and a device
without it is refused with a clear error."""

from __future__ import annotations

import pytest
import torch

from fast.attention import INVARIANT_BLOCK_M, INVARIANT_BLOCK_N
from fast.kernels.add_rmsnorm import add_rmsnorm
from fast.kernels.decode_attention import decode_attention
from fast.kernels.gemv import small_batch_linear
from fast.kernels.matmul import invariant_linear, matmul_counters
from fast.kernels.pdl import check_pdl_device
from fast.kernels.prefill_attention import prefill_attention
from fast.kernels.qk_norm_rope import qk_norm_rope_store_kv_
from fast.kernels.silu_and_mul import silu_and_mul
from spec.errors import ConfigError
from tests.fast.kernels.reference import build_cos_sin_cache, build_paged_cache
from tests.fast.kernels.strategies import seeded_generator


def test_a_cpu_device_is_refused() -> None:
    with pytest.raises(ConfigError, match="programmatic dependent launch needs a CUDA device"):
        check_pdl_device(torch.device("cpu"))


HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTER, BLOCK = 1024, 16, 8, 128, 3072, 16


def _inputs(rows: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """A decoder layer's inputs at one decode step of `rows` sequences (fixed seed: equal on every call)."""
    generator = torch.Generator(device="cuda").manual_seed(7)

    def randn(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(shape, generator=generator, device="cuda") * scale).to(dtype)

    seq_lens = torch.tensor([BLOCK * 3 + 5 + r for r in range(rows)], dtype=torch.int32, device="cuda")
    return {
        "x": randn(rows, HIDDEN),
        "residual": randn(rows, HIDDEN),
        "norm": randn(HIDDEN),
        "qkv": randn((HEADS + 2 * KV_HEADS) * HEAD_DIM, HIDDEN, scale=0.03),
        "o": randn(HIDDEN, HEADS * HEAD_DIM, scale=0.03),
        "gate_up": randn(2 * INTER, HIDDEN, scale=0.03),
        "down": randn(HIDDEN, INTER, scale=0.03),
        "k_cache": randn(8, BLOCK, KV_HEADS, HEAD_DIM),
        "v_cache": randn(8, BLOCK, KV_HEADS, HEAD_DIM),
        "seq_lens": seq_lens,
        "tables": torch.arange(8, dtype=torch.int32, device="cuda").repeat(rows, 1),
        "slots": (seq_lens - 1).to(torch.int64),
        "cos_sin": build_cos_sin_cache(4096, HEAD_DIM),
    }


def _layer_chain(inputs: dict[str, torch.Tensor], pdl: bool) -> list[torch.Tensor]:
    """The layer's kernels in the engine's order, each consuming the one before; the results."""
    t = inputs
    rows = t["x"].shape[0]
    normed, residual = add_rmsnorm(t["x"], t["residual"], t["norm"], 1e-6, pdl=pdl)
    qkv = small_batch_linear(normed, t["qkv"], pdl=pdl).view(rows, HEADS + 2 * KV_HEADS, HEAD_DIM)
    q, k, v = qkv[:, :HEADS], qkv[:, HEADS : HEADS + KV_HEADS], qkv[:, HEADS + KV_HEADS :]
    q_norm, k_norm = t["norm"][:HEAD_DIM], t["norm"][HEAD_DIM : 2 * HEAD_DIM]
    qk_norm_rope_store_kv_(
        q, k, v, q_norm, k_norm, t["cos_sin"], t["slots"], 1e-6, t["k_cache"], t["v_cache"], t["slots"], pdl=pdl
    )
    attn = decode_attention(
        q, t["k_cache"], t["v_cache"], t["tables"], t["seq_lens"], HEAD_DIM**-0.5, 8 * BLOCK, split_size=64, pdl=pdl
    )
    out = small_batch_linear(attn.view(rows, HEADS * HEAD_DIM), t["o"], pdl=pdl)
    normed, residual = add_rmsnorm(out, residual, t["norm"], 1e-6, pdl=pdl)
    activated = silu_and_mul(small_batch_linear(normed, t["gate_up"], pdl=pdl), pdl=pdl)
    down = small_batch_linear(activated, t["down"], pdl=pdl)
    return [qkv, t["k_cache"], t["v_cache"], attn, residual, down]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("rows", [1, 8])
def test_a_layer_chain_gives_the_same_bits_with_pdl(dtype: torch.dtype, rows: int) -> None:
    check_pdl_device(torch.device("cuda"))
    without = _layer_chain(_inputs(rows, dtype), pdl=False)
    with_pdl = _layer_chain(_inputs(rows, dtype), pdl=True)
    for expected, got in zip(without, with_pdl, strict=True):
        assert torch.equal(expected, got)
    # The same chain captured in a CUDA graph and replayed, as the engine's decode steps run.
    _layer_chain(_inputs(rows, dtype), pdl=True)  # compiled and warm before the capture
    captured_inputs = _inputs(rows, dtype)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = _layer_chain(captured_inputs, pdl=True)
    graph.replay()
    torch.cuda.synchronize()
    for expected, got in zip(without, captured, strict=True):
        assert torch.equal(expected, got)


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("rows", "width", "depth"),
    [
        (1, 6144, 1024),  # FMA tiles, one step
        (1, 12288, 4096),  # tensor-core tiles, many steps (a rank's share of the 8B gate_up)
        (1, 4096, 12288),  # the 8B down: the deepest weight
        (3, 1000, 1000),  # K not a multiple of the tile
        (8, 4096, 4096),
        (16, 2048, 3000),
    ],
)
def test_gemv_gives_the_same_bits_with_pdl_at_the_engine_shapes(rows: int, width: int, depth: int) -> None:
    """The GEMV alone, FMA and tensor-core tiles, one step and many, with and without a bias."""
    generator = torch.Generator(device="cuda").manual_seed(rows * width + depth)
    x = torch.randn((rows, depth), generator=generator, device="cuda").to(torch.bfloat16)
    weight = (torch.randn((width, depth), generator=generator, device="cuda") * 0.03).to(torch.bfloat16)
    bias = torch.randn(width, generator=generator, device="cuda").to(torch.bfloat16)
    for with_bias in (None, bias):
        expected = small_batch_linear(x, weight, with_bias)
        assert torch.equal(small_batch_linear(x, weight, with_bias, pdl=True), expected)


@pytest.mark.gpu
@pytest.mark.parametrize(("width", "depth"), [(4096, 1024), (1024, 3072), (151936, 1024)])
def test_invariant_matmul_gives_the_same_bits_with_pdl(width: int, depth: int) -> None:
    """Batch-invariant mode's matmul with programmatic dependent launch: the split path (its last programs summing
    with counters, and the sum kernel without), the fused path, 1, 5 and 300 rows: the same bits as without."""
    generator = torch.Generator(device="cuda").manual_seed(width + depth)
    weight = (torch.randn((width, depth), generator=generator, device="cuda") * 0.03).to(torch.bfloat16)
    counters = matmul_counters(torch.device("cuda"))
    for rows in (1, 5, 300):
        x = torch.randn((rows, depth), generator=generator, device="cuda").to(torch.bfloat16)
        expected = invariant_linear(x, weight, split=False)
        for split, with_counters in ((True, True), (True, False), (False, False), (None, True)):
            kwargs = {"split": split, "counters": counters if with_counters else None}
            assert torch.equal(invariant_linear(x, weight, pdl=True, **kwargs), expected), (rows, kwargs)
    assert not counters.any()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("packed", [False, True], ids=["default-tiles", "invariant-mode-tiles"])
def test_prefill_attention_gives_the_same_bits_with_pdl(dtype: torch.dtype, packed: bool) -> None:
    """Prefill attention with programmatic dependent launch: a mixed batch (a whole prompt, a chunk after a cached
    prefix, a decode row) and batch-invariant mode's packed decode step, eager and replayed from a CUDA graph after
    the kernel before it (qk_norm_rope_store_kv_'s place in a layer is taken by a PDL add_rmsnorm here): the same
    bits as without."""
    check_pdl_device(torch.device("cuda"))
    tiles = {"pack_gqa": True, "block_m": INVARIANT_BLOCK_M, "block_n": INVARIANT_BLOCK_N, "always_mask": True}
    tiles = tiles if packed else {}
    generator = seeded_generator(11)
    seq_lens, q_lens = ([300, 170, 41], [300, 64, 1]) if not packed else ([300, 170, 41], [1, 1, 1])
    cache = build_paged_cache(seq_lens, 16, KV_HEADS, HEAD_DIM, dtype, generator)
    q = torch.randn((sum(q_lens), HEADS, HEAD_DIM), generator=generator).to(dtype).to("cuda")
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    residual, norm = torch.zeros_like(q.view(q.shape[0], -1)), torch.ones(HEADS * HEAD_DIM, dtype=dtype, device="cuda")

    def chain(pdl: bool) -> torch.Tensor:
        normed, _ = add_rmsnorm(q.view(q.shape[0], -1), residual, norm, 1e-6, pdl=pdl)
        args = (cache.seq_lens, cache.block_tables, cache.k_cache, cache.v_cache, HEAD_DIM**-0.5, max(q_lens))
        return prefill_attention(normed.view_as(q), cu, *args, pdl=pdl, **tiles)

    expected = chain(pdl=False)
    assert torch.equal(chain(pdl=True), expected)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = chain(pdl=True)
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, expected)
