"""A hypothesis state machine over a whole engine: the tiny fp32 Qwen3 model, random requests,
steps and aborts under small pools and token budgets.

Every request is also run alone on a fresh reference engine (the solo run, cached by request).
After every step each output the engine returns, finished or not, must be a prefix of its solo
run's: exactly the same tokens, logprobs within LOGPROB_TOLERANCE, and on finishing the same
finish reason (and prompt logprobs, when asked for). Batching, chunked prefill, prefix-cache
hits, preemption and recompute, and other requests' aborts must change nothing. An aborted
request must leave no block held; once everything is done the pool must hold no block at all.
The engine runs with check_invariants on, so every step is also held to the spec's invariants.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import hypothesis.strategies as st
import torch
from hypothesis.stateful import initialize, precondition, rule

from fuzz import stats
from fuzz.properties import CONSERVATION, IDLE_POOL_FREE, LIVENESS, violated
from fuzz.strategies import CountedMachine, checked_step
from spec.agreement import token_logprobs_agree
from spec.engine import Engine
from spec.engine_config import EngineConfig
from spec.errors import InvalidRequestError
from spec.invariants import check_scheduler
from spec.model_config import ModelConfig
from spec.request import FinishReason, RequestOutput
from spec.sampling_params import SamplingParams
from spec.scheduling import StepPlan

LOGPROB_TOLERANCE = 1e-4
# The solo run's pool: large enough for any request the machine draws.
SOLO_BLOCK_SIZE = 16
SOLO_NUM_BLOCKS = 64
# Solo-equal outputs compared against a different engine's tokens: a property of its own name.
SOLO_AGREEMENT = "solo-agreement"

EngineBuilder = Callable[[ModelConfig, dict[str, torch.Tensor], EngineConfig], Engine]


@dataclass(frozen=True)
class WorkloadLimits:
    """How large the drawn workload gets (the fast engine on Triton's interpreter needs it small)."""

    max_prompt_tokens: int
    max_new_tokens: int
    max_requests_per_add: int
    max_steps_per_rule: int


@dataclass(frozen=True)
class TinyModel:
    """The model every engine of a run serves, and the tokens it tends to generate (stop-token candidates)."""

    config: ModelConfig
    state_dict: dict[str, torch.Tensor]
    likely_tokens: tuple[int, ...]


SoloKey = tuple[tuple[int, ...], SamplingParams, int]


class SoloRuns:
    """Each request run alone on a fresh reference engine, cached by (prompt, params, max_model_len)."""

    def __init__(self, model: TinyModel, build_reference: EngineBuilder) -> None:
        self.model = model
        self.build_reference = build_reference
        self._outputs: dict[SoloKey, RequestOutput] = {}

    def output(self, prompt: tuple[int, ...], params: SamplingParams, max_model_len: int) -> RequestOutput:
        key = (prompt, params, max_model_len)
        if key not in self._outputs:
            config = EngineConfig(block_size=SOLO_BLOCK_SIZE, num_blocks=SOLO_NUM_BLOCKS, max_model_len=max_model_len)
            engine = self.build_reference(self.model.config, self.model.state_dict, config)
            [self._outputs[key]] = engine.generate([list(prompt)], params)
        return self._outputs[key]


@dataclass
class Submitted:
    prompt: tuple[int, ...]
    params: SamplingParams
    expected: RequestOutput  # the solo run
    tokens_seen: int = 0


class EngineMachine(CountedMachine):
    engine_name: ClassVar[str]
    build_engine: ClassVar[EngineBuilder]
    model: ClassVar[TinyModel]
    solo: ClassVar[SoloRuns]
    limits: ClassVar[WorkloadLimits]

    def __init__(self) -> None:
        super().__init__()
        self.submitted: dict[str, Submitted] = {}
        self.active: list[str] = []  # added, neither finished nor aborted, in arrival order
        self.requests_drawn = 0

    # -- set-up ------------------------------------------------------------------------------

    @initialize(data=st.data())
    @checked_step
    def build(self, data: st.DataObject) -> None:
        limits = self.limits
        block_size = data.draw(st.sampled_from((2, 4, 8)), label="block_size")
        longest_request = limits.max_prompt_tokens + limits.max_new_tokens
        config = EngineConfig(
            block_size=block_size,
            # From a pool too small for the longest request (refused) to one that holds a few.
            num_blocks=data.draw(st.integers(2, 3 * -(-longest_request // block_size)), label="num_blocks"),
            max_num_seqs=data.draw(st.integers(1, 4), label="max_num_seqs"),
            max_num_batched_tokens=data.draw(st.integers(1, 16), label="max_num_batched_tokens"),
            max_model_len=data.draw(
                st.one_of(st.just(self.model.config.max_position_embeddings), st.integers(4, longest_request)),
                label="max_model_len",
            ),
            enable_prefix_caching=data.draw(st.booleans().map(lambda disabled: not disabled), label="prefix_caching"),
            check_invariants=True,
        )
        self.engine = type(self).build_engine(self.model.config, self.model.state_dict, config)
        self.config = self.engine.config
        self.stems = data.draw(
            st.lists(
                st.lists(st.integers(1, 40), min_size=1, max_size=limits.max_prompt_tokens), min_size=1, max_size=3
            ),
            label="prompt stems",
        )
        self._record_plans()

    # -- rules -------------------------------------------------------------------------------

    @rule(data=st.data())
    @checked_step
    def add_requests(self, data: st.DataObject) -> None:
        for _ in range(data.draw(st.integers(1, self.limits.max_requests_per_add), label="requests")):
            self._add_request(data)

    @rule(data=st.data())
    @checked_step
    def step(self, data: st.DataObject) -> None:
        for _ in range(data.draw(st.integers(1, self.limits.max_steps_per_rule), label="steps")):
            self._step()

    @precondition(lambda self: bool(self.active))
    @rule(data=st.data())
    @checked_step
    def abort(self, data: st.DataObject) -> None:
        request_id = data.draw(st.sampled_from(self.active), label="request to abort")
        output = self.engine.abort(request_id)
        if output.finish_reason is not FinishReason.ABORT:
            raise violated(CONSERVATION, f"aborted {request_id!r} came back with {output.finish_reason}")
        self._check_prefix_of_solo(output)
        self.active.remove(request_id)
        allocator = self.engine.scheduler.allocator
        snapshot = self.engine.scheduler.snapshot()
        check_scheduler(snapshot)
        if allocator.block_table(request_id) or request_id in snapshot.allocator.block_tables:
            raise violated(
                CONSERVATION, f"aborted {request_id!r} still holds blocks {allocator.block_table(request_id)}"
            )
        if request_id in snapshot.requests:
            raise violated(CONSERVATION, f"aborted {request_id!r} is still queued")
        stats.bump(self.stats_label, "aborts")

    def check_at_teardown(self) -> None:
        if not hasattr(self, "engine"):
            return  # nothing was built
        bound = sum(len(self.submitted[r].prompt) + self.submitted[r].params.max_tokens + 2 for r in self.active) + 1
        steps = 0
        while self.engine.has_unfinished:
            if steps >= bound:
                raise violated(LIVENESS, f"requests {self.active} unfinished after {steps} steps (bound {bound})")
            self._step()
            steps += 1
        if self.active:
            raise violated(CONSERVATION, f"the engine is idle but {self.active} never finished")
        allocator = self.engine.scheduler.allocator
        if allocator.num_free_blocks != self.config.num_blocks:
            held = [b.block_id for b in self.engine.scheduler.snapshot().allocator.blocks if b.ref_count]
            raise violated(IDLE_POOL_FREE, f"all requests are done but blocks {held} are held")
        stats.bump(self.stats_label, "drains")

    # -- helpers -----------------------------------------------------------------------------

    def _add_request(self, data: st.DataObject) -> None:
        self.requests_drawn += 1
        request_id = f"r{self.requests_drawn}"
        prompt = tuple(self._draw_prompt(data))
        params = self._draw_params(data)
        free_before = self.engine.scheduler.allocator.num_free_blocks
        try:
            self.engine.add_request(list(prompt), params, request_id=request_id)
        except InvalidRequestError:
            if self.engine.scheduler.allocator.num_free_blocks != free_before or request_id in self._queued():
                raise violated(CONSERVATION, f"refusing {request_id!r} changed the engine") from None
            stats.bump(self.stats_label, "requests_rejected")
            return
        expected = self.solo.output(prompt, params, self.config.model_len)
        self.submitted[request_id] = Submitted(prompt, params, expected)
        self.active.append(request_id)
        stats.bump(self.stats_label, "requests_added")

    def _draw_prompt(self, data: st.DataObject) -> list[int]:
        stem = data.draw(st.sampled_from(self.stems), label="stem")
        keep = data.draw(st.one_of(st.just(len(stem)), st.integers(0, len(stem))), label="stem tokens kept")
        fresh = data.draw(
            st.lists(st.integers(1, 40), min_size=0 if keep else 1, max_size=self.limits.max_prompt_tokens - keep),
            label="fresh tokens",
        )
        return [*stem[:keep], *fresh]

    def _draw_params(self, data: st.DataObject) -> SamplingParams:
        temperature = data.draw(st.sampled_from((0.0, 0.0, 0.7, 1.5)), label="temperature")
        sampled = temperature > 0
        return SamplingParams(
            temperature=temperature,
            top_k=data.draw(st.sampled_from((0, 5)), label="top_k") if sampled else 0,
            top_p=data.draw(st.sampled_from((1.0, 0.8)), label="top_p") if sampled else 1.0,
            min_p=data.draw(st.sampled_from((0.0, 0.1)), label="min_p") if sampled else 0.0,
            # A sampled request needs a seed for its solo run to be comparable; a greedy one may leave it to the engine.
            seed=data.draw(st.integers(0, 2**63 - 1) if sampled else st.none(), label="seed"),
            max_tokens=data.draw(st.integers(1, self.limits.max_new_tokens), label="max_tokens"),
            ignore_eos=data.draw(st.booleans(), label="ignore_eos"),
            stop_token_ids=tuple(
                data.draw(st.lists(st.sampled_from(self.model.likely_tokens), max_size=2), label="stop tokens")
            ),
            logprobs=data.draw(st.integers(0, 3), label="logprobs"),
            prompt_logprobs=data.draw(st.one_of(st.none(), st.none(), st.integers(0, 2)), label="prompt_logprobs"),
        )

    def _step(self) -> None:
        for output in self.engine.step():
            self._check_prefix_of_solo(output)
            if output.finished:
                self.active.remove(output.request_id)
                stats.bump(self.stats_label, f"finished_{output.finish_reason.value}")
        stats.bump(self.stats_label, "engine_steps")

    def _queued(self) -> set[str]:
        snapshot = self.engine.scheduler.snapshot()
        return {*snapshot.waiting, *snapshot.running}

    def _check_prefix_of_solo(self, output: RequestOutput) -> None:
        """The output so far equals the start of the solo run's (all of it, once finished)."""
        request_id = output.request_id
        if request_id not in self.active:
            raise violated(CONSERVATION, f"output for {request_id!r}, which is not active")
        submitted = self.submitted[request_id]
        expected = submitted.expected
        tokens = output.token_ids
        if tokens != expected.token_ids[: len(tokens)] or len(tokens) < submitted.tokens_seen:
            raise violated(
                SOLO_AGREEMENT, f"{request_id!r} has tokens {tokens}; alone it generates {expected.token_ids}"
            )
        submitted.tokens_seen = len(tokens)
        if expected.logprobs is not None:
            _check_logprobs(request_id, "logprobs", output.logprobs, expected.logprobs[: len(tokens)])
        if output.finish_reason is FinishReason.ABORT or not output.finished:
            return
        if (tokens, output.finish_reason) != (expected.token_ids, expected.finish_reason):
            raise violated(
                SOLO_AGREEMENT,
                f"{request_id!r} finished with {tokens} ({output.finish_reason}); alone: "
                f"{expected.token_ids} ({expected.finish_reason})",
            )
        if expected.prompt_logprobs is not None:
            _check_logprobs(request_id, "prompt logprobs", output.prompt_logprobs, expected.prompt_logprobs)
        stats.bump(self.stats_label, "solo_comparisons")

    def _record_plans(self) -> None:
        """Count preemptions and prefix hits as the engine's scheduler decides them."""
        scheduler = self.engine.scheduler
        schedule = scheduler.schedule

        def schedule_and_count() -> StepPlan:
            plan = schedule()
            stats.bump(self.stats_label, "preemptions", len(plan.preempted))
            stats.bump(self.stats_label, "chunked_prefills", sum(1 for chunk in plan.chunks if not chunk.samples))
            hits = sum(1 for chunk in plan.chunks if chunk.request_id in plan.admitted and chunk.start > 0)
            stats.bump(self.stats_label, "admissions_with_prefix_hit", hits)
            return plan

        scheduler.schedule = schedule_and_count


def _check_logprobs(request_id: str, what: str, actual: Any, expected: Any) -> None:
    if actual is None or len(actual) != len(expected):
        raise violated(SOLO_AGREEMENT, f"{request_id!r} {what}: {actual}; alone: {expected}")
    for position, (got, want) in enumerate(zip(actual, expected, strict=True)):
        if got is None or want is None:
            if got is not want:
                raise violated(SOLO_AGREEMENT, f"{request_id!r} {what}[{position}]: {got}; alone: {want}")
            continue
        if not token_logprobs_agree(got, want, LOGPROB_TOLERANCE):
            raise violated(SOLO_AGREEMENT, f"{request_id!r} {what}[{position}]: {got}; alone: {want}")
