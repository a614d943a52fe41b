"""The model configuration both engines read from a checkpoint's config.json.

Supported: Qwen3, Llama (Llama-3 with its llama3 RoPE scaling) and Qwen2 (Qwen2.5). They differ
only in the traits of `ArchitectureTraits`: q/k norm and where projections carry biases.
Features none of the engines implement (sliding-window attention, activations other than
SiLU) are refused when the config is read, never silently ignored.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spec.errors import ConfigError


@dataclass(frozen=True)
class ArchitectureTraits:
    """How a supported architecture's layers differ; read from config.json by `traits_for`."""

    use_qk_norm: bool  # per-head RMSNorm on q and k before RoPE (Qwen3)
    qkv_bias: bool  # biases on the q, k and v projections
    o_proj_bias: bool  # bias on the attention output projection
    mlp_bias: bool  # biases on gate, up and down projections


def _qwen3_traits(raw: dict[str, Any]) -> ArchitectureTraits:
    bias = bool(raw.get("attention_bias", False))
    return ArchitectureTraits(use_qk_norm=True, qkv_bias=bias, o_proj_bias=bias, mlp_bias=False)


def _llama_traits(raw: dict[str, Any]) -> ArchitectureTraits:
    bias = bool(raw.get("attention_bias", False))
    return ArchitectureTraits(
        use_qk_norm=False, qkv_bias=bias, o_proj_bias=bias, mlp_bias=bool(raw.get("mlp_bias", False))
    )


def _qwen2_traits(raw: dict[str, Any]) -> ArchitectureTraits:
    return ArchitectureTraits(use_qk_norm=False, qkv_bias=True, o_proj_bias=False, mlp_bias=False)


# Architecture name (config.json "architectures"[0]) -> how to read its traits.
ARCHITECTURES: dict[str, Callable[[dict[str, Any]], ArchitectureTraits]] = {
    "Qwen3ForCausalLM": _qwen3_traits,
    "LlamaForCausalLM": _llama_traits,
    "Qwen2ForCausalLM": _qwen2_traits,
}
SUPPORTED_ARCHITECTURES = tuple(ARCHITECTURES)
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn")


@dataclass(frozen=True)
class RopeScaling:
    """RoPE frequency scaling. `rope_type` 'default' means none.

    linear: inv_freq /= factor.
    llama3: Llama-3.1 wavelength-dependent interpolation (factor, low_freq_factor,
            high_freq_factor, original_max_position_embeddings).
    yarn:   YaRN ramp between interpolation and extrapolation (factor, beta_fast, beta_slow,
            original_max_position_embeddings) and a cos/sin attention factor.
    """

    rope_type: str = "default"
    factor: float = 1.0
    original_max_position_embeddings: int | None = None
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    attention_factor: float | None = None
    truncate: bool = True

    def __post_init__(self) -> None:
        if self.rope_type not in SUPPORTED_ROPE_TYPES:
            raise ConfigError(
                f"unsupported rope_scaling type {self.rope_type!r}; supported: {', '.join(SUPPORTED_ROPE_TYPES)}"
            )
        if not (self.factor > 0 and math.isfinite(self.factor)):
            raise ConfigError(f"rope_scaling factor must be a positive number, got {self.factor!r}")
        needs_original = self.rope_type in ("llama3", "yarn")
        if needs_original and not self.original_max_position_embeddings:
            raise ConfigError(f"rope_scaling type {self.rope_type!r} needs 'original_max_position_embeddings'")
        if self.rope_type == "llama3" and not self.high_freq_factor > self.low_freq_factor:
            raise ConfigError("rope_scaling llama3 needs high_freq_factor > low_freq_factor")


@dataclass(frozen=True)
class ModelConfig:
    """Shape and numerics of a decoder-only transformer, validated once at construction."""

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    rope_scaling: RopeScaling = RopeScaling()
    traits: ArchitectureTraits = ArchitectureTraits(use_qk_norm=True, qkv_bias=False, o_proj_bias=False, mlp_bias=False)
    hidden_act: str = "silu"
    torch_dtype: str = "float32"
    eos_token_ids: tuple[int, ...] = ()
    bos_token_id: int | None = None

    def __post_init__(self) -> None:
        check_architecture(self.architecture)
        for name in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "max_position_embeddings",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ConfigError(f"config field {name!r} must be a positive integer, got {value!r}")
        if self.num_attention_heads % self.num_key_value_heads != 0:
            raise ConfigError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )
        if self.head_dim % 2 != 0:
            raise ConfigError(f"head_dim must be even for rotary embeddings, got {self.head_dim}")
        if not (self.rms_norm_eps > 0):
            raise ConfigError(f"rms_norm_eps must be positive, got {self.rms_norm_eps!r}")
        if not (self.rope_theta > 0):
            raise ConfigError(f"rope_theta must be positive, got {self.rope_theta!r}")
        if self.hidden_act != "silu":
            raise ConfigError(f"unsupported hidden_act {self.hidden_act!r}; only 'silu' is supported")
        for token_id in self.eos_token_ids:
            if not 0 <= token_id < self.vocab_size:
                raise ConfigError(f"eos_token_id {token_id} is outside the vocabulary of {self.vocab_size}")

    @property
    def num_queries_per_kv(self) -> int:
        return self.num_attention_heads // self.num_key_value_heads

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> ModelConfig:
        """Build from the dictionary of a Hugging Face config.json (transformers 4 or 5 layout)."""
        architecture = _architecture(raw)
        if raw.get("use_sliding_window"):
            raise ConfigError("sliding-window attention (use_sliding_window: true) is not supported")
        head_dim = raw.get("head_dim") or _required(raw, "hidden_size") // _required(raw, "num_attention_heads")
        rope_theta, rope_scaling = _rope(raw)
        return cls(
            architecture=architecture,
            vocab_size=_required(raw, "vocab_size"),
            hidden_size=_required(raw, "hidden_size"),
            intermediate_size=_required(raw, "intermediate_size"),
            num_hidden_layers=_required(raw, "num_hidden_layers"),
            num_attention_heads=_required(raw, "num_attention_heads"),
            num_key_value_heads=raw.get("num_key_value_heads") or raw["num_attention_heads"],
            head_dim=head_dim,
            rms_norm_eps=float(_required(raw, "rms_norm_eps")),
            rope_theta=rope_theta,
            max_position_embeddings=_required(raw, "max_position_embeddings"),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            rope_scaling=rope_scaling,
            traits=ARCHITECTURES[architecture](raw),
            hidden_act=raw.get("hidden_act", "silu"),
            torch_dtype=str(raw.get("torch_dtype") or raw.get("dtype") or "float32"),
            eos_token_ids=_token_ids(raw.get("eos_token_id")),
            bos_token_id=raw.get("bos_token_id"),
        )

    @classmethod
    def from_json_file(cls, path: str | Path) -> ModelConfig:
        path = Path(path)
        try:
            raw = json.loads(path.read_text())
        except FileNotFoundError as error:
            raise ConfigError(f"no config.json at {path}") from error
        except json.JSONDecodeError as error:
            raise ConfigError(f"{path} is not valid JSON: {error}") from error
        if not isinstance(raw, dict):
            raise ConfigError(f"{path} must hold a JSON object")
        return cls.from_dict(raw)


def _architecture(raw: dict[str, Any]) -> str:
    architectures = raw.get("architectures")
    if not architectures or not isinstance(architectures, list):
        raise ConfigError("config.json has no 'architectures' list naming the model class")
    return check_architecture(str(architectures[0]))


def check_architecture(architecture: str) -> str:
    if architecture not in SUPPORTED_ARCHITECTURES:
        raise ConfigError(f"unsupported architecture {architecture!r}; supported: {', '.join(SUPPORTED_ARCHITECTURES)}")
    return architecture


def _required(raw: dict[str, Any], name: str) -> Any:
    if name not in raw or raw[name] is None:
        raise ConfigError(f"config.json is missing the required field {name!r}")
    return raw[name]


def _token_ids(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(int(v) for v in value)


def _rope(raw: dict[str, Any]) -> tuple[float, RopeScaling]:
    """rope_theta and scaling from either `rope_parameters` (transformers 5) or the older
    top-level `rope_theta` plus `rope_scaling` (what hub checkpoints ship)."""
    parameters = raw.get("rope_parameters")
    if isinstance(parameters, dict) and "rope_theta" in parameters:
        theta = float(parameters["rope_theta"])
        scaling_fields = parameters
    else:
        theta = float(raw.get("rope_theta", 10000.0))
        scaling_fields = raw.get("rope_scaling") or {}
    rope_type = scaling_fields.get("rope_type") or scaling_fields.get("type") or "default"
    if rope_type == "default":
        return theta, RopeScaling()
    known = {
        "factor",
        "original_max_position_embeddings",
        "low_freq_factor",
        "high_freq_factor",
        "beta_fast",
        "beta_slow",
        "attention_factor",
        "truncate",
    }
    values = {k: v for k, v in scaling_fields.items() if k in known and v is not None}
    if "factor" in values:
        values["factor"] = float(values["factor"])
    return theta, RopeScaling(rope_type=rope_type, **values)
