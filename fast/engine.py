"""The fast engine: the spec's scheduler and request bookkeeping over `ModelRunner` and the GPU sampler.

Same public API as the reference engine (spec.engine.ScheduledEngine: add_request, step, abort,
generate, has_unfinished); it differs only in how one step executes: the plan's chunks go into
persistent device buffers (fast.input_batch), one forward pass computes logits only for the rows
that sample or score prompt positions, and the sampler picks tokens on the device.

Tensor parallelism (`tensor_parallel_size` N > 1, or EngineConfig.tensor_parallel_size): this
process is rank 0. It runs the scheduler and the sampler, and each step sends its inputs to ranks
1..N-1 once (fast.tp_launch starts and stops them, fast.tp_worker is their loop). A rank that
fails makes `step` raise TensorParallelError; `shutdown()` (also `with FastEngine(...)`, garbage
collection and interpreter exit) ends every rank.
"""

from __future__ import annotations

import logging
import os
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from types import TracebackType

import torch

from fast.input_batch import SequenceInput
from fast.model_runner import ModelRunner, PreparedStep
from fast.readback import HostTokens, TokenReadback
from fast.row_upload import RowUpload
from fast.sampler import Sampler, SamplerRow
from fast.scheduler import Scheduler
from fast.sharded_loading import CheckpointWeights, WeightSource
from fast.tp_launch import TensorParallelRuntime, start_tensor_parallel
from spec.checkpoint import load_state_dict, open_checkpoint
from spec.engine import (
    SampledToken,
    ScheduledEngine,
    default_device,
    sampling_positions,
    step_results,
    token_logprobs,
)
from spec.engine_config import EngineConfig
from spec.errors import ConfigError
from spec.model_config import ModelConfig
from spec.request import (
    PENDING_TOKEN,
    Request,
    RequestOutput,
    RequestStatus,
    prompt_logprob_positions,
)
from spec.sampling import SamplingRow
from spec.sampling_params import SamplingParams
from spec.scheduling import StepPlan
from spec.speculative import DRAFT_MODEL, DraftModelProposer, DraftProposer, check_draft_vocabulary

logger = logging.getLogger(__name__)


@dataclass
class StepTimings:
    """Wall time spent per phase, summed over steps (the forward phase ends when the sampled
    tokens reach the host, so it includes the GPU's work)."""

    num_steps: int = 0
    schedule_s: float = 0.0
    prepare_s: float = 0.0  # building and packing the step's inputs on the host, before its launch
    forward_s: float = 0.0
    # Of schedule_s: the time spent applying a step's lengths and scheduling the next one while the
    # device ran the step (EngineConfig.async_scheduling), i.e. not between two device steps; and
    # the number of steps that did so (a step whose next one may propose drafts applies its lengths
    # ahead but schedules after its tokens are read: not counted).
    ahead_s: float = 0.0
    ahead_steps: int = 0
    prepared_ahead_steps: int = 0  # steps launched from inputs loaded while the previous step ran
    launched_ahead_steps: int = 0  # steps launched before the previous step's tokens were read
    # Speculative decoding: verify chunks run, the draft tokens they checked, and how many of those were kept.
    verify_chunks: int = 0
    draft_tokens: int = 0
    accepted_draft_tokens: int = 0

    def reset(self) -> None:
        for name, value in asdict(StepTimings()).items():
            setattr(self, name, value)

    def count_verified(self, plan: StepPlan, results: Mapping[str, SampledToken]) -> None:
        """Add a verify step's chunks: their draft tokens, and the ones kept (a result's `more` tokens)."""
        for chunk in plan.chunks:
            if chunk.draft_token_ids and chunk.request_id in results:
                self.verify_chunks += 1
                self.draft_tokens += len(chunk.draft_token_ids)
                more = results[chunk.request_id].more  # a last one from an unsampleable row is not a draft kept
                self.accepted_draft_tokens += len(more) - (bool(more) and more[-1].token_id < 0)


class FastEngine(ScheduledEngine):
    def __init__(
        self,
        model_config: ModelConfig,
        state_dict: Mapping[str, torch.Tensor] | WeightSource,
        engine_config: EngineConfig | None = None,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
        tensor_parallel_size: int | None = None,
    ) -> None:
        """state_dict: the checked state dict (spec.checkpoint.load_state_dict), or a weight source from
        which each rank reads its own slices (fast.sharded_loading.CheckpointWeights).
        tensor_parallel_size: overrides engine_config.tensor_parallel_size when given. With N > 1, rank r
        runs on cuda:(index + r) of `device` (under torchrun on cuda:LOCAL_RANK), or on the CPU."""
        self.tensor_parallel: TensorParallelRuntime | None = None
        config = engine_config or EngineConfig()
        if tensor_parallel_size is not None:
            config = replace(config, tensor_parallel_size=tensor_parallel_size)
        self.device = torch.device(device) if device is not None else default_device()
        _check_device(self.device)
        self.model_config = model_config
        self.dtype = dtype
        if config.tensor_parallel_size == 1:
            runner = ModelRunner(model_config, state_dict, config, dtype, self.device)
        else:
            runner, self.tensor_parallel = start_tensor_parallel(model_config, state_dict, config, dtype, self.device)
            self.device = runner.device
            self._finalizer = weakref.finalize(self, self.tensor_parallel.shutdown)
        self._attach(runner, Sampler(runner.max_sample_rows, model_config.vocab_size, self.device))
        if self.device.type == "cuda":
            self._compile_sampler()

    def _attach(self, runner: ModelRunner, sampler: Sampler) -> None:
        """The host side over a built runner: the scheduler, the sampler, step timings, the request table."""
        self.runner = runner
        self.config = runner.config
        self.scheduler = Scheduler(self.config, self.model_config.eos_token_ids, proposer=self._draft_model_proposer())
        self.sampler = sampler
        self.step_timings = StepTimings()
        self._execute_s = 0.0  # the current step's time in execute(), to split out scheduling time
        # Each unfinished request's constant sampler columns, keyed by the Request itself (not its id,
        # which a new request may reuse once this one is finished): made once, not every step.
        self._sampler_rows: dict[Request, SamplerRow] = {}
        self._next_plan: StepPlan | None = None  # scheduled ahead (async_scheduling), not yet concluded
        self._prepared: _PreparedAhead | None = None  # its inputs, loaded ahead
        self._in_flight: _LaunchedStep | None = None  # ... and launched ahead: the next step() concludes it
        self._readback = TokenReadback(runner.max_sample_rows, runner.device)
        self._read_unsampleable = False  # whether the tokens read last hold an unsampleable row's code
        # Rows of a step's logits picked on the device (prompt-logprob steps): at most one per token.
        self._logit_rows = RowUpload(runner.inputs.max_num_tokens, runner.device)
        self._init_requests()

    def _draft_model_proposer(self) -> DraftProposer | None:
        """speculative method "draft-model": the draft checkpoint in a fast engine of its own, on this device,
        with this engine's pool size (on CUDA it must fit beside this engine's pool: give num_blocks, or a
        lower gpu_memory_utilization, to leave it room). None otherwise (the scheduler builds prompt lookup)."""
        speculative = self.config.speculative
        if speculative is None or speculative.method != DRAFT_MODEL:
            return None
        if self.tensor_parallel is not None:
            raise ConfigError("speculative method 'draft-model' runs on one device: not with tensor parallelism")
        draft = FastEngine.from_pretrained(
            speculative.draft_model, self.config.for_draft_model(), self.dtype, self.device
        )
        check_draft_vocabulary(draft.model_config.vocab_size, self.model_config.vocab_size, speculative.draft_model)
        return DraftModelProposer(draft)

    @classmethod
    def from_pretrained(
        cls,
        model: str | Path,
        engine_config: EngineConfig | None = None,
        dtype: str | torch.dtype = "auto",
        device: torch.device | str | None = None,
        tensor_parallel_size: int | None = None,
    ) -> FastEngine:
        """With tensor parallelism each rank reads only its own slices of the safetensors files."""
        opened = open_checkpoint(model, dtype, device)
        _check_device(opened.device)
        size = tensor_parallel_size or (engine_config or EngineConfig()).tensor_parallel_size
        if size > 1:
            weights = CheckpointWeights(opened.path)
            return cls(opened.config, weights, engine_config, opened.dtype, opened.device, size)
        state_dict = load_state_dict(opened.path, opened.config, opened.dtype, opened.device)
        return cls(opened.config, state_dict, engine_config, opened.dtype, opened.device, tensor_parallel_size)

    def _compile_sampler(self) -> None:
        """Sample once without and once with a filter, so that the sampling kernel's two variants are
        compiled at start-up, not in the first step that samples (the model's kernels: ModelRunner)."""
        logits = torch.zeros((1, self.model_config.vocab_size), dtype=torch.float32, device=self.device)
        for params in (SamplingParams(temperature=1.0), SamplingParams(temperature=1.0, top_k=1)):
            self.sampler.set_rows([SamplingRow(params, seed=0, output_position=0)])
            self.sampler.sample(logits)
        torch.cuda.synchronize(self.device)

    # -- tensor parallelism ----------------------------------------------------------------------

    def shutdown(self) -> None:
        """End every tensor-parallel rank and release their process groups (idempotent; nothing to
        do for a single process). The engine cannot step afterwards."""
        if self.tensor_parallel is not None:
            self.tensor_parallel.shutdown()

    def __enter__(self) -> FastEngine:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.shutdown()

    def tensor_parallel_info(self) -> dict[str, object]:
        """How the model is split and which all-reduce paths run (for benchmark records)."""
        info: dict[str, object] = {"tensor_parallel_size": self.config.tensor_parallel_size}
        if self.tensor_parallel is not None:
            info |= self.tensor_parallel.describe() | self.runner.describe_parallel()
        return info

    def step(self) -> list[RequestOutput]:
        started = time.perf_counter()
        self._execute_s = 0.0
        outputs = self._step_ahead() if self.config.async_scheduling else super().step()
        self._forget_finished_rows()
        self.step_timings.num_steps += 1
        # Everything but execute(): scheduling, applying results, building outputs.
        self.step_timings.schedule_s += time.perf_counter() - started - self._execute_s
        return outputs

    # -- scheduling ahead (EngineConfig.async_scheduling) ----------------------------------------

    def _step_ahead(self) -> list[RequestOutput]:
        """ScheduledEngine.step, making the next step's plan while the device runs this one.

        Possible when no request sampling in this step can be finished by its token's value (only by
        its length): the scheduler's update then needs the number of new tokens, not their values.
        It runs with a PENDING_TOKEN per sampling request once the step's device work is queued, the
        next plan is scheduled, and the sampled values replace the placeholders when they reach the
        host, before anything reads them (outputs, invariant checks, the next step's inputs on the
        host). The next step's inputs are loaded ahead too (`_prepare_ahead`): its decode rows take
        their tokens from this step's sampled tokens on the device. Where the next step can go ahead in
        turn, it is launched too (`_launch_next_ahead`), before this step's tokens are read: the device
        then runs one step after the other with no wait for the host between them. The plans are those
        of the step-by-step engine (the same update, then the same schedule), except that a request
        added while a step is launched ahead joins the step after it. Otherwise the step runs step by step.

        With speculative decoding a step goes ahead only when it has no verify chunk (`_verifies`), and
        the next one is planned ahead only when no request can propose in it
        (fast.scheduler.Scheduler.may_propose_next, from counts alone): a proposer reads token values.
        Where one can, this step's update still runs ahead with pending tokens, and the next step()
        schedules once the tokens are read, as step by step.
        """
        plan, self._next_plan = self._next_plan, None
        if plan is None:
            plan = self.scheduler.schedule()
            self._check_invariants()
        if plan.is_empty:  # nothing to run (or every request of a step launched ahead was aborted)
            self._in_flight = None
            return []
        sampling_ids = [chunk.request_id for chunk in plan.chunks if chunk.samples]
        if self._in_flight is None and (
            not self.scheduler.finishes_by_length_only(sampling_ids) or self._verifies(plan)
        ):
            return self._run_plan(plan)
        finished: list[Request] = []

        def schedule_next(step: _LaunchedStep) -> None:
            finished.extend(self.scheduler.update(plan, dict.fromkeys(sampling_ids, PENDING_TOKEN)))
            if not self.scheduler.has_unfinished:  # as step by step: nothing is scheduled once all are done
                self.step_timings.ahead_steps += 1
            elif not self.scheduler.may_propose_next():
                self._next_plan = self.scheduler.schedule()
                self._prepared = self._prepare_ahead(self._next_plan, step)
                self._launch_next_ahead(step)
                self.step_timings.ahead_steps += 1
            # Else a request may propose: its draft needs this step's tokens, so the next step() schedules
            # once they are read (the update made here with pending tokens is the one made step by step).

        sampled = self.execute(plan, meanwhile=schedule_next)
        requests = self._requests
        for request_id, token in sampled.items():
            if token.token_id >= 0:  # else an unsampleable row's code: its request fails below, placeholder and all
                requests[request_id].resolve_pending_token(token.token_id)
        finished.extend(self._fail(self._unsampleable(sampled), sampled))
        return self._conclude(sampled, finished)

    def _verifies(self, plan: StepPlan) -> bool:
        """Whether the plan has a verify chunk: its accepted count, hence every count after it, is known only
        once its tokens are read, so the next step cannot be planned ahead of them."""
        return self.config.speculative is not None and any(chunk.draft_token_ids for chunk in plan.chunks)

    def _prepare_ahead(self, plan: StepPlan, step: _LaunchedStep) -> _PreparedAhead | None:
        """Load `plan`'s inputs and sampler rows now, while the device runs `step`: a token that step
        samples (PENDING_TOKEN on the host) is copied into its input row on the device. Not for a plan
        that scores prompt positions. Under tensor parallelism the other ranks get the rows to fill in
        with the step's packed words, and fill them from the tokens rank 0 shares after sampling."""
        sequences, sampling, scored = self._sequences(plan)
        if scored:
            return None
        source_row = {request.request_id: row for row, (_, request) in enumerate(step.sampling)}
        token_rows, source_rows, cursor = [], [], 0
        for chunk, sequence in zip(plan.chunks, sequences, strict=True):
            cursor += chunk.num_tokens
            if sequence.token_ids[-1] == PENDING_TOKEN:  # only ever a chunk's last token: the newest output
                token_rows.append(cursor - 1)
                source_rows.append(source_row[chunk.request_id])
        prepared = self.runner.prepare(sequences)
        if step.tokens is not None:  # else no step sampled: nothing is pending
            self.runner.inputs.set_pending_tokens(token_rows, step.tokens, source_rows)
        if sampling:
            self._set_sampler_rows(sampling)
        return _PreparedAhead(plan, prepared, sampling)

    def _launch_next_ahead(self, step: _LaunchedStep) -> None:
        """Launch the step whose inputs were just loaded ahead, before `step`'s tokens are read, when it
        can go ahead itself (its requests finish by length only) and `step`'s logits will not be read
        once it has run: no logprobs asked for and no prompt position scored (a graph replay rewrites the
        graph's logits buffer, which `step`'s logit rows may be views of)."""
        ahead = self._prepared
        if ahead is None or step.scored or any(request.params.logprobs for _, request in step.sampling):
            return
        if not self.scheduler.finishes_by_length_only(chunk.request_id for chunk in ahead.plan.chunks if chunk.samples):
            return
        self._in_flight = self._launch(ahead.plan, share=True)
        self.step_timings.launched_ahead_steps += 1

    def add_request(
        self, prompt_token_ids: Sequence[int], params: SamplingParams | None = None, request_id: str | None = None
    ) -> str:
        request_id = super().add_request(prompt_token_ids, params, request_id)
        # A plan made before this request arrived admits it as schedule() would, unless it is launched.
        if self._next_plan is not None and self._in_flight is None:
            self._next_plan = self.scheduler.admit_more()
            self._check_invariants()
        return request_id

    def _unsampleable(self, sampled: Mapping[str, SampledToken]) -> list[str]:
        # Most steps: the tokens read on the host hold no code (their minimum, taken in C, is not negative).
        return super()._unsampleable(sampled) if self._read_unsampleable else []

    def _fail(self, failed: Sequence[str], sampled: Mapping[str, SampledToken]) -> list[Request]:
        newly_finished = super()._fail(failed, sampled)
        if self._next_plan is not None:  # scheduled ahead with the failed request: dropped as an abort drops it
            for request in newly_finished:
                self._next_plan = self.scheduler.drop_from_plan(request.request_id, admit=self._in_flight is None)
        return newly_finished

    def abort(self, request_id: str) -> RequestOutput:
        output = super().abort(request_id)
        if self._next_plan is not None:
            # A launched step runs with the request's row; its results for the request are dropped.
            self._next_plan = self.scheduler.drop_from_plan(request_id, admit=self._in_flight is None)
            self._check_invariants()
        return output

    # -- one step --------------------------------------------------------------------------------

    def execute(
        self, plan: StepPlan, meanwhile: Callable[[_LaunchedStep], None] | None = None
    ) -> dict[str, SampledToken]:
        """meanwhile: host work run once the step's device work is queued, before its tokens are read;
        it gets the launched step (its sampled tokens on the device)."""
        if self.tensor_parallel is None:
            return self._execute(plan, meanwhile)
        self.tensor_parallel.check()
        try:
            results = self._execute(plan, meanwhile)
        except Exception as error:
            raise self.tensor_parallel.failure(error) from error
        self.tensor_parallel.check()  # a rank that died during the step (on a GPU its wait was aborted)
        return results

    def _execute(
        self, plan: StepPlan, meanwhile: Callable[[_LaunchedStep], None] | None = None
    ) -> dict[str, SampledToken]:
        started = time.perf_counter()
        step, self._in_flight = self._in_flight, None  # launched by the last step, for this plan
        if step is None:
            step = self._launch(plan, share=meanwhile is not None)
        launched = time.perf_counter()
        ahead_s = 0.0
        if meanwhile is not None:
            meanwhile(step)
            ahead_s = time.perf_counter() - launched
        results = self._sampled(step, plan)
        if step.scored:
            self._record_prompt_logprobs(step.logits, step.scored)
        finished = time.perf_counter()
        self.step_timings.forward_s += finished - launched - ahead_s
        self.step_timings.ahead_s += ahead_s
        self._execute_s = finished - started - ahead_s  # the ahead time counts as scheduling
        return results

    def _launch(self, plan: StepPlan, share: bool) -> _LaunchedStep:
        """Queue the plan's forward pass, its sampling and the copy of its tokens to the host, from the
        inputs loaded ahead for it if there are any. share: under tensor parallelism, send the sampled
        tokens to the other ranks (the next step loaded ahead fills its pending rows from them)."""
        started = time.perf_counter()
        ahead, self._prepared = self._prepared, None
        if ahead is not None and ahead.plan is plan:  # inputs and sampler rows loaded while the last step ran
            prepared, sampling, scored = ahead.step, ahead.sampling, []
            self.step_timings.prepared_ahead_steps += 1
        else:
            sequences, sampling, scored = self._sequences(plan)
            prepared = self.runner.prepare(sequences)
            if sampling:
                self._set_sampler_rows(sampling)
        self.step_timings.prepare_s += time.perf_counter() - started
        num_shared = len(sampling) if share and self.tensor_parallel is not None else 0
        step = sampled_step = self.runner.launch(prepared, num_shared)
        if scored:  # the sampling rows among the scored ones (the head's row max and argmax with them)
            sampled_step = step.rows(self._logit_rows.upload([row for row, _ in sampling]))
        logits, sample_logits = step.logits, sampled_step.logits
        if not sampling:
            return _LaunchedStep(plan, logits, sample_logits, sampling, scored, None, None)
        tokens = self.sampler.sample(sample_logits, sampled_step.head_max)
        if num_shared:
            self.runner.share_tokens(tokens)
        return _LaunchedStep(plan, logits, sample_logits, sampling, scored, tokens, self._readback.copy(tokens))

    def _sequences(
        self, plan: StepPlan
    ) -> tuple[list[SequenceInput], list[tuple[int, Request]], list[tuple[int, Request, int]]]:
        """The chunks as runner inputs; (logit row, request) of each sampling chunk; and
        (logit row, request, prompt position) of each prompt position to score."""
        sequences: list[SequenceInput] = []
        sampling: list[tuple[int, Request]] = []
        scored: list[tuple[int, Request, int]] = []
        logit_row = 0
        requests = self._requests
        tables = self.scheduler.allocator.block_tables(chunk.request_id for chunk in plan.chunks)
        for chunk, table in zip(plan.chunks, tables, strict=True):
            request = requests[chunk.request_id]
            start, num_tokens = chunk.start, chunk.num_tokens
            offsets: list[int] = []
            if request.params.prompt_logprobs is not None:  # else no position is scored (most requests)
                for position in prompt_logprob_positions(request, start, num_tokens):
                    offsets.append(position - start)
                    scored.append((logit_row, request, position + 1))
                    logit_row += 1
            draft = chunk.draft_token_ids
            if draft:  # a verify chunk: the request's last token, then the draft; a row at each position
                token_ids = [*request.token_span(start, num_tokens - len(draft)), *draft]
                for offset in range(num_tokens - 1 - len(draft), num_tokens):
                    offsets.append(offset)
                    sampling.append((logit_row, request))
                    logit_row += 1
                sequences.append(SequenceInput(token_ids, start, table, offsets))
                continue
            if chunk.samples:
                offsets.append(num_tokens - 1)
                sampling.append((logit_row, request))
                logit_row += 1
            sequences.append(SequenceInput(request.token_span(start, num_tokens), start, table, offsets))
        return sequences, sampling, scored

    def _set_sampler_rows(self, sampling: list[tuple[int, Request]]) -> None:
        requests = [request for _, request in sampling]
        rows = self._sampler_rows
        if self.config.speculative is not None:  # a verify chunk's rows: consecutive, output positions counting on
            positions = sampling_positions(requests)
        else:
            positions = [len(request.output_token_ids) for request in requests]
        sampler_rows = [rows.get(request) or self._sampler_row(request) for request in requests]
        self.sampler.set_sampler_rows(sampler_rows, positions)

    def _sampled(self, step: _LaunchedStep, plan: StepPlan) -> dict[str, SampledToken]:
        """The tokens read on the host (the step's one wait for the device), with logprobs where asked
        for; only those of `plan`'s requests (a request aborted after its step was launched has none)."""
        self._read_unsampleable = False
        if step.host_tokens is None:
            return {}
        requests = [request for _, request in step.sampling]
        tokens = step.host_tokens.values()
        self._read_unsampleable = min(tokens) < 0  # an unsampleable row's code (spec.sampling)
        counts = [request.params.logprobs for request in requests]
        verifies = self.config.speculative is not None and any(chunk.draft_token_ids for chunk in step.plan.chunks)
        if verifies:
            entries = token_logprobs(step.sample_logits, tokens, counts) if any(counts) else [None] * len(tokens)
            entries = [entry if count > 0 else None for entry, count in zip(entries, counts, strict=True)]
            stop_token_ids = self.scheduler.stop_token_ids
            results = step_results(step.plan, requests, tokens, entries, lambda r: stop_token_ids(r.request_id))
            self.step_timings.count_verified(step.plan, results)
        elif not any(counts):  # most steps: no request asks for logprobs
            results = {
                request.request_id: SampledToken(token, None) for request, token in zip(requests, tokens, strict=True)
            }
        else:
            entries = token_logprobs(step.sample_logits, tokens, counts)
            results = {
                request.request_id: SampledToken(token, entry if count > 0 else None)
                for request, token, entry, count in zip(requests, tokens, entries, counts, strict=True)
            }
        if plan is not step.plan:  # requests dropped from the plan after its launch
            kept = {chunk.request_id for chunk in plan.chunks if chunk.samples}
            results = {request_id: token for request_id, token in results.items() if request_id in kept}
        return results

    def _sampler_row(self, request: Request) -> SamplerRow:
        """The request's constant sampler columns, made on its first sampling step and kept until it finishes."""
        row = self._sampler_rows[request] = self.sampler.row(request.params, request.seed)
        return row

    def _forget_finished_rows(self) -> None:
        """Drop the sampler rows of requests that finished (or were aborted) since the last call."""
        if len(self._sampler_rows) > len(self._requests):
            for request in [r for r in self._sampler_rows if r.status is RequestStatus.FINISHED]:
                del self._sampler_rows[request]

    def _record_prompt_logprobs(self, logits: torch.Tensor, scored: list[tuple[int, Request, int]]) -> None:
        """Logits row r (at prompt position p - 1) scores prompt token p."""
        rows = self._logit_rows.upload([row for row, _, _ in scored])
        targets = [request.prompt_token_ids[position] for _, request, position in scored]
        counts = [request.params.prompt_logprobs or 0 for _, request, _ in scored]
        entries = token_logprobs(logits[rows], targets, counts)
        for (_, request, position), entry in zip(scored, entries, strict=True):
            request.record_prompt_logprobs(position, entry)


@dataclass(frozen=True)
class _PreparedAhead:
    """A plan scheduled ahead whose inputs and sampler rows are loaded (FastEngine._prepare_ahead)."""

    plan: StepPlan
    step: PreparedStep
    sampling: list[tuple[int, Request]]  # (logit row, request) of each sampling chunk


@dataclass(frozen=True)
class _LaunchedStep:
    """A plan whose forward pass, sampling and tokens' copy to the host are queued (FastEngine._launch)."""

    plan: StepPlan  # as launched (a request aborted since is dropped from the engine's plan, not from this)
    logits: torch.Tensor  # every logit row
    sample_logits: torch.Tensor  # the sampling rows' (a graph's output buffer: the next replay rewrites it)
    sampling: list[tuple[int, Request]]  # (logit row, request) of each sampling chunk; tokens in this order
    scored: list[tuple[int, Request, int]]  # (logit row, request, prompt position) of each scored position
    tokens: torch.Tensor | None  # int64 [len(sampling)] on the device; None when no chunk samples
    host_tokens: HostTokens | None


def _check_device(device: torch.device) -> None:
    """The fast engine runs on CUDA, or on the CPU through Triton's interpreter when asked for."""
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError("the fast engine was asked for device cuda, but CUDA is not available")
        return
    if device.type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1":
        return
    raise ConfigError(
        f"the fast engine runs on CUDA; on {device.type} it runs only through Triton's interpreter: set "
        "TRITON_INTERPRET=1 before importing twinfer (slow; for tests), or use engine='reference'"
    )
