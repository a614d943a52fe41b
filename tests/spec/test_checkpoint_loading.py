"""Checkpoint loading: every broken checkpoint is a clear error that names the problem."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from reference.engine import ReferenceEngine
from spec.checkpoint import expected_weight_shapes, load_model_config, load_state_dict, parse_dtype, resolve_checkpoint
from spec.errors import CheckpointError, ConfigError
from tests.engines import FAST_DEVICE


@pytest.fixture
def checkpoint_copy(tiny_checkpoint: Path, tmp_path: Path) -> Path:
    target = tmp_path / "checkpoint"
    shutil.copytree(tiny_checkpoint, target)
    return target


def rewrite_weights(checkpoint: Path, change) -> None:
    tensors = load_file(str(checkpoint / "model.safetensors"))
    change(tensors)
    save_file(tensors, str(checkpoint / "model.safetensors"), metadata={"format": "pt"})


def load(checkpoint: Path) -> dict[str, torch.Tensor]:
    config = load_model_config(checkpoint)
    return load_state_dict(checkpoint, config, torch.float32)


def test_loads_every_expected_tensor_with_tied_embeddings(tiny_checkpoint: Path) -> None:
    config = load_model_config(tiny_checkpoint)
    state = load_state_dict(tiny_checkpoint, config, torch.float32)
    assert config.tie_word_embeddings and "lm_head.weight" not in state
    assert set(state) == set(expected_weight_shapes(config))


def test_dtype_conversion(tiny_checkpoint: Path) -> None:
    config = load_model_config(tiny_checkpoint)
    state = load_state_dict(tiny_checkpoint, config, torch.float16)
    assert {t.dtype for t in state.values()} == {torch.float16}
    with pytest.raises(CheckpointError, match="unsupported dtype 'int8'"):
        parse_dtype("int8")


def test_missing_tensor_is_named(checkpoint_copy: Path) -> None:
    rewrite_weights(checkpoint_copy, lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
    with pytest.raises(CheckpointError, match=r"missing tensors: model\.layers\.1\.mlp\.up_proj\.weight"):
        load(checkpoint_copy)


def test_wrong_shape_is_named(checkpoint_copy: Path) -> None:
    def shrink(tensors: dict[str, torch.Tensor]) -> None:
        tensors["model.layers.0.self_attn.k_proj.weight"] = tensors["model.layers.0.self_attn.k_proj.weight"][:-1]

    rewrite_weights(checkpoint_copy, shrink)
    with pytest.raises(CheckpointError, match=r"k_proj\.weight.*shape \(31, 64\).*implies \(32, 64\)"):
        load(checkpoint_copy)


def test_unexpected_tensor_is_named(checkpoint_copy: Path) -> None:
    rewrite_weights(checkpoint_copy, lambda t: t.update({"model.layers.9.extra.weight": torch.zeros(2)}))
    with pytest.raises(CheckpointError, match=r"does not use: model\.layers\.9\.extra\.weight"):
        load(checkpoint_copy)


def test_untied_checkpoint_needs_lm_head(checkpoint_copy: Path) -> None:
    config_path = checkpoint_copy / "config.json"
    raw = json.loads(config_path.read_text())
    raw["tie_word_embeddings"] = False
    config_path.write_text(json.dumps(raw))
    with pytest.raises(CheckpointError, match=r"missing tensors: lm_head\.weight"):
        load(checkpoint_copy)
    rewrite_weights(checkpoint_copy, lambda t: t.update({"lm_head.weight": t["model.embed_tokens.weight"].clone() * 2}))
    state = load(checkpoint_copy)
    assert torch.equal(state["lm_head.weight"], state["model.embed_tokens.weight"] * 2)


def test_unsupported_architecture_is_named(checkpoint_copy: Path) -> None:
    config_path = checkpoint_copy / "config.json"
    raw = json.loads(config_path.read_text())
    raw["architectures"] = ["MambaForCausalLM"]
    config_path.write_text(json.dumps(raw))
    with pytest.raises(ConfigError, match="unsupported architecture 'MambaForCausalLM'"):
        load_model_config(checkpoint_copy)


@pytest.mark.parametrize("field", ["hidden_size", "vocab_size", "num_hidden_layers", "rms_norm_eps"])
def test_missing_config_field_is_named(checkpoint_copy: Path, field: str) -> None:
    config_path = checkpoint_copy / "config.json"
    raw = json.loads(config_path.read_text())
    del raw[field]
    config_path.write_text(json.dumps(raw))
    with pytest.raises(ConfigError, match=f"missing the required field '{field}'"):
        load_model_config(checkpoint_copy)


def test_truncated_safetensors_is_a_clear_error(checkpoint_copy: Path) -> None:
    weights = checkpoint_copy / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=r"cannot read .*model\.safetensors \(truncated or corrupt"):
        load(checkpoint_copy)


def test_pickled_bin_weights_are_refused(checkpoint_copy: Path) -> None:
    tensors = load_file(str(checkpoint_copy / "model.safetensors"))
    (checkpoint_copy / "model.safetensors").unlink()
    torch.save(tensors, checkpoint_copy / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match=r"only pickled weights \(pytorch_model\.bin\).*refuses"):
        load(checkpoint_copy)


def test_sharded_checkpoint_loads_like_single_file(checkpoint_copy: Path, tiny_checkpoint: Path) -> None:
    tensors = load_file(str(checkpoint_copy / "model.safetensors"))
    (checkpoint_copy / "model.safetensors").unlink()
    names = sorted(tensors)
    shards = {
        "model-00001-of-00002.safetensors": names[: len(names) // 2],
        "model-00002-of-00002.safetensors": names[len(names) // 2 :],
    }
    weight_map = {}
    for file, shard_names in shards.items():
        save_file({n: tensors[n] for n in shard_names}, str(checkpoint_copy / file), metadata={"format": "pt"})
        weight_map.update({n: file for n in shard_names})
    (checkpoint_copy / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map})
    )
    sharded, single = load(checkpoint_copy), load(tiny_checkpoint)
    assert sharded.keys() == single.keys()
    assert all(torch.equal(sharded[name], single[name]) for name in single)


def test_shard_index_naming_a_missing_file(checkpoint_copy: Path) -> None:
    (checkpoint_copy / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"x": "gone.safetensors"}}))
    with pytest.raises(CheckpointError, match="names missing files"):
        load(checkpoint_copy)


def test_missing_directory_and_offline_hub_id(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(CheckpointError, match="no checkpoint directory"):
        resolve_checkpoint(tmp_path / "nowhere" / "model")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    with pytest.raises(CheckpointError, match=r"cannot fetch checkpoint 'twinfer-test/not-a-model'.*offline"):
        resolve_checkpoint("twinfer-test/not-a-model")


def test_missing_config_json(checkpoint_copy: Path) -> None:
    (checkpoint_copy / "config.json").unlink()
    with pytest.raises(ConfigError, match="no config.json"):
        ReferenceEngine.from_pretrained(checkpoint_copy, device="cpu")


@pytest.mark.parametrize("engine_name", ["reference", "fast"])
def test_a_transposed_tensor_with_the_same_size_is_refused(checkpoint_copy: Path, engine_name: str) -> None:
    """gate_proj stored as [hidden, intermediate] instead of [intermediate, hidden]: same number of
    elements, so only the shape check can catch it, before either engine builds anything."""
    from twinfer.registry import engine_class

    name = "model.layers.1.mlp.gate_proj.weight"

    def transpose(tensors: dict[str, torch.Tensor]) -> None:
        tensors[name] = tensors[name].T.contiguous()

    rewrite_weights(checkpoint_copy, transpose)
    with pytest.raises(CheckpointError, match=r"gate_proj\.weight.*has shape \(64, 128\).*implies \(128, 64\)"):
        device = torch.device(FAST_DEVICE if engine_name == "fast" else "cpu")
        engine_class(engine_name, device).from_pretrained(checkpoint_copy, None, "float32", device)
