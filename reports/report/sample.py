"""A small, fixed report holding every kind of content the page shows (passed, failed and not-run
cells, near-tie and breaking disagreements, error distributions, fuzz runs, kernel failures, speed
tables and plots), with HTML in every user-controlled field. The tests render it; its numbers are
made up for the page's sake and are never published.
"""

from __future__ import annotations

from dataclasses import asdict, replace

from reports.report.assemble import report_of_sections
from reports.report.bench_records import BenchRecord
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
    SpeedSection,
    Status,
    TokenChoice,
)
from reports.report.speed_section import speed_from_records
from reports.report.verdicts import error_distribution
from spec.engine_config import EngineConfig

HOSTILE_PROMPT = '<script>alert("prompt")</script> & </td></tr></table>'
HOSTILE_MODEL = "<script>alert('model')</script>/tiny"
HOSTILE_TOKEN = "<img src=x onerror=alert(1)>"


def sample_report(commit: str = "0123456789abcdef0123456789abcdef01234567") -> Report:
    return report_of_sections(
        created="2026-11-30T12:00:00+00:00",
        commit=commit,
        commit_dirty=False,
        settings=RunSettings(HOSTILE_MODEL, "cpu", ("float32", "bfloat16"), True, "twinfer report --quick"),
        environment={"python": "3.11.7", "torch": "2.13.0+cpu", "host": "<b>host</b>"},
        correctness=_correctness(),
        fuzz=_fuzz(),
        kernels=_kernels(),
        speed=_speed(),
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
        command="python -m pytest -q tests/fast/kernels",
        wall_time_s=31.8,
        files=(
            PytestFileSummary("tests/fast/kernels/test_decode_attention.py", 20, 1, 30, 0),
            PytestFileSummary("tests/fast/kernels/test_kv_store.py", 50, 0, 70, 0),
        ),
        failures=(
            PytestFailure(
                "tests/fast/kernels/test_decode_attention.py::test_x[dtype0]", f"AssertionError: {HOSTILE_TOKEN}"
            ),
        ),
    )


SAMPLE_GPU = "<i>sample GPU</i>"
SAMPLE_BENCH_COMMIT = "feedc0ffee0123456789abcdef0123456789abcd"
TUNED = {"max_num_seqs": 256, "max_num_batched_tokens": 8192, "async_scheduling": True}
# (label, requests, prompt tokens, output tokens) of each workload's phases, as reports.bench.workloads has them.
SAMPLE_PHASES = {
    "offline-256": (("offline", 256, 142827, 133966),),
    "decode-bs1": (("decode", 1, 128, 256),),
    "decode-sweep": tuple((f"batch-{n}", n, 1024 * n, 128 * n) for n in (1, 8, 32)),
    "prefix-shared": (("prefix-caching-on", 64, 139264, 8192), ("prefix-caching-off", 64, 139264, 8192)),
}


def bench_record(
    workload: str,
    figures: dict[str, dict[str, tuple[float, float]]],
    settings: dict[str, object] | None = None,
    shape: str = "qwen3-0.6b",
    commit: str = SAMPLE_BENCH_COMMIT,
    identical_with_prefix_caching: bool | None = None,
) -> dict[str, object]:
    """A `twinfer bench` record in the format reports.bench.harness writes, holding the fields the report reads.
    `figures`: per engine ("fast", "hf"), per phase label, (output tokens/s, time per output token in s);
    the floors are derived from them with a fixed ceiling, so the page has fractions to show."""
    settings = settings or {}
    shapes = {label: (requests, prompt, output) for label, requests, prompt, output in SAMPLE_PHASES[workload]}
    results = []
    for engine, by_phase in figures.items():
        phases = [_bench_phase(engine, label, *values, shapes[label], settings) for label, values in by_phase.items()]
        result: dict[str, object] = {"engine": engine, "phases": phases, "comparisons": None}
        if engine == "hf":
            result["transformers_settings"] = {"attn_implementation": "sdpa", "continuous_batching_given": {}}
        else:
            result["engine_settings_given"] = dict(settings)
            if identical_with_prefix_caching is not None:
                result["comparisons"] = {
                    "phases": ["prefix-caching-on", "prefix-caching-off"],
                    "outputs_identical": identical_with_prefix_caching,
                    "num_requests_identical": 64 if identical_with_prefix_caching else 61,
                    "num_requests": 64,
                }
        results.append(result)
    return {
        "record": "twinfer bench",
        "workload": {
            "name": workload,
            "standard_workload": True,
            "scale": 1.0,
            "scale_note": None,
            "phases": [
                {"label": label, "num_requests": requests, "num_prompt_tokens": prompt, "num_output_tokens": output}
                for label, requests, prompt, output in SAMPLE_PHASES[workload]
            ],
        },
        "shape": {"name": shape, "num_parameters": 596049920 if shape == "qwen3-0.6b" else 8190735360},
        "dtype": "bfloat16",
        "environment": {"device": "cuda", "gpu": SAMPLE_GPU, "gpu_driver": "1.0", "commit": commit},
        "ceilings": {
            "copy_bandwidth": {"value": 4000.0, "unit": "GB/s (bytes read + written)"},
            "matmul_bf16": {"value": 800.0, "unit": "TFLOP/s"},
        },
        "runs_per_phase": 3,
        "weight_seed": 0,
        "results": results,
    }


def _bench_phase(
    engine: str,
    label: str,
    tokens_per_s: float,
    tpot_s: float,
    shape: tuple[int, int, int],
    settings: dict[str, object],
) -> dict[str, object]:
    requests, prompt_tokens, output_tokens = shape
    metrics = {
        "num_requests": requests,
        "prompt_tokens": prompt_tokens,
        "output_tokens": output_tokens,
        "output_tokens_per_s": tokens_per_s,
        "prompt_tokens_served_from_cache": None,
        "prompt_tokens_computed": None,
        "tpot_s": tpot_s,
        "tpot_s_per_run": [tpot_s * 0.99, tpot_s, tpot_s * 1.02],
        "floors": {
            "fraction_of_output_ceiling": tokens_per_s / 40000.0,
            "tpot_over_decode_step_floor": tpot_s / 4e-4,
        },
    }
    entry: dict[str, object] = {"phase": label, "metrics": metrics}
    if engine != "hf":
        entry["engine_config"] = asdict(EngineConfig(**settings))
    return entry


def sample_bench_records() -> list[dict[str, object]]:
    """Every kind of record the speed section shows: one workload at tuned flags (given first) and at the
    defaults, batch-invariant mode on beside the same flags off, another shape, a sweep, prefix-shared."""
    return [
        bench_record("offline-256", {"fast": {"offline": (20000.0, 0.011)}, "hf": {"offline": (600.0, 0.26)}}, TUNED),
        bench_record("offline-256", {"fast": {"offline": (12000.0, 0.018)}, "hf": {"offline": (600.0, 0.26)}}),
        bench_record("offline-256", {"fast": {"offline": (18000.0, 0.012)}}, {**TUNED, "batch_invariant": True}),
        bench_record("decode-bs1", {"fast": {"decode": (1000.0, 0.001)}, "hf": {"decode": (25.0, 0.04)}}),
        bench_record(
            "decode-bs1", {"fast": {"decode": (160.0, 0.006)}, "hf": {"decode": (22.0, 0.045)}}, shape="qwen3-8b"
        ),
        bench_record(
            "decode-sweep",
            {
                "fast": {"batch-1": (800.0, 0.0012), "batch-8": (4000.0, 0.0019), "batch-32": (10000.0, 0.0031)},
                "hf": {"batch-1": (35.0, 0.028), "batch-8": (260.0, 0.030), "batch-32": (1300.0, 0.024)},
            },
            TUNED,
        ),
        bench_record(
            "prefix-shared",
            {"fast": {"prefix-caching-on": (6600.0, 0.009), "prefix-caching-off": (5000.0, 0.011)}},
            identical_with_prefix_caching=True,
        ),
    ]


def _speed() -> SpeedSection:
    records = [BenchRecord(record, f"bench/sample-{index}.json") for index, record in enumerate(sample_bench_records())]
    return speed_from_records(records)
