"""Built-in tiny checkpoints (Qwen3 by default; Llama and Qwen2 too): random weights made by
transformers, deterministic for a seed.

Nothing here can download weights, so tests and the CLI default build their own checkpoint in
Hugging Face format (config.json, safetensors, tokenizer files) and load it through the real
loading code.
"""

from __future__ import annotations

import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

# A small English corpus for the byte-level BPE tokenizer; its merges only need to be plausible.
_TOKENIZER_CORPUS = """
The quick brown fox jumps over the lazy dog. A verified inference engine computes the same tokens
as its reference, token by token. Attention reads keys and values from a paged cache; blocks that
hold a shared prefix are reused across requests. The scheduler admits waiting requests first come
first served, chunks long prompts, and preempts the newest request when memory runs out.
Once upon a time there was a small model with random weights. It spoke in riddles and numbers:
one two three four five six seven eight nine ten. Hello world! How are you today? I am fine.
""".strip()

END_OF_TEXT = "<|endoftext|>"


@dataclass(frozen=True)
class TinyModelShape:
    """The shape of the built-in tiny model: small enough for CPU tests, GQA, several layers."""

    hidden_size: int = 64
    intermediate_size: int = 128
    num_hidden_layers: int = 3
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 16
    max_position_embeddings: int = 1024
    tokenizer_vocab_size: int = 384
    initializer_range: float = 0.15
    tie_word_embeddings: bool = True
    attention_bias: bool = False  # Qwen3 and Llama only (Qwen2 always has q/k/v biases)
    mlp_bias: bool = False  # Llama only


# Short names for the CLI -> transformers model class names (each also a supported architecture).
TINY_ARCHITECTURES = {"qwen3": "Qwen3ForCausalLM", "llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}


def build_tokenizer(vocab_size: int):  # -> transformers.PreTrainedTokenizerFast
    """A byte-level BPE tokenizer trained on the built-in corpus (deterministic)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[END_OF_TEXT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator([_TOKENIZER_CORPUS], trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=END_OF_TEXT, pad_token=END_OF_TEXT)


def write_tiny_model(
    directory: str | os.PathLike[str],
    seed: int = 0,
    shape: TinyModelShape = TinyModelShape(),
    architecture: str = "qwen3",
) -> Path:
    """Write a Hugging Face format checkpoint with random weights to `directory`.

    architecture: "qwen3" (the default model), "llama" or "qwen2".
    """
    import torch

    if architecture not in TINY_ARCHITECTURES:
        raise ValueError(f"unknown tiny architecture {architecture!r}; choose from {', '.join(TINY_ARCHITECTURES)}")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(shape.tokenizer_vocab_size)
    eos_id = tokenizer.convert_tokens_to_ids(END_OF_TEXT)
    config_class, model_class = _transformers_classes(architecture)
    extra = {"attention_bias": shape.attention_bias} if architecture != "qwen2" else {}
    if architecture == "llama":
        extra["mlp_bias"] = shape.mlp_bias
    config = config_class(
        vocab_size=len(tokenizer),
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_hidden_layers,
        num_attention_heads=shape.num_attention_heads,
        num_key_value_heads=shape.num_key_value_heads,
        head_dim=shape.head_dim,
        max_position_embeddings=shape.max_position_embeddings,
        initializer_range=shape.initializer_range,
        tie_word_embeddings=shape.tie_word_embeddings,
        rms_norm_eps=1e-6,
        bos_token_id=eos_id,
        eos_token_id=eos_id,
        pad_token_id=eos_id,
        **extra,
    )
    generator_state = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)
        model = model_class(config)
        # Norm weights start at exactly 1 and biases at 0: perturb them so they are exercised too.
        with torch.no_grad():
            for name, parameter in model.named_parameters():
                if name.endswith(("norm.weight", ".bias")):
                    parameter.add_(torch.randn_like(parameter) * 0.1)
    finally:
        torch.random.set_rng_state(generator_state)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    logger.info("wrote tiny %s checkpoint (seed %d, vocab %d) to %s", architecture, seed, len(tokenizer), directory)
    return directory


def _transformers_classes(architecture: str) -> tuple[type, type]:
    import transformers

    model_class = getattr(transformers, TINY_ARCHITECTURES[architecture])
    return model_class.config_class, model_class


def default_cache_dir() -> Path:
    root = os.environ.get("TWINFER_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"), "twinfer"
    )
    return Path(root)


def ensure_tiny_model(seed: int = 0, cache_dir: Path | None = None) -> Path:
    """The default tiny checkpoint for `seed`, created in the cache directory on first use."""
    directory = (cache_dir or default_cache_dir()) / f"tiny-qwen3-seed{seed}"
    if directory.is_dir():
        return directory
    logger.info("creating the built-in tiny model in %s", directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    # Write beside the target and rename, so a crash or a concurrent run never leaves half a checkpoint.
    with tempfile.TemporaryDirectory(dir=directory.parent) as scratch:
        written = write_tiny_model(Path(scratch) / "checkpoint", seed)
        try:
            written.rename(directory)
        except OSError:
            if not directory.is_dir():  # another process finishing first is fine
                raise
    return directory
