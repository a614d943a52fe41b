"""The differential matrix: engine pairs x dtypes x features x modes, each cell a verdict.

Each engine runs a prompt set once per (dtype, feature) it is affected by, in both modes, and its
outputs are kept; the cells compare kept outputs, so an engine shared by two pairs runs once.
An engine that cannot run gives "not run: <reason>" cells; an engine that crashes fails its cells.

An OpenAI endpoint (`openai:URL`) is an engine too, under the one feature "as-served". Its server
has a dtype of its own that cannot be asked for, so it is queried once per workload and that answer
is compared with the local baseline in every dtype of the matrix. An endpoint that cannot be
reached, or that gives no prompt logprobs with echo, leaves its cells (or its teacher-forced cells)
not run; an HTTP error or an unusable answer fails them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

from reports.diff.endpoint import (
    EchoUnsupported,
    EndpointUnreachable,
    endpoint_teacher_forced,
    endpoint_url,
    is_endpoint,
    run_greedy,
)
from reports.report import engines, traces, workloads
from reports.report.records import Cell, CorrectnessSection, PromptRecord, Status
from reports.report.verdicts import CellKey, Decode, failed_cell, free_running_cell, not_run_cell, teacher_forced_cell
from spec.checkpoint import load_model_config
from spec.engine import Engine
from spec.engine_config import DEFAULT_NUM_BLOCKS, EngineConfig

logger = logging.getLogger(__name__)

BASE_FEATURE = "base"  # an engine a cell's feature does not change runs with the default EngineConfig


@dataclass(frozen=True)
class CorrectnessOptions:
    checkpoint: Path
    device: torch.device
    dtypes: tuple[torch.dtype, ...]
    quick: bool
    pairs: tuple[tuple[str, str], ...] = workloads.PAIRS
    features: tuple[str, ...] = tuple(f.name for f in workloads.FEATURES)
    modes: tuple[str, ...] = workloads.MODES
    endpoint_model: str | None = None  # the model endpoints are asked for (None: the first each lists)
    # One explicit pool size for every engine, so twins make identical scheduling decisions (and
    # the fast engine does not size its pool from the GPU memory transformers also needs).
    base_config: EngineConfig = field(default_factory=lambda: EngineConfig(num_blocks=DEFAULT_NUM_BLOCKS))


@dataclass(frozen=True)
class EngineRun:
    """One engine's outputs for one (dtype, feature, workload), in each mode; a string is why a mode has none."""

    free_running: traces.FreeRunning | str
    teacher_forced: traces.TeacherForced | str
    evidence: str
    seconds: float
    # It crashed while starting: both strings above are the crash (the cells fail). A crash within one
    # mode is that mode's string, starting with _CRASH_PREFIX; any other string is why it could not run.
    crashed: bool = False


@dataclass(frozen=True)
class PromptSet:
    workload: workloads.Workload
    prompts: tuple[tuple[int, ...], ...]
    num_text_prompts: int  # the first ones; the rest are drawn token ids


def run_correctness(options: CorrectnessOptions) -> CorrectnessSection:
    model_config = load_model_config(options.checkpoint)
    decode = _decoder(options.checkpoint)
    matrix = _Matrix(options, model_config.vocab_size, decode)
    keys = matrix.cell_keys()
    cells = []
    with tqdm(total=len(keys), desc="correctness", unit="cell") as progress:
        for key in keys:
            progress.set_postfix_str(key.id)
            cells.append(matrix.cell(key))
            progress.update()
    shown_prompts = matrix.largest_prompt_set()
    failed = sum(c.status is Status.FAILED for c in cells)
    not_run = sum(c.status is Status.NOT_RUN for c in cells)
    detail = f"{len(cells)} cells: {len(cells) - failed - not_run} passed, {failed} failed, {not_run} not run"
    status = Status.FAILED if failed else (Status.NOT_RUN if not_run == len(cells) else Status.PASSED)
    return CorrectnessSection(
        status=status,
        detail=detail,
        model=str(options.checkpoint),
        pairs=tuple(f"{a}-{b}" for a, b in options.pairs),
        dtypes=tuple(_dtype_name(d) for d in options.dtypes),
        features=matrix_features(options),
        modes=options.modes,
        prompts=tuple(
            _prompt_record(i, p, shown_prompts.num_text_prompts, decode) for i, p in enumerate(shown_prompts.prompts)
        ),
        cells=tuple(cells),
    )


class _Matrix:
    """Runs engines on demand and keeps their outputs for the cells that compare them."""

    def __init__(self, options: CorrectnessOptions, vocab_size: int, decode: Decode) -> None:
        self.options = options
        self.vocab_size = vocab_size
        self.decode = decode
        self._prompt_sets: dict[str, PromptSet] = {}
        self._runs: dict[tuple[str, torch.dtype | None, str, str], EngineRun] = {}

    def cell_keys(self) -> list[CellKey]:
        keys = []
        for dtype in self.options.dtypes:
            for feature_name in matrix_features(self.options):
                feature = workloads.FEATURES_BY_NAME[feature_name]
                for candidate, baseline in self.options.pairs:
                    if not _pair_has_feature(feature, candidate, baseline):
                        continue
                    for mode in self.options.modes:
                        keys.append(CellKey(candidate, baseline, _dtype_name(dtype), feature_name, mode))
        return keys

    def largest_prompt_set(self) -> PromptSet:
        workload = workloads.choose_workload(self.options.device.type, self.options.quick, involves_fast=False)
        return self._prompt_set(workload)

    def cell(self, key: CellKey) -> Cell:
        dtype = _DTYPES[key.dtype]
        workload = workloads.choose_workload(
            self.options.device.type, self.options.quick, "fast" in (key.candidate, key.baseline)
        )
        feature = workloads.FEATURES_BY_NAME[key.feature]
        prompt_set = self._prompt_set(workload)
        candidate = self._run(key.candidate, dtype, feature, prompt_set)
        baseline = self._run(key.baseline, dtype, feature, prompt_set)
        for side in (candidate, baseline):
            outcome = side.free_running if key.mode == "free-running" else side.teacher_forced
            if isinstance(outcome, str):
                crashed = side.crashed or outcome.startswith(_CRASH_PREFIX)
                return failed_cell(key, outcome) if crashed else not_run_cell(key, outcome)
        evidence = _evidence(key, feature, candidate, baseline)
        if key.mode == "free-running":
            return free_running_cell(
                key,
                candidate.free_running,
                baseline.free_running,
                prompt_set.prompts,
                workload.max_new_tokens,
                self.decode,
                evidence,
                candidate.seconds,
            )
        reference = self._run(engines.HF, torch.float32, feature, prompt_set).teacher_forced
        if isinstance(reference, str):
            return not_run_cell(key, f"no fp32 transformers run to take margins from: {reference}")
        margins = [traces.top_two_margins(positions) for positions in reference.positions]
        return teacher_forced_cell(
            key, candidate.teacher_forced, baseline.teacher_forced, margins, self.decode, evidence, candidate.seconds
        )

    # -- prompt sets -----------------------------------------------------------------------

    def _prompt_set(self, workload: workloads.Workload) -> PromptSet:
        if workload.name not in self._prompt_sets:
            text_prompts = self._encode_text_prompts(workload.num_text_prompts)
            prompts = tuple(tuple(p) for p in [*text_prompts, *workloads.token_prompts(workload, self.vocab_size)])
            self._prompt_sets[workload.name] = PromptSet(workload, prompts, len(text_prompts))
        return self._prompt_sets[workload.name]

    def _encode_text_prompts(self, count: int) -> list[list[int]]:
        tokenizer = _tokenizer(self.options.checkpoint)
        if tokenizer is None:
            return []
        encoded = [list(tokenizer.encode(text, add_special_tokens=False)) for text in workloads.TEXT_PROMPTS[:count]]
        return [ids for ids in encoded if ids]

    def _teacher_sequences(self, prompt_set: PromptSet) -> tuple[tuple[int, ...], ...] | str:
        fp32 = self._run(engines.HF, torch.float32, None, prompt_set).free_running
        if isinstance(fp32, str):
            return fp32
        return traces.teacher_sequences(prompt_set.prompts, fp32.traces)

    # -- engine runs -----------------------------------------------------------------------

    def _run(
        self, engine: str, dtype: torch.dtype, feature: workloads.Feature | None, prompt_set: PromptSet
    ) -> EngineRun:
        applies = feature is not None and engine in feature.engines
        feature_key = feature.name if applies else BASE_FEATURE
        # An endpoint answers in its server's dtype whatever the cell's: one query serves every dtype.
        memo_key = (engine, None if is_endpoint(engine) else dtype, feature_key, prompt_set.workload.name)
        if memo_key not in self._runs:
            self._runs[memo_key] = self._start(engine, dtype, feature if applies else None, prompt_set)
        return self._runs[memo_key]

    def _start(
        self, engine: str, dtype: torch.dtype, feature: workloads.Feature | None, prompt_set: PromptSet
    ) -> EngineRun:
        if engine == engines.HF:
            return self._run_hf(dtype, prompt_set)
        if is_endpoint(engine):
            return self._run_endpoint(engine, prompt_set)
        return self._run_twin(engine, dtype, feature, prompt_set)

    def _run_hf(self, dtype: torch.dtype, prompt_set: PromptSet) -> EngineRun:
        workload = prompt_set.workload
        wants_teacher = "teacher-forced" in self.options.modes
        # Other dtypes are teacher-forced on fp32 transformers' continuations: run that first.
        sequences = self._teacher_sequences(prompt_set) if wants_teacher and dtype != torch.float32 else None
        started = time.perf_counter()
        try:
            model = engines.load_hf_model(self.options.checkpoint, dtype, self.options.device)
        except Exception as error:  # the baseline cannot run here: its cells say why
            reason = f"transformers could not load the model in {_dtype_name(dtype)}: {type(error).__name__}: {error}"
            return EngineRun(reason, reason, "", 0.0)
        try:
            free = traces.hf_free_running(model, prompt_set.prompts, workload.max_new_tokens, workloads.TOP_K)
            teacher: traces.TeacherForced | str = _TEACHER_FORCED_OFF
            if wants_teacher:
                sequences = sequences or traces.teacher_sequences(prompt_set.prompts, free.traces)
                teacher = (
                    sequences
                    if isinstance(sequences, str)
                    else traces.hf_teacher_forced(model, sequences, workloads.TOP_K)
                )
        finally:
            del model
            engines.release_device_memory(self.options.device)
        return EngineRun(free, teacher, "", time.perf_counter() - started)

    def _run_twin(
        self, engine: str, dtype: torch.dtype, feature: workloads.Feature | None, prompt_set: PromptSet
    ) -> EngineRun:
        try:
            engines.check_available(engine, dtype, self.options.device)
            forced = self._forced_config(feature, prompt_set)
        except engines.EngineUnavailable as reason:
            return EngineRun(str(reason), str(reason), "", 0.0)
        started = time.perf_counter()
        try:
            built = engines.build_engine(engine, self.options.checkpoint, forced.config, dtype, self.options.device)
        except engines.EngineUnavailable as reason:
            return EngineRun(str(reason), str(reason), forced.evidence, 0.0)
        except engines.EngineCrashed as crash:
            return EngineRun(str(crash), str(crash), forced.evidence, 0.0, crashed=True)
        try:
            free, teacher = self._twin_outputs(engine, built, feature, prompt_set)
        finally:
            built = None  # drop the engine (and its KV pool) before the next one starts
            engines.release_device_memory(self.options.device)
        return EngineRun(free, teacher, forced.evidence, time.perf_counter() - started)

    def _twin_outputs(
        self, name: str, engine: Engine, feature: workloads.Feature | None, prompt_set: PromptSet
    ) -> tuple[traces.FreeRunning | str, traces.TeacherForced | str]:
        workload = prompt_set.workload
        warm_passes = feature.warm_passes if feature else 0
        free = _guarded(
            name,
            lambda: traces.engine_free_running(
                engine, prompt_set.prompts, workload.max_new_tokens, workloads.TOP_K, warm_passes
            ),
        )
        teacher = self._teacher_forced(
            name, prompt_set, lambda sequences: traces.engine_teacher_forced(engine, sequences, workloads.TOP_K)
        )
        return free, teacher

    def _teacher_forced(
        self,
        name: str,
        prompt_set: PromptSet,
        score: Callable[[tuple[tuple[int, ...], ...]], traces.TeacherForced],
        unavailable: tuple[type[Exception], ...] = (),
    ) -> traces.TeacherForced | str:
        """`score` on the sequences every engine is teacher-forced on, guarded like any mode."""
        if "teacher-forced" not in self.options.modes:
            return _TEACHER_FORCED_OFF
        sequences = self._teacher_sequences(prompt_set)
        if isinstance(sequences, str):
            return sequences
        return _guarded(name, lambda: score(sequences), unavailable)

    def _run_endpoint(self, engine: str, prompt_set: PromptSet) -> EngineRun:
        notes: list[str] = []  # what the endpoint's answers made us approximate, for the cells' evidence
        started = time.perf_counter()
        free = _guarded(engine, lambda: self._endpoint_free_running(engine, prompt_set, notes), _ENDPOINT_UNAVAILABLE)
        teacher = self._teacher_forced(
            engine,
            prompt_set,
            lambda sequences: self._endpoint_teacher_forced(engine, sequences, notes),
            _ENDPOINT_UNAVAILABLE,
        )
        return EngineRun(free, teacher, "; ".join(dict.fromkeys(notes)), time.perf_counter() - started)

    def _endpoint_free_running(self, engine: str, prompt_set: PromptSet, notes: list[str]) -> traces.FreeRunning:
        result = run_greedy(
            endpoint_url(engine),
            self.options.checkpoint,
            prompt_set.prompts,
            prompt_set.workload.max_new_tokens,
            workloads.TOP_K,
            self.options.endpoint_model,
        )
        notes.extend(_endpoint_notes(result.notes, result.unmapped_alternatives, "free-running"))
        return traces.FreeRunning(tuple(result.traces), 0)

    def _endpoint_teacher_forced(
        self, engine: str, sequences: tuple[tuple[int, ...], ...], notes: list[str]
    ) -> traces.TeacherForced:
        try:
            echoed = endpoint_teacher_forced(
                endpoint_url(engine), self.options.checkpoint, sequences, workloads.TOP_K, self.options.endpoint_model
            )
        except EchoUnsupported as error:
            raise traces.PromptLogprobsMissing(
                f"the server does not support echo with prompt logprobs, which teacher-forced cells need: {error}"
            ) from error
        notes.extend(_endpoint_notes(echoed.notes, echoed.unmapped_alternatives, "teacher-forced"))
        return traces.TeacherForced(sequences, tuple(tuple(entries) for entries in echoed.positions))

    def _forced_config(self, feature: workloads.Feature | None, prompt_set: PromptSet) -> workloads.ForcedConfig:
        base = self.options.base_config
        if feature is None:
            return workloads.ForcedConfig(base, "")
        return workloads.feature_config(
            feature, [list(p) for p in prompt_set.prompts], prompt_set.workload.max_new_tokens, base
        )


_CRASH_PREFIX = "the engine raised"
_TEACHER_FORCED_OFF = "teacher-forced mode not selected"
# An endpoint that does not answer at all is not there to be checked: its cells say why, without failing.
_ENDPOINT_UNAVAILABLE: tuple[type[Exception], ...] = (EndpointUnreachable,)


def _guarded(engine: str, work: Callable[[], object], unavailable: tuple[type[Exception], ...] = ()):
    """Run one mode; a missing capability (or one of `unavailable`) is a reason (not run), any other
    exception a crash (failed)."""
    try:
        return work()
    except (traces.PromptLogprobsMissing, *unavailable) as missing:
        return f"{engine}: {missing}"
    except Exception as error:  # an engine bug: the cell fails and shows it
        logger.exception("%s crashed", engine)
        return f"{_CRASH_PREFIX} {type(error).__name__}: {error}"


PROMPT_IDS_SHOWN = 24


def _prompt_record(index: int, prompt: tuple[int, ...], num_text_prompts: int, decode: Decode) -> PromptRecord:
    if index < num_text_prompts:
        return PromptRecord(index, "text", decode(prompt), len(prompt))
    shown = ", ".join(str(token) for token in prompt[:PROMPT_IDS_SHOWN])
    return PromptRecord(index, "token ids", shown + (", …" if len(prompt) > PROMPT_IDS_SHOWN else ""), len(prompt))


def _endpoint_notes(notes: list[str], unmapped_alternatives: int, mode: str) -> list[str]:
    if not unmapped_alternatives:
        return notes
    left_out = f"{unmapped_alternatives} top-k alternatives ({mode}) matched no single token id and were left out"
    return [*notes, left_out]


def _evidence(key: CellKey, feature: workloads.Feature, candidate: EngineRun, baseline: EngineRun) -> str:
    """How the cell's configuration forces its feature, and what the twins report it did."""
    parts = [feature.description, _endpoint_dtype_evidence(key)] if feature.for_endpoints else []
    parts.append(candidate.evidence or baseline.evidence)
    if key.mode == "free-running" and feature.warm_passes:
        parts.append(f"the prompts ran {feature.warm_passes + 1} times and the last pass is compared")
    if key.mode == "teacher-forced" and feature.warm_passes:
        parts.append("requests asking for prompt log-probabilities take no prefix-cache hit (spec.scheduling)")
    for name, run in ((key.candidate, candidate), (key.baseline, baseline)):
        outputs = run.free_running if key.mode == "free-running" else run.teacher_forced
        cache_matters = feature.name.startswith("prefix-cache") or (
            not isinstance(outputs, str) and outputs.cached_prompt_tokens
        )
        if name != engines.HF and not isinstance(outputs, str) and cache_matters:
            parts.append(f"{name}: {outputs.cached_prompt_tokens} prompt tokens served from the prefix cache")
    return "; ".join(part for part in parts if part)


def _endpoint_dtype_evidence(key: CellKey) -> str:
    rule = "the exact rule" if key.exact else "the near-tie rule"
    return (
        f"the endpoint answers in its server's dtype, which a request cannot set: it was queried once for every "
        f"dtype, and here its answers are compared with {key.baseline} in {key.dtype} ({rule})"
    )


_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def parse_dtypes(text: str) -> tuple[torch.dtype, ...]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in _DTYPES]
    if unknown or not names:
        from spec.errors import ConfigError

        raise ConfigError(f"--dtype takes a comma-separated list of {', '.join(_DTYPES)}; got {text!r}")
    return tuple(_DTYPES[name] for name in names)


def _feature_runs(name: str, device: torch.device) -> bool:
    return not workloads.FEATURES_BY_NAME[name].cuda_only or device.type == "cuda"


def matrix_features(options: CorrectnessOptions) -> tuple[str, ...]:
    """The features with cells: those chosen that run on this device, and "as-served" when a pair has an
    endpoint (only then, so a report without endpoints has no such column)."""
    chosen = [name for name in options.features if _feature_runs(name, options.device)]
    has_endpoint = any(is_endpoint(engine) for pair in options.pairs for engine in pair)
    if has_endpoint and workloads.AS_SERVED.name not in chosen:
        chosen.append(workloads.AS_SERVED.name)
    return tuple(chosen)


def _pair_has_feature(feature: workloads.Feature, candidate: str, baseline: str) -> bool:
    """A pair with an endpoint has the endpoint features and no other (its server's settings are fixed);
    another pair has each feature that changes one of its twins."""
    if is_endpoint(candidate) or is_endpoint(baseline):
        return feature.for_endpoints
    return bool(feature.engines & {candidate, baseline})


def _tokenizer(checkpoint: Path):
    if not any(checkpoint.glob("tokenizer*")):
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(checkpoint))


def _decoder(checkpoint: Path) -> Decode:
    tokenizer = _tokenizer(checkpoint)
    if tokenizer is None:
        return lambda ids: " ".join(f"[{token}]" for token in ids)
    return lambda ids: tokenizer.decode(list(ids), skip_special_tokens=False)
