"""The speculative-decoding options of every engine command (twinfer.engine_options)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spec.speculative import SpeculativeConfig
from twinfer.cli import build_parser, main
from twinfer.engine_options import engine_config_from_args


def config_of(*flags: str):
    return engine_config_from_args(build_parser().parse_args(["generate", *flags]))


def test_flags_build_the_speculative_config() -> None:
    assert config_of().speculative is None
    assert config_of("--speculative-method", "ngram", "--num-speculative-tokens", "3").speculative == (
        SpeculativeConfig("ngram", 3)
    )
    drafted = config_of(
        "--speculative-method", "draft-model", "--num-speculative-tokens", "2", "--speculative-draft-model", "d"
    )
    assert drafted.speculative == SpeculativeConfig("draft-model", 2, draft_model="d")
    lookup = config_of(
        "--speculative-method", "ngram", "--num-speculative-tokens", "4", "--speculative-ngram-min", "2",
        "--speculative-ngram-max", "5",
    )  # fmt: skip
    assert lookup.speculative == SpeculativeConfig("ngram", 4, ngram_min=2, ngram_max=5)
    always = config_of(
        "--speculative-method", "ngram", "--num-speculative-tokens", "2", "--speculative-min-acceptance-rate", "0"
    )
    assert always.speculative == SpeculativeConfig("ngram", 2, min_acceptance_rate=0.0)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--num-speculative-tokens", "3"], "--num-speculative-tokens need --speculative-method"),
        (["--speculative-method", "ngram"], "needs --num-speculative-tokens K"),
        (["--speculative-method", "ngram", "--num-speculative-tokens", "0"], "must be a positive integer, got 0"),
        (
            ["--speculative-method", "ngram", "--num-speculative-tokens", "2"]
            + ["--speculative-min-acceptance-rate", "2"],
            "must be a fraction in [0, 1], got 2.0",
        ),
    ],
)
def test_bad_speculative_flags_are_named(
    flags: list[str], message: str, tiny_checkpoint: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["generate", "--model", str(tiny_checkpoint), "--device", "cpu", *flags]) == 2
    assert message in capsys.readouterr().err


def test_generate_with_speculation_prints_the_plain_output(
    tiny_checkpoint: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    common = ["generate", "--model", str(tiny_checkpoint), "--device", "cpu", "--engine", "reference", "--json"]
    common += ["--token-ids", "5,6,7,5,6,7,5,6", "--max-tokens", "8", "--ignore-eos", "--logprobs", "1"]
    assert main(common) == 0
    plain = json.loads(capsys.readouterr().out)
    assert main([*common, "--speculative-method", "ngram", "--num-speculative-tokens", "3"]) == 0
    speculative = json.loads(capsys.readouterr().out)
    assert speculative["token_ids"] == plain["token_ids"]
    assert [entry["token_id"] for entry in speculative["logprobs"]] == plain["token_ids"]
