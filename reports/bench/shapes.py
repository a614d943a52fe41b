"""The benchmark model shapes (../shared/benchmarks.md), built with random weights on the device.

Timing does not depend on weight values, so nothing is downloaded: the state dict is drawn from a
seeded generator on the target device (an 8B shape is ~16 GB in bf16; drawing it on the CPU first
would double the memory and take minutes). Drawing is deterministic for a seed, so transformers
and twinfer's engines can each be given the same weights without holding two copies at once.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from types import MappingProxyType

import torch

from fast.weights import ShardLayout
from spec.checkpoint import expected_weight_shapes
from spec.model_config import ModelConfig

# Standard deviation of the random matrices (transformers' Qwen3 initializer_range): keeps
# activations in range in bf16, so no NaN reaches the sampler.
WEIGHT_STD = 0.02
# The workloads' prompt ids lie in [0, 10000) (reports.bench.workloads); the tiny shape covers them.
WORKLOAD_VOCABULARY = 10240


@dataclass(frozen=True)
class ModelShape:
    """A Qwen3 decoder's sizes: the columns of the table in benchmarks.md."""

    name: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    tie_word_embeddings: bool
    rope_theta: float = 1e6
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 40960

    def config_dict(self) -> dict[str, object]:
        """The config.json a Hugging Face Qwen3 checkpoint of this shape would carry."""
        return {
            "architectures": ["Qwen3ForCausalLM"],
            "model_type": "qwen3",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "tie_word_embeddings": self.tie_word_embeddings,
            "rope_theta": self.rope_theta,
            "rms_norm_eps": self.rms_norm_eps,
            "max_position_embeddings": self.max_position_embeddings,
            "hidden_act": "silu",
            "attention_bias": False,
            "torch_dtype": "bfloat16",
        }

    @classmethod
    def of_checkpoint(cls, name: str, config: ModelConfig) -> ModelShape:
        """The shape of a checkpoint's model (its config.json, read by spec.checkpoint.load_model_config)."""
        return cls(
            name,
            config.vocab_size,
            config.hidden_size,
            config.intermediate_size,
            config.num_hidden_layers,
            config.num_attention_heads,
            config.num_key_value_heads,
            config.head_dim,
            config.tie_word_embeddings,
            config.rope_theta,
            config.rms_norm_eps,
            config.max_position_embeddings,
        )

    def model_config(self) -> ModelConfig:
        return ModelConfig.from_dict(self.config_dict())

    def num_parameters(self) -> int:
        return sum(math.prod(shape) for shape in expected_weight_shapes(self.model_config()).values())

    def weight_bytes_read_per_decode_step(self, dtype: torch.dtype) -> int:
        """Bytes of weights one decode step must read. An untied input-embedding table is not read
        (a step gathers a few rows of it); a tied one is, as the LM head."""
        parameters = self.num_parameters()
        if not self.tie_word_embeddings:
            parameters -= self.vocab_size * self.hidden_size
        return parameters * dtype.itemsize

    def kv_bytes_per_token(self, dtype: torch.dtype) -> int:
        """K and V of one token over every layer."""
        return 2 * self.num_key_value_heads * self.head_dim * self.num_hidden_layers * dtype.itemsize

    def layer_matmul_parameters(self) -> int:
        """Weights of every layer's projections (q, k, v, o, gate, up, down), the LM head excluded."""
        attention = self.hidden_size * self.head_dim * (2 * self.num_attention_heads + 2 * self.num_key_value_heads)
        mlp = 3 * self.hidden_size * self.intermediate_size
        return self.num_hidden_layers * (attention + mlp)

    def prefill_flops(self, prompt_length: int) -> int:
        """FLOPs of one causal prefill of `prompt_length` tokens: 2 per weight per token in the
        projections, plus QK^T and PV over the causal half (the LM head, run for one row, and the
        elementwise work are left out)."""
        projections = 2 * self.layer_matmul_parameters() * prompt_length
        causal_pairs = prompt_length * (prompt_length + 1) // 2
        attention = 2 * 2 * causal_pairs * self.head_dim * self.num_attention_heads * self.num_hidden_layers
        return projections + attention

    def record(self) -> dict[str, object]:
        return {**asdict(self), "num_parameters": self.num_parameters()}

    def rank_share(self, ranks: int) -> ModelShape:
        """The model one rank of `ranks`-way tensor parallelism computes (fast.weights.ShardLayout):
        attention heads, intermediate size and vocabulary divided by `ranks`, KV heads too (at least
        one: fewer than `ranks` are replicated), the hidden size whole. Run alone on one GPU it
        measures a rank's compute without any collective: the floor of a tensor-parallel step.

        The vocabulary keeps at least WORKLOAD_VOCABULARY ids, so the workloads' prompts stay valid;
        the clamp applies to the tiny harness shape only (the benchmark shapes' halves are 75,968)."""
        if ranks < 1 or self.num_attention_heads % ranks or self.intermediate_size % ranks:
            raise ValueError(f"{ranks} ranks do not divide {self.name}'s attention heads and intermediate size")
        if ranks == 1:
            return self
        layout = ShardLayout.for_rank(self.model_config(), 0, ranks)  # the engine's own split rule
        return replace(
            self,
            name=f"{self.name}/rank-share-of-{ranks}",
            vocab_size=max(WORKLOAD_VOCABULARY, layout.vocab_shard_size),
            intermediate_size=layout.intermediate_size,
            num_attention_heads=layout.num_heads,
            num_key_value_heads=layout.num_kv_heads,
        )


SHAPES: Mapping[str, ModelShape] = MappingProxyType(
    {
        "qwen3-0.6b": ModelShape("qwen3-0.6b", 151936, 1024, 3072, 28, 16, 8, 128, tie_word_embeddings=True),
        "qwen3-8b": ModelShape("qwen3-8b", 151936, 4096, 12288, 36, 32, 8, 128, tie_word_embeddings=False),
        # For CPU tests of the harness only. The vocabulary covers the workloads' ids (0 to 10000).
        "tiny": ModelShape("tiny", WORKLOAD_VOCABULARY, 64, 128, 2, 4, 2, 16, tie_word_embeddings=True),
    }
)


def random_state_dict(
    config: ModelConfig, dtype: torch.dtype, device: torch.device, seed: int
) -> dict[str, torch.Tensor]:
    """Every tensor the model needs, drawn on `device`: matrices N(0, WEIGHT_STD), norm weights 1, biases 0."""
    generator = torch.Generator(device=device).manual_seed(seed)
    state_dict = {}
    for name, shape in expected_weight_shapes(config).items():
        if name.endswith("norm.weight"):
            state_dict[name] = torch.ones(shape, dtype=dtype, device=device)
        elif name.endswith(".bias"):
            state_dict[name] = torch.zeros(shape, dtype=dtype, device=device)
        else:
            tensor = torch.empty(shape, dtype=dtype, device=device)
            state_dict[name] = tensor.normal_(0.0, WEIGHT_STD, generator=generator)
    return state_dict


def build_hf_model(
    shape: ModelShape,
    dtype: torch.dtype,
    device: torch.device,
    seed: int,
    attn_implementation: str,
    checkpoint: Path | None = None,
) -> torch.nn.Module:
    """The transformers model of `shape`, built on `device`, holding the weights of random_state_dict(seed);
    or, given a checkpoint directory, transformers' own loading of it."""
    from transformers import AutoConfig, AutoModelForCausalLM

    if checkpoint is not None:
        model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=dtype, attn_implementation=attn_implementation)
        return model.to(device).eval()

    fields = {key: value for key, value in shape.config_dict().items() if key not in ("architectures", "model_type")}
    config = AutoConfig.for_model("qwen3", **fields)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation=attn_implementation)
    state_dict = random_state_dict(shape.model_config(), dtype, device, seed)
    missing, unexpected = model.load_state_dict(state_dict, strict=False)
    tied_head = ["lm_head.weight"] if shape.tie_word_embeddings else []
    if sorted(missing) != tied_head or unexpected:
        raise RuntimeError(
            f"transformers' {shape.name} model does not match the shape: missing {missing}, unexpected {unexpected}"
        )
    return model.eval()
