"""Reading Hugging Face checkpoints: config.json plus safetensors (single file or sharded).

Pickled `.bin` weights are refused: loading them runs arbitrary code. Every tensor the model
needs must be present with the shape the config implies, and nothing unknown may be left over.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from spec.engine import default_device
from spec.errors import CheckpointError
from spec.model_config import ModelConfig

logger = logging.getLogger(__name__)

SINGLE_FILE = "model.safetensors"
SHARD_INDEX = "model.safetensors.index.json"
HUB_PATTERNS = [
    "config.json",
    "generation_config.json",
    "*.safetensors",
    "*.safetensors.index.json",
    "tokenizer*",
    "*.txt",
    "*.model",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
]
# Tensors some checkpoints carry that no engine needs.
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}


def parse_dtype(name: str | torch.dtype, config: ModelConfig | None = None) -> torch.dtype:
    """'float32' | 'float16' | 'bfloat16' | 'auto' (the checkpoint's own dtype) or a torch.dtype."""
    if isinstance(name, torch.dtype):
        if name not in DTYPES.values():
            raise CheckpointError(f"unsupported dtype {name}; use one of {', '.join(DTYPES)}")
        return name
    if name == "auto":
        return DTYPES.get(config.torch_dtype if config else "float32", torch.float32)
    if name not in DTYPES:
        raise CheckpointError(f"unsupported dtype {name!r}; use one of auto, {', '.join(DTYPES)}")
    return DTYPES[name]


def resolve_checkpoint(model: str | os.PathLike[str]) -> Path:
    """A local checkpoint directory, or a hub id downloaded (or found in the local hub cache)."""
    path = Path(model).expanduser()
    if path.is_dir():
        return path
    if path.exists():
        raise CheckpointError(f"{path} is a file; a checkpoint is a directory holding config.json and safetensors")
    text = str(model)
    if text.startswith((".", "/", "~")) or text.count("/") != 1:
        raise CheckpointError(f"no checkpoint directory at {text!r} (and it is not a hub id of the form owner/name)")
    return _download(text)


def _download(repo_id: str) -> Path:
    try:
        from huggingface_hub import snapshot_download
    except ImportError as error:  # pragma: no cover - huggingface_hub is a dependency
        raise CheckpointError("huggingface_hub is needed to fetch hub checkpoints") from error
    try:
        return Path(snapshot_download(repo_id, allow_patterns=HUB_PATTERNS))
    except Exception as online_error:
        try:
            return Path(snapshot_download(repo_id, allow_patterns=HUB_PATTERNS, local_files_only=True))
        except Exception:
            raise CheckpointError(
                f"cannot fetch checkpoint {repo_id!r} from the Hugging Face hub and it is not in the local cache "
                f"(offline?): {type(online_error).__name__}: {online_error}"
            ) from online_error


def load_model_config(checkpoint: Path) -> ModelConfig:
    return ModelConfig.from_json_file(checkpoint / "config.json")


def weight_files(checkpoint: Path) -> list[Path]:
    """The safetensors files of a checkpoint, from its shard index when it has one."""
    index = checkpoint / SHARD_INDEX
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as error:
            raise CheckpointError(f"shard index {index} is not a valid safetensors index: {error}") from error
        files = sorted({checkpoint / name for name in weight_map.values()})
        missing = [str(f) for f in files if not f.is_file()]
        if missing:
            raise CheckpointError(f"shard index {index} names missing files: {', '.join(missing)}")
        return files
    single = checkpoint / SINGLE_FILE
    if single.is_file():
        return [single]
    others = sorted(checkpoint.glob("*.safetensors"))
    if others:
        return others
    pickled = sorted(p.name for p in checkpoint.glob("*.bin")) + sorted(p.name for p in checkpoint.glob("*.pt"))
    if pickled:
        raise CheckpointError(
            f"{checkpoint} holds only pickled weights ({', '.join(pickled)}); twinfer refuses them because loading "
            "pickles can run arbitrary code. Convert the checkpoint to safetensors."
        )
    raise CheckpointError(f"no safetensors weights in {checkpoint}")


def iter_tensors(checkpoint: Path, device: str | torch.device = "cpu") -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) for every tensor of every safetensors file, as stored."""
    from safetensors import SafetensorError, safe_open

    for file in weight_files(checkpoint):
        try:
            with safe_open(str(file), framework="pt", device=str(device)) as handle:
                for name in handle.keys():
                    yield name, handle.get_tensor(name)
        except (SafetensorError, OSError, ValueError, RuntimeError) as error:
            raise CheckpointError(f"cannot read {file} (truncated or corrupt safetensors?): {error}") from error


def expected_weight_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor name the model needs, with its shape (Hugging Face naming)."""
    hidden, heads, kv_heads, head_dim = (
        config.hidden_size,
        config.num_attention_heads,
        config.num_key_value_heads,
        config.head_dim,
    )
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (config.vocab_size, hidden),
        "model.norm.weight": (hidden,),
    }
    if not config.tie_word_embeddings:
        shapes["lm_head.weight"] = (config.vocab_size, hidden)
    for layer in range(config.num_hidden_layers):
        prefix = f"model.layers.{layer}"
        shapes.update(
            {
                f"{prefix}.input_layernorm.weight": (hidden,),
                f"{prefix}.post_attention_layernorm.weight": (hidden,),
                f"{prefix}.self_attn.q_proj.weight": (heads * head_dim, hidden),
                f"{prefix}.self_attn.k_proj.weight": (kv_heads * head_dim, hidden),
                f"{prefix}.self_attn.v_proj.weight": (kv_heads * head_dim, hidden),
                f"{prefix}.self_attn.o_proj.weight": (hidden, heads * head_dim),
                f"{prefix}.mlp.gate_proj.weight": (config.intermediate_size, hidden),
                f"{prefix}.mlp.up_proj.weight": (config.intermediate_size, hidden),
                f"{prefix}.mlp.down_proj.weight": (hidden, config.intermediate_size),
            }
        )
        traits = config.traits
        if traits.use_qk_norm:
            shapes[f"{prefix}.self_attn.q_norm.weight"] = (head_dim,)
            shapes[f"{prefix}.self_attn.k_norm.weight"] = (head_dim,)
        if traits.qkv_bias:
            shapes[f"{prefix}.self_attn.q_proj.bias"] = (heads * head_dim,)
            shapes[f"{prefix}.self_attn.k_proj.bias"] = (kv_heads * head_dim,)
            shapes[f"{prefix}.self_attn.v_proj.bias"] = (kv_heads * head_dim,)
        if traits.o_proj_bias:
            shapes[f"{prefix}.self_attn.o_proj.bias"] = (hidden,)
        if traits.mlp_bias:
            shapes[f"{prefix}.mlp.gate_proj.bias"] = (config.intermediate_size,)
            shapes[f"{prefix}.mlp.up_proj.bias"] = (config.intermediate_size,)
            shapes[f"{prefix}.mlp.down_proj.bias"] = (hidden,)
    return shapes


def is_ignored_tensor(name: str, config: ModelConfig) -> bool:
    """Tensors a checkpoint may carry that no model reads (rotary caches; a tied checkpoint's lm_head)."""
    return name.endswith(IGNORED_SUFFIXES) or (name == "lm_head.weight" and config.tie_word_embeddings)


def check_tensor(
    name: str,
    shape: tuple[int, ...],
    is_float: bool,
    dtype_name: object,
    expected: Mapping[str, tuple[int, ...]],
    checkpoint: Path,
) -> None:
    """A stored tensor's shape (exactly the config's, so a transposed one is refused too) and float dtype."""
    if shape != expected[name]:
        raise CheckpointError(
            f"tensor {name!r} in {checkpoint} has shape {shape}, but the config implies {expected[name]}"
        )
    if not is_float:
        raise CheckpointError(f"tensor {name!r} has non-float dtype {dtype_name}")


def check_tensor_names(
    checkpoint: Path, config: ModelConfig, expected: Iterable[str], found: Iterable[str], unexpected: Sequence[str]
) -> None:
    """Every expected tensor found, and none the model does not use."""
    missing = sorted(set(expected) - set(found))
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise CheckpointError(f"checkpoint {checkpoint} is missing tensors: {shown}")
    if unexpected:
        shown = ", ".join(sorted(unexpected)[:5]) + (f" and {len(unexpected) - 5} more" if len(unexpected) > 5 else "")
        raise CheckpointError(
            f"checkpoint {checkpoint} has tensors the {config.architecture} model does not use: {shown}"
        )


def load_state_dict(
    checkpoint: Path, config: ModelConfig, dtype: torch.dtype, device: str | torch.device = "cpu"
) -> dict[str, torch.Tensor]:
    """All tensors the model needs, checked against the config and converted to `dtype` on `device`."""
    expected = expected_weight_shapes(config)
    loaded: dict[str, torch.Tensor] = {}
    unexpected: list[str] = []
    for name, tensor in iter_tensors(checkpoint):
        if is_ignored_tensor(name, config):
            continue
        if name not in expected:
            unexpected.append(name)
            continue
        check_tensor(name, tuple(tensor.shape), tensor.is_floating_point(), tensor.dtype, expected, checkpoint)
        loaded[name] = tensor.to(device=device, dtype=dtype)
    check_tensor_names(checkpoint, config, expected, loaded, unexpected)
    logger.info("loaded %d tensors from %s as %s", len(loaded), checkpoint, dtype)
    return loaded


@dataclass(frozen=True)
class OpenedCheckpoint:
    """A checkpoint resolved for an engine: where it is, its config, and the dtype and device to load it as."""

    path: Path
    config: ModelConfig
    dtype: torch.dtype
    device: torch.device


def open_checkpoint(
    model: str | os.PathLike[str], dtype: str | torch.dtype = "auto", device: torch.device | str | None = None
) -> OpenedCheckpoint:
    """Resolve a directory or hub id, read its config, and settle dtype ("auto": the checkpoint's) and device
    (default: CUDA when available); what every engine's from_pretrained does before loading weights."""
    path = resolve_checkpoint(model)
    config = load_model_config(path)
    target = torch.device(device) if device is not None else default_device()
    return OpenedCheckpoint(path, config, parse_dtype(dtype, config), target)
