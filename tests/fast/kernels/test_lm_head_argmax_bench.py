"""reports/bench/kernels/lm_head_argmax.py on the CPU: its refusal without CUDA, and one tiny head end to end
through Triton's interpreter in fp32 with a wall-clock timer in place of CUDA graphs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from reports.bench.kernels import lm_head_argmax as bench
from tests.fast.kernels.reference import wall_clock_us


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without CUDA")
def test_needs_cuda(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bench.json"
    assert bench.main(["--json", str(path)]) == 2
    assert "needs a CUDA device" in capsys.readouterr().err
    assert not path.exists()


@pytest.mark.interpreter
def test_one_head_end_to_end_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench, "MIN_CALLS", 1)
    copy_gbps = 2.0
    timings, checks = bench.bench_head(
        "tiny", 48, 24, (1, 3), copy_gbps, 1, torch.float32, torch.device("cpu"), wall_clock_us
    )
    assert [(t.m, t.variant) for t in timings] == [(m, v) for m in (1, 3) for v in bench.VARIANTS]
    weight_bytes = 48 * 24 * 4
    for timing in timings:
        assert timing.weight_copies == 2 and timing.calls_per_graph == 2  # two copies: one is over 3 x a 1-byte L2
        assert timing.floor_us == pytest.approx(weight_bytes / (copy_gbps * 1e3))
        assert timing.over_floor == pytest.approx(timing.us_per_call / timing.floor_us)
        assert timing.weight_GBps == pytest.approx(weight_bytes / timing.us_per_call / 1e3)
    assert [(c.m, c.max_equals_torch_max) for c in checks] == [(1, True), (3, True)]
    assert all(c.logits_max_abs_error < 1e-4 and c.argmax_rows_differing_from_cublas == 0 for c in checks)
    summary = bench.summarise(timings)
    assert [(row["model"], row["m"]) for row in summary] == [("tiny", 1), ("tiny", 3)]
    for row in summary:
        assert row["speedup_vs_cublas+cast+max"] == pytest.approx(row["cublas+cast+max_us"] / row["lm_head_argmax_us"])
        assert all(f"{variant}_over_floor" in row for variant in bench.VARIANTS)
