"""Rotary position embedding frequencies, defined once for both engines.

The formulas follow the published definitions (RoPE; linear position interpolation; Llama-3.1's
wavelength-dependent scaling; YaRN) in the form Hugging Face checkpoints configure them.
"""

from __future__ import annotations

import math

import torch

from spec.model_config import ModelConfig, RopeScaling


def rope_parameters(config: ModelConfig) -> tuple[torch.Tensor, float]:
    """(inv_freq fp32 [head_dim // 2], attention_scaling applied to cos and sin)."""
    dim = config.head_dim
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).to(torch.float32) / dim
    inv_freq = 1.0 / (config.rope_theta**exponents)
    scaling = config.rope_scaling
    if scaling.rope_type == "default":
        return inv_freq, 1.0
    if scaling.rope_type == "linear":
        return inv_freq / scaling.factor, 1.0
    if scaling.rope_type == "llama3":
        return _llama3(inv_freq, scaling), 1.0
    return _yarn(config.rope_theta, dim, scaling)


def _llama3(inv_freq: torch.Tensor, scaling: RopeScaling) -> torch.Tensor:
    """Long wavelengths are divided by `factor`, short ones kept, the band between interpolated."""
    assert scaling.original_max_position_embeddings is not None
    old_context = scaling.original_max_position_embeddings
    low_freq_wavelen = old_context / scaling.low_freq_factor
    high_freq_wavelen = old_context / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / scaling.factor, inv_freq)
    smooth = (old_context / wavelen - scaling.low_freq_factor) / (scaling.high_freq_factor - scaling.low_freq_factor)
    smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def _yarn(base: float, dim: int, scaling: RopeScaling) -> tuple[torch.Tensor, float]:
    """YaRN: per-dimension blend of interpolated and extrapolated frequencies, plus an attention factor."""
    assert scaling.original_max_position_embeddings is not None
    factor = scaling.factor
    attention_factor = scaling.attention_factor
    if attention_factor is None:
        attention_factor = 1.0 if factor <= 1 else 0.1 * math.log(factor) + 1.0

    def correction_dim(num_rotations: float) -> float:
        return (dim * math.log(scaling.original_max_position_embeddings / (num_rotations * 2 * math.pi))) / (
            2 * math.log(base)
        )

    low, high = correction_dim(scaling.beta_fast), correction_dim(scaling.beta_slow)
    if scaling.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # avoid dividing by zero in the ramp
    position_freqs = base ** (torch.arange(0, dim, 2).to(torch.float32) / dim)
    extrapolation = 1.0 / position_freqs
    interpolation = 1.0 / (factor * position_freqs)
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    extrapolation_weight = 1 - ramp
    inv_freq = interpolation * (1 - extrapolation_weight) + extrapolation * extrapolation_weight
    return inv_freq, float(attention_factor)


def rope_cos_sin(
    inv_freq: torch.Tensor, attention_scaling: float, positions: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [num_tokens, head_dim] in fp32 for integer positions [num_tokens] (rotate-half layout)."""
    freqs = positions.to(torch.float32)[:, None] * inv_freq.to(positions.device)[None, :]
    angles = torch.cat((freqs, freqs), dim=-1)
    return angles.cos() * attention_scaling, angles.sin() * attention_scaling


def cos_sin_cache(config: ModelConfig, max_positions: int) -> torch.Tensor:
    """fp32 [max_positions, head_dim]: row p is [cos_0 .. cos_{half-1}, sin_0 .. sin_{half-1}] at position p.

    The attention scaling (YaRN's factor) is already applied. The rotate-half layout repeats each
    angle in both halves of `rope_cos_sin`'s output, so one half of each is the whole table (the
    layout `fast.kernels.qk_norm_rope` reads).
    """
    if max_positions < 1:
        raise ValueError(f"max_positions must be >= 1, got {max_positions}")
    inv_freq, attention_scaling = rope_parameters(config)
    positions = torch.arange(max_positions, dtype=torch.int64)
    cos, sin = rope_cos_sin(inv_freq, attention_scaling, positions)
    half = config.head_dim // 2
    return torch.cat((cos[:, :half], sin[:, :half]), dim=-1).contiguous()
