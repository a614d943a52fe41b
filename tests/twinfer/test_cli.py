"""The `twinfer` command: each subcommand runs, reports and fails as documented."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from reports.bench.harness import WORKLOAD_SUMMARIES
from reports.diff.command import DIFF_TEXT_PROMPTS, DIFF_TOKEN_PROMPTS
from tests.engines import FAST_DEVICE
from twinfer import cli
from twinfer.cli import build_parser, main

HELP_COMMANDS = [
    [],
    ["generate"],
    ["tiny-model"],
    ["diff"],
    ["bench"],
    ["bench", "kernels"],
    *(["bench", workload] for workload in WORKLOAD_SUMMARIES),
]


@pytest.mark.parametrize("command", HELP_COMMANDS, ids=lambda command: " ".join(command) or "twinfer")
def test_help_for_every_command(command: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args([*command, "--help"])
    assert exit_info.value.code == 0
    assert "usage: twinfer" in capsys.readouterr().out


def test_engine_settings_are_offered_for_every_engine_config_field(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["generate", "--help"])
    usage = capsys.readouterr().out
    for flag in (
        "--block-size",
        "--num-blocks",
        "--max-num-seqs",
        "--max-num-batched-tokens",
        "--max-model-len",
        "--prefix-caching",
        "--no-prefix-caching",
        "--gpu-memory-utilization",
        "--no-cuda-graphs",
    ):
        assert flag in usage


def test_optional_commands_appear_only_when_their_module_offers_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        cli,
        "MODULE_COMMANDS",
        (
            cli.ModuleCommand("absent", "twinfer.no_such_module", "a module that does not exist"),
            cli.ModuleCommand("absent-package", "no_such_package.cli", "a package that does not exist"),
            cli.ModuleCommand("unfinished", "twinfer.models.tiny_model", "a module without configure_parser and run"),
            cli.ModuleCommand("train-again", "twinfer.models.train_tiny", "a module that offers both"),
        ),
    )
    commands = next(a for a in build_parser()._actions if a.dest == "command").choices
    assert "train-again" in commands
    assert not {"absent", "absent-package", "unfinished"} & set(commands)


def test_a_harness_command_imports_its_module_only_when_it_runs(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Registered by name and help alone: a module that cannot be imported shows only once its command runs."""
    monkeypatch.setattr(
        cli, "MODULE_COMMANDS", (cli.ModuleCommand("later", "reports.no_such_module", "imported when run", True),)
    )
    parser = build_parser()
    with pytest.raises(SystemExit):
        parser.parse_args(["--help"])
    assert "imported when run" in capsys.readouterr().out
    with pytest.raises(ModuleNotFoundError, match="reports.no_such_module"):
        parser.parse_args(["later"])


def test_tiny_model_is_deterministic_for_a_seed(tmp_path: Path) -> None:
    assert main(["tiny-model", str(tmp_path / "a"), "--seed", "3"]) == 0
    assert main(["tiny-model", str(tmp_path / "b"), "--seed", "3"]) == 0
    assert main(["tiny-model", str(tmp_path / "c"), "--seed", "4"]) == 0
    weights = [(tmp_path / name / "model.safetensors").read_bytes() for name in "abc"]
    assert weights[0] == weights[1] != weights[2]
    assert {"config.json", "tokenizer.json"} <= {p.name for p in (tmp_path / "a").iterdir()}


def test_generate_prints_json(tiny_checkpoint: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "generate",
            "--model",
            str(tiny_checkpoint),
            "--device",
            "cpu",
            "--token-ids",
            "1,2,3",
            "--max-tokens",
            "5",
            "--ignore-eos",
            "--logprobs",
            "2",
            "--json",
        ]
    )
    assert code == 0
    record = json.loads(capsys.readouterr().out.strip())
    assert record["prompt_token_ids"] == [1, 2, 3]
    assert len(record["token_ids"]) == 5 and record["finish_reason"] == "length"
    assert len(record["logprobs"]) == 5 and len(record["logprobs"][0]["top"]) == 2


def test_generate_passes_engine_settings(tiny_checkpoint: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Two identical prompts: with prefix caching the second is served from the cache, without it not."""
    prompt = ",".join(str(i) for i in range(1, 20))
    common = [
        "generate",
        "--model",
        str(tiny_checkpoint),
        "--device",
        "cpu",
        "--engine",
        "reference",
        "--token-ids",
        prompt,
        "--max-tokens",
        "2",
        "--json",
        "--block-size",
        "8",
        "--max-num-batched-tokens",
        "19",
    ]
    assert main([*common, "--token-ids", prompt]) == 0  # a budget of one prompt per step: the second one hits
    cached = [json.loads(line)["num_cached_prompt_tokens"] for line in capsys.readouterr().out.splitlines()]
    assert cached == [0, 16]
    assert main([*common, "--token-ids", prompt, "--no-prefix-caching"]) == 0
    cached = [json.loads(line)["num_cached_prompt_tokens"] for line in capsys.readouterr().out.splitlines()]
    assert cached == [0, 0]


def test_generate_reports_bad_input_clearly(tiny_checkpoint: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["generate", "--model", str(tiny_checkpoint), "--device", "cpu", "--top-p", "0"])
    assert code == 2
    assert "twinfer: error: top_p must be in (0, 1]" in capsys.readouterr().err


def test_generate_reports_bad_engine_settings_clearly(
    tiny_checkpoint: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["generate", "--model", str(tiny_checkpoint), "--device", "cpu", "--block-size", "12"])
    assert code == 2
    assert "twinfer: error: block_size must be a power of two, got 12" in capsys.readouterr().err


def test_generate_fast_on_cpu_without_interpreter_is_a_clear_error(
    tiny_checkpoint: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    code = main(["generate", "--model", str(tiny_checkpoint), "--device", "cpu", "--engine", "fast"])
    assert code == 2
    assert "set TRITON_INTERPRET=1" in capsys.readouterr().err


NUM_DIFF_PROMPTS = len(DIFF_TEXT_PROMPTS) + len(DIFF_TOKEN_PROMPTS)


def test_generate_uses_the_built_in_model_by_default(capsys: pytest.CaptureFixture[str]) -> None:
    """No --model: the shipped stdlib-tiny model, whose tokenizer knows Python ("def " is one token)."""
    from twinfer.default_model import DEFAULT_MODEL_DIR

    assert main(["generate", "--device", "cpu", "--prompt", "def ", "--max-tokens", "3", "--json"]) == 0
    record = json.loads(capsys.readouterr().out.splitlines()[0])
    from transformers import AutoTokenizer

    assert record["prompt_token_ids"] == AutoTokenizer.from_pretrained(str(DEFAULT_MODEL_DIR)).encode("def ")


@pytest.mark.differential
def test_diff_reports_full_agreement(tiny_checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    record_path = tmp_path / "diff.json"
    code = main(
        [
            "diff",
            "--engines",
            "reference,hf",
            "--model",
            str(tiny_checkpoint),
            "--device",
            "cpu",
            "--max-new-tokens",
            "16",
            "--json",
            str(record_path),
        ]
    )
    assert code == 0
    assert "full agreement" in capsys.readouterr().out
    record = json.loads(record_path.read_text())
    assert record["all_agree"] and record["engines"] == ["reference", "hf"]
    (comparison,) = record["comparisons"]
    assert (comparison["candidate"], comparison["baseline"]) == ("reference", "hf")
    assert len(comparison["prompts"]) == NUM_DIFF_PROMPTS
    assert all(p["first_divergence"] is None and p["num_tokens"] == 16 for p in comparison["prompts"])


@pytest.mark.differential
def test_diff_compares_every_pair_of_three_engines(
    tiny_checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """fast (on the GPU where there is one, else through Triton's interpreter), reference and transformers
    on the same device: three pairs."""
    record_path = tmp_path / "diff.json"
    code = main(
        [
            "diff",
            "--engines",
            "fast,reference,hf",
            "--model",
            str(tiny_checkpoint),
            "--device",
            FAST_DEVICE,
            "--num-blocks",  # on CUDA the fast engine would size its pool from the GPU the other workers share
            "256",
            "--max-new-tokens",
            "3",
            "--json",
            str(record_path),
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    assert "full agreement" in out and "fast vs reference, fast vs hf, reference vs hf" in out
    record = json.loads(record_path.read_text())
    pairs = [(c["candidate"], c["baseline"]) for c in record["comparisons"]]
    assert pairs == [("fast", "reference"), ("fast", "hf"), ("reference", "hf")]
    assert all(len(c["prompts"]) == NUM_DIFF_PROMPTS and c["all_agree"] for c in record["comparisons"])


@pytest.mark.differential
def test_diff_exits_nonzero_on_disagreement(
    tiny_checkpoint: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Plant a realistic bug (interleaved instead of rotate-half RoPE) in the reference engine."""
    import torch

    import reference.model

    def interleaved_rotation(x: torch.Tensor) -> torch.Tensor:
        pairs = x.unflatten(-1, (-1, 2))
        return torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).flatten(-2)

    monkeypatch.setattr(reference.model, "rotate_half", interleaved_rotation)
    code = main(
        [
            "diff",
            "--engines",
            "reference,hf",
            "--model",
            str(tiny_checkpoint),
            "--device",
            "cpu",
            "--max-new-tokens",
            "8",
        ]
    )
    assert code == 1
    out = capsys.readouterr().out
    assert "DISAGREE" in out and "DISAGREEMENT" in out


@pytest.mark.parametrize("engines", ["reference,vllm", "reference", "hf,hf"])
def test_diff_rejects_bad_engine_lists(engines: str, tiny_checkpoint: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diff", "--engines", engines, "--model", str(tiny_checkpoint), "--device", "cpu"]) == 2
    assert "--engines takes two or more distinct engines of fast, reference, hf" in capsys.readouterr().err


def test_diff_with_fast_on_cpu_without_interpreter_fails_before_running(
    tiny_checkpoint: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert main(["diff", "--engines", "reference,fast", "--model", str(tiny_checkpoint), "--device", "cpu"]) == 2
    assert "set TRITON_INTERPRET=1" in capsys.readouterr().err


def test_serve_runs_the_engine_in_a_process_on_cuda_only_by_default() -> None:
    from twinfer.server.cli import engine_process_by_default

    assert engine_process_by_default(None, "cpu") is False
    assert engine_process_by_default(True, "cpu") is True
    assert engine_process_by_default(False, "cpu") is False
    if torch.cuda.is_available():
        assert engine_process_by_default(None, "cuda") is True
