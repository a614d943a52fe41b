"""Running one benchmark phase and timing every output token: on a twinfer engine (add_request and
step), with transformers' `generate`, or with transformers' continuous batching.

Every runner submits all of the phase's requests at once and returns a `PhaseRun`: when each
output token reached the host (seconds since submission), what was generated, and, for twinfer
engines, the host wall time of each step and the engine's own split of it (`step_timings`) when
the engine keeps one. Nothing here computes figures; reports.bench.harness does.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch
from tqdm import tqdm

from reports.bench.workloads import WARMUP_MAX_TOKENS, Phase, warmup_prompt
from spec.engine import Engine
from spec.sampling_params import SamplingParams

# Names given to the fields of an engine's per-step timing entries that are plain triples.
STEP_TIMING_FIELDS = ("schedule_s", "prepare_s", "forward_s")
# How long to wait for transformers' continuous batching to hand back a result before checking
# that its generation thread is still alive.
HF_RESULT_POLL_S = 1.0


@dataclass
class RequestRun:
    num_prompt_tokens: int
    token_ids: tuple[int, ...]
    token_times_s: tuple[float, ...] | None  # per output token, since submission; None if not observable
    num_cached_prompt_tokens: int | None = None  # None where the runner cannot know (transformers)

    @property
    def first_token_s(self) -> float | None:
        return self.token_times_s[0] if self.token_times_s else None

    @property
    def time_per_output_token_s(self) -> float | None:
        """Time per output token after the first: (last - first) / (tokens - 1)."""
        times = self.token_times_s
        if not times or len(times) < 2:
            return None
        return (times[-1] - times[0]) / (len(times) - 1)


@dataclass
class PhaseRun:
    """One run of a phase: submission of the first request to the last completion."""

    wall_s: float
    requests: list[RequestRun]
    step_wall_s: list[float] = field(default_factory=list)  # host time of each engine.step()
    # Steps in which every request of the phase produced a decode token (the batch fully decoding).
    full_batch_decode_step_s: list[float] = field(default_factory=list)
    engine_step_timings: dict[str, object] | None = None

    @property
    def num_output_tokens(self) -> int:
        return sum(len(request.token_ids) for request in self.requests)


def sampling_params(phase: Phase, max_tokens: int) -> SamplingParams:
    return SamplingParams(temperature=phase.temperature, max_tokens=max_tokens, ignore_eos=True)


# ----------------------------------------------------------------------------- twinfer engines


def warm_up_engine(engine: Engine) -> None:
    """One short request through prefill and decode (kernels compiled, graphs and caches warm)."""
    engine.generate(
        [list(warmup_prompt(engine.model_config.vocab_size))],
        SamplingParams(temperature=0.0, max_tokens=WARMUP_MAX_TOKENS, ignore_eos=True),
    )


def run_on_engine(engine: Engine, phase: Phase, progress: bool) -> PhaseRun:
    timings_before = _step_timings_snapshot(engine)
    start = time.perf_counter()
    request_ids = [
        engine.add_request(request.prompt_token_ids, sampling_params(phase, request.max_tokens))
        for request in phase.requests
    ]
    index_of = {request_id: index for index, request_id in enumerate(request_ids)}
    token_times: list[list[float]] = [[] for _ in request_ids]
    finished: dict[int, object] = {}
    step_wall_s: list[float] = []
    full_batch_decode_step_s: list[float] = []
    with tqdm(total=len(request_ids), desc=phase.label, unit="request", disable=not progress, leave=False) as bar:
        while len(finished) < len(request_ids):
            step_start = time.perf_counter()
            outputs = engine.step()
            step_end = time.perf_counter()
            step_wall_s.append(step_end - step_start)
            decoding = 0
            for output in outputs:
                index = index_of.get(output.request_id)
                if index is None:
                    continue
                new_tokens = len(output.token_ids) - len(token_times[index])
                if token_times[index] and new_tokens == 1:
                    decoding += 1
                token_times[index].extend([step_end - start] * new_tokens)
                if output.finished:
                    finished[index] = output
                    bar.update(1)
            if decoding == len(request_ids):
                full_batch_decode_step_s.append(step_end - step_start)
            if not outputs and not engine.has_unfinished and len(finished) < len(request_ids):
                raise RuntimeError(
                    f"engine stopped with {len(request_ids) - len(finished)} requests of {phase.label} unfinished"
                )
    requests = [
        RequestRun(
            num_prompt_tokens=len(output.prompt_token_ids),
            token_ids=tuple(output.token_ids),
            token_times_s=tuple(token_times[index]),
            num_cached_prompt_tokens=output.num_cached_prompt_tokens,
        )
        for index, output in sorted(finished.items())
    ]
    return PhaseRun(
        wall_s=max(times[-1] for times in token_times),
        requests=requests,
        step_wall_s=step_wall_s,
        full_batch_decode_step_s=full_batch_decode_step_s,
        engine_step_timings=_step_timings_since(engine, timings_before),
    )


def _step_timings_snapshot(engine: Engine) -> object:
    """What the engine's `step_timings` holds now: a dict of a record's fields, or a list's length."""
    timings = getattr(engine, "step_timings", None)
    if timings is None:
        return None
    if dataclasses.is_dataclass(timings):
        return dataclasses.asdict(timings)
    if isinstance(timings, Sequence):
        return len(timings)
    return None


def _step_timings_since(engine: Engine, before: object) -> dict[str, object] | None:
    """The engine's own step-time split over the run: totals of each field.

    Engines keep either one record of running totals (the run's share is after - before) or a
    list with one entry per step (the run's share is the entries added since)."""
    timings = getattr(engine, "step_timings", None)
    if timings is None or before is None:
        return None
    if isinstance(before, dict):
        after = dataclasses.asdict(timings)
        totals = {name: after[name] - before[name] for name in after if _is_number(after[name])}
        return {"source": f"engine.step_timings ({type(timings).__name__}, running totals)", **totals}
    entries = [_timing_entry(entry) for entry in list(timings)[before:]]
    names = [name for name in (entries[0] if entries else {}) if _is_number(entries[0][name])]
    totals = {name: math.fsum(entry[name] for entry in entries) for name in names}
    medians = {f"median_{name}": statistics.median(entry[name] for entry in entries) for name in names}
    return {"source": "engine.step_timings (one entry per step)", "num_steps": len(entries), **totals, **medians}


def _timing_entry(entry: object) -> dict[str, object]:
    if dataclasses.is_dataclass(entry):
        return dataclasses.asdict(entry)
    if hasattr(entry, "_asdict"):
        return dict(entry._asdict())
    if isinstance(entry, Mapping):
        return dict(entry)
    if isinstance(entry, Sequence) and len(entry) == len(STEP_TIMING_FIELDS):
        return dict(zip(STEP_TIMING_FIELDS, entry, strict=True))
    raise TypeError(f"cannot read a step timing entry of type {type(entry).__name__}: {entry!r}")


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


# ----------------------------------------------------------------------------- transformers generate


class _TokenClock:
    """A transformers streamer that notes when each generated token reaches the host.

    generate hands the streamer the prompt first, then each step's tokens after copying them to
    the host (a device sync), so each note is the moment that step's tokens exist."""

    def __init__(self, bar: tqdm) -> None:
        self.times: list[float] = []
        self._bar = bar
        self._prompt_seen = False

    def put(self, value: torch.Tensor) -> None:
        if not self._prompt_seen:
            self._prompt_seen = True
            return
        # A step of plain decoding hands [batch] tokens, one per sequence; a step of assisted generation
        # (prompt lookup, batch 1) hands [1, n]: the n tokens it accepted, which exist from this moment.
        count = value.shape[-1] if value.dim() == 2 else 1
        now = time.perf_counter()
        self.times.extend([now] * count)
        self._bar.update(count)

    def end(self) -> None:
        pass


def warm_up_hf_generate(model: torch.nn.Module) -> None:
    _generate(model, [warmup_prompt(model.config.vocab_size)], WARMUP_MAX_TOKENS, 0.0, streamer=None)


def run_hf_generate(
    model: torch.nn.Module, phase: Phase, progress: bool, prompt_lookup_num_tokens: int | None = None
) -> PhaseRun:
    """The whole phase as one batch through model.generate (its prompts must have one length and
    one max_tokens, so no padding is involved). prompt_lookup_num_tokens: transformers' assisted
    generation by prompt lookup, drafts of that many tokens (batch 1 only)."""
    lengths = {len(request.prompt_token_ids) for request in phase.requests}
    max_tokens = {request.max_tokens for request in phase.requests}
    if len(lengths) != 1 or len(max_tokens) != 1:
        raise ValueError(f"phase {phase.label}: generate needs equal prompt lengths and max_tokens")
    (tokens,) = max_tokens
    with tqdm(total=tokens, desc=f"transformers {phase.label}", unit="step", disable=not progress, leave=False) as bar:
        clock = _TokenClock(bar)
        start = time.perf_counter()
        prompts = [r.prompt_token_ids for r in phase.requests]
        output = _generate(model, prompts, tokens, phase.temperature, clock, prompt_lookup_num_tokens)
        _synchronize(model)
        end = time.perf_counter()
    generated = output[:, lengths.pop() :].tolist()
    times = tuple(t - start for t in clock.times)
    requests = [
        RequestRun(len(request.prompt_token_ids), tuple(ids), times if len(times) == len(ids) else None)
        for request, ids in zip(phase.requests, generated, strict=True)
    ]
    return PhaseRun(wall_s=end - start, requests=requests)


@torch.inference_mode()
def _generate(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    max_tokens: int,
    temperature: float,
    streamer: object,
    prompt_lookup_num_tokens: int | None = None,
) -> torch.Tensor:
    from transformers import GenerationConfig

    device = next(model.parameters()).device
    input_ids = torch.tensor([list(prompt) for prompt in prompts], dtype=torch.int64, device=device)
    config = GenerationConfig(
        max_new_tokens=max_tokens,
        min_new_tokens=max_tokens,
        eos_token_id=None,  # ignore_eos
        pad_token_id=0,
        prompt_lookup_num_tokens=prompt_lookup_num_tokens,
        **_hf_sampling(temperature),
    )
    return model.generate(
        input_ids=input_ids, attention_mask=torch.ones_like(input_ids), generation_config=config, streamer=streamer
    )


def _hf_sampling(temperature: float) -> dict[str, object]:
    """transformers' settings for the spec's plain temperature sampling (no top-k, top-p or min-p)."""
    if temperature == 0:
        return {"do_sample": False}
    return {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}


def _synchronize(model: torch.nn.Module) -> None:
    device = next(model.parameters()).device
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ----------------------------------------------------------------------------- transformers continuous batching


@dataclass(frozen=True)
class ContinuousBatchingSettings:
    """What the benchmark sets on transformers' continuous batching; None keeps its default."""

    num_blocks: int | None = None
    max_batch_tokens: int | None = None
    use_cuda_graph: bool | None = None

    def given(self) -> dict[str, object]:
        return {name: value for name, value in dataclasses.asdict(self).items() if value is not None}


def run_hf_continuous_batching(
    model: torch.nn.Module, phase: Phase, settings: ContinuousBatchingSettings, progress: bool
) -> PhaseRun:
    """Every request of the phase through one continuous-batching manager, after one warm-up request."""
    generation_config = _continuous_batching_generation_config(phase)
    manager_kwargs = _continuous_batching_config(generation_config, settings)
    with model.continuous_batching_context_manager(
        generation_config=generation_config, block=True, timeout=30, **manager_kwargs
    ) as manager:
        warmup = list(warmup_prompt(model.config.vocab_size))
        manager.add_request(warmup, request_id="warm-up", max_new_tokens=WARMUP_MAX_TOKENS)
        _collect_results(manager, {"warm-up"}, bar=None)
        bar = tqdm(
            total=len(phase.requests),
            desc=f"transformers {phase.label}",
            unit="request",
            disable=not progress,
            leave=False,
        )
        with bar:
            # Per-token timestamps exist in recent transformers only; without them no TPOT is reported.
            timestamps = {"record_timestamps": True} if _accepts(manager.add_request, "record_timestamps") else {}
            start = time.perf_counter()
            request_ids = [f"bench-{index}" for index in range(len(phase.requests))]
            for request_id, request in zip(request_ids, phase.requests, strict=True):
                manager.add_request(
                    list(request.prompt_token_ids),
                    request_id=request_id,
                    max_new_tokens=request.max_tokens,
                    **timestamps,
                )
            results = _collect_results(manager, set(request_ids), bar)
            end = time.perf_counter()
    requests = []
    for request_id, request in zip(request_ids, phase.requests, strict=True):
        result = results[request_id]
        timestamps = getattr(result, "timestamps", None)
        times = tuple(t - start for t in timestamps) if timestamps else None
        requests.append(RequestRun(len(request.prompt_token_ids), tuple(result.generated_tokens), times))
    return PhaseRun(wall_s=end - start, requests=requests)


def _continuous_batching_generation_config(phase: Phase):  # -> transformers.GenerationConfig
    from transformers import GenerationConfig

    return GenerationConfig(
        max_new_tokens=max(request.max_tokens for request in phase.requests),
        eos_token_id=-1,  # ignore_eos: continuous batching's own value for "no end-of-sequence token"
        pad_token_id=0,
        **_hf_sampling(phase.temperature),
    )


def _continuous_batching_config(generation_config: object, settings: ContinuousBatchingSettings) -> dict[str, object]:
    """The manager's keyword arguments. transformers 5.x takes a ContinuousBatchingConfig; earlier
    releases read the same settings from the GenerationConfig."""
    given = settings.given()
    if not given:
        return {}
    try:
        from transformers import ContinuousBatchingConfig
    except ImportError:
        for name, value in given.items():
            setattr(generation_config, name, value)
        return {}
    return {"continuous_batching_config": ContinuousBatchingConfig(**given)}


def _accepts(function: object, parameter: str) -> bool:
    return parameter in inspect.signature(function).parameters


def _collect_results(manager: object, request_ids: set[str], bar: tqdm | None) -> dict[str, object]:
    results: dict[str, object] = {}
    while len(results) < len(request_ids):
        result = manager.get_result(timeout=HF_RESULT_POLL_S)
        if result is None:
            if not manager.is_running():
                raise RuntimeError("transformers' continuous batching stopped before every request finished")
            continue
        if result.request_id not in request_ids or not result.is_finished():
            continue
        if result.error is not None:
            raise RuntimeError(f"transformers' continuous batching failed request {result.request_id}: {result.error}")
        results[result.request_id] = result
        if bar is not None:
            bar.update(1)
    return results
