"""The `twinfer` command: each subcommand runs, reports and fails as documented."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reports.cli import build_parser, main


@pytest.mark.parametrize("command", [[], ["generate"], ["tiny-model"], ["diff"], ["bench"], ["bench", "kernels"]])
def test_help_for_every_command(command: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args([*command, "--help"])
    assert exit_info.value.code == 0
    assert "usage: twinfer" in capsys.readouterr().out


def test_tiny_model_is_deterministic_for_a_seed(tmp_path: Path) -> None:
    assert main(["tiny-model", str(tmp_path / "a"), "--seed", "3"]) == 0
    assert main(["tiny-model", str(tmp_path / "b"), "--seed", "3"]) == 0
    assert main(["tiny-model", str(tmp_path / "c"), "--seed", "4"]) == 0
    weights = [(tmp_path / name / "model.safetensors").read_bytes() for name in "abc"]
    assert weights[0] == weights[1] != weights[2]
    assert {"config.json", "tokenizer.json"} <= {p.name for p in (tmp_path / "a").iterdir()}


def test_generate_prints_json(tiny_checkpoint: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["generate", "--model", str(tiny_checkpoint), "--device", "cpu", "--token-ids", "1,2,3",
                 "--max-tokens", "5", "--ignore-eos", "--logprobs", "2", "--json"])
    assert code == 0
    record = json.loads(capsys.readouterr().out.strip())
    assert record["prompt_token_ids"] == [1, 2, 3]
    assert len(record["token_ids"]) == 5 and record["finish_reason"] == "length"
    assert len(record["logprobs"]) == 5 and len(record["logprobs"][0]["top"]) == 2


def test_generate_reports_bad_input_clearly(tiny_checkpoint: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["generate", "--model", str(tiny_checkpoint), "--device", "cpu", "--top-p", "0"])
    assert code == 2
    assert "twinfer: error: top_p must be in (0, 1]" in capsys.readouterr().err


def test_generate_uses_the_built_in_model_by_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("TWINFER_CACHE", str(tmp_path))
    assert main(["generate", "--device", "cpu", "--prompt", "Hello", "--max-tokens", "3"]) == 0
    assert (tmp_path / "tiny-qwen3-seed0" / "model.safetensors").is_file()
    assert "finish=" in capsys.readouterr().out


@pytest.mark.differential
def test_diff_reports_full_agreement(tiny_checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    record_path = tmp_path / "diff.json"
    code = main(["diff", "--engines", "reference,hf", "--model", str(tiny_checkpoint), "--device", "cpu",
                 "--max-new-tokens", "16", "--json", str(record_path)])
    assert code == 0
    assert "full agreement" in capsys.readouterr().out
    record = json.loads(record_path.read_text())
    assert record["all_agree"] and len(record["prompts"]) == 6
    assert all(p["first_divergence"] is None and p["num_tokens"] == 16 for p in record["prompts"])


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
    code = main(["diff", "--engines", "reference,hf", "--model", str(tiny_checkpoint), "--device", "cpu", "--max-new-tokens", "8"])
    assert code == 1
    out = capsys.readouterr().out
    assert "DISAGREE" in out and "DISAGREEMENT" in out


def test_diff_rejects_unknown_engines(tiny_checkpoint: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diff", "--engines", "reference,vllm", "--model", str(tiny_checkpoint), "--device", "cpu"]) == 2
    assert "--engines takes two of reference, hf" in capsys.readouterr().err
