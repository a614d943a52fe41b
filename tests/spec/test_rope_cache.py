"""spec.rope.cos_sin_cache, the table the fused q/k-norm + RoPE kernel reads, for every RoPE scaling
type: equal to `rope_cos_sin`, to transformers' rotary embedding, and, through the kernel, to the
reference model's rotation. Also: the reference model keeps its RoPE frequencies in fp32."""

from __future__ import annotations

import math

import pytest
import torch

from spec.model_config import ModelConfig
from spec.rope import cos_sin_cache, rope_cos_sin, rope_parameters
from tests.engines import FAST_DEVICE

HEAD_DIM = 32
HALF = HEAD_DIM // 2
MAX_POSITIONS = 4096
BASE = {
    "architectures": ["LlamaForCausalLM"],
    "vocab_size": 100,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": HEAD_DIM,
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": MAX_POSITIONS,
}
LLAMA3 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 512,
}


def _default_wavelength(index: int) -> float:
    """Wavelength index of the unscaled table (base 1e6, HEAD_DIM), as the llama3 rule computes it (fp32)."""
    exponents = torch.arange(0, HEAD_DIM, 2, dtype=torch.int64).to(torch.float32) / HEAD_DIM
    return float((2 * math.pi / (1.0 / (1e6**exponents)))[index])


# llama3 bounds that fall exactly on a wavelength (512 / 471.2: the low bound on wavelength 5, 512 / 198.7: the high
# bound on wavelength 4), where the rule's `<=` and `>=` decide the band (found by mutation testing,
# reports/results/mutation/local_2core_p.json).
LOW_ON_A_WAVELENGTH = LLAMA3["original_max_position_embeddings"] / _default_wavelength(5)
HIGH_ON_A_WAVELENGTH = LLAMA3["original_max_position_embeddings"] / _default_wavelength(4)
ROPE_CASES = {
    "default": {"rope_type": "default"},
    "linear": {"rope_type": "linear", "factor": 4.0},
    "llama3": LLAMA3,
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024},
    "yarn-explicit-factor": {
        "rope_type": "yarn",
        "factor": 8.0,
        "original_max_position_embeddings": 512,
        "attention_factor": 0.8,
        "beta_fast": 16.0,
        "beta_slow": 2.0,
    },
    # Edges of the scaling rules (found by mutation testing, reports/results/mutation/local_2core_n.json):
    # llama3 with a low-frequency factor other than 1 (its wavelength bound divides by it);
    "llama3-low-freq-factor": {**LLAMA3, "low_freq_factor": 2.0, "high_freq_factor": 8.0},
    # YaRN's attention factor at factor 2 (0.1 ln 2 + 1) and at factor 1 (1, no log term);
    "yarn-factor-2": {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 2048},
    "yarn-factor-1": {"rope_type": "yarn", "factor": 1.0, "original_max_position_embeddings": 4096},
    # a base so small that both ends of YaRN's correction range clamp to the last dimension (the ramp's
    # zero-width guard), and one where only the high end clamps.
    "yarn-clamped": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024, "rope_theta": 2.0},
    "yarn-high-clamped": {
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 1024,
        "rope_theta": 10.0,
    },
    # the bounds on a wavelength (above), and YaRN's zero-width guard inside the table: equal betas without
    # truncation make the correction range one point; a factor below 1 keeps the attention factor at 1.
    "llama3-low-bound-on-a-wavelength": {**LLAMA3, "low_freq_factor": LOW_ON_A_WAVELENGTH},
    "llama3-high-bound-on-a-wavelength": {**LLAMA3, "high_freq_factor": HIGH_ON_A_WAVELENGTH},
    "yarn-one-point-range": {
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 1024,
        "beta_fast": 8.0,
        "beta_slow": 8.0,
        "truncate": False,
    },
    "yarn-factor-below-1": {"rope_type": "yarn", "factor": 0.5, "original_max_position_embeddings": 4096},
}


def config_fields(case: str) -> dict[str, object]:
    return {**BASE, "rope_parameters": {"rope_theta": 1e6, **ROPE_CASES[case]}}


def model_config(case: str) -> ModelConfig:
    return ModelConfig.from_dict(config_fields(case))


def test_llama3_case_has_frequencies_inside_the_smoothing_band() -> None:
    # Otherwise the interpolated branch of llama3 scaling would go untested.
    inv_freq, _ = rope_parameters(model_config("default"))
    wavelengths = 2 * math.pi / inv_freq
    old_context = LLAMA3["original_max_position_embeddings"]
    high_freq_wavelength = old_context / LLAMA3["high_freq_factor"]
    low_freq_wavelength = old_context / LLAMA3["low_freq_factor"]
    inside = (wavelengths > high_freq_wavelength) & (wavelengths < low_freq_wavelength)
    assert int(inside.sum()) >= 2, wavelengths.tolist()
    assert bool((wavelengths < high_freq_wavelength).any()) and bool((wavelengths > low_freq_wavelength).any())


def test_the_edge_cases_sit_on_their_edges() -> None:
    """The bounds of the two llama3 edge cases equal a wavelength as the rule compares them (fp32), and the YaRN
    case's correction range is one point inside the table."""
    inv_freq, _ = rope_parameters(model_config("default"))
    wavelengths = 2 * math.pi / inv_freq
    old_context = LLAMA3["original_max_position_embeddings"]
    assert bool((wavelengths == old_context / LOW_ON_A_WAVELENGTH).any())
    assert bool((wavelengths == old_context / HIGH_ON_A_WAVELENGTH).any())
    dim, base = HEAD_DIM, 1e6
    point = dim * math.log(1024 / (8.0 * 2 * math.pi)) / (2 * math.log(base))
    assert 0 < point < dim // 2 - 1 and point != int(point)


@pytest.mark.parametrize("case", sorted(ROPE_CASES))
def test_cache_rows_are_rope_cos_sin(case: str) -> None:
    config = model_config(case)
    inv_freq, attention_scaling = rope_parameters(config)
    cache = cos_sin_cache(config, MAX_POSITIONS)
    assert cache.dtype == torch.float32 and cache.shape == (MAX_POSITIONS, HEAD_DIM) and cache.is_contiguous()
    positions = torch.tensor([0, 1, 7, 511, 512, 1500, MAX_POSITIONS - 1])
    cos, sin = rope_cos_sin(inv_freq, attention_scaling, positions)
    assert torch.equal(cache[positions, :HALF], cos[:, :HALF])
    assert torch.equal(cache[positions, HALF:], sin[:, :HALF])
    # Row 0 is angle 0: the attention scaling alone, so a missing YaRN factor shows here.
    assert torch.equal(cache[0, :HALF], torch.full((HALF,), attention_scaling))


@pytest.mark.parametrize("case", sorted(ROPE_CASES))
def test_cache_matches_transformers_rotary_embedding(case: str) -> None:
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    fields = config_fields(case)
    rotary = LlamaRotaryEmbedding(LlamaConfig(**{k: v for k, v in fields.items() if k != "architectures"}))
    hf_cos, hf_sin = rotary(torch.zeros(1, dtype=torch.float32), torch.arange(MAX_POSITIONS)[None, :])
    cache = cos_sin_cache(model_config(case), MAX_POSITIONS)
    assert rotary.attention_scaling == pytest.approx(rope_parameters(model_config(case))[1])
    torch.testing.assert_close(cache[:, :HALF], hf_cos[0, :, :HALF], rtol=0, atol=1e-6)
    torch.testing.assert_close(cache[:, HALF:], hf_sin[0, :, :HALF], rtol=0, atol=1e-6)


def test_scaled_configs_change_the_table() -> None:
    # Guards the cases above against comparing the default table with itself.
    default = cos_sin_cache(model_config("default"), 1024)
    for case in sorted(ROPE_CASES):
        if case not in ("default", "yarn-factor-1"):
            assert (cos_sin_cache(model_config(case), 1024) - default).abs().max() > 1e-2, case
    # YaRN at factor 1 scales nothing: the default table, to rounding (its frequencies are recomputed).
    torch.testing.assert_close(cos_sin_cache(model_config("yarn-factor-1"), 1024), default, rtol=0, atol=1e-6)


@pytest.mark.parametrize("case", ["llama3", "yarn-explicit-factor"])
def test_kernel_with_the_cache_rotates_like_the_reference_model(case: str) -> None:
    from fast.kernels.qk_norm_rope import qk_norm_rope_
    from reference.model import RMSNorm, rotate_half

    config = model_config(case)
    generator = torch.Generator().manual_seed(3)
    num_tokens, num_heads, num_kv_heads, eps = 5, 4, 2, 1e-6
    q = torch.randn(num_tokens, num_heads, HEAD_DIM, generator=generator)
    k = torch.randn(num_tokens, num_kv_heads, HEAD_DIM, generator=generator)
    q_norm, k_norm = RMSNorm(HEAD_DIM, eps), RMSNorm(HEAD_DIM, eps)
    with torch.no_grad():
        q_norm.weight.copy_(1 + 0.1 * torch.randn(HEAD_DIM, generator=generator))
        k_norm.weight.copy_(1 + 0.1 * torch.randn(HEAD_DIM, generator=generator))
    positions = torch.tensor([0, 3, 600, 2047, 4000])
    inv_freq, attention_scaling = rope_parameters(config)
    cos, sin = rope_cos_sin(inv_freq, attention_scaling, positions)
    with torch.no_grad():
        expected_q = q_norm(q) * cos[:, None] + rotate_half(q_norm(q)) * sin[:, None]
        expected_k = k_norm(k) * cos[:, None] + rotate_half(k_norm(k)) * sin[:, None]
        # The kernel where the fast engine's tests run (tests.engines.FAST_DEVICE), in place.
        q, k = q.to(FAST_DEVICE), k.to(FAST_DEVICE)
        weights = (q_norm.weight.detach().to(FAST_DEVICE), k_norm.weight.detach().to(FAST_DEVICE))
        cache = cos_sin_cache(config, MAX_POSITIONS).to(FAST_DEVICE)
        qk_norm_rope_(q, k, *weights, cache, positions.to(FAST_DEVICE), eps)
    torch.testing.assert_close(q.cpu(), expected_q, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(k.cpu(), expected_k, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_reference_model_keeps_rope_frequencies_in_fp32(dtype: torch.dtype) -> None:
    from reference.model import CausalLM

    config = model_config("yarn")
    model = CausalLM(config).to(dtype)
    assert model.model.embed_tokens.weight.dtype == dtype  # the cast did happen
    assert model.inv_freq.dtype == torch.float32
    assert torch.equal(model.inv_freq, rope_parameters(config)[0])


def test_the_cache_holds_any_positive_number_of_positions() -> None:
    config = model_config("default")
    assert cos_sin_cache(config, 1).shape == (1, HEAD_DIM)
    assert cos_sin_cache(config, 2).shape == (2, HEAD_DIM)
    with pytest.raises(ValueError, match="max_positions must be >= 1, got 0"):
        cos_sin_cache(config, 0)
