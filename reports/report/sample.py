"""A small, fixed report holding every kind of content the page shows (passed, failed and not-run
cells, near-tie and breaking disagreements, error distributions, fuzz runs, kernel failures, speed
tables and plots), with HTML in every user-controlled field. The tests render it; its numbers are
made up for the page's sake and are never published.
"""

from __future__ import annotations

from dataclasses import replace

from reports.report.assemble import (
    correctness_checks,
    correctness_figures,
    fuzz_checks,
    fuzz_figures,
    kernel_checks,
    speed_checks,
    speed_figures,
)
from reports.report.records import (
    Cell,
    CorrectnessSection,
    Disagreement,
    FuzzMachine,
    FuzzRun,
    FuzzSection,
    KernelSection,
    PlantedBug,
    PromptRecord,
    PytestFailure,
    PytestFileSummary,
    Report,
    RunSettings,
    Series,
    SpeedPlot,
    SpeedRow,
    SpeedSection,
    SpeedTable,
    Status,
    TokenChoice,
)
from reports.report.verdicts import error_distribution

HOSTILE_PROMPT = '<script>alert("prompt")</script> & </td></tr></table>'
HOSTILE_MODEL = "<script>alert('model')</script>/tiny"
HOSTILE_TOKEN = "<img src=x onerror=alert(1)>"


def sample_report(commit: str = "0123456789abcdef0123456789abcdef01234567") -> Report:
    correctness = _correctness()
    fuzz = _fuzz()
    kernels = _kernels()
    speed = _speed()
    return Report(
        created="2026-11-30T12:00:00+00:00",
        commit=commit,
        commit_dirty=False,
        settings=RunSettings(HOSTILE_MODEL, "cpu", ("float32", "bfloat16"), True, "twinfer report --quick"),
        environment={"python": "3.11.7", "torch": "2.13.0+cpu", "host": "<b>host</b>"},
        checks=(*correctness_checks(correctness), *fuzz_checks(fuzz), *kernel_checks(kernels), *speed_checks(speed)),
        figures=(*correctness_figures(correctness), *fuzz_figures(fuzz), *speed_figures(speed)),
        correctness=correctness,
        fuzz=fuzz,
        kernels=kernels,
        speed=speed,
    )


def _choice(token: int, text: str, logprob: float) -> TokenChoice:
    return TokenChoice(token, text, logprob)


def _correctness() -> CorrectnessSection:
    top_candidate = (_choice(5, HOSTILE_TOKEN, -0.69), _choice(9, " the", -0.70), _choice(2, "\n", -3.1))
    top_baseline = (_choice(9, " the", -0.68), _choice(5, HOSTILE_TOKEN, -0.71), _choice(2, "\n", -3.1))
    near_tie = Disagreement(
        prompt_index=0,
        position=6,
        kind="token",
        allowed=True,
        candidate=top_candidate[0],
        baseline=top_baseline[0],
        candidate_top=top_candidate,
        baseline_top=top_baseline,
        text_before=HOSTILE_PROMPT + " and then",
        candidate_text_after=HOSTILE_TOKEN + " ran",
        baseline_text_after=" the end",
    )
    breaking = replace(near_tie, prompt_index=1, position=2, allowed=False, candidate_top=top_candidate[:1])
    base = {
        "candidate": "reference",
        "baseline": "hf",
        "pair": "reference-hf",
        "feature": "prefix-cache-off",
        "seconds": 0.5,
    }
    cells = (
        Cell(
            id="reference-hf/float32/prefix-cache-off/free-running",
            dtype="float32",
            mode="free-running",
            status=Status.PASSED,
            detail="all 2 prompts agree",
            rule="exact",
            feature_evidence="prefix caching off",
            num_prompts=2,
            num_positions=16,
            max_logprob_error=3e-6,
            mean_logprob_error=8e-7,
            identical_prefix_lengths=(8, 8),
            max_new_tokens=8,
            **base,
        ),
        Cell(
            id="reference-hf/float32/prefix-cache-off/teacher-forced",
            dtype="float32",
            mode="teacher-forced",
            status=Status.FAILED,
            detail="1 disagreements",
            rule="exact",
            feature_evidence="prefix caching off",
            num_prompts=2,
            num_positions=40,
            max_logprob_error=0.02,
            mean_logprob_error=1e-3,
            top1_checked_positions=40,
            error_distribution=error_distribution([0.0, 1e-7, 2e-6, 0.02] * 10),
            num_disagreements=1,
            disagreements=(breaking,),
            **base,
        ),
        Cell(
            id="reference-hf/bfloat16/prefix-cache-off/free-running",
            dtype="bfloat16",
            mode="free-running",
            status=Status.PASSED,
            detail="all 2 prompts agree (near-tie)",
            rule="near-tie",
            feature_evidence="prefix caching off",
            num_prompts=2,
            num_positions=16,
            max_logprob_error=0.03,
            mean_logprob_error=0.01,
            identical_prefix_lengths=(6, 8),
            max_new_tokens=8,
            num_disagreements=1,
            disagreements=(near_tie,),
            **base,
        ),
        Cell(
            id="reference-hf/bfloat16/prefix-cache-off/teacher-forced",
            dtype="bfloat16",
            mode="teacher-forced",
            status=Status.PASSED,
            detail="all 40 positions agree",
            rule="top1-above-margin",
            feature_evidence="prefix caching off",
            num_prompts=2,
            num_positions=40,
            max_logprob_error=0.05,
            mean_logprob_error=0.012,
            top1_checked_positions=31,
            error_distribution=error_distribution([0.001 * (i % 17) for i in range(40)]),
            **base,
        ),
        Cell(
            id="fast-hf/float32/prefix-cache-off/free-running",
            pair="fast-hf",
            candidate="fast",
            baseline="hf",
            dtype="float32",
            feature="prefix-cache-off",
            mode="free-running",
            status=Status.NOT_RUN,
            detail="not run: engine 'fast' is not available: module fast.engine is missing",
        ),
    )
    prompts = (
        PromptRecord(0, "text", HOSTILE_PROMPT, 12),
        PromptRecord(1, "token ids", "1, 2, 3, 4, …", 33),
    )
    return CorrectnessSection(
        status=Status.FAILED, detail="5 cells: 3 passed, 1 failed, 1 not run", model=HOSTILE_MODEL,
        pairs=("reference-hf", "fast-hf"), dtypes=("float32", "bfloat16"), features=("prefix-cache-off",),
        modes=("free-running", "teacher-forced"), prompts=prompts, cells=cells,
    )  # fmt: skip


def _fuzz() -> FuzzSection:
    run = FuzzRun(
        source="committed record",
        path="reports/results/fuzz/deep_run.json",
        status=Status.PASSED,
        detail="passed: 19 passed",
        profile="deep",
        command="python -m pytest fuzz --hypothesis-profile=deep",
        commit="5368bfb9d784b59b63552814f8e187abb53726dc",
        wall_time_s=535.8,
        totals={"examples": 3009, "steps": 306201, "invariant_evaluations": 7305006},
        planted_bugs=(PlantedBug("ref count decremented twice", True), PlantedBug("prefix hit <not> aligned", None)),
        machines=(FuzzMachine("allocator[reference]", {"examples": 1568, "steps": 152442}),),
    )
    return FuzzSection(Status.PASSED, "committed record: passed", (run,))


def _kernels() -> KernelSection:
    return KernelSection(
        status=Status.FAILED,
        detail="70 passed, 1 failed, 100 skipped",
        command="python -m pytest -q tests/kernels",
        wall_time_s=31.8,
        files=(
            PytestFileSummary("tests/kernels/test_decode_attention.py", 20, 1, 30, 0),
            PytestFileSummary("tests/kernels/test_kv_store.py", 50, 0, 70, 0),
        ),
        failures=(
            PytestFailure("tests/kernels/test_decode_attention.py::test_x[dtype0]", f"AssertionError: {HOSTILE_TOKEN}"),
        ),
    )


def _speed() -> SpeedSection:
    table = SpeedTable(
        workload="decode-sweep batch-8",
        metric="time per output token",
        unit="ms",
        better="lower",
        rows=(SpeedRow("twinfer fast", 1.9, 0.05, 0.61), SpeedRow("transformers", 24.0, 0.8, 0.05)),
        note="sample figures",
    )
    plot = SpeedPlot(
        id="throughput-vs-batch",
        title="decode throughput vs batch size",
        x_label="batch size",
        y_label="decode tokens/s",
        series=(
            Series("twinfer fast", (1, 8, 32), (600, 4100, 12000)),
            Series("transformers", (1, 8, 32), (45, 330, 1100)),
        ),
        log_x=True,
    )
    return SpeedSection(
        Status.PASSED, "sample workloads", (table,), (plot,), {"gpu": "<i>sample GPU</i>", "driver": "1.0"}
    )
