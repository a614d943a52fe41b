"""reports/bench/kernels/invariant_matmul.py on the CPU: its shapes, its invariance check (which must be
able to fail), and one shape end to end through Triton's interpreter in fp32 with tiny sizes and
a wall-clock timer in place of CUDA graphs."""

from __future__ import annotations

import argparse

import pytest
import torch

from fast.kernels.matmul import invariant_linear
from reports.bench.kernels import invariant_matmul as bench
from reports.bench.shapes import SHAPES
from tests.fast.kernels.reference import DEVICE, wall_clock_us
from tests.fast.kernels.strategies import seeded_generator


def test_projection_shapes() -> None:
    shapes = {p.layer: (p.n, p.k, p.per_forward) for p in bench.projections(SHAPES["qwen3-0.6b"])}
    assert shapes == {
        "qkv": (4096, 1024, 28),
        "o_proj": (1024, 2048, 28),
        "gate_up": (6144, 1024, 28),
        "down": (1024, 3072, 28),
        "lm_head": (151936, 1024, 1),
    }
    shapes = {p.layer: (p.n, p.k) for p in bench.projections(SHAPES["qwen3-8b"])}
    assert shapes == {
        "qkv": (6144, 4096),
        "o_proj": (4096, 4096),
        "gate_up": (24576, 4096),
        "down": (4096, 12288),
        "lm_head": (151936, 4096),
    }


def test_invariance_check_passes_and_fails() -> None:
    generator = seeded_generator(0)
    x, weight = torch.randn((40, 136), generator=generator), torch.randn((24, 136), generator=generator)
    x, weight = x.to(DEVICE), weight.to(DEVICE)
    passed = bench.check_invariance(lambda rows: invariant_linear(rows, weight), x, (1, 3, 40, 99), ((20, 21),))
    assert passed == {"passed": True, "cases": {"x[:1]": True, "x[:3]": True, "x[:40]": True, "x[20:21]": True}}

    def depends_on_m(rows: torch.Tensor) -> torch.Tensor:  # another reduction order for small batches
        return invariant_linear(rows, weight, block_k=16 if rows.shape[0] < 8 else 128)

    failed = bench.check_invariance(depends_on_m, x, (1, 3, 40), ((20, 21),))
    assert not failed["passed"]
    assert failed["cases"]["x[:40]"] and not failed["cases"]["x[:1]"]


@pytest.mark.interpreter
def test_one_model_end_to_end_on_cpu(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    for name, value in {
        "DTYPE": torch.float32,  # the interpreter has no bf16 arithmetic
        "CHECK_ROWS": 70,
        "CHECK_PREFIXES": (1, 3, 16, 17, 70),
        "CHECK_SLICES": ((33, 34), (20, 50)),
        "ERROR_ROWS": 8,
        "TIMED_ROWS": (1, 64),
        "MIN_CALLS": {"small": 1, "large": 1},
    }.items():
        monkeypatch.setattr(bench, name, value)
    variants = {
        "default": {},
        "small": {"block_m": 16, "block_n": 16, "block_k": 16, "group_m": 2},
        "bad": {"block_m": 8},
    }
    shapes = [bench.Projection("tiny", "qkv", 40, 24, 2), bench.Projection("tiny", "lm_head", 48, 24, 1)]
    results = [bench.bench_projection(p, variants, 1, torch.device("cpu"), wall_clock_us) for p in shapes]
    summary = bench.summarise(results, list(variants))

    for name in ("default", "small"):
        assert summary[name]["invariant_every_shape"], name
        assert summary[name]["max_relative_error"] < 1e-5
        totals = summary[name]["time_over_cublas"]["tiny"]
        assert set(totals) == {"layers_m1", "layers_m64", "lm_head_m1", "lm_head_m64"}
        assert all(value > 0 for value in totals.values())
    assert summary["bad"]["failed_shapes"] == ["tiny qkv 40x24", "tiny lm_head 48x24"]
    assert "block_m must be a power of two" in results[0].errors["bad"]
    assert results[0].configs["small"]["block_m"] == 16 and results[0].configs["default"]["block_m"] == 64
    assert results[0].weight_copies == 1  # one weight is more than 3 x a 1-byte L2
    assert [t.m for t in results[0].timings if t.variant == "default"] == [1, 64]
    assert list(results[0].invariance["small"]["cases"]) == [
        "x[:1]",
        "x[:3]",
        "x[:16]",
        "x[:17]",
        "x[:70]",
        "x[33:34]",
        "x[20:50]",
    ]

    fastest = bench.fastest_by_shape(results, list(variants))
    assert set(fastest) == {"tiny qkv 40x24", "tiny lm_head 48x24"}
    assert all(row[m] in ("default", "small") for row in fastest.values() for m in (1, 64))

    record = {
        "environment": {"gpu": "cpu", "torch": torch.__version__, "triton": "interpreter"},
        "l2_bytes": 1,
        "sm_count": 0,
        "summary": summary,
        "seconds": 0.0,
    }
    bench.print_report(record, results, list(variants))
    printed = capsys.readouterr().out
    assert "tiny qkv 40x24" in printed and "default         invariant=yes" in printed
    assert "bad             invariant=NO  failed: tiny qkv 40x24, tiny lm_head 48x24" in printed


def test_cli_arguments() -> None:
    parser = argparse.ArgumentParser()
    bench.configure_parser(parser)
    args = parser.parse_args(["--shapes", "qwen3-0.6b,qwen3-8b", "--configs", "default,previous"])
    assert (args.shapes, args.configs) == ("qwen3-0.6b,qwen3-8b", "default,previous")
    assert parser.parse_args([]).configs.split(",") == list(bench.CANDIDATES)
    with pytest.raises(SystemExit):
        parser.parse_args(["--configs", "default,nonsense"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message given without CUDA")
def test_needs_cuda(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    bench.configure_parser(parser)
    assert bench.run(parser.parse_args([])) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


@pytest.mark.interpreter
@pytest.mark.parametrize("name", ["chunk256", "chunk128"])
def test_smaller_chunk_candidates_run_and_stay_invariant(name: str) -> None:
    """The candidates with more, smaller K chunks are valid launches at a depth of several chunks (K = 512 with the
    default block_k of 128), correct, and invariant: a row's result does not depend on the rows around it."""
    generator = seeded_generator(7)
    x, weight = torch.randn((9, 512), generator=generator).to(DEVICE), torch.randn((24, 512), generator=generator)
    weight = weight.to(DEVICE)
    overrides = bench.CANDIDATES[name]
    full = invariant_linear(x, weight, **overrides)
    torch.testing.assert_close(full, x @ weight.T, rtol=1e-5, atol=1e-4)
    assert torch.equal(invariant_linear(x[2:3], weight, **overrides), full[2:3])
