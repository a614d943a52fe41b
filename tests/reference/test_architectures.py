"""Llama and Qwen2 checkpoints (and Qwen3 with biases) through the same reference engine,
against their transformers twins in fp32: identical greedy tokens and top-5 logprobs within 1e-4."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from reference.engine import ReferenceEngine
from reports.diff.differential import hf_greedy_trace, trace_from_output
from spec.agreement import compare_traces
from spec.checkpoint import expected_weight_shapes, load_model_config
from spec.engine_config import EngineConfig
from spec.errors import ConfigError
from spec.model_config import ModelConfig
from spec.sampling_params import SamplingParams
from twinfer.models.tiny_model import TinyModelShape, write_tiny_model

pytestmark = pytest.mark.differential

MAX_NEW_TOKENS = 32
_rng = random.Random(99)
PROMPTS = [[_rng.randrange(384) for _ in range(n)] for n in (1, 11, 40)]

VARIANTS = {
    "llama": ("llama", TinyModelShape(tie_word_embeddings=False)),
    "llama-biases": ("llama", TinyModelShape(attention_bias=True, mlp_bias=True)),
    "qwen2": ("qwen2", TinyModelShape(tie_word_embeddings=False)),
    "qwen3-attention-bias": ("qwen3", TinyModelShape(attention_bias=True)),
}


def with_llama3_rope(checkpoint: Path) -> None:
    """Llama-3.1 style wavelength-dependent RoPE scaling, short original context so it matters."""
    raw = json.loads((checkpoint / "config.json").read_text())
    raw["rope_parameters"] = {
        "rope_theta": 500000.0,
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 32,
    }
    (checkpoint / "config.json").write_text(json.dumps(raw))


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_architecture_matches_transformers(variant: str, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    architecture, shape = VARIANTS[variant]
    checkpoint = write_tiny_model(tmp_path / variant, seed=5, shape=shape, architecture=architecture)
    if architecture == "llama":
        with_llama3_rope(checkpoint)
    config = load_model_config(checkpoint)
    assert config.architecture.lower().startswith(architecture)
    biases = [name for name in expected_weight_shapes(config) if name.endswith(".bias")]
    assert bool(biases) == (variant != "llama"), biases
    hf = AutoModelForCausalLM.from_pretrained(str(checkpoint), dtype=torch.float32).eval()
    engine = ReferenceEngine.from_pretrained(checkpoint, EngineConfig(block_size=8, num_blocks=24), "float32", "cpu")
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW_TOKENS, ignore_eos=True, logprobs=5)
    for prompt, output in zip(PROMPTS, engine.generate(PROMPTS, params), strict=True):
        comparison = compare_traces(trace_from_output(output), hf_greedy_trace(hf, prompt, MAX_NEW_TOKENS, 5))
        assert comparison.agree, (variant, len(prompt), comparison)


def test_sliding_window_is_refused() -> None:
    raw = {
        "architectures": ["Qwen2ForCausalLM"],
        "vocab_size": 10,
        "hidden_size": 8,
        "intermediate_size": 16,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 64,
        "use_sliding_window": True,
        "sliding_window": 16,
    }
    with pytest.raises(ConfigError, match="sliding-window attention"):
        ModelConfig.from_dict(raw)
    assert ModelConfig.from_dict({**raw, "use_sliding_window": False}).traits.qkv_bias
