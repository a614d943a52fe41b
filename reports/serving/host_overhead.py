"""The fast engine's host (Python) time per step, with the device work stubbed out, on the CPU.

On an H200, offline-256 keeps the GPU busy only part of the time: between GPU steps the host
schedules, packs the step's inputs, loads the sampler's rows and applies the sampled tokens.
This harness times exactly that host path. It runs the real FastEngine code (ScheduledEngine.step,
FastEngine.step / _execute / _sequences / _launch / _sampled), the real fast.scheduler.Scheduler and its
block allocator, the real fast.input_batch.InputBatch.load (on the CPU) and the real
fast.sampler.Sampler's host work, and replaces only what runs on the device:

- the model: `StubRunner.run` packs the step into a real InputBatch (decode steps padded to the
  CUDA-graph batch sizes, as ModelRunner.run does with graphs on) and returns zero logits;
- the sampler's Gumbel-max kernel (`Sampler._gumbel_max`): on the CPU it would run in Triton's
  interpreter, about a second a step, so `StubSampler` takes each row's noise key modulo the
  vocabulary instead. Everything around it (set_rows, the row keys, the host copy of the tokens)
  is the real code.

The sampler works over a small vocabulary (SAMPLER_VOCAB, 64) so that the zero logits cost
nothing; requests are validated against the benchmark model's config (qwen3-0.6b), whose
vocabulary holds the workload's prompt ids. The sampled tokens differ from a GPU run's, which does
not matter for the host path: the workload uses ignore_eos, so every request runs to max_tokens
whatever it samples, and the scheduling is the same.

    python -m reports.serving.host_overhead --json reports/results/host/after.json [--scale 0.1] [--profile]

Figures: the host seconds of every engine.step() summed over the run, the number of steps, and the
median / p90 of the steps in which all of the workload's requests decode (the full batch, 256
requests at scale 1), from the median run of `--repeats`; plus FastEngine.step_timings' split.

Same behaviour: one more, untimed run with seeded requests (seed = index, logprobs=1 on every 7th)
records sha256 digests of every step's plan, every runner input (token ids, positions, block
tables, logit rows) and every output (`digest` in the record): a change to the host path that keeps
the engine's decisions keeps all three.
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import logging
import math
import os
import platform
import pstats
import statistics
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from fast.cuda_graphs import DecodeGraphs
from fast.engine import FastEngine
from fast.input_batch import InputBatch, SequenceInput
from fast.logits import StepLogits
from fast.model_runner import PreparedStep, device_settings, load_step, verify_graph_batch
from fast.sampler import Sampler
from reports.bench.device import REPOSITORY_ROOT, git_commit, git_has_uncommitted_changes
from reports.bench.harness import json_saver
from reports.bench.runners import PhaseRun, run_on_engine, warm_up_engine
from reports.bench.shapes import SHAPES
from reports.bench.workloads import Phase, build_workload
from spec.engine_config import EngineConfig
from spec.model_config import ModelConfig
from spec.request import PENDING_TOKEN, RequestOutput
from spec.sampling_params import SamplingParams
from spec.scheduling import StepPlan

logger = logging.getLogger(__name__)

WORKLOAD = "offline-256"
MODEL_SHAPE = "qwen3-0.6b"
SAMPLER_VOCAB = 64
# offline-256's engine settings (reports/results/bench/COMMAND.txt) and the pool the H200 run sized
# from its memory (reports/results/bench/after/offline-256.json): every request fits at once.
ENGINE_SETTINGS: dict[str, object] = {
    "max_num_seqs": 256,
    "max_num_batched_tokens": 8192,
    "max_model_len": 2048,
    "num_blocks": 68120,
}
DEFAULT_REPEATS = 3
PROFILE_TOP = 25
DIGEST_LOGPROBS_EVERY = 7  # the digest run asks every 7th request for logprobs=1 (the logprob path runs too)


# ----------------------------------------------------------------------------- the stubbed engine


class StubRunner:
    """What FastEngine reads of its ModelRunner (config, max_step_seqs, max_sample_rows, device, run), no model."""

    def __init__(self, model_config: ModelConfig, engine_config: EngineConfig, vocab_size: int) -> None:
        self.device = torch.device("cpu")
        self.config = device_settings(engine_config, model_config, self.device)  # as ModelRunner resolves it
        config = self.config
        self.max_step_seqs = min(config.max_num_seqs, config.max_num_batched_tokens)
        # As ModelRunner: one sampled row per sequence, or with speculative decoding one per verify position.
        drafts = config.speculative.num_speculative_tokens if config.speculative is not None else 0
        self.max_sample_rows = min(self.max_step_seqs * (1 + drafts), config.max_num_batched_tokens)
        self.inputs = InputBatch(
            config.max_num_batched_tokens,
            self.max_step_seqs,
            math.ceil(config.model_len / config.block_size),
            config.block_size,
            config.pool_blocks,  # the padding block, one past the pool, as the KV cache places it
            self.device,
        )
        # Only the batch sizes: nothing is captured, but decode steps are padded as with graphs on.
        self.graphs = DecodeGraphs(self.max_step_seqs) if config.enable_cuda_graphs else None
        verify_batch = verify_graph_batch(self.max_step_seqs, config.max_num_batched_tokens, drafts)
        self.verify_graphs = (
            DecodeGraphs(verify_batch, query_len=1 + drafts) if config.enable_cuda_graphs and verify_batch else None
        )
        # Every row a step can ask logits for (prompt-logprob rows included), zero: sampling costs nothing.
        self._logits = torch.zeros((config.max_num_batched_tokens, vocab_size), dtype=torch.float32)
        self.input_digest: StepDigest | None = None  # set by the digest run only (hashing costs host time)
        self._loaded: list[SequenceInput] = []  # the sequences prepare() loaded last

    @torch.inference_mode()
    def run(self, sequences: list[SequenceInput]) -> StepLogits:
        return self.launch(self.prepare(sequences))

    def prepare(self, sequences: list[SequenceInput]) -> PreparedStep:
        """ModelRunner.prepare's host work: packing the inputs, decode steps padded to a graph size."""
        self._loaded = sequences
        return load_step(self.inputs, sequences, self.graphs, self.verify_graphs)

    def launch(self, prepared: PreparedStep, num_shared: int = 0) -> StepLogits:
        """Zero logits for the step `prepare` loaded (the digest run hashes its inputs here, once any token
        loaded as pending has been filled in on the "device" by InputBatch.set_pending_tokens)."""
        if self.input_digest is not None:
            self.input_digest.add_inputs(self._filled_in(self._loaded))
        return StepLogits(self._logits[: prepared.num_rows])  # no head max: the sampler reduces the rows

    def _filled_in(self, sequences: list[SequenceInput]) -> list[SequenceInput]:
        filled, cursor = [], 0
        for sequence in sequences:
            tokens = list(sequence.token_ids)
            for offset, token in enumerate(tokens):
                if token == PENDING_TOKEN:
                    tokens[offset] = int(self.inputs.token_ids[cursor + offset])
            filled.append(sequence._replace(token_ids=tokens))
            cursor += len(tokens)
        return filled


class StubSampler(Sampler):
    """The real Sampler but for its Gumbel-max kernel, which on the CPU would run in Triton's interpreter."""

    def _gumbel_max(
        self, logits: torch.Tensor, temperature: torch.Tensor, keys: torch.Tensor, keep: torch.Tensor | None
    ) -> torch.Tensor:
        return keys % logits.shape[1]


class HostOnlyFastEngine(FastEngine):
    """FastEngine over StubRunner and StubSampler; every other method is FastEngine's own.

    FastEngine.__init__ builds a ModelRunner (weights, KV pool, kernels); this attaches the host side
    (FastEngine._attach) to the stubs instead (tests/reports/test_host_overhead.py checks the attributes agree).
    """

    def __init__(
        self, model_config: ModelConfig, engine_config: EngineConfig, sampler_vocab: int = SAMPLER_VOCAB
    ) -> None:
        self.tensor_parallel = None
        self.device = torch.device("cpu")
        self.model_config = model_config
        self.dtype = torch.bfloat16
        runner = StubRunner(model_config, engine_config, sampler_vocab)
        self._attach(runner, StubSampler(runner.max_sample_rows, sampler_vocab, self.device))


# ----------------------------------------------------------------------------- same behaviour


class StepDigest:
    """sha256 over every step's plan, the runner inputs it produced and the outputs step() returned.

    Two versions of the host path that make the same decisions give the same three digests: the
    plans (scheduled request ids, starts, token counts, preemptions, admissions), the runner inputs
    (token ids, positions, whole block tables, logit rows) and the outputs (tokens, logprobs, finish
    reasons, cached prompt tokens). Inputs are hashed as plain tuples, so a change of container type
    (list, array) does not change the digest; plans and outputs by their dataclass repr.
    """

    def __init__(self) -> None:
        self._plans = hashlib.sha256()
        self._inputs = hashlib.sha256()
        self._outputs = hashlib.sha256()
        self.num_plans = 0
        self.num_outputs = 0

    def add_plan(self, plan: StepPlan) -> None:
        self._plans.update(repr(plan).encode())
        self.num_plans += 1

    def add_inputs(self, sequences: Sequence[SequenceInput]) -> None:
        for seq in sequences:
            normalised = (tuple(seq.token_ids), seq.start, tuple(seq.block_table), tuple(seq.logit_offsets))
            self._inputs.update(repr(normalised).encode())
        self._inputs.update(b"|")  # the step boundary

    def add_outputs(self, outputs: Sequence[RequestOutput]) -> None:
        self._outputs.update(repr(list(outputs)).encode())
        self.num_outputs += len(outputs)

    def record(self) -> dict[str, object]:
        return {
            "plans_sha256": self._plans.hexdigest(),
            "inputs_sha256": self._inputs.hexdigest(),
            "outputs_sha256": self._outputs.hexdigest(),
            "num_plans": self.num_plans,
            "num_outputs": self.num_outputs,
        }


def digest_params(phase: Phase, index: int) -> SamplingParams:
    """The workload's params, seeded by the request's index (so two runs sample alike), logprobs on some."""
    return SamplingParams(
        temperature=phase.temperature,
        max_tokens=phase.requests[index].max_tokens,
        ignore_eos=True,
        seed=index,
        logprobs=1 if index % DIGEST_LOGPROBS_EVERY == 0 else 0,
    )


def digest_run(phase: Phase, settings: HostSettings) -> dict[str, object]:
    """One untimed run of the phase with seeded requests, hashing every plan, runner input and output."""
    engine = build_engine(settings)
    warm_up_engine(engine)
    digest = StepDigest()
    engine.runner.input_digest = digest
    schedule = engine.scheduler.schedule

    def recording_schedule() -> StepPlan:
        plan = schedule()
        digest.add_plan(plan)
        return plan

    engine.scheduler.schedule = recording_schedule  # type: ignore[method-assign]
    for index, request in enumerate(phase.requests):
        engine.add_request(request.prompt_token_ids, digest_params(phase, index))
    while engine.has_unfinished:
        digest.add_outputs(engine.step())
    return digest.record()


# ----------------------------------------------------------------------------- measuring


@dataclass(frozen=True)
class HostSettings:
    scale: float = 1.0
    repeats: int = DEFAULT_REPEATS
    profile: bool = False
    sampler_vocab: int = SAMPLER_VOCAB
    torch_threads: int = 1
    async_scheduling: bool = False


def build_engine(settings: HostSettings) -> HostOnlyFastEngine:
    config = EngineConfig(**ENGINE_SETTINGS, async_scheduling=settings.async_scheduling)
    return HostOnlyFastEngine(SHAPES[MODEL_SHAPE].model_config(), config, settings.sampler_vocab)


def measure_once(phase: Phase, settings: HostSettings) -> tuple[PhaseRun, HostOnlyFastEngine]:
    """One run of the phase on a fresh engine (a second run on one engine would hit the prefix cache)."""
    engine = build_engine(settings)
    warm_up_engine(engine)
    return run_on_engine(engine, phase, progress=False), engine


def run_summary(run: PhaseRun, phase: Phase) -> dict[str, object]:
    full = run.full_batch_decode_step_s
    expected = [request.max_tokens for request in phase.requests]
    produced = [len(request.token_ids) for request in run.requests]
    return {
        "host_s": math.fsum(run.step_wall_s),
        "run_wall_s": run.wall_s,
        "num_steps": len(run.step_wall_s),
        "num_full_batch_steps": len(full),
        "full_batch_step_median_ms": statistics.median(full) * 1e3 if full else None,
        "full_batch_step_p90_ms": _percentile(full, 90) * 1e3 if full else None,
        "full_batch_step_min_ms": min(full) * 1e3 if full else None,
        "step_timings": run.engine_step_timings,
        "num_requests_finished": len(run.requests),
        "num_output_tokens": run.num_output_tokens,
        "all_requests_complete": len(run.requests) == len(phase.requests) and produced == expected,
    }


def _percentile(values: Sequence[float], percent: float) -> float:
    """Linear interpolation between the closest ranks (numpy's default)."""
    ordered = sorted(values)
    rank = (len(ordered) - 1) * percent / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def median_run(runs: list[dict[str, object]]) -> dict[str, object]:
    """The run whose total host time is the median (the lower middle one for an even count)."""
    ordered = sorted(runs, key=lambda run: run["host_s"])
    return ordered[(len(ordered) - 1) // 2]


def spread(runs: list[dict[str, object]], key: str) -> dict[str, float | None]:
    values = [run[key] for run in runs if run[key] is not None]
    if not values:
        return {"median": None, "min": None, "max": None}
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def profile_run(phase: Phase, settings: HostSettings) -> dict[str, object]:
    """One extra run under cProfile (slower than the timed ones): the top functions both ways."""
    engine = build_engine(settings)
    warm_up_engine(engine)
    profiler = cProfile.Profile()
    profiler.enable()
    run_on_engine(engine, phase, progress=False)
    profiler.disable()
    stats = pstats.Stats(profiler)
    return {
        "note": "cProfile adds a cost per Python call, so its seconds overstate call-heavy code; compare "
        "functions with each other, not with the timed runs",
        "total_s": stats.total_tt,  # type: ignore[attr-defined]
        "top_cumulative": _top_functions(stats, "cumulative"),
        "top_total": _top_functions(stats, "tottime"),
    }


def _top_functions(stats: pstats.Stats, order: str) -> list[dict[str, object]]:
    entries = stats.stats  # type: ignore[attr-defined]  # (file, line, name) -> (cc, nc, tt, ct, callers)
    index = 3 if order == "cumulative" else 2
    ranked = sorted(entries.items(), key=lambda item: item[1][index], reverse=True)[:PROFILE_TOP]
    return [
        {
            "function": name,
            "location": f"{_short_path(file)}:{line}",
            "calls": calls,
            "primitive_calls": primitive,
            "total_s": round(total, 6),
            "cumulative_s": round(cumulative, 6),
        }
        for (file, line, name), (primitive, calls, total, cumulative, _) in ranked
    ]


def _short_path(file: str) -> str:
    """Repository files relative to its root; others (the standard library, torch) as given."""
    path = Path(file)
    if path.is_absolute() and path.is_relative_to(REPOSITORY_ROOT):
        return str(path.relative_to(REPOSITORY_ROOT))
    return file


def machine() -> dict[str, object]:
    return {
        "cpu": _cpu_model() or platform.processor() or platform.machine(),
        "cpu_count": _cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "host": platform.node(),
    }


def _cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        return None
    return None


def _cpu_count() -> int | None:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def measure(settings: HostSettings) -> dict[str, object]:
    """The record: settings, machine, each run's figures, and the medians over runs."""
    torch.set_num_threads(settings.torch_threads)
    workload = build_workload(WORKLOAD, settings.scale)
    (phase,) = workload.phases
    runs = []
    for repeat in range(settings.repeats):
        run, engine = measure_once(phase, settings)
        runs.append(run_summary(run, phase))
        logger.info(
            "run %d/%d: %.3f s host over %d steps; full-batch step median %s ms",
            repeat + 1,
            settings.repeats,
            runs[-1]["host_s"],
            runs[-1]["num_steps"],
            _format_ms(runs[-1]["full_batch_step_median_ms"]),
        )
    record: dict[str, object] = {
        "what": "fast engine host time per step, device work stubbed (reports.serving.host_overhead)",
        "stubs": {
            "model": "StubRunner.run: real InputBatch.load on the CPU (decode steps padded to CUDA-graph sizes), "
            "then zero logits",
            "sampler": f"real Sampler host path over a {settings.sampler_vocab}-token vocabulary; its Gumbel-max "
            "kernel (Sampler._gumbel_max, Triton's interpreter on the CPU: ~0.9 s a step) replaced by "
            "row_key % vocab",
        },
        "workload": workload.record(),
        "model_config": MODEL_SHAPE,
        "engine_config": asdict(engine.config),
        "settings": asdict(settings),
        "machine": machine(),
        "commit": git_commit(),
        "uncommitted_changes": git_has_uncommitted_changes(),
        "command": sys.argv,
        "repeats": settings.repeats,
        "median_run": median_run(runs),
        "spread": {
            key: spread(runs, key)
            for key in ("host_s", "full_batch_step_median_ms", "full_batch_step_p90_ms", "run_wall_s")
        },
        "runs": runs,
        "digest": digest_run(phase, settings),
    }
    if settings.profile:
        record["profile"] = profile_run(phase, settings)
    return record


def _format_ms(value: object) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def summary_text(record: dict[str, object]) -> str:
    run = record["median_run"]
    host = record["spread"]["host_s"]
    full = record["spread"]["full_batch_step_median_ms"]
    timings = run["step_timings"] or {}
    lines = [
        f"{record['workload']['name']} (scale {record['workload']['scale']}) on {record['machine']['cpu']}, "
        f"commit {record['commit']}",
        f"host s: median {host['median']:.3f} (min {host['min']:.3f}, max {host['max']:.3f}) over {record['repeats']} "
        f"runs; {run['num_steps']} steps",
        f"full-batch step ms: median {_format_ms(full['median'])} (runs {_format_ms(full['min'])} .. "
        f"{_format_ms(full['max'])}), p90 {_format_ms(run['full_batch_step_p90_ms'])} "
        f"over {run['num_full_batch_steps']} steps",
        "split (median run): "
        + ", ".join(f"{name} {timings.get(name, 0.0):.3f} s" for name in ("schedule_s", "prepare_s", "forward_s")),
        f"all requests complete: {run['all_requests_complete']}",
        "digest: " + ", ".join(f"{key} {value}" for key, value in record["digest"].items()),
    ]
    return "\n".join(lines)


# ----------------------------------------------------------------------------- command line


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", type=Path, help="write the record here")
    parser.add_argument("--scale", type=float, default=1.0, help="shrink the workload (0 < scale <= 1; 1: standard)")
    parser.add_argument("--repeats", type=int, default=DEFAULT_REPEATS, help="timed runs; the median is kept")
    parser.add_argument("--profile", action="store_true", help="one extra run under cProfile, top functions")
    parser.add_argument("--sampler-vocab", type=int, default=SAMPLER_VOCAB, help="the sampler's vocabulary")
    parser.add_argument("--torch-threads", type=int, default=1, help="torch intra-op threads (tiny host ops)")
    parser.add_argument(
        "--async-scheduling",
        action="store_true",
        help="EngineConfig.async_scheduling (on the CPU nothing runs beside the host, so only the plans can differ)",
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m reports.serving.host_overhead", description=__doc__.split("\n\n")[0]
    )
    configure_parser(parser)
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = HostSettings(
        args.scale, args.repeats, args.profile, args.sampler_vocab, args.torch_threads, args.async_scheduling
    )
    record = measure(settings)
    json_saver(args.json)(record)
    print(summary_text(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
