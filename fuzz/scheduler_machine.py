"""A hypothesis state machine over schedulers: add requests, step with a fake model, abort, drain.

Small max_num_seqs, token budgets and pools make chunked prefill, preemption and eviction
routine. Each registered scheduler runs the same operations; after every step each is held to
- the spec's scheduler invariants (InvariantMonitor on its snapshots),
- conservation: every added request is active until it comes back, and comes back exactly
  once with exactly the tokens and finish reason the fake model implies (fuzz/workload.py),
- liveness: a drain finishes every request within a bound derived from the workload,
- an idle scheduler holds no block except through the prefix cache,
- the same plans, finishes and state (queues, prefix hits, computed counts, block tables, free
  queue, prefix cache: block ids included) as every other implementation, after every schedule,
  update and abort,
and, with the twin check on, to the decisions of the oracle written from spec.scheduling.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import ClassVar

import hypothesis.strategies as st
from hypothesis.stateful import initialize, precondition, rule

from fuzz import stats
from fuzz.implementations import SchedulerImplementation, SchedulerUnderTest
from fuzz.oracle_scheduler import OracleScheduler
from fuzz.properties import (
    CONSERVATION,
    IDLE_POOL_FREE,
    LIVENESS,
    TWIN_DECISIONS,
    check_implementations_agree,
    violated,
)
from fuzz.shared_checks import CheckedMonitor
from fuzz.strategies import BOOLEANS, RUNNER, CountedMachine, checked_step, draw_tokens, integers, pick, prefix_stems
from fuzz.workload import (
    EOS_TOKEN_IDS,
    GENERATED_ALPHABET,
    RequestScript,
    expected_completion,
    fake_model_step,
    is_servable,
    workload_step_bound,
)
from spec.engine_config import EngineConfig
from spec.invariants import ALL_INVARIANTS, SchedulerSnapshot
from spec.request import FinishReason, Request
from spec.scheduling import StepPlan
from spec.speculative import SpeculativeConfig

# InvariantMonitor.observe checks every spec invariant but finishes-exactly-once (fed separately).
INVARIANTS_PER_OBSERVE = len(ALL_INVARIANTS) - 1
NO_MODEL_LEN_LIMIT = 4096


@st.composite
def engine_configs(draw: st.DrawFn, speculative: bool = False) -> EngineConfig:
    """Tiny engines: a few blocks, a few sequences, a budget of a few tokens."""
    block_size = draw(st.sampled_from((1, 2, 4, 8)), label="block_size")
    num_blocks = draw(st.integers(2, 16), label="num_blocks")
    max_model_len = draw(
        st.one_of(st.just(NO_MODEL_LEN_LIMIT), st.integers(2, (num_blocks + 1) * block_size)), label="max_model_len"
    )
    return EngineConfig(
        block_size=block_size,
        num_blocks=num_blocks,
        max_num_seqs=draw(st.integers(1, 4), label="max_num_seqs"),
        max_num_batched_tokens=draw(st.integers(1, 24), label="max_num_batched_tokens"),
        max_model_len=max_model_len,
        enable_prefix_caching=draw(st.booleans().map(lambda disabled: not disabled), label="enable_prefix_caching"),
        # Drawn only by the speculative machine: the plain machine's search (and the planted bugs' shrunk
        # counterexamples) stay what they were.
        speculative=draw(speculative_configs(), label="speculative") if speculative else None,
    )


@st.composite
def speculative_configs(draw: st.DrawFn) -> SpeculativeConfig:
    """Prompt lookup over the fake model's few symbols: drafts that agree with it, and drafts that do not;
    acceptance gates small enough that requests of a few outputs pause, probe and meet large steps."""
    ngram_max = draw(st.integers(1, 3), label="ngram_max")
    backoff = draw(st.integers(1, 3), label="backoff_outputs")
    return SpeculativeConfig(
        "ngram",
        draw(st.integers(1, 4), label="num_speculative_tokens"),
        ngram_min=draw(st.integers(1, ngram_max), label="ngram_min"),
        ngram_max=ngram_max,
        # Short windows and strict rates: a request of a few outputs verifies a few times at most, and
        # must be able to pause and probe within them (rate 0, never pausing, is the plain step 2b).
        acceptance_window=draw(st.integers(1, 2), label="acceptance_window"),
        min_acceptance_rate=draw(st.sampled_from((1.0, 0.5)), label="min_acceptance_rate"),
        backoff_outputs=backoff,
        max_backoff_outputs=backoff + draw(st.integers(0, 4), label="max_backoff_extra"),
        # Not 1: then every step with a decoding chunk is large, and a request without a full window of
        # verifies never gets one.
        large_batch_rows=draw(st.none() | st.integers(2, 3), label="large_batch_rows"),
        large_batch_acceptance_rate=draw(st.sampled_from((1.0, 0.5, 0.0)), label="large_batch_acceptance_rate"),
    )


@dataclass(frozen=True)
class EngineSetup:
    config: EngineConfig
    stems: tuple[tuple[int, ...], ...]  # prompts start with pieces of these


@dataclass(frozen=True)
class RequestDraft:
    """A request as drawn; the rule numbers it (a strategy must not change the machine)."""

    prompt: tuple[int, ...]
    max_tokens: int
    ignore_eos: bool
    stop_token_ids: tuple[int, ...]
    eos_at_output_index: int | None
    period: int | None

    def script(self, request_id: str) -> RequestScript:
        return RequestScript(
            request_id=request_id,
            prompt=self.prompt,
            max_tokens=self.max_tokens,
            ignore_eos=self.ignore_eos,
            stop_token_ids=self.stop_token_ids,
            eos_at_output_index=self.eos_at_output_index,
            period=self.period,
        )


# Rule arguments, drawn from the machine's state (st.runner() is the machine).


ENGINE_CONFIGS = engine_configs()
SPECULATIVE_ENGINE_CONFIGS = engine_configs(speculative=True)


@st.composite
def engine_setups(draw: st.DrawFn) -> EngineSetup:
    machine: SchedulerMachine = draw(st.runner())
    config = draw(SPECULATIVE_ENGINE_CONFIGS if machine.speculative else ENGINE_CONFIGS)
    return EngineSetup(config, tuple(map(tuple, draw(prefix_stems(4 * config.block_size)))))


@st.composite
def request_drafts(draw: st.DrawFn) -> RequestDraft:
    """Prompts up to the pool's size (some too long for max_model_len: rejected), output limits,
    stop ids and where the fake model emits EOS; the alternatives shrink to none."""
    machine: SchedulerMachine = draw(RUNNER)
    block_size = machine.config.block_size
    longest_prompt = min(machine.config.model_len - 1, machine.config.num_blocks * block_size) or 1
    # The speculative machine's requests run longer: enough verify chunks to pause, back off and probe.
    max_tokens = draw(integers(1, max(4, 2 * block_size) * (2 if machine.speculative else 1)))
    return RequestDraft(
        prompt=tuple(draw_tokens(draw, machine.stems, longest_prompt)),
        max_tokens=max_tokens,
        ignore_eos=draw(BOOLEANS),
        stop_token_ids=(pick(draw, GENERATED_ALPHABET),) if draw(BOOLEANS) else (),
        eos_at_output_index=draw(integers(0, max_tokens - 1)) if draw(BOOLEANS) else None,
        # Periodic outputs give prompt lookup drafts that agree (speculative machine only, as above).
        period=draw(st.none() | st.integers(1, 3), label="period") if machine.speculative else None,
    )


@st.composite
def active_requests(draw: st.DrawFn) -> str:
    machine: SchedulerMachine = draw(RUNNER)
    return pick(draw, machine.active)


@dataclass
class Twin:
    """One scheduler implementation under test, with the requests it was handed."""

    implementation: SchedulerImplementation
    scheduler: SchedulerUnderTest
    monitor: CheckedMonitor = field(default_factory=CheckedMonitor)
    requests: dict[str, Request] = field(default_factory=dict)  # every request it was given
    returned: set[str] = field(default_factory=set)  # finished or aborted
    # The snapshot checked last, while the scheduler has not been called since (but for has_unfinished, a read):
    # the idle check reuses it instead of taking and checking an equal one again.
    checked: SchedulerSnapshot | None = None


@dataclass
class Checkpoint:
    """The implementations' snapshots at one point (after a schedule, an update, an abort), first implementation
    first, each checked as it was added; `all_equal`: every later one equalled the first, which the check found
    (sharing its verdict), so the implementations are known to agree there without comparing again."""

    snapshots: list[SchedulerSnapshot] = field(default_factory=list)
    all_equal: bool = True

    @property
    def passed(self) -> SchedulerSnapshot | None:
        """The first implementation's snapshot, which passed the invariants (or it raised)."""
        return self.snapshots[0] if self.snapshots else None


class SchedulerMachine(CountedMachine):
    """Each rule checks as it goes (after every scheduler step), so no per-rule check is added."""

    implementations: ClassVar[tuple[SchedulerImplementation, ...]]
    twin_check: ClassVar[bool]
    speculative: ClassVar[bool] = False  # draws speculative-decoding configurations (prompt lookup)

    def __init__(self) -> None:
        super().__init__()
        self.scripts: dict[str, RequestScript] = {}
        self.expected: dict[str, tuple[tuple[int, ...], FinishReason]] = {}
        self.active: list[str] = []  # added and not yet come back, in arrival order
        self.scripts_drawn = 0  # numbers request ids, rejected requests included

    # -- set-up ------------------------------------------------------------------------------

    @initialize(setup=engine_setups())
    @checked_step
    def build_engines(self, setup: EngineSetup) -> None:
        config = self.config = setup.config
        self.stems = setup.stems
        self.twins = [Twin(impl, impl.build(config, EOS_TOKEN_IDS)) for impl in self.implementations]
        self.oracle = OracleScheduler(config, EOS_TOKEN_IDS) if self.twin_check else None

    # -- rules -------------------------------------------------------------------------------

    @rule(drafts=st.lists(request_drafts(), min_size=1, max_size=3))
    @checked_step
    def add_requests(self, drafts: list[RequestDraft]) -> None:
        """Add a few requests at once: several arriving together is what builds pool pressure."""
        for draft in drafts:
            self.scripts_drawn += 1
            self._add_request(draft.script(f"r{self.scripts_drawn}"))

    @rule(times=st.integers(1, 4))
    @checked_step
    def step(self, times: int) -> None:
        for _ in range(times):
            self._step_all()

    @precondition(lambda self: bool(self.active))
    @rule(request_id=active_requests())
    @checked_step
    def abort(self, request_id: str) -> None:
        after_abort = Checkpoint()
        for twin in self.twins:
            request = twin.requests[request_id]
            twin.checked = None
            twin.scheduler.abort(request)
            self._came_back(twin, request)
            self._check_twin(twin, after_abort)
        self._compare_states(f"state after abort({request_id!r})", after_abort)
        self.active.remove(request_id)
        if self.oracle is not None:
            self.oracle.abort(request_id)
            self._compare_queues_with_oracle(after_abort.snapshots)
        stats.bump(self.stats_label, "aborts")

    @rule()
    @checked_step
    def drain(self) -> None:
        self._drain()

    def check_at_teardown(self) -> None:
        if hasattr(self, "twins"):
            self._drain()  # every run ends idle: liveness and the idle checks apply to all of them

    # -- stepping ----------------------------------------------------------------------------

    def _step_all(self) -> list[StepPlan]:
        plans: list[StepPlan] = []
        finished_by_twin: list[list[str]] = []
        after_schedule, after_update = Checkpoint(), Checkpoint()
        for twin in self.twins:
            twin.checked = None
            plan = twin.scheduler.schedule()
            self._observe(twin, twin.scheduler.snapshot(), after_schedule, plan)
            sampled = fake_model_step(plan, self.scripts)
            finished = twin.scheduler.update(plan, sampled)
            for request in finished:
                self._came_back(twin, request)
            self._check_twin(twin, after_update)
            plans.append(plan)
            finished_by_twin.append([request.request_id for request in finished])
        self._compare_implementations("plan", plans)
        self._compare_states("state after schedule()", after_schedule)
        self._compare_implementations("finished requests", finished_by_twin)
        self._compare_states("state after update()", after_update)
        for request_id in dict.fromkeys(request_id for finished in finished_by_twin for request_id in finished):
            if request_id in self.active:
                self.active.remove(request_id)
        if self.oracle is not None:
            self._step_oracle_and_compare(plans, finished_by_twin, after_update.snapshots)
        return plans

    def _drain(self) -> None:
        """Step until idle; every request must finish within the bound the workload implies."""
        bound = workload_step_bound([self.scripts[request_id] for request_id in self.active], self.config.model_len)
        steps = 0
        while any(twin.scheduler.has_unfinished for twin in self.twins):
            if steps >= bound:
                raise violated(
                    LIVENESS, f"requests {self.active} still unfinished after {steps} drain steps (bound {bound})"
                )
            for twin, plan in zip(self.twins, self._step_all(), strict=True):
                if plan.is_empty and twin.scheduler.has_unfinished:
                    raise violated(LIVENESS, f"{twin.implementation.name}: nothing scheduled while {self.active} wait")
            steps += 1
        idle = Checkpoint()
        for twin in self.twins:
            self._check_idle(twin, idle)
        stats.bump(self.stats_label, "drains")

    # -- checks ------------------------------------------------------------------------------

    def _observe(
        self, twin: Twin, snapshot: SchedulerSnapshot, point: Checkpoint, plan: StepPlan | None = None
    ) -> None:
        """The spec's invariants on `snapshot`, then added to `point`. A snapshot equal to the first one there (which
        passed them) shares its verdict: fuzz/shared_checks.py says why that is exact."""
        if not twin.monitor.observe_like(snapshot, point.passed):
            stats.bump(self.stats_label, "snapshot_verdicts_shared")
        elif point.snapshots:
            point.all_equal = False  # checked in full: it differs from the first
        point.snapshots.append(snapshot)
        stats.bump(self.stats_label, "snapshot_checks")
        stats.bump(self.stats_label, "invariant_evaluations", INVARIANTS_PER_OBSERVE)
        if plan is not None:
            self._count_plan(plan, snapshot)

    def _came_back(self, twin: Twin, request: Request) -> None:
        """A request finished or was aborted: exactly once, with what the fake model implies."""
        request_id = request.request_id
        twin.monitor.finished([request_id])
        stats.bump(self.stats_label, "invariant_evaluations")
        if request_id not in self.scripts or request_id in twin.returned:
            raise violated(CONSERVATION, f"{twin.implementation.name}: {request_id!r} came back but is not active")
        twin.returned.add(request_id)
        script = self.scripts[request_id]
        if request.prompt_token_ids != script.prompt:
            raise violated(
                CONSERVATION,
                f"{request_id!r} came back with prompt {request.prompt_token_ids}, added with {script.prompt}",
            )
        tokens, reason = tuple(request.output_token_ids), request.finish_reason
        expected_tokens, expected_reason = self.expected[request_id]
        if reason is FinishReason.ABORT:
            if (
                request_id not in self.active
                or expected_tokens[: len(tokens)] != tokens
                or len(tokens) >= len(expected_tokens)
            ):
                raise violated(
                    CONSERVATION, f"aborted {request_id!r} returned {tokens}; the model's output is {expected_tokens}"
                )
        elif (tokens, reason) != (expected_tokens, expected_reason):
            raise violated(
                CONSERVATION,
                f"{twin.implementation.name}: {request_id!r} returned {tokens} ({reason}); "
                f"expected {expected_tokens} ({expected_reason}) for max_tokens {script.max_tokens}",
            )
        stats.bump(self.stats_label, f"finished_{reason.value if reason else 'none'}")

    def _compare_implementations(self, what: str, values: list) -> None:
        """Every implementation made the first one's decision (plans, hits, preemptions, block ids)."""
        if len(self.twins) > 1:
            check_implementations_agree(what, [twin.implementation.name for twin in self.twins], values)
            stats.bump(self.stats_label, "implementation_comparisons")

    def _compare_states(self, what: str, point: Checkpoint) -> None:
        """The implementations' states at `point` are equal: known already where every verdict was shared
        (each snapshot was found equal to the first), compared here otherwise."""
        if not point.all_equal:
            self._compare_implementations(what, point.snapshots)
        elif len(self.twins) > 1:
            stats.bump(self.stats_label, "implementation_comparisons")

    def _check_twin(self, twin: Twin, point: Checkpoint) -> None:
        """After a step or an abort: invariants (the snapshot joins `point`), then no active request lost or
        ahead of the model."""
        snapshot = twin.checked = twin.scheduler.snapshot()
        self._observe(twin, snapshot, point)
        in_queues = set(snapshot.waiting) | set(snapshot.running)
        should_be_active = set(twin.requests) - twin.returned
        if in_queues != should_be_active:
            raise violated(
                CONSERVATION,
                f"{twin.implementation.name}: lost {sorted(should_be_active - in_queues)}, "
                f"still holds returned {sorted(in_queues - should_be_active)}",
            )
        for request_id in should_be_active:
            output = tuple(twin.requests[request_id].output_token_ids)
            expected_tokens, _ = self.expected[request_id]
            if len(output) >= len(expected_tokens) or expected_tokens[: len(output)] != output:
                raise violated(
                    CONSERVATION, f"active {request_id!r} holds {output}; the model's output is {expected_tokens}"
                )
        if twin.scheduler.has_unfinished != bool(should_be_active):
            raise violated(
                CONSERVATION,
                f"has_unfinished is {twin.scheduler.has_unfinished} with {sorted(should_be_active)} active",
            )

    def _check_idle(self, twin: Twin, point: Checkpoint) -> None:
        """Idle: every request came back and every block is free."""
        snapshot = twin.checked
        if snapshot is None:
            snapshot = twin.checked = twin.scheduler.snapshot()
            self._observe(twin, snapshot, point)
        # else: the state is the one last checked (nothing changed it since), whose invariants held; a snapshot
        # taken now would be equal, and observing it again would compare it with itself.
        twin.monitor.check_all_finished()
        missing = sorted(set(twin.requests) - twin.returned)
        if missing:
            raise violated(CONSERVATION, f"{twin.implementation.name} is idle but never returned {missing}")
        allocator = snapshot.allocator
        if len(allocator.free_block_ids) != allocator.num_blocks:
            held = sorted(set(range(allocator.num_blocks)) - set(allocator.free_block_ids))
            raise violated(IDLE_POOL_FREE, f"{twin.implementation.name} is idle but blocks {held} are not free")

    def _step_oracle_and_compare(
        self, plans: list[StepPlan], finished_by_twin: list[list[str]], snapshots: list[SchedulerSnapshot]
    ) -> None:
        assert self.oracle is not None
        gate_events = Counter(self.oracle.gate_events)
        expected_plan = self.oracle.schedule()
        expected_finished = self.oracle.update(expected_plan, fake_model_step(expected_plan, self.scripts))
        for event, count in (self.oracle.gate_events - gate_events).items():  # the acceptance gates' coverage
            stats.bump(self.stats_label, f"gate_{event}", count)
        for twin, plan, finished in zip(self.twins, plans, finished_by_twin, strict=True):
            if plan != expected_plan:
                raise violated(
                    TWIN_DECISIONS,
                    f"{twin.implementation.name} planned {plan}; the spec's policy plans {expected_plan}",
                )
            if finished != expected_finished:
                raise violated(
                    TWIN_DECISIONS,
                    f"{twin.implementation.name} finished {finished}; the spec's policy finishes {expected_finished}",
                )
        self._compare_queues_with_oracle(snapshots)

    def _compare_queues_with_oracle(self, snapshots: list[SchedulerSnapshot]) -> None:
        """Each twin's queues (in `snapshots`, its latest) are the oracle's, and so are its requests' acceptance
        gates (speculative decoding: a gate that decided otherwise shows here before it changes a plan)."""
        assert self.oracle is not None
        expected = (tuple(r.request_id for r in self.oracle.waiting), tuple(r.request_id for r in self.oracle.running))
        expected_gates = self.oracle.gate_states()
        for twin, snapshot in zip(self.twins, snapshots, strict=True):
            if (snapshot.waiting, snapshot.running) != expected:
                raise violated(
                    TWIN_DECISIONS,
                    f"{twin.implementation.name} queues (waiting, running) are {(snapshot.waiting, snapshot.running)}; "
                    f"the spec's policy has {expected}",
                )
            gates = {request_id: state.draft_gate for request_id, state in snapshot.requests.items()}
            if expected_gates and gates != expected_gates:
                raise violated(
                    TWIN_DECISIONS,
                    f"{twin.implementation.name} acceptance gates are {gates}; the spec's policy has {expected_gates}",
                )
        stats.bump(self.stats_label, "twin_comparisons")

    # -- helpers -----------------------------------------------------------------------------

    def _add_request(self, script: RequestScript) -> None:
        if not is_servable(script, self.config):
            stats.bump(self.stats_label, "requests_rejected")  # an engine would refuse it: never added
            return
        self.scripts[script.request_id] = script
        self.expected[script.request_id] = expected_completion(script, self.config.model_len)
        self.active.append(script.request_id)
        arrival = len(self.scripts) - 1
        for twin in self.twins:
            request = script.new_request(arrival)
            twin.requests[script.request_id] = request
            twin.checked = None
            twin.scheduler.add(request)
        if self.oracle is not None:
            self.oracle.add(script)
        stats.bump(self.stats_label, "requests_added")

    def _count_plan(self, plan: StepPlan, snapshot: SchedulerSnapshot) -> None:
        stats.bump(self.stats_label, "scheduler_steps")
        stats.bump(self.stats_label, "preemptions", len(plan.preempted))
        stats.bump(self.stats_label, "admissions", len(plan.admitted))
        stats.bump(self.stats_label, "partial_prefill_chunks", sum(1 for chunk in plan.chunks if not chunk.samples))
        hits = sum(1 for request_id in plan.admitted if snapshot.requests[request_id].cached_tokens_at_admission > 0)
        stats.bump(self.stats_label, "admissions_with_prefix_hit", hits)
        if not plan.chunks and snapshot.waiting:
            stats.bump(self.stats_label, "steps_blocked")
        verify = [chunk for chunk in plan.chunks if chunk.draft_token_ids]
        if verify:
            stats.bump(self.stats_label, "verify_chunks", len(verify))
            sampled = fake_model_step(StepPlan(tuple(verify), (), ()), self.scripts)
            appended = sum(len(sampled[chunk.request_id]) for chunk in verify)
            drafted = sum(len(chunk.draft_token_ids) for chunk in verify)
            stats.bump(self.stats_label, "draft_tokens_accepted", appended - len(verify))
            stats.bump(self.stats_label, "draft_tokens_rejected", drafted - (appended - len(verify)))


def scheduler_machine(
    implementations: tuple[SchedulerImplementation, ...],
    twin_check: bool = True,
    stats_label: str | None = None,
    speculative: bool = False,
) -> type[SchedulerMachine]:
    """The state machine class driving `implementations` side by side (and the oracle, if `twin_check`);
    speculative: every engine configuration speculates (prompt lookup), over periodic fake outputs too."""
    names = "+".join(impl.name for impl in implementations) + ("+speculative" if speculative else "")
    return type(
        f"SchedulerMachine_{names.replace('+', '_')}",
        (SchedulerMachine,),
        {
            "implementations": implementations,
            "twin_check": twin_check,
            "speculative": speculative,
            "stats_label": stats_label or f"scheduler[{names}{'+oracle' if twin_check else ''}]",
            "last_run_steps": 0,
        },
    )
