"""Checkpoint loading: every broken checkpoint is a clear error that names the problem."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from reference.engine import ReferenceEngine
from spec.checkpoint import (
    HUB_PATTERNS,
    expected_weight_shapes,
    is_ignored_tensor,
    iter_tensors,
    load_model_config,
    load_state_dict,
    open_checkpoint,
    parse_dtype,
    resolve_checkpoint,
)
from spec.engine import default_device
from spec.errors import CheckpointError, ConfigError
from tests.engines import FAST_DEVICE
from twinfer.models.tiny_model import TinyModelShape, write_tiny_model


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


@pytest.mark.parametrize(
    "device, kind, message",
    [("cuda:x", ValueError, "invalid digit"), ("mps", RuntimeError, "mps")],
    ids=["unparsable-device-index", "device-not-in-this-torch"],
)
def test_a_reading_error_of_any_kind_is_a_checkpoint_error_naming_the_file(
    tiny_checkpoint: Path, device: str, kind: type[Exception], message: str
) -> None:
    """iter_tensors turns what safetensors and torch raise while reading into a CheckpointError that names the
    file: no malformed file was found that raises other than SafetensorError or OSError (local_2core_j.json),
    but the device it reads to can: an index safetensors cannot parse is a ValueError, a device this torch
    build lacks (MPS off macOS) a RuntimeError."""
    if device == "mps" and torch.backends.mps.is_available():
        pytest.skip("this torch can read to MPS")
    with pytest.raises(CheckpointError, match=rf"cannot read .*model\.safetensors .*{message}") as error:
        list(iter_tensors(tiny_checkpoint, device))
    assert isinstance(error.value.__cause__, kind)


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


@pytest.mark.parametrize(
    ("architecture", "shape"),
    [
        ("llama", TinyModelShape(attention_bias=True, mlp_bias=True)),
        ("llama", TinyModelShape(tie_word_embeddings=False)),
        ("qwen2", TinyModelShape()),
        ("qwen3", TinyModelShape(attention_bias=True)),
    ],
    ids=["llama-biases", "llama-untied", "qwen2", "qwen3-attention-bias"],
)
def test_every_architecture_loads_the_tensors_transformers_writes(
    architecture: str, shape: TinyModelShape, tmp_path: Path
) -> None:
    """A checkpoint transformers wrote (biases on q, k, v, o and the MLP; an untied lm_head) loads whole: the
    shapes expected from the config are exactly those stored, tensor for tensor."""
    checkpoint = write_tiny_model(tmp_path / "model", seed=3, shape=shape, architecture=architecture)
    config = load_model_config(checkpoint)
    stored = {name: tuple(tensor.shape) for name, tensor in load_file(str(checkpoint / "model.safetensors")).items()}
    kept = {name: size for name, size in stored.items() if not is_ignored_tensor(name, config)}
    assert expected_weight_shapes(config) == kept
    state = load_state_dict(checkpoint, config, torch.float32)
    assert {name: tuple(tensor.shape) for name, tensor in state.items()} == kept


@pytest.mark.parametrize("count", [1, 5, 6, 9])
def test_missing_and_unexpected_tensors_are_listed_five_then_counted(
    checkpoint_copy: Path, tiny_checkpoint: Path, count: int
) -> None:
    """Up to five missing (or unexpected) tensor names are listed; past five, the first five and how many more."""
    more = f" and {count - 5} more" if count > 5 else ""
    names = sorted(expected_weight_shapes(load_model_config(checkpoint_copy)))[:count]
    rewrite_weights(checkpoint_copy, lambda tensors: [tensors.pop(name) for name in names])
    with pytest.raises(CheckpointError, match=f"missing tensors: {re.escape(', '.join(names[:5]))}{more}$"):
        load(checkpoint_copy)
    shutil.copy(tiny_checkpoint / "model.safetensors", checkpoint_copy / "model.safetensors")
    extra = sorted(f"model.layers.9.extra_{number}.weight" for number in range(count))
    rewrite_weights(checkpoint_copy, lambda tensors: tensors.update({name: torch.zeros(2) for name in extra}))
    with pytest.raises(CheckpointError, match=f"does not use: {re.escape(', '.join(extra[:5]))}{more}$"):
        load(checkpoint_copy)


def test_dtypes_are_parsed_by_name_and_auto_is_the_checkpoints(tiny_checkpoint: Path) -> None:
    """A supported torch dtype passes through and another is refused; "auto" is the config's torch_dtype, float32
    for a config with none it supports and with no config."""
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        assert parse_dtype(dtype) is dtype
    with pytest.raises(CheckpointError, match="unsupported dtype torch.int8; use one of float32, float16, bfloat16"):
        parse_dtype(torch.int8)
    config = load_model_config(tiny_checkpoint)
    for stored, expected in (("bfloat16", torch.bfloat16), ("float16", torch.float16), ("int4", torch.float32)):
        assert parse_dtype("auto", dataclasses.replace(config, torch_dtype=stored)) is expected
    assert parse_dtype("auto") is torch.float32


def test_open_checkpoint_settles_dtype_and_device(tiny_checkpoint: Path) -> None:
    """The device given is the device (meta here); none given is the default (CUDA where available); "auto" is
    the checkpoint's dtype."""
    opened = open_checkpoint(tiny_checkpoint, "auto", "meta")
    assert (opened.path, opened.device, opened.dtype) == (tiny_checkpoint, torch.device("meta"), parse_dtype("auto"))
    assert opened.config == load_model_config(tiny_checkpoint)
    assert open_checkpoint(str(tiny_checkpoint), torch.float16).device == default_device()
    with pytest.raises(dataclasses.FrozenInstanceError):
        opened.dtype = torch.float16  # type: ignore[misc]


def test_tensors_no_model_reads_are_skipped(checkpoint_copy: Path, tiny_checkpoint: Path) -> None:
    """A rotary cache (any layer's rotary_emb.inv_freq) and a tied checkpoint's stored lm_head are skipped, and
    every tensor after them still loads."""

    def add_unread(tensors: dict[str, torch.Tensor]) -> None:
        tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"].clone()
        tensors["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(16)

    rewrite_weights(checkpoint_copy, add_unread)
    loaded, plain = load(checkpoint_copy), load(tiny_checkpoint)
    assert loaded.keys() == plain.keys() and all(torch.equal(loaded[name], plain[name]) for name in plain)


@pytest.mark.parametrize("index", ["{}", "[]", "not json"], ids=["no-weight-map", "a-list", "not-json"])
def test_a_shard_index_that_is_not_one_is_named(checkpoint_copy: Path, index: str) -> None:
    (checkpoint_copy / "model.safetensors.index.json").write_text(index)
    with pytest.raises(CheckpointError, match="is not a valid safetensors index"):
        load(checkpoint_copy)


def test_a_weights_path_that_cannot_be_read_is_named(checkpoint_copy: Path) -> None:
    """A directory named like a weights file (the only one) is an error naming it, not an OSError."""
    (checkpoint_copy / "model.safetensors").unlink()
    (checkpoint_copy / "weights.safetensors").mkdir()
    with pytest.raises(CheckpointError, match=r"cannot read .*weights\.safetensors"):
        load(checkpoint_copy)


def test_paths_that_are_neither_a_directory_nor_a_hub_id_are_refused(tmp_path: Path) -> None:
    """A relative path (even with one slash), a path of three parts and a file are refused without asking the hub."""
    for model in ("./nowhere", "owner/name/extra", "~/nowhere/model"):
        with pytest.raises(CheckpointError, match=f"no checkpoint directory at '{re.escape(model)}'"):
            resolve_checkpoint(model)
    (tmp_path / "weights.bin").write_bytes(b"")
    with pytest.raises(CheckpointError, match="is a file; a checkpoint is a directory"):
        resolve_checkpoint(tmp_path / "weights.bin")


def test_a_hub_id_falls_back_to_the_local_cache_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """When the hub cannot be reached, a hub id is looked up in the local cache alone (local_files_only), with the
    same file patterns; without huggingface_hub a hub id is a CheckpointError naming it."""
    import huggingface_hub

    calls: list[dict[str, object]] = []

    def snapshot_download(repo_id: str, **options: object) -> str:
        calls.append(options)
        if not options.get("local_files_only"):
            raise ConnectionError("no network")
        return str(tmp_path / repo_id)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    assert resolve_checkpoint("owner/model") == tmp_path / "owner" / "model"
    assert [call.get("local_files_only", False) for call in calls] == [False, True]
    assert all(call["allow_patterns"] == HUB_PATTERNS for call in calls)
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)
    with pytest.raises(CheckpointError, match="huggingface_hub is needed to fetch hub checkpoints"):
        resolve_checkpoint("owner/model")
