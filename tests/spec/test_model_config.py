"""ModelConfig parsing, RoPE frequencies against transformers' own, and engine settings."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from spec.engine_config import EngineConfig
from spec.errors import ConfigError
from spec.model_config import ModelConfig, RopeScaling
from spec.rope import rope_parameters

BASE = {
    "architectures": ["Qwen3ForCausalLM"],
    "vocab_size": 100,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 4096,
}

ROPE_CASES = {
    "default": {"rope_type": "default"},
    "linear": {"rope_type": "linear", "factor": 4.0},
    "llama3": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 512,
    },
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024},
}


def test_reads_transformers_5_and_older_rope_layouts() -> None:
    new = ModelConfig.from_dict({**BASE, "rope_parameters": {"rope_theta": 1e6, **ROPE_CASES["yarn"]}})
    old = ModelConfig.from_dict(
        {
            **BASE,
            "rope_theta": 1e6,
            "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024},
        }
    )
    assert new == old
    assert new.rope_theta == 1e6 and new.rope_scaling.rope_type == "yarn"


@pytest.mark.parametrize("rope_type", sorted(ROPE_CASES))
def test_rope_frequencies_match_transformers(rope_type: str) -> None:
    from transformers import Qwen3Config
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding

    fields = {**BASE, "rope_parameters": {"rope_theta": 1e6, **ROPE_CASES[rope_type]}}
    hf_config = Qwen3Config(**{k: v for k, v in fields.items() if k != "architectures"})
    init = (
        Qwen3RotaryEmbedding.compute_default_rope_parameters
        if rope_type == "default"
        else ROPE_INIT_FUNCTIONS[rope_type]
    )
    hf_inv_freq, hf_scaling = init(hf_config)
    inv_freq, scaling = rope_parameters(ModelConfig.from_dict(fields))
    torch.testing.assert_close(inv_freq, hf_inv_freq.to(torch.float32), rtol=1e-6, atol=0)
    assert scaling == pytest.approx(hf_scaling)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"num_key_value_heads": 3}, "must be a multiple of num_key_value_heads"),
        ({"hidden_act": "gelu"}, "unsupported hidden_act 'gelu'"),
        ({"vocab_size": 0}, "'vocab_size' must be a positive integer"),
        ({"head_dim": 31}, "head_dim must be even"),
        ({"rope_scaling": {"rope_type": "longrope", "factor": 2.0}}, "unsupported rope_scaling type 'longrope'"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 2.0}}, "needs 'original_max_position_embeddings'"),
        ({"architectures": []}, "no 'architectures' list"),
        ({"eos_token_id": 500}, "eos_token_id 500 is outside the vocabulary"),
    ],
)
def test_bad_model_config_is_named(change: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        ModelConfig.from_dict({**BASE, **change})


def test_rope_scaling_rejects_nonpositive_factor() -> None:
    with pytest.raises(ConfigError, match="factor must be a positive number"):
        RopeScaling(rope_type="linear", factor=0.0)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"block_size": 12}, "block_size must be a power of two"),
        ({"num_blocks": 0}, "'num_blocks' must be a positive integer"),
        ({"max_num_seqs": -1}, "'max_num_seqs' must be a positive integer"),
        ({"max_num_batched_tokens": 1.5}, "'max_num_batched_tokens' must be a positive integer"),
        ({"max_model_len": 1}, "max_model_len must be an integer >= 2"),
        ({"programmatic_dependent_launch": 1}, "'programmatic_dependent_launch' must be a bool"),
    ],
)
def test_bad_engine_config_is_named(settings: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        EngineConfig(**settings)  # type: ignore[arg-type]


def test_max_model_len_defaults_to_and_may_not_exceed_the_model() -> None:
    model = ModelConfig.from_dict(BASE)
    assert EngineConfig().resolved(model).max_model_len == 4096
    with pytest.raises(ConfigError, match="max_model_len 5000 exceeds the model's max_position_embeddings 4096"):
        EngineConfig(max_model_len=5000).resolved(model)


@pytest.mark.differential
def test_yarn_scaled_model_matches_transformers(tiny_checkpoint: Path, tmp_path: Path) -> None:
    """The whole model with YaRN scaling (as long-context Qwen3 checkpoints configure it) against transformers."""
    from transformers import Qwen3ForCausalLM

    from reference.engine import ReferenceEngine
    from reports.diff.differential import hf_greedy_trace, trace_from_output
    from spec.agreement import compare_traces
    from spec.sampling_params import SamplingParams

    checkpoint = tmp_path / "yarn"
    shutil.copytree(tiny_checkpoint, checkpoint)
    raw = json.loads((checkpoint / "config.json").read_text())
    raw["rope_parameters"] = {
        "rope_theta": 10000.0,
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 64,
    }
    (checkpoint / "config.json").write_text(json.dumps(raw))
    prompt = list(range(10, 90))  # longer than original_max_position_embeddings
    hf = Qwen3ForCausalLM.from_pretrained(str(checkpoint), dtype=torch.float32).eval()
    expected = hf_greedy_trace(hf, prompt, 24, 5)
    engine = ReferenceEngine.from_pretrained(checkpoint, EngineConfig(block_size=8, num_blocks=64), "float32", "cpu")
    output = engine.generate([prompt], SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, logprobs=5))[0]
    comparison = compare_traces(trace_from_output(output), expected)
    assert comparison.agree, comparison
