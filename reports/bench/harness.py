"""`twinfer bench WORKLOAD`: the standard workloads of ../shared/benchmarks.md on a model shape with
random weights, on one engine, optionally beside transformers (`--baseline hf`) in the same process.

The JSON record holds: where it ran (GPU, driver, versions, commit), the device's copy bandwidth
and bf16 matmul ceiling measured in the same process, the model shape, dtype, workload (and
whether it is the standard one), each engine's settings, and per phase the workload's figures
with the raw numbers they come from. Every phase runs `--repeats` times. Latency workloads (time per
output token) run them on one engine and keep the median; their throughput figures come from the
first run, when no prompt of the phase is in the prefix cache yet. Throughput workloads (offline-256,
prefix-shared) run each time on a fresh engine, so that no run finds its prompts cached, and keep the
run of median wall time; their profile (`--profile`) runs on a fresh engine too. transformers runs a
throughput phase once (its offline-256 takes minutes a run).
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, is_dataclass
from functools import partial
from pathlib import Path
from typing import TypeVar

import torch

from reports.bench.device import environment, measure_ceilings
from reports.bench.profile import profile_run
from reports.bench.runners import (
    ContinuousBatchingSettings,
    PhaseRun,
    run_hf_continuous_batching,
    run_hf_generate,
    run_on_engine,
    warm_up_engine,
    warm_up_hf_generate,
)
from reports.bench.shapes import SHAPES, ModelShape, build_hf_model, random_state_dict
from reports.bench.workloads import (
    GENERATE,
    WARMUP_MAX_TOKENS,
    WARMUP_PROMPT,
    WORKLOADS,
    Phase,
    Workload,
    build_workload,
)
from spec.checkpoint import load_model_config, load_state_dict, parse_dtype
from spec.engine import Engine
from spec.engine_config import DEFAULT_NUM_BLOCKS, SMALL_BATCHES, EngineConfig
from spec.errors import ConfigError
from twinfer.engine_options import add_engine_arguments, given_engine_settings
from twinfer.registry import ENGINE_NAMES, default_engine_name, engine_class, engine_entry, resolve_device

logger = logging.getLogger(__name__)

HF = "hf"
WORKLOAD_SUMMARIES = {
    "offline-256": "256 requests of random lengths, temperature 0.6 (nano-vllm's bench): output tokens/s",
    "decode-bs1": "one request, 128-token prompt, 256 greedy tokens: time per output token",
    "decode-sweep": "batch sizes 1, 8, 32, 128, 256 of 1024-token prompts, 128 tokens each: TPOT per batch size",
    "prefix-shared": "64 requests sharing a 2048-token prefix, prefix caching on and off",
    "long-context": "8 requests with 16,384-token prompts, 256 tokens each: prefill tokens/s and TPOT",
    "decode-bs1-edit": "one request whose output can repeat its prompt (a source file, then its start again), "
    "256 greedy tokens: time per output token (speculative decoding's workload)",
}
if set(WORKLOAD_SUMMARIES) != set(WORKLOADS):  # a workload added to one table but not the other
    raise ImportError("WORKLOAD_SUMMARIES must name exactly the workloads of reports.bench.workloads")
# transformers' continuous batching sizes its cache from free GPU memory; on the CPU (harness
# tests) it is given a size, generous for any page size it uses.
CPU_CONTINUOUS_BATCHING_MAX_BATCH_TOKENS = 256


@dataclass(frozen=True)
class BenchSettings:
    """Everything a run depends on, validated once."""

    workload: Workload
    shape: ModelShape
    engine: str  # a twinfer engine name, or HF
    baseline: str | None
    dtype: torch.dtype
    device: torch.device
    repeats: int
    weight_seed: int
    engine_settings: dict[str, object] = field(default_factory=dict)  # EngineConfig fields given
    hf_attn_implementation: str = "sdpa"
    hf_continuous_batching: ContinuousBatchingSettings = ContinuousBatchingSettings()
    hf_prompt_lookup_num_tokens: int | None = None  # transformers' assisted generation by prompt lookup
    model: Path | None = None  # a checkpoint whose weights run instead of the shape's random ones
    progress: bool = True
    commit: str | None = None
    profile: bool = False  # one extra, untimed run of each engine phase under torch.profiler

    @property
    def runs_per_phase(self) -> int:
        return self.repeats

    @property
    def hf_runs_per_phase(self) -> int:
        return self.repeats if self.workload.latency else 1


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--shape", default="qwen3-0.6b", choices=sorted(SHAPES), help="model shape (random weights)")
    parser.add_argument(
        "--model",
        type=Path,
        help="a checkpoint directory (Hugging Face layout) to run instead of --shape's random weights, e.g. the "
        "shipped model twinfer/models/stdlib-tiny; transformers loads the same checkpoint",
    )
    parser.add_argument(
        "--rank-share",
        type=int,
        default=1,
        metavar="N",
        help="run the share of the shape that one rank of N-way tensor parallelism computes (heads, KV heads, "
        "intermediate size and vocabulary divided by N), alone on one device, no collectives: a rank's compute "
        "floor (default 1: the whole shape)",
    )
    parser.add_argument(
        "--engine",
        default=None,
        choices=(*ENGINE_NAMES, HF),
        help="what runs the workload (default: fast on CUDA, reference on the CPU)",
    )
    parser.add_argument("--baseline", choices=(HF,), help="also run transformers on the same workload, in this process")
    parser.add_argument("--json", type=Path, help="write the record as JSON to this file")
    parser.add_argument(
        "--dtype", default="bfloat16", choices=["float32", "float16", "bfloat16"], help="dtype (default bfloat16)"
    )
    parser.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    parser.add_argument(
        "--scale",
        type=float,
        default=1.0,
        help="shrink every count and length by this factor, for harness tests (default 1: the standard workload)",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="runs per phase (default 3): on one engine for latency workloads, each on a fresh engine for throughput "
        "ones; transformers runs a throughput phase once",
    )
    parser.add_argument("--weight-seed", type=int, default=0, help="seed of the random weights (default 0)")
    parser.add_argument("--commit", help="git commit to record (default: `git rev-parse HEAD`)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="after the timed runs, one more run of each phase under torch.profiler: GPU busy time, "
        "kernel time by kind and name (recorded under the phase's 'profile')",
    )
    hf = parser.add_argument_group("transformers baseline")
    hf.add_argument("--hf-attn-implementation", default="sdpa", help="attn_implementation (default sdpa)")
    hf.add_argument(
        "--hf-cuda-graph",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="continuous batching's use_cuda_graph (default: transformers decides)",
    )
    hf.add_argument(
        "--hf-num-blocks", type=int, help="continuous batching's num_blocks (default: transformers sizes it)"
    )
    hf.add_argument("--hf-max-batch-tokens", type=int, help="continuous batching's max_batch_tokens")
    hf.add_argument(
        "--hf-prompt-lookup",
        type=int,
        metavar="K",
        help="generate with assisted generation by prompt lookup (prompt_lookup_num_tokens=K): transformers' "
        "counterpart of --speculative-method ngram (batch-1 workloads)",
    )
    add_engine_arguments(parser)


def settings_from_args(args: argparse.Namespace) -> BenchSettings:
    device = resolve_device(args.device)
    engine = args.engine if args.engine is not None else default_engine_name(device)
    if args.baseline == engine:
        raise ConfigError(f"--baseline {args.baseline} is the engine benchmarked already")
    if args.repeats < 1:
        raise ConfigError(f"--repeats must be at least 1, got {args.repeats}")
    if args.hf_prompt_lookup is not None and args.hf_prompt_lookup < 1:
        raise ConfigError(f"--hf-prompt-lookup must be at least 1, got {args.hf_prompt_lookup}")
    engine_settings = given_engine_settings(args)
    EngineConfig(**engine_settings)  # reject bad settings before anything is built
    if args.model is not None:
        if args.rank_share != 1:
            raise ConfigError("--rank-share applies to --shape's random weights, not to --model")
        shape = ModelShape.of_checkpoint(args.model.name, load_model_config(args.model))
    else:
        shape = rank_share(SHAPES[args.shape], args.rank_share)
    if engine != HF:
        engine_class(engine, device)  # fails now, not after the baseline ran, if it cannot run here
    return BenchSettings(
        workload=build_workload(args.workload, args.scale),
        shape=shape,
        engine=engine,
        baseline=args.baseline,
        dtype=parse_dtype(args.dtype),
        device=device,
        repeats=args.repeats,
        weight_seed=args.weight_seed,
        engine_settings=engine_settings,
        hf_attn_implementation=args.hf_attn_implementation,
        hf_continuous_batching=ContinuousBatchingSettings(
            args.hf_num_blocks, args.hf_max_batch_tokens, args.hf_cuda_graph
        ),
        hf_prompt_lookup_num_tokens=args.hf_prompt_lookup,
        model=args.model,
        progress=not args.no_progress,
        commit=args.commit,
        profile=args.profile,
    )


def rank_share(shape: ModelShape, ranks: int) -> ModelShape:
    try:
        return shape.rank_share(ranks)
    except ValueError as error:
        raise ConfigError(f"--rank-share {ranks}: {error}") from None


def json_saver(path: Path | None) -> Callable[[dict[str, object]], None]:
    """A `save` callback that (re)writes the record as JSON to `path`; nothing when path is None."""

    def save(record: dict[str, object]) -> None:
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(record, indent=2) + "\n")

    return save


def run(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    record = run_benchmark(settings, json_saver(args.json))
    print(summary_text(record))
    return 0


def run_benchmark(
    settings: BenchSettings, save: Callable[[dict[str, object]], None] = lambda record: None
) -> dict[str, object]:
    """The record of the workload on the engine and baseline; `save` receives it after each of
    them, so the figures of one survive a failure of the next."""
    workload, shape = settings.workload, settings.shape
    logger.info("measuring the device's ceilings on %s", settings.device)
    ceilings = measure_ceilings(settings.device)
    record: dict[str, object] = {
        "record": "twinfer bench",
        "workload": workload.record(),
        "shape": shape.record(),
        "model": None if settings.model is None else str(settings.model),
        "dtype": str(settings.dtype).removeprefix("torch."),
        "environment": environment(settings.device, settings.commit),
        "ceilings": ceilings,
        "runs_per_phase": settings.runs_per_phase,
        "hf_runs_per_phase": settings.hf_runs_per_phase,
        "weight_seed": settings.weight_seed,
        "results": [],
    }
    for name in (settings.engine, settings.baseline):
        if name is None:
            continue
        result = run_hf(settings) if name == HF else run_engine(name, settings)
        add_floors(result, settings, ceilings)
        record["results"].append(result)
        save(record)
    return record


# ----------------------------------------------------------------------------- twinfer engines


def build_random_engine(
    name: str,
    shape: ModelShape,
    config: EngineConfig,
    dtype: torch.dtype,
    device: torch.device,
    weight_seed: int,
    model: Path | None = None,
) -> Engine:
    """Engine `name` over the shape's random weights, drawn on the device (random_state_dict), or over the
    checkpoint `model`'s weights."""
    if model is not None:
        model_config = load_model_config(model)
        state_dict = load_state_dict(model, model_config, dtype, device)
    else:
        model_config = shape.model_config()
        state_dict = random_state_dict(model_config, dtype, device, weight_seed)
    engine = engine_class(name, device)(model_config, state_dict, config, dtype, device)
    del state_dict  # the engine holds what it needs; what it does not is freed
    return engine


T = TypeVar("T")


def _on_fresh_engine(
    name: str, settings: BenchSettings, config: EngineConfig, work: Callable[[Engine], T]
) -> tuple[T, dict[str, object], dict[str, object]]:
    """work(engine) on a fresh engine for `config`, warmed up by one request; then the engine ends (tensor-parallel
    ranks end with theirs) and its memory goes back before anything else is built. Returns what work returned, the
    engine's start-up times and its resolved config."""
    built = time.perf_counter()
    engine = build_random_engine(
        name, settings.shape, config, settings.dtype, settings.device, settings.weight_seed, settings.model
    )
    start_up = {"build_s": time.perf_counter() - built} | _runner_startup(engine)
    resolved = asdict(engine.config)
    try:
        warm_up_engine(engine)
        result = work(engine)
    finally:
        if hasattr(engine, "shutdown"):
            engine.shutdown()
        del engine  # the last reference: the memory below is the engine's
        _release_memory(settings.device)
    return result, start_up, resolved


def _run_phase(name: str, settings: BenchSettings, phase: Phase) -> tuple[list[PhaseRun], dict[str, object]]:
    """The phase's runs and its record. A latency workload runs them on one engine (warmed up by one request), then
    the profile there; a throughput workload runs each (and the profile) on an engine of its own, as its figures
    count the prefill a second run on one engine would find in the prefix cache."""
    config = bench_engine_config(name, settings, phase)
    count, independent = settings.runs_per_phase, not settings.workload.latency

    def one_run(engine: Engine) -> PhaseRun:
        return run_on_engine(engine, phase, settings.progress)

    def profile_of(engine: Engine) -> dict[str, object]:
        return profile_run(partial(run_on_engine, engine, phase, False), settings.device)[1]

    def runs_then_profile(engine: Engine) -> tuple[list[PhaseRun], dict[str, object] | None]:
        timed = [one_run(engine) for _ in range(count)]
        return timed, profile_of(engine) if settings.profile else None

    profile = None
    if independent:
        results = [_on_fresh_engine(name, settings, config, one_run) for _ in range(count)]
        runs = [run for run, _, _ in results]
        _, start_up, resolved = results[0]  # the first engine's start-up, as a latency workload's one engine
        if settings.profile:
            profile = _on_fresh_engine(name, settings, config, profile_of)[0]
    else:
        (runs, profile), start_up, resolved = _on_fresh_engine(name, settings, config, runs_then_profile)
    entry = {
        "phase": phase.label,
        "engine_config": resolved,
        "start_up": start_up,
        "metrics": phase_metrics(runs, independent),
        "runs": [run_record(run) for run in runs],
    }
    if profile is not None:
        entry["profile"] = profile
    return runs, entry


def run_engine(name: str, settings: BenchSettings) -> dict[str, object]:
    """Each phase of the workload on fresh engines built from random weights on the device (_run_phase)."""
    phases, runs_by_label = [], {}
    for phase in settings.workload.phases:
        runs, entry = _run_phase(name, settings, phase)
        runs_by_label[phase.label] = runs
        phases.append(entry)
    return {
        "engine": name,
        # JSON: the one nested setting (speculative) as its fields
        "engine_settings_given": {
            key: asdict(value) if is_dataclass(value) else value for key, value in settings.engine_settings.items()
        },
        "phases": phases,
        "comparisons": prefix_caching_comparison(settings.workload, runs_by_label),
    }


def _runner_startup(engine: Engine) -> dict[str, object]:
    """The fast engine's start-up phases (fast.model_runner.StartupTimings), the random weights' drawing
    excluded; nothing for an engine that keeps none."""
    startup = getattr(getattr(engine, "runner", None), "startup", None)
    return asdict(startup) if startup is not None else {}


def bench_engine_config(name: str, settings: BenchSettings, phase: Phase) -> EngineConfig:
    """The settings given, and nothing else where the engine sizes itself (the fast engine on CUDA: what
    a user gets with no flags). Elsewhere (the harness's CPU tests) what was not given is sized so that
    the workload is what is measured: room for the largest phase's requests all at once, so that neither
    the batch limit nor the KV pool throttles it."""
    phases = settings.workload.phases
    sized: dict[str, object] = {}
    if not (engine_entry(name).sizes_kv_pool_from_gpu_memory and settings.device.type == "cuda"):
        sized["max_num_seqs"] = max(SMALL_BATCHES.max_num_seqs, *(len(p.requests) for p in phases))
        block_size = settings.engine_settings.get("block_size", EngineConfig().block_size)
        needed = max(_blocks_needed(p, block_size) for p in phases) + _blocks_for(
            len(WARMUP_PROMPT) + WARMUP_MAX_TOKENS, block_size
        )
        sized["num_blocks"] = max(DEFAULT_NUM_BLOCKS, needed)
    forced = {} if phase.prefix_caching is None else {"enable_prefix_caching": phase.prefix_caching}
    return EngineConfig(**(sized | settings.engine_settings | forced))


def _blocks_needed(phase: Phase, block_size: int) -> int:
    return sum(_blocks_for(len(r.prompt_token_ids) + r.max_tokens, block_size) for r in phase.requests)


def _blocks_for(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


def prefix_caching_comparison(workload: Workload, runs_by_label: dict[str, list[PhaseRun]]) -> dict[str, object] | None:
    """Whether the phases run with prefix caching on and off generated identical tokens."""
    on = [p.label for p in workload.phases if p.prefix_caching is True]
    off = [p.label for p in workload.phases if p.prefix_caching is False]
    if not on or not off or on[0] not in runs_by_label or off[0] not in runs_by_label:
        return None
    with_cache, without_cache = runs_by_label[on[0]][0], runs_by_label[off[0]][0]
    identical = [a.token_ids == b.token_ids for a, b in zip(with_cache.requests, without_cache.requests, strict=True)]
    return {
        "phases": [on[0], off[0]],
        "outputs_identical": all(identical),
        "num_requests_identical": sum(identical),
        "num_requests": len(identical),
    }


# ----------------------------------------------------------------------------- transformers


def run_hf(settings: BenchSettings) -> dict[str, object]:
    model = build_hf_model(
        settings.shape,
        settings.dtype,
        settings.device,
        settings.weight_seed,
        settings.hf_attn_implementation,
        settings.model,
    )
    lookup = settings.hf_prompt_lookup_num_tokens
    continuous_batching = _hf_continuous_batching_settings(settings)
    phases = []
    for phase in settings.workload.phases:
        if not phase.run_on_hf:
            continue
        if phase.hf_method == GENERATE:
            warm_up_hf_generate(model)
            runs = [run_hf_generate(model, phase, settings.progress, lookup) for _ in range(settings.hf_runs_per_phase)]
        else:
            runs = [
                run_hf_continuous_batching(model, phase, continuous_batching, settings.progress)
                for _ in range(settings.hf_runs_per_phase)
            ]
        phases.append(
            {
                "phase": phase.label,
                "method": phase.hf_method,
                "metrics": phase_metrics(runs),
                "runs": [run_record(run) for run in runs],
            }
        )
    del model
    _release_memory(settings.device)
    return {
        "engine": HF,
        "transformers_settings": {
            "attn_implementation": settings.hf_attn_implementation,
            "prompt_lookup_num_tokens": lookup,
            "continuous_batching_given": continuous_batching.given(),
        },
        "phases": phases,
        "comparisons": None,
    }


def _hf_continuous_batching_settings(settings: BenchSettings) -> ContinuousBatchingSettings:
    given = settings.hf_continuous_batching
    if settings.device.type == "cuda":
        return given
    tokens = max(p.num_prompt_tokens + p.num_output_tokens for p in settings.workload.phases)
    requests = max(len(p.requests) for p in settings.workload.phases)
    return ContinuousBatchingSettings(
        num_blocks=given.num_blocks or _blocks_for(tokens, 16) + requests + 16,
        max_batch_tokens=given.max_batch_tokens or CPU_CONTINUOUS_BATCHING_MAX_BATCH_TOKENS,
        use_cuda_graph=given.use_cuda_graph,
    )


# ----------------------------------------------------------------------------- figures


def phase_metrics(runs: list[PhaseRun], independent: bool = False) -> dict[str, object]:
    """A phase's figures: throughput and prefill from one run, time per output token as the median over runs of
    each run's median over requests. The one run: with independent runs (each on a fresh engine) the run of median
    wall time (the slower middle one of an even count), otherwise the first (the only one that found no prompt of
    the phase cached)."""
    chosen = sorted(runs, key=lambda run: run.wall_s)[len(runs) // 2] if independent else runs[0]
    prompt_tokens = sum(r.num_prompt_tokens for r in chosen.requests)
    cached = [r.num_cached_prompt_tokens for r in chosen.requests]
    cached_total = None if any(c is None for c in cached) else sum(cached)
    first_tokens = [r.first_token_s for r in chosen.requests]
    prefill_s = None if any(t is None for t in first_tokens) else max(first_tokens)
    tpot_runs = [_median_tpot(run) for run in runs]
    tpot = statistics.median(tpot_runs) if all(t is not None for t in tpot_runs) else None
    full_batch_steps = [s for run in runs for s in run.full_batch_decode_step_s]
    return {
        "throughput_run": runs.index(chosen),
        "wall_s": chosen.wall_s,
        "num_requests": len(chosen.requests),
        "prompt_tokens": prompt_tokens,
        "output_tokens": chosen.num_output_tokens,
        "output_tokens_per_s": chosen.num_output_tokens / chosen.wall_s,
        "prompt_tokens_served_from_cache": cached_total,
        "prompt_tokens_computed": None if cached_total is None else prompt_tokens - cached_total,
        "time_to_first_token_s_median": None if prefill_s is None else statistics.median(first_tokens),
        "time_to_last_first_token_s": prefill_s,
        "prefill_tokens_per_s": None if not prefill_s else prompt_tokens / prefill_s,
        "tpot_s": tpot,
        "tpot_s_per_run": tpot_runs,
        "tokens_per_s_per_request_from_tpot": None if not tpot else 1 / tpot,
        "full_batch_decode_step_s_median": statistics.median(full_batch_steps) if full_batch_steps else None,
        "num_full_batch_decode_steps": len(full_batch_steps),
        "engine_step_timings": chosen.engine_step_timings,
    }


def _median_tpot(run: PhaseRun) -> float | None:
    values = [r.time_per_output_token_s for r in run.requests]
    if not values or any(v is None for v in values):
        return None
    return statistics.median(values)


def run_record(run: PhaseRun) -> dict[str, object]:
    return {
        "wall_s": run.wall_s,
        "output_tokens": run.num_output_tokens,
        "tpot_s_median": _median_tpot(run),
        "prompt_tokens_served_from_cache": _sum_or_none([r.num_cached_prompt_tokens for r in run.requests]),
        "num_steps": len(run.step_wall_s) or None,
        "step_wall_s_total": sum(run.step_wall_s) if run.step_wall_s else None,
        "step_wall_s_median": statistics.median(run.step_wall_s) if run.step_wall_s else None,
        "engine_step_timings": run.engine_step_timings,
    }


def _sum_or_none(values: list[int | None]) -> int | None:
    return None if any(v is None for v in values) else sum(values)


def add_floors(result: dict[str, object], settings: BenchSettings, ceilings: dict[str, object]) -> None:
    """Beside each measured figure, the physical limit it is held to (benchmarks.md, 'Physical
    limits' and 'Floors'), from the ceilings measured in this run."""
    bandwidth = ceilings["copy_bandwidth"]["value"] * 1e9  # bytes/s
    matmul = ceilings["matmul_bf16"]["value"] * 1e12  # FLOP/s
    shape, dtype = settings.shape, settings.dtype
    phases_by_label = {phase.label: phase for phase in settings.workload.phases}
    for entry in result["phases"]:
        phase = phases_by_label[entry["phase"]]
        metrics = entry["metrics"]
        decode_steps = max(r.max_tokens for r in phase.requests)
        read_floor_s = decode_read_bytes(shape, dtype, phase) / bandwidth
        step_floor_s = read_floor_s / decode_steps
        weight_floor_s = shape.weight_bytes_read_per_decode_step(dtype) / bandwidth
        tpot = metrics["tpot_s"]
        ceiling = phase.num_output_tokens / read_floor_s
        floors: dict[str, object] = {
            "note": "decode reads every weight once per step (untied input embedding excluded) and each "
            "request's K/V once per token it generates; all requests run at once; prefill compute not counted",
            "decode_read_floor_s": read_floor_s,
            "output_tokens_per_s_ceiling": ceiling,
            "fraction_of_output_ceiling": metrics["output_tokens_per_s"] / ceiling,
            "decode_step_floor_s": step_floor_s,
            "tpot_over_decode_step_floor": tpot / step_floor_s if tpot else None,
            "weight_read_floor_s": weight_floor_s,
            "tpot_over_weight_read_floor": tpot / weight_floor_s if tpot else None,
        }
        if metrics["time_to_last_first_token_s"]:
            flops = sum(shape.prefill_flops(len(r.prompt_token_ids)) for r in phase.requests)
            achieved = flops / metrics["time_to_last_first_token_s"]
            floors["prefill_tflops"] = achieved / 1e12
            floors["prefill_fraction_of_matmul_ceiling"] = achieved / matmul
        metrics["floors"] = floors


def decode_read_bytes(shape: ModelShape, dtype: torch.dtype, phase: Phase) -> int:
    """Bytes the phase's decoding must read with every request running at once: the weights once per
    step (as many steps as the longest request has tokens), and for every output token the K/V of
    its prompt and of the outputs before it."""
    weight_bytes = shape.weight_bytes_read_per_decode_step(dtype) * max(r.max_tokens for r in phase.requests)
    token_reads = sum(
        r.max_tokens * len(r.prompt_token_ids) + r.max_tokens * (r.max_tokens - 1) // 2 for r in phase.requests
    )
    return weight_bytes + token_reads * shape.kv_bytes_per_token(dtype)


def summary_text(record: dict[str, object]) -> str:
    environment_record = record["environment"]
    ceilings = record["ceilings"]
    workload = record["workload"]
    lines = [
        f"{workload['name']}{'' if workload['standard_workload'] else ' (SCALED: not the standard workload)'} on "
        f"{record['shape']['name']} {record['dtype']}, {environment_record['gpu'] or environment_record['device']}, "
        f"commit {environment_record['commit']}",
        f"copy bandwidth {ceilings['copy_bandwidth']['value']:.4g} GB/s, bf16 matmul "
        f"{ceilings['matmul_bf16']['value']:.3g} TFLOP/s",
        f"{'engine':<10} {'phase':<20} {'out tok/s':>10} {'TPOT ms':>9} {'x floor':>8} {'prefill tok/s':>14} "
        f"{'cached':>8} {'wall s':>8}",
    ]
    for result in record["results"]:
        for entry in result["phases"]:
            m = entry["metrics"]
            over_floor = m["floors"]["tpot_over_decode_step_floor"]
            lines.append(
                f"{result['engine']:<10} {entry['phase']:<20} {m['output_tokens_per_s']:>10.1f} "
                f"{_format(m['tpot_s'], 1e3, '.3f'):>9} {_format(over_floor, 1, '.2f'):>8} "
                f"{_format(m['prefill_tokens_per_s'], 1, '.0f'):>14} "
                f"{_format(m['prompt_tokens_served_from_cache'], 1, 'd'):>8} {m['wall_s']:>8.2f}"
            )
        if result["comparisons"] is not None:
            comparison = result["comparisons"]
            lines.append(
                f"{result['engine']:<10} outputs identical with and without prefix caching: "
                f"{comparison['outputs_identical']} "
                f"({comparison['num_requests_identical']}/{comparison['num_requests']})"
            )
    return "\n".join(lines)


def _format(value: float | int | None, factor: float, spec: str) -> str:
    if value is None:
        return "-"
    return format(value * factor if factor != 1 else value, spec)


def _release_memory(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
