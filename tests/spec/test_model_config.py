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
from spec.speculative import SpeculativeConfig

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


def test_model_config_derives_its_shapes_and_bounds_at_their_edges() -> None:
    """Queries per KV head is heads // kv_heads; head_dim defaults to hidden // heads; eps and theta must be > 0; an
    eos id must be in [0, vocab_size); llama3 scaling needs high_freq_factor > low_freq_factor (other types do not);
    a scaling factor is a float; Qwen3 and Llama have no biases unless config.json asks; the config is frozen."""
    from dataclasses import FrozenInstanceError

    from spec.model_config import ArchitectureTraits

    config = ModelConfig.from_dict(BASE)
    assert (config.num_queries_per_kv, config.head_dim) == (2, 32)
    assert ModelConfig.from_dict({k: v for k, v in BASE.items() if k != "head_dim"}).head_dim == 16
    for field, value, message in (
        ("rms_norm_eps", 0.0, "rms_norm_eps must be positive"),
        ("rope_theta", 0.0, "rope_theta must be positive"),
    ):
        with pytest.raises(ConfigError, match=message):
            ModelConfig.from_dict({**BASE, field: value})
    assert ModelConfig.from_dict({**BASE, "eos_token_id": 99}).eos_token_ids == (99,)
    with pytest.raises(ConfigError, match="eos_token_id 100 is outside the vocabulary of 100"):
        ModelConfig.from_dict({**BASE, "eos_token_id": 100})
    with pytest.raises(ConfigError, match="needs high_freq_factor > low_freq_factor"):
        RopeScaling("llama3", 8.0, 512, low_freq_factor=2.0, high_freq_factor=2.0)
    assert RopeScaling("linear", 2.0, low_freq_factor=4.0, high_freq_factor=1.0).factor == 2.0
    scaled = ModelConfig.from_dict({**BASE, "rope_scaling": {"rope_type": "linear", "factor": 4}}).rope_scaling
    assert isinstance(scaled.factor, float) and scaled.factor == 4.0
    no_bias = ArchitectureTraits(use_qk_norm=True, qkv_bias=False, o_proj_bias=False, mlp_bias=False)
    direct = ModelConfig("Qwen3ForCausalLM", 100, 64, 128, 2, 4, 2, 32, 1e-6, 1e4, 4096, True)
    assert direct.traits == config.traits == no_bias
    llama = ModelConfig.from_dict({**BASE, "architectures": ["LlamaForCausalLM"]}).traits
    assert llama == ArchitectureTraits(use_qk_norm=False, qkv_bias=False, o_proj_bias=False, mlp_bias=False)
    with pytest.raises(FrozenInstanceError):
        config.vocab_size = 5  # type: ignore[misc]


def test_config_json_defaults_are_transformers_and_bad_files_are_named(tmp_path: Path) -> None:
    """What config.json may leave out takes transformers' default (untied embeddings; the dtype from torch_dtype,
    else dtype, else float32; rope_theta 10000; llama3's low and high frequency factors 1 and 4; YaRN's beta_fast 32
    and beta_slow 1; no scaling factor 1); sizes of 1 and a theta below 1 are valid, a bool is not a size, an eos id
    of -1 is refused; the first of several architectures is the one; a file that is not JSON is a ConfigError."""
    config = ModelConfig.from_dict(BASE)
    assert (config.tie_word_embeddings, config.torch_dtype, config.rope_scaling.factor) == (False, "float32", 1.0)
    assert ModelConfig.from_dict({**BASE, "dtype": "bfloat16"}).torch_dtype == "bfloat16"
    assert ModelConfig.from_dict({**BASE, "torch_dtype": "float16", "dtype": "bfloat16"}).torch_dtype == "float16"
    llama3 = {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 512}
    scaling = ModelConfig.from_dict({**BASE, "rope_scaling": llama3}).rope_scaling
    assert (scaling.low_freq_factor, scaling.high_freq_factor) == (1.0, 4.0)
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024}
    scaling = ModelConfig.from_dict({**BASE, "rope_scaling": yarn}).rope_scaling
    assert (scaling.beta_fast, scaling.beta_slow) == (32.0, 1.0)
    with pytest.raises(ConfigError, match="'vocab_size' must be a positive integer, got True"):
        ModelConfig.from_dict({**BASE, "vocab_size": True})
    edge = ModelConfig.from_dict({**BASE, "num_hidden_layers": 1, "num_key_value_heads": 1, "rope_theta": 0.5})
    assert (edge.num_hidden_layers, edge.num_key_value_heads, edge.rope_theta) == (1, 1, 0.5)
    assert ModelConfig.from_dict({k: v for k, v in BASE.items() if k != "rope_theta"}).rope_theta == 10000.0
    with pytest.raises(ConfigError, match="eos_token_id -1 is outside the vocabulary"):
        ModelConfig.from_dict({**BASE, "eos_token_id": -1})
    first = ModelConfig.from_dict({**BASE, "architectures": ["LlamaForCausalLM", "Qwen3ForCausalLM"]})
    assert first.architecture == "LlamaForCausalLM"
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="config.json is not valid JSON"):
        ModelConfig.from_json_file(tmp_path / "config.json")


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


POSITIVE_SETTINGS = ("block_size", "num_blocks", "max_num_seqs", "max_num_batched_tokens", "tensor_parallel_size")
SWITCHES = (
    "enable_prefix_caching", "check_invariants", "enable_cuda_graphs", "batch_invariant", "async_scheduling",
    "programmatic_dependent_launch", "fused_all_reduce_norm",
)  # fmt: skip
RESOLVED_BY_ENGINE = {"num_blocks", "max_num_seqs", "max_num_batched_tokens", "async_scheduling"}


def test_engine_config_accepts_each_bound_at_its_edge_and_refuses_past_it() -> None:
    """Every range's edge is inside (block_size 1, a pool of one block, one sequence, a budget of one token, one
    rank, max_model_len 2, gpu_memory_utilization 1); one step past it, a bool for an int, a float for an int and
    a non-bool switch are each refused by name, whatever settings come before or after it (a None the engine
    resolves skips only its own check)."""
    edge = EngineConfig(
        block_size=1, num_blocks=1, max_num_seqs=1, max_num_batched_tokens=1, max_model_len=2, gpu_memory_utilization=1
    )
    assert (edge.block_size, edge.pool_blocks, edge.model_len, edge.gpu_memory_utilization) == (1, 1, 2, 1)
    for utilization in (1.0, 1e-6, 0.5):
        assert EngineConfig(gpu_memory_utilization=utilization).gpu_memory_utilization == utilization
    for utilization in (0, 0.0, -0.5, 1.0001, 2, True, "0.9"):
        with pytest.raises(ConfigError, match=r"gpu_memory_utilization must be in \(0, 1\]"):
            EngineConfig(gpu_memory_utilization=utilization)  # type: ignore[arg-type]
    for max_model_len in (1, 0, 2.0, "8"):
        with pytest.raises(ConfigError, match="max_model_len must be an integer >= 2"):
            EngineConfig(max_model_len=max_model_len)  # type: ignore[arg-type]
    for size in (2, 4, 64):
        assert EngineConfig(block_size=size).block_size == size
    for size in (3, 6, 24):
        with pytest.raises(ConfigError, match=f"block_size must be a power of two, got {size}"):
            EngineConfig(block_size=size)
    for name in POSITIVE_SETTINGS:
        for value in (0, -1, True, 1.5, *(() if name in RESOLVED_BY_ENGINE else (None,))):
            # The other settings left at their defaults (num_blocks None among them) come before and after.
            with pytest.raises(ConfigError, match=f"engine setting {name!r} must be a positive integer"):
                EngineConfig(**{name: value})  # type: ignore[arg-type]
    for name in SWITCHES:
        also = " \\(or None: [^)]*\\)" if name in {"async_scheduling", "programmatic_dependent_launch"} else ""
        for value in (1, "yes", *(() if also else (None,))):
            with pytest.raises(ConfigError, match=f"engine setting {name!r} must be a bool{also}, got {value!r}"):
                EngineConfig(**{name: value})  # type: ignore[arg-type]
    assert EngineConfig(async_scheduling=None, programmatic_dependent_launch=None).async_scheduling is None
    with pytest.raises(ConfigError, match="'speculative' must be a SpeculativeConfig or None, got 'ngram'"):
        EngineConfig(speculative="ngram")  # type: ignore[arg-type]
    speculative = SpeculativeConfig("ngram", 2)
    assert EngineConfig(speculative=speculative).speculative is speculative


def test_engine_config_defaults_and_resolution_are_the_documented_ones() -> None:
    """EngineConfig() is the documented defaults; `resolved` keeps what was given and fills the rest (the model's
    length, a pool of DEFAULT_NUM_BLOCKS = 1024 blocks or the engine's own, the engine's batch defaults); an
    unresolved pool or length is an error where it is read; the settings are frozen; the draft model's engine
    keeps the geometry and drops speculation, invariant checks, tensor parallelism and the fused all-reduce."""
    from dataclasses import FrozenInstanceError

    from spec.engine_config import DEFAULT_NUM_BLOCKS, SMALL_BATCHES, BatchDefaults

    config = EngineConfig()
    defaults = {
        "block_size": 16, "num_blocks": None, "max_num_seqs": None, "max_num_batched_tokens": None,
        "max_model_len": None, "enable_prefix_caching": True, "check_invariants": False,
        "gpu_memory_utilization": 0.9, "enable_cuda_graphs": True, "batch_invariant": False,
        "tensor_parallel_size": 1, "async_scheduling": None, "programmatic_dependent_launch": None,
        "fused_all_reduce_norm": False, "speculative": None,
    }  # fmt: skip
    assert {name: getattr(config, name) for name in defaults} == defaults
    for unresolved in ("pool_blocks", "model_len"):
        with pytest.raises(ConfigError, match="unresolved: call EngineConfig.resolved"):
            getattr(config, unresolved)
    model = ModelConfig.from_dict(BASE)
    resolved = config.resolved(model)
    assert DEFAULT_NUM_BLOCKS == 1024 and SMALL_BATCHES == BatchDefaults(64, 2048, False)
    assert (resolved.model_len, resolved.pool_blocks, resolved.max_num_seqs) == (4096, 1024, 64)
    assert (resolved.max_num_batched_tokens, resolved.async_scheduling) == (2048, False)
    assert config.resolved(model, num_blocks=7).pool_blocks == 7  # the engine's own pool size
    given = EngineConfig(num_blocks=5, max_num_seqs=3, max_num_batched_tokens=9, max_model_len=4096)
    resolved = given.resolved(model, num_blocks=7, batches=BatchDefaults(256, 16384, True))
    assert (resolved.pool_blocks, resolved.max_num_seqs, resolved.max_num_batched_tokens) == (5, 3, 9)
    assert (resolved.model_len, resolved.async_scheduling) == (4096, True)
    assert [resolved.blocks_for_tokens(n) for n in (0, 1, 16, 17, 33)] == [0, 1, 1, 2, 3]
    with pytest.raises(FrozenInstanceError):
        config.block_size = 8  # type: ignore[misc]
    with pytest.raises(FrozenInstanceError):
        SMALL_BATCHES.max_num_seqs = 8  # type: ignore[misc]
    full = EngineConfig(
        block_size=8, num_blocks=40, check_invariants=True, tensor_parallel_size=2, fused_all_reduce_norm=True,
        speculative=SpeculativeConfig("ngram", 2), batch_invariant=True, max_model_len=128,
    )  # fmt: skip
    draft = full.for_draft_model()
    assert (draft.speculative, draft.check_invariants, draft.tensor_parallel_size, draft.fused_all_reduce_norm) == (
        None, False, 1, False,
    )  # fmt: skip
    assert (draft.block_size, draft.num_blocks, draft.batch_invariant, draft.max_model_len) == (8, 40, True, 128)


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
