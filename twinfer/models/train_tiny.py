"""Train `stdlib-tiny`: a small Qwen3 model on the Python standard library's own source files.

Run as `python -m twinfer.models.train_tiny OUT_DIR` (or `twinfer train-tiny OUT_DIR`). About a minute on
one H200 with the defaults (25 s of it training); `--max-steps 3 --max-files 20 --batch-size 2
--seq-len 64` runs on a CPU in seconds.

Two choices serve bf16-against-fp32 comparisons: a z-loss keeps the logits' log-partition near 0, so
the largest logits are small numbers that bf16 holds finely, and the saved weights are rounded to
bf16 values (stored in fp32, as a bf16 checkpoint read in fp32 would be), so both dtypes run the
same weights.

Corpus: every `*.py` file under `sysconfig.get_paths()["stdlib"]`, in sorted order of its path
relative to that root, except
  * installed third-party packages (`site-packages`, `dist-packages`): not the standard library;
  * test directories (`test`, `tests`, `idle_test`): some distributions ship them and some do not,
    and they hold deliberately malformed files, so leaving them out keeps the corpus the same
    wherever CPython's own library is installed;
  * files that are not valid UTF-8 (counted in the model card).
A file is held out when the SHA-256 of its relative path, read as a number in [0, 1), falls in
the last 5%: the split depends on the path alone, never on the machine or the file order.

Tokenizer: byte-level BPE of 4,096 tokens trained on the training files, with `<|endoftext|>`
as end-of-sequence token and as the separator after every document. Its pre-tokens keep a space
with the word before it (see PRE_TOKEN_PATTERN), so `def ` is one token, as in the training text.

Model: transformers' own `Qwen3ForCausalLM` (the oracle's implementation, not twinfer's), with
grouped-query attention and tied embeddings, trained with AdamW (fused on CUDA) under bf16
autocast on CUDA and in fp32 on CPU. Seeds are fixed: the initial weights and the order of the
training windows are the same on every run; GPU kernels are not bitwise deterministic.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import math
import platform
import sys
import sysconfig
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from spec.errors import ConfigError

logger = logging.getLogger(__name__)

END_OF_TEXT = "<|endoftext|>"
HELD_OUT_FRACTION = 0.05
EXCLUDED_DIRECTORIES = frozenset({"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"})
# The acceptance limit for the committed checkpoint: model.safetensors in fp32.
MAX_CHECKPOINT_BYTES = 16_000_000
# Head sizes twinfer's Triton attention kernels are built for.
SUPPORTED_HEAD_DIMS = (16, 32, 64, 128, 256)
CHECKPOINT_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "README.md")


# -- corpus -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Corpus:
    """The standard library's source files, split by path hash, as decoded text."""

    root: Path
    train_paths: tuple[str, ...]  # relative to root, sorted
    held_out_paths: tuple[str, ...]
    train_texts: tuple[str, ...]
    held_out_texts: tuple[str, ...]
    undecodable_paths: tuple[str, ...]  # not valid UTF-8, left out

    @property
    def train_bytes(self) -> int:
        return sum(len(text.encode()) for text in self.train_texts)

    @property
    def held_out_bytes(self) -> int:
        return sum(len(text.encode()) for text in self.held_out_texts)


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def is_held_out(relative_path: str, fraction: float = HELD_OUT_FRACTION) -> bool:
    """True for the files whose path hashes into the last `fraction` of [0, 1)."""
    digest = hashlib.sha256(relative_path.encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 >= 1.0 - fraction


def corpus_paths(root: Path) -> list[str]:
    """Relative POSIX paths of the corpus files under `root`, sorted."""
    paths = []
    for path in root.rglob("*.py"):
        relative = path.relative_to(root)
        if EXCLUDED_DIRECTORIES.intersection(relative.parts[:-1]) or not path.is_file():
            continue
        paths.append(relative.as_posix())
    return sorted(paths)


def load_corpus(root: Path | None = None, max_files: int | None = None) -> Corpus:
    """Read and split the corpus. `max_files` keeps the first max_files training files and the
    first max(1, max_files // 20) held-out files (for quick runs)."""
    root = root or stdlib_root()
    paths = corpus_paths(root)
    if not paths:
        raise ConfigError(f"no Python source files under {root}; is this the standard library?")
    train = [p for p in paths if not is_held_out(p)]
    held_out = [p for p in paths if is_held_out(p)]
    if max_files is not None:
        train, held_out = train[:max_files], held_out[: max(1, max_files // 20)]
    train_kept, train_texts, undecodable = _read_texts(root, train)
    held_kept, held_texts, undecodable_held = _read_texts(root, held_out)
    if not train_texts or not held_texts:
        raise ConfigError(f"the corpus under {root} needs at least one training and one held-out file")
    return Corpus(root, train_kept, held_kept, train_texts, held_texts, tuple(undecodable + undecodable_held))


def _read_texts(root: Path, paths: list[str]) -> tuple[tuple[str, ...], tuple[str, ...], list[str]]:
    kept, texts, undecodable = [], [], []
    for relative in paths:
        try:
            text = (root / relative).read_bytes().decode("utf-8")
        except UnicodeDecodeError:
            undecodable.append(relative)
            continue
        kept.append(relative)
        texts.append(text)
    return tuple(kept), tuple(texts), undecodable


# -- tokenizer ----------------------------------------------------------------------------------


# Pre-tokens: a run of word characters or of punctuation, each with at most one following space, or a
# run of whitespace (newline plus indentation). A space belongs to the word before it, not the one
# after it (as in GPT-2), so a prompt that ends in a space, like "def ", ends on a whole token just as
# "def " does inside the training text.
PRE_TOKEN_PATTERN = r"[\p{L}\p{N}_]+ ?|[^\s\p{L}\p{N}_]+ ?|\s+"


def train_tokenizer(texts: Sequence[str], vocab_size: int):  # -> transformers.PreTrainedTokenizerFast
    """Byte-level BPE trained on `texts`; `<|endoftext|>` is token 0, the eos and the pad token."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRE_TOKEN_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[END_OF_TEXT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=END_OF_TEXT, pad_token=END_OF_TEXT)


def encode_documents(tokenizer, texts: Sequence[str]) -> torch.Tensor:
    """All documents as one int64 stream, each followed by the end-of-text token."""
    eos_id = tokenizer.convert_tokens_to_ids(END_OF_TEXT)
    encoded = tokenizer.backend_tokenizer.encode_batch(list(texts), add_special_tokens=False)
    stream: list[int] = []
    for document in encoded:
        stream.extend(document.ids)
        stream.append(eos_id)
    return torch.tensor(stream, dtype=torch.int64)


def evenly_spaced_windows(stream: torch.Tensor, count: int, length: int) -> torch.Tensor:
    """`count` windows of `length` tokens spread evenly over `stream` (fewer if it is short)."""
    if stream.numel() < length:
        raise ConfigError(f"the token stream ({stream.numel()} tokens) is shorter than one window of {length}")
    last_start = stream.numel() - length
    count = min(count, last_start + 1)
    starts = [round(i * last_start / max(count - 1, 1)) for i in range(count)]
    return torch.stack([stream[s : s + length] for s in starts])


# -- model --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelShape:
    """The stdlib-tiny shape: about 3.8M parameters, 15.3 MB in fp32, 4 query heads per KV head."""

    vocab_size: int = 4096
    hidden_size: int = 256
    intermediate_size: int = 512
    num_hidden_layers: int = 5
    num_attention_heads: int = 8
    num_key_value_heads: int = 2
    head_dim: int = 32
    max_position_embeddings: int = 1024

    def __post_init__(self) -> None:
        if self.head_dim not in SUPPORTED_HEAD_DIMS:
            raise ConfigError(
                f"head_dim must be one of {SUPPORTED_HEAD_DIMS} (the Triton kernels'), got {self.head_dim}"
            )
        if not self.num_attention_heads > self.num_key_value_heads >= 1:
            raise ConfigError(
                "grouped-query attention needs more query heads than KV heads, got "
                f"{self.num_attention_heads} query and {self.num_key_value_heads} KV heads"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError("num_attention_heads must be a multiple of num_key_value_heads")


def build_model(shape: ModelShape, eos_id: int, seed: int):  # -> transformers.Qwen3ForCausalLM
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        **asdict(shape),
        tie_word_embeddings=True,
        rms_norm_eps=1e-6,
        bos_token_id=eos_id,
        eos_token_id=eos_id,
        pad_token_id=eos_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config)
    return model


# -- training -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class TrainSettings:
    max_steps: int
    batch_size: int
    seq_len: int
    learning_rate: float
    min_lr_ratio: float
    warmup_steps: int
    weight_decay: float
    grad_clip: float
    z_loss: float
    eval_every: int
    eval_windows: int
    seed: int
    max_train_seconds: float | None

    def __post_init__(self) -> None:
        for name in ("max_steps", "batch_size", "seq_len", "eval_every", "eval_windows"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.learning_rate > 0:
            raise ConfigError(f"learning rate must be > 0, got {self.learning_rate}")


@dataclass
class CurvePoint:
    step: int
    tokens_seen: int
    train_loss: float  # cross-entropy, mean over the steps since the previous point
    held_out_loss: float
    held_out_log_z: float  # mean log-partition of the held-out logits (z-loss pulls it to 0)
    elapsed_s: float


@dataclass
class TrainingRecord:
    curve: list[CurvePoint] = field(default_factory=list)
    steps_done: int = 0
    stopped_by_time: bool = False
    train_seconds: float = 0.0


def learning_rate_at(step: int, settings: TrainSettings) -> float:
    """Linear warm-up, then cosine decay to min_lr_ratio of the peak at max_steps."""
    if step < settings.warmup_steps:
        return settings.learning_rate * (step + 1) / settings.warmup_steps
    progress = (step - settings.warmup_steps) / max(settings.max_steps - settings.warmup_steps, 1)
    cosine = 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))
    return settings.learning_rate * (settings.min_lr_ratio + (1.0 - settings.min_lr_ratio) * cosine)


def make_optimizer(model: torch.nn.Module, settings: TrainSettings, device: torch.device) -> torch.optim.Optimizer:
    # Matrices (the tied embedding included) decay; norm weights do not.
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": settings.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=settings.learning_rate, betas=(0.9, 0.95), fused=device.type == "cuda")


@dataclass(frozen=True)
class LossTerms:
    cross_entropy: torch.Tensor  # mean next-token cross-entropy (nats)
    log_z: torch.Tensor  # mean log-partition (logsumexp of the logits)
    log_z_squared: torch.Tensor  # mean squared log-partition: the z-loss


def causal_lm_losses(model: torch.nn.Module, windows: torch.Tensor, autocast_bf16: bool) -> LossTerms:
    """Loss terms over windows [batch, seq_len + 1], predicting each token from those before it."""
    inputs, targets = windows[:, :-1], windows[:, 1:]
    with torch.autocast(device_type=windows.device.type, dtype=torch.bfloat16, enabled=autocast_bf16):
        logits = model(input_ids=inputs).logits
    logits = logits.float().flatten(0, 1)
    log_z = torch.logsumexp(logits, dim=-1)
    cross_entropy = (log_z - logits.gather(1, targets.reshape(-1, 1))[:, 0]).mean()
    return LossTerms(cross_entropy, log_z.mean(), log_z.square().mean())


@torch.no_grad()
def held_out_losses(
    model: torch.nn.Module, windows: torch.Tensor, autocast_bf16: bool, batch_size: int
) -> tuple[float, float]:
    """(cross-entropy, mean log-partition) over the held-out windows."""
    model.eval()
    cross_entropy = log_z = 0.0
    for start in range(0, windows.shape[0], batch_size):
        chunk = windows[start : start + batch_size]
        terms = causal_lm_losses(model, chunk, autocast_bf16)
        cross_entropy += terms.cross_entropy.item() * chunk.shape[0]
        log_z += terms.log_z.item() * chunk.shape[0]
    model.train()
    return cross_entropy / windows.shape[0], log_z / windows.shape[0]


def train(
    model: torch.nn.Module,
    train_stream: torch.Tensor,
    eval_windows: torch.Tensor,
    settings: TrainSettings,
    device: torch.device,
) -> TrainingRecord:
    """Train in place on random windows of `train_stream` (drawn from a generator seeded once)."""
    window = settings.seq_len + 1
    if train_stream.numel() <= window:
        raise ConfigError(f"the training stream ({train_stream.numel()} tokens) is shorter than one window")
    autocast_bf16 = device.type == "cuda"
    model.to(device).train()
    optimizer = make_optimizer(model, settings, device)
    stream = train_stream.to(device)
    eval_windows = eval_windows.to(device)
    offsets_generator = torch.Generator().manual_seed(settings.seed)
    window_offsets = torch.arange(window, device=device)
    record = TrainingRecord()
    started = time.perf_counter()
    losses_since_point: list[torch.Tensor] = []
    for step in range(settings.max_steps):
        starts = torch.randint(0, stream.numel() - window + 1, (settings.batch_size,), generator=offsets_generator)
        windows = stream[starts.to(device)[:, None] + window_offsets]
        for group in optimizer.param_groups:
            group["lr"] = learning_rate_at(step, settings)
        terms = causal_lm_losses(model, windows, autocast_bf16)
        optimizer.zero_grad(set_to_none=True)
        (terms.cross_entropy + settings.z_loss * terms.log_z_squared).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), settings.grad_clip)
        optimizer.step()
        losses_since_point.append(terms.cross_entropy.detach())
        record.steps_done = step + 1
        elapsed = time.perf_counter() - started
        out_of_time = settings.max_train_seconds is not None and elapsed > settings.max_train_seconds
        if record.steps_done % settings.eval_every == 0 or record.steps_done == settings.max_steps or out_of_time:
            train_loss = torch.stack(losses_since_point).mean().item()
            losses_since_point.clear()
            evaluation = held_out_losses(model, eval_windows, autocast_bf16, settings.batch_size)
            point = CurvePoint(
                step=record.steps_done,
                tokens_seen=record.steps_done * settings.batch_size * settings.seq_len,
                train_loss=round(train_loss, 4),
                held_out_loss=round(evaluation[0], 4),
                held_out_log_z=round(evaluation[1], 3),
                elapsed_s=round(time.perf_counter() - started, 1),
            )
            record.curve.append(point)
            logger.info(
                "step %d/%d  train loss %.4f  held-out loss %.4f  log Z %.2f  lr %.2e  %.1fs  %.0f tokens/s",
                point.step,
                settings.max_steps,
                point.train_loss,
                point.held_out_loss,
                point.held_out_log_z,
                learning_rate_at(step, settings),
                point.elapsed_s,
                point.tokens_seen / max(point.elapsed_s, 1e-9),
            )
        if out_of_time:
            record.stopped_by_time = True
            logger.warning(
                "stopped after %d steps: the time budget of %ss ran out", record.steps_done, settings.max_train_seconds
            )
            break
    record.train_seconds = round(time.perf_counter() - started, 1)
    return record


# -- checkpoint ---------------------------------------------------------------------------------


def round_weights_to_bf16(model: torch.nn.Module) -> None:
    """Make every weight a bf16 value (kept in fp32), as in a bf16 checkpoint read in fp32: then an fp32
    run and a bf16 run use the same weights, and what differs between them is the arithmetic alone."""
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_(parameter.to(torch.bfloat16).to(parameter.dtype))


def save_checkpoint(model: torch.nn.Module, tokenizer, out_dir: Path) -> None:
    """config.json, model.safetensors (fp32) and the tokenizer in transformers' format, nothing else."""
    out_dir.mkdir(parents=True, exist_ok=True)
    model.to("cpu", torch.float32).save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    # generation_config.json and the like are not needed by any loader here; keep the checkpoint minimal.
    for path in out_dir.iterdir():
        if path.name not in CHECKPOINT_FILES:
            path.unlink()
    size = (out_dir / "model.safetensors").stat().st_size
    if size > MAX_CHECKPOINT_BYTES:
        raise ConfigError(f"model.safetensors is {size:,} bytes, over the {MAX_CHECKPOINT_BYTES:,}-byte limit")


def canonical_command(args: argparse.Namespace) -> str:
    """The command that reproduces this run, every setting spelled out."""
    parts = ["python -m twinfer.models.train_tiny", str(args.out_dir)]
    for name, value in sorted(vars(args).items()):
        if name in ("out_dir", "handler", "command", "verbose") or value is None or callable(value):
            continue
        flag = name.replace("_", "-")
        if isinstance(value, bool):
            parts.append(f"--{flag}" if value else f"--no-{flag}")
        else:
            parts.append(f"--{flag} {value}")
    return " ".join(parts)


def write_model_card(out_dir: Path, facts: dict) -> None:
    curve = facts["curve"]
    lines = [
        "# stdlib-tiny",
        "",
        "A small Qwen3 model (grouped-query attention, tied embeddings) trained on the Python standard",
        "library's own source files, so that twinfer's default model makes confident, stable predictions",
        "and prints Python-looking text. Made by `twinfer/models/train_tiny.py`; its acceptance figures are made",
        "by `twinfer/models/eval_tiny.py` (see `reports/results/trained_tiny/`).",
        "",
        "## Training command",
        "",
        "```bash",
        facts["command"],
        "```",
        "",
        "## Environment",
        "",
        f"- Python {facts['python_version']} ({facts['platform']}); torch {facts['torch']}, "
        f"transformers {facts['transformers']}, tokenizers {facts['tokenizers']}",
        f"- device: {facts['device']}",
        "",
        "## Data",
        "",
        "- corpus: `*.py` under the standard library root (`sysconfig.get_paths()['stdlib']`, here",
        f"  `{facts['stdlib_root']}`), sorted by relative path; `site-packages`, `dist-packages`, `test`, `tests`",
        "  and `idle_test` directories left out; a file is held out when the SHA-256 of its relative path falls",
        "  in the last 5%",
        f"- files: {facts['train_files']} training, {facts['held_out_files']} held out, "
        f"{facts['undecodable_files']} left out as not UTF-8",
        f"- bytes: {facts['train_bytes']:,} training, {facts['held_out_bytes']:,} held out",
        f"- tokens (byte-level BPE, vocabulary {facts['tokenizer_vocab']}, `{END_OF_TEXT}` after each file): "
        f"{facts['train_tokens']:,} training, {facts['held_out_tokens']:,} held out; pre-tokens are runs of word",
        "  characters or punctuation, each keeping one following space, and runs of whitespace, so `def ` is one",
        "  token",
        "",
        "## Model",
        "",
        f"- `Qwen3ForCausalLM`: {json.dumps(facts['shape'])}",
        f"- {facts['parameters']:,} parameters; model.safetensors {facts['safetensors_bytes']:,} bytes (fp32)",
        "",
        "## Training",
        "",
        f"- {facts['steps_done']} steps of {facts['batch_size']} windows of {facts['seq_len']} tokens "
        f"({facts['tokens_seen']:,} tokens, {facts['epochs']:.1f} epochs), in {facts['train_seconds']} s"
        + (" (stopped by the time budget)" if facts["stopped_by_time"] else ""),
        f"- AdamW (betas 0.9, 0.95; weight decay {facts['weight_decay']} on matrices), peak learning rate "
        f"{facts['learning_rate']}, {facts['warmup_steps']} warm-up steps, cosine decay to "
        f"{facts['min_lr_ratio']} of the peak, gradient clipping {facts['grad_clip']}; "
        f"{'bf16 autocast' if facts['autocast_bf16'] else 'fp32'}; seed {facts['seed']}",
        f"- z-loss: {facts['z_loss']} times the mean squared log-partition (logsumexp of the logits) is added to the",
        "  loss. It changes no prediction (softmax ignores a common shift) but keeps the log-partition near 0, so",
        "  the largest logits are small numbers, which bf16 represents finely (bf16 steps are 0.0625 between 8",
        "  and 16, where the largest logits sit without it); column log Z below",
        "- weights: "
        + (
            "rounded to bf16 values after training and stored in fp32, like a bf16 checkpoint read in fp32, so"
            " fp32 and bf16 runs use identical weights and differ in arithmetic alone"
            if facts["bf16_exact_weights"]
            else "fp32 as trained"
        ),
        f"- held-out loss below: mean next-token cross-entropy (nats) on {facts['eval_windows']} evenly spaced "
        f"held-out windows of {facts['seq_len']} tokens, computed as in training",
        "",
        "| step | tokens seen | train loss | held-out loss | log Z | elapsed s |",
        "|---:|---:|---:|---:|---:|---:|",
        *(
            f"| {point['step']} | {point['tokens_seen']:,} | {point['train_loss']:.4f} | "
            f"{point['held_out_loss']:.4f} | {point['held_out_log_z']:.2f} | {point['elapsed_s']} |"
            for point in curve
        ),
        "",
        f"Final held-out loss: **{facts['final_held_out_loss']:.4f}** nats/token"
        + (" (with the bf16-exact weights that are stored)." if facts["bf16_exact_weights"] else "."),
        "",
    ]
    (out_dir / "README.md").write_text("\n".join(lines))


# -- command line -------------------------------------------------------------------------------


def configure_parser(parser: argparse.ArgumentParser) -> None:
    defaults = ModelShape()
    parser.add_argument("out_dir", type=Path, help="where to write config, safetensors, tokenizer and README.md")
    parser.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    parser.add_argument("--max-files", type=int, default=None, help="use only the first N training files (quick runs)")
    parser.add_argument("--vocab-size", type=int, default=defaults.vocab_size, help="BPE vocabulary (default 4096)")
    parser.add_argument("--hidden-size", type=int, default=defaults.hidden_size)
    parser.add_argument("--intermediate-size", type=int, default=defaults.intermediate_size)
    parser.add_argument("--num-layers", type=int, default=defaults.num_hidden_layers)
    parser.add_argument("--num-heads", type=int, default=defaults.num_attention_heads)
    parser.add_argument("--num-kv-heads", type=int, default=defaults.num_key_value_heads)
    parser.add_argument("--head-dim", type=int, default=defaults.head_dim)
    parser.add_argument("--seq-len", type=int, default=defaults.max_position_embeddings, help="window (default 1024)")
    parser.add_argument("--max-steps", type=int, default=800)
    parser.add_argument("--batch-size", type=int, default=32, help="windows per step (default 32)")
    parser.add_argument("--learning-rate", type=float, default=2e-3)
    parser.add_argument("--min-lr-ratio", type=float, default=0.1)
    parser.add_argument("--warmup-steps", type=int, default=100)
    parser.add_argument("--weight-decay", type=float, default=0.1)
    parser.add_argument("--grad-clip", type=float, default=1.0)
    parser.add_argument(
        "--z-loss", type=float, default=0.05, help="weight of the mean squared log-partition in the loss (default 0.05)"
    )
    parser.add_argument("--eval-every", type=int, default=100, help="steps between held-out evaluations")
    parser.add_argument("--eval-windows", type=int, default=64, help="held-out windows per evaluation")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--bf16-exact-weights",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="round the trained weights to bf16 values before saving them in fp32 (default: on)",
    )
    parser.add_argument("--max-train-seconds", type=float, default=None, help="stop after this much training")


def run(args: argparse.Namespace) -> int:
    import tokenizers
    import transformers

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    shape = ModelShape(
        vocab_size=args.vocab_size,
        hidden_size=args.hidden_size,
        intermediate_size=args.intermediate_size,
        num_hidden_layers=args.num_layers,
        num_attention_heads=args.num_heads,
        num_key_value_heads=args.num_kv_heads,
        head_dim=args.head_dim,
        max_position_embeddings=max(args.seq_len, ModelShape.max_position_embeddings),
    )
    settings = TrainSettings(
        max_steps=args.max_steps,
        batch_size=args.batch_size,
        seq_len=args.seq_len,
        learning_rate=args.learning_rate,
        min_lr_ratio=args.min_lr_ratio,
        warmup_steps=args.warmup_steps,
        weight_decay=args.weight_decay,
        grad_clip=args.grad_clip,
        z_loss=args.z_loss,
        eval_every=args.eval_every,
        eval_windows=args.eval_windows,
        seed=args.seed,
        max_train_seconds=args.max_train_seconds,
    )
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True

    started = time.perf_counter()
    corpus = load_corpus(max_files=args.max_files)
    logger.info(
        "corpus: %d training files (%d bytes), %d held out (%d bytes), %d not UTF-8, under %s",
        len(corpus.train_paths),
        corpus.train_bytes,
        len(corpus.held_out_paths),
        corpus.held_out_bytes,
        len(corpus.undecodable_paths),
        corpus.root,
    )
    tokenizer = train_tokenizer(corpus.train_texts, args.vocab_size)
    eos_id = tokenizer.convert_tokens_to_ids(END_OF_TEXT)
    train_stream = encode_documents(tokenizer, corpus.train_texts)
    held_out_stream = encode_documents(tokenizer, corpus.held_out_texts)
    logger.info(
        "tokenizer: %d tokens; %d training and %d held-out tokens (%.1fs so far)",
        len(tokenizer),
        train_stream.numel(),
        held_out_stream.numel(),
        time.perf_counter() - started,
    )
    eval_windows = evenly_spaced_windows(held_out_stream, settings.eval_windows, settings.seq_len + 1)

    model = build_model(shape, eos_id, settings.seed)
    parameters = sum(p.numel() for p in model.parameters())
    logger.info("model: %d parameters, %s on %s", parameters, shape, device)
    record = train(model, train_stream, eval_windows, settings, device)
    final_held_out_loss = record.curve[-1].held_out_loss
    if args.bf16_exact_weights:
        round_weights_to_bf16(model)
        final_held_out_loss = round(
            held_out_losses(model, eval_windows.to(device), device.type == "cuda", settings.batch_size)[0], 4
        )
    save_checkpoint(model, tokenizer, args.out_dir)

    tokens_seen = record.steps_done * settings.batch_size * settings.seq_len
    facts = {
        "command": canonical_command(args),
        "python_version": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else str(device),
        "stdlib_root": str(corpus.root),
        "train_files": len(corpus.train_paths),
        "held_out_files": len(corpus.held_out_paths),
        "undecodable_files": len(corpus.undecodable_paths),
        "train_bytes": corpus.train_bytes,
        "held_out_bytes": corpus.held_out_bytes,
        "tokenizer_vocab": len(tokenizer),
        "train_tokens": train_stream.numel(),
        "held_out_tokens": held_out_stream.numel(),
        "shape": asdict(shape),
        "parameters": parameters,
        "safetensors_bytes": (args.out_dir / "model.safetensors").stat().st_size,
        "steps_done": record.steps_done,
        "stopped_by_time": record.stopped_by_time,
        "train_seconds": record.train_seconds,
        "tokens_seen": tokens_seen,
        "epochs": tokens_seen / train_stream.numel(),
        "autocast_bf16": device.type == "cuda",
        "curve": [asdict(point) for point in record.curve],
        "bf16_exact_weights": args.bf16_exact_weights,
        "final_held_out_loss": final_held_out_loss,
        **{
            name: getattr(settings, name)
            for name in (
                "batch_size",
                "seq_len",
                "learning_rate",
                "min_lr_ratio",
                "warmup_steps",
                "weight_decay",
                "grad_clip",
                "z_loss",
                "eval_windows",
                "seed",
            )
        },
    }
    write_model_card(args.out_dir, facts)
    final = record.curve[-1]
    print(
        f"wrote stdlib-tiny to {args.out_dir}: {record.steps_done} steps, train loss {final.train_loss:.4f}, "
        f"held-out loss {final.held_out_loss:.4f}, {time.perf_counter() - started:.0f}s in all"
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    parser = argparse.ArgumentParser(prog="python -m twinfer.models.train_tiny", description=__doc__.split("\n\n")[0])
    configure_parser(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
