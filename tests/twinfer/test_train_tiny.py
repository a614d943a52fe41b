"""stdlib-tiny: the training and evaluation scripts run end to end on CPU, and the committed
checkpoint is small, uses grouped-query attention, round-trips text and writes Python."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
import torch

from spec.checkpoint import load_model_config, load_state_dict
from twinfer.models import eval_tiny, train_tiny

COMMITTED = Path(__file__).resolve().parents[2] / "twinfer" / "models" / "stdlib-tiny"

# A model small enough to train a few steps in a second or two on one CPU core.
TINY_TRAINING_ARGS = [
    "--device",
    "cpu",
    "--max-files",
    "20",
    "--max-steps",
    "3",
    "--batch-size",
    "2",
    "--seq-len",
    "64",
    "--eval-every",
    "2",
    "--eval-windows",
    "2",
    "--vocab-size",
    "512",
    "--hidden-size",
    "64",
    "--intermediate-size",
    "128",
    "--num-layers",
    "2",
    "--num-heads",
    "4",
    "--num-kv-heads",
    "2",
    "--head-dim",
    "16",
]


@pytest.fixture(scope="module")
def trained_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out_dir = tmp_path_factory.mktemp("stdlib-tiny") / "checkpoint"
    assert train_tiny.main([str(out_dir), *TINY_TRAINING_ARGS]) == 0
    return out_dir


def test_held_out_split_depends_on_the_path_alone() -> None:
    paths = [f"package{i // 50}/module{i}.py" for i in range(4000)]
    held_out = {p for p in paths if train_tiny.is_held_out(p)}
    assert 0.04 < len(held_out) / len(paths) < 0.06
    assert held_out == {p for p in reversed(paths) if train_tiny.is_held_out(p)}
    assert not train_tiny.is_held_out("os.py", fraction=0.0) and train_tiny.is_held_out("os.py", fraction=1.0)


def test_corpus_leaves_out_tests_and_installed_packages() -> None:
    paths = train_tiny.corpus_paths(train_tiny.stdlib_root())
    assert "os.py" in paths and paths == sorted(paths)
    assert not any({"site-packages", "dist-packages", "test", "tests"} & set(p.split("/")[:-1]) for p in paths)


def test_training_writes_a_checkpoint_both_loaders_read(trained_checkpoint: Path) -> None:
    from transformers import AutoTokenizer, Qwen3ForCausalLM

    assert {p.name for p in trained_checkpoint.iterdir()} == set(train_tiny.CHECKPOINT_FILES)
    config = load_model_config(trained_checkpoint)
    ours = load_state_dict(trained_checkpoint, config, torch.float32)
    theirs = Qwen3ForCausalLM.from_pretrained(str(trained_checkpoint), dtype=torch.float32).state_dict()
    assert config.num_attention_heads == 4 and config.num_key_value_heads == 2 and config.head_dim == 16
    for name, tensor in ours.items():
        torch.testing.assert_close(tensor, theirs[name], rtol=0, atol=0)
        assert torch.equal(tensor, tensor.to(torch.bfloat16).float()), f"{name} is not bf16-exact"
    tokenizer = AutoTokenizer.from_pretrained(str(trained_checkpoint))
    assert tokenizer.eos_token == train_tiny.END_OF_TEXT and tokenizer.eos_token_id in config.eos_token_ids
    card = (trained_checkpoint / "README.md").read_text()
    assert "python -m twinfer.models.train_tiny" in card and "--max-steps 3" in card
    assert re.search(r"\| 2 \| 256 \| \d+\.\d{4} \| \d+\.\d{4} \| -?\d+\.\d{2} \|", card)  # loss curve, step 2
    assert "Final held-out loss" in card


def test_training_stops_at_the_time_budget(tmp_path: Path) -> None:
    args = [str(tmp_path / "ckpt"), *TINY_TRAINING_ARGS, "--max-steps", "1000", "--max-train-seconds", "0"]
    assert train_tiny.main(args) == 0
    card = (tmp_path / "ckpt" / "README.md").read_text()
    assert "1 steps of 2 windows" in card and "stopped by the time budget" in card


def test_training_refuses_shapes_without_grouped_query_attention(tmp_path: Path) -> None:
    from spec.errors import ConfigError

    with pytest.raises(ConfigError, match="more query heads than KV heads"):
        train_tiny.ModelShape(num_attention_heads=4, num_key_value_heads=4)
    with pytest.raises(ConfigError, match="head_dim"):
        train_tiny.ModelShape(head_dim=48)


def test_eval_runs_and_records_every_figure(trained_checkpoint: Path, tmp_path: Path) -> None:
    out = tmp_path / "eval.json"
    code = eval_tiny.main(
        [
            str(trained_checkpoint),
            "--json",
            str(out),
            "--device",
            "cpu",
            "--max-files",
            "20",
            "--windows",
            "2",
            "--window-len",
            "32",
            "--prompts",
            "3",
            "--prompt-len",
            "8",
            "--new-tokens",
            "6",
        ]
    )
    record = json.loads(out.read_text())
    assert code == (0 if all(record["acceptance"].values()) else 1)
    assert record["held_out"]["positions"] == 2 * 31
    assert set(record["teacher_forcing_via"]) == {"float32", "bfloat16"}
    assert 0.0 <= record["float32"]["fraction_gap_above_0.25"] <= 1.0
    assert record["float32"]["held_out_loss"] > 0
    greedy = record["greedy_bfloat16_vs_float32"]
    assert len(greedy["identical_tokens_per_prompt"]) == 3 and sum(greedy["histogram"].values()) == 3


def test_identical_prefix() -> None:
    assert eval_tiny.identical_prefix([1, 2, 3], [1, 2, 3]) == 3
    assert eval_tiny.identical_prefix([1, 2, 3], [1, 5, 3]) == 1
    assert eval_tiny.identical_prefix([4], [5]) == 0


# -- the committed checkpoint ------------------------------------------------------------------


def test_committed_checkpoint_is_small_and_uses_grouped_query_attention() -> None:
    config = load_model_config(COMMITTED)
    state_dict = load_state_dict(COMMITTED, config, torch.float32)
    assert (COMMITTED / "model.safetensors").stat().st_size <= train_tiny.MAX_CHECKPOINT_BYTES
    assert config.architecture == "Qwen3ForCausalLM" and config.tie_word_embeddings
    assert config.num_attention_heads > config.num_key_value_heads
    assert config.head_dim in train_tiny.SUPPORTED_HEAD_DIMS
    assert config.vocab_size == 4096 and state_dict["model.embed_tokens.weight"].shape == (4096, config.hidden_size)
    # Stored in fp32 but bf16-exact, like a bf16 checkpoint read in fp32 (see the model card).
    assert all(torch.equal(t, t.to(torch.bfloat16).float()) for t in state_dict.values())
    card = (COMMITTED / "README.md").read_text()
    assert "Final held-out loss" in card and "Python 3." in card


def test_committed_tokenizer_round_trips_text() -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(COMMITTED))
    assert len(tokenizer) == 4096 and tokenizer.eos_token == train_tiny.END_OF_TEXT
    for text in ("def main(argv=None):\n    return 0\n", "naïve café — λ = 3 # 日本語\t\n", "<|endoftext|>x"):
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert tokenizer.decode(ids) == text
    # Indentation runs are single tokens (the tokenizer was trained on Python source), and a space
    # goes with the word before it, so the prompt "def " is one whole token, as in the training text.
    assert len(tokenizer.encode("\n        return", add_special_tokens=False)) <= 3
    assert tokenizer.convert_ids_to_tokens(tokenizer.encode("def ", add_special_tokens=False)) == ["defĠ"]


@pytest.fixture(scope="module")
def committed_llm():
    from twinfer import LLM

    return LLM(str(COMMITTED), dtype="float32", device="cpu")


def _greedy_text(llm, prompt: str, max_tokens: int = 32) -> str:
    from spec.sampling_params import SamplingParams

    return prompt + llm.generate(prompt, SamplingParams(temperature=0.0, max_tokens=max_tokens))[0].text


def test_committed_checkpoint_generates_from_def_in_seconds_on_cpu(committed_llm) -> None:
    started = time.perf_counter()
    text = _greedy_text(committed_llm, "def ")
    elapsed = time.perf_counter() - started
    assert elapsed < 30, f"32 greedy tokens took {elapsed:.1f}s on CPU"
    assert re.match(r"def [A-Za-z_]\w*", text) and "\ufffd" not in text, text  # a name follows, as in the corpus


def test_committed_checkpoint_continues_a_signature_as_python(committed_llm) -> None:
    text = _greedy_text(committed_llm, "def __init__(self, ")
    # Parameter names separated by commas, and a continuation line indented under the open parenthesis.
    assert re.match(r"def __init__\(self, (\w+, )+", text) and "\n                 " in text, text


def test_committed_checkpoint_writes_a_function_signature_after_def(committed_llm) -> None:
    """`twinfer generate --prompt "def "`: a whole signature, then an indented body line."""
    assert re.match(r"def \w+\([^()]*\):\n {8}\w", _greedy_text(committed_llm, "def ")), "no signature"
