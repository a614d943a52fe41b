"""A hypothesis state machine over block allocators, driven the way the scheduler drives them.

Tiny pools (2 to 16 blocks of 1 to 16 tokens) make exhaustion and eviction routine; prompts
start with pieces of a few shared stems so prefix-cache hits are routine too. Every
implementation given runs the same operations side by side. After every step each one's
allocator invariants are checked, the implementations must have answered every call alike and
hold the same state (block ids included), and the whole state is compared with the plain model
in fuzz/pool_model.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import hypothesis.strategies as st
from hypothesis.stateful import initialize, precondition, rule

from fuzz import stats
from fuzz.implementations import AllocatorImplementation, AllocatorUnderTest
from fuzz.pool_model import PoolModel
from fuzz.properties import MODEL_AGREEMENT, check_agrees_with_model, check_implementations_agree, violated
from fuzz.shared_checks import CheckedMonitor
from fuzz.strategies import (
    BLOCK_SIZES,
    BOOLEANS,
    RUNNER,
    CountedMachine,
    checked_step,
    draw_fresh_tokens,
    draw_tokens,
    integers,
    pick,
    prefix_stems,
)

# check_allocator's three invariants plus the monitor's hashed-block-immutable.
ALLOCATOR_INVARIANTS_PER_CHECK = 4


@dataclass
class LiveRequest:
    tokens: list[int]
    computed: int

    @property
    def uncomputed(self) -> int:
        return len(self.tokens) - self.computed


@dataclass(frozen=True)
class Pool:
    num_blocks: int
    block_size: int
    enable_prefix_caching: bool
    stems: tuple[tuple[int, ...], ...]  # prompts start with pieces of these


@dataclass(frozen=True)
class Admission:
    tokens: tuple[int, ...]
    first_chunk: int  # tokens computed at admission, beyond the prefix hit


@dataclass(frozen=True)
class Computation:
    request_id: str
    appended: tuple[int, ...]  # sampled tokens appended first (maybe none)
    chunk: int  # tokens then computed


# Rule arguments, drawn from the machine's state (st.runner() is the machine).


@st.composite
def pools(draw: st.DrawFn) -> Pool:
    block_size = draw(st.sampled_from(BLOCK_SIZES))
    return Pool(
        num_blocks=draw(st.integers(2, 16)),
        block_size=block_size,
        enable_prefix_caching=not draw(BOOLEANS),  # shrinks to caching on
        stems=tuple(map(tuple, draw(prefix_stems(4 * block_size)))),
    )


@st.composite
def prompts(draw: st.DrawFn) -> tuple[int, ...]:
    machine: AllocatorMachine = draw(RUNNER)
    return tuple(draw_tokens(draw, machine.stems, machine.max_prompt_tokens))


@st.composite
def admissions(draw: st.DrawFn) -> Admission:
    """A prompt and its first chunk: 1 to all of its tokens past the prefix hit. The hit is the
    model's; the rule checks that every implementation's hit is the same before using the chunk."""
    machine: AllocatorMachine = draw(RUNNER)
    tokens = tuple(draw_tokens(draw, machine.stems, machine.max_prompt_tokens))
    cached_tokens = len(machine.model.cached_prefix(tokens)) * machine.block_size
    return Admission(tokens, draw(integers(1, len(tokens) - cached_tokens)))


@st.composite
def live_requests(draw: st.DrawFn) -> str:
    machine: AllocatorMachine = draw(RUNNER)
    return pick(draw, sorted(machine.live))


@st.composite
def computations(draw: st.DrawFn) -> Computation:
    """Sampled tokens to append (at least one when all are computed), then 1 to all uncomputed tokens."""
    machine: AllocatorMachine = draw(RUNNER)
    request_id = pick(draw, sorted(machine.live))
    uncomputed = machine.live[request_id].uncomputed
    appended = draw_fresh_tokens(draw, 0 if uncomputed else 1, machine.block_size + 1)
    return Computation(request_id, tuple(appended), draw(integers(1, uncomputed + len(appended))))


class AllocatorMachine(CountedMachine):
    implementations: ClassVar[tuple[AllocatorImplementation, ...]]

    def __init__(self) -> None:
        super().__init__()
        self.live: dict[str, LiveRequest] = {}
        self.next_request_number = 0

    # -- set-up ------------------------------------------------------------------------------

    @initialize(pool=pools())
    @checked_step
    def build_pool(self, pool: Pool) -> None:
        self.allocators: list[AllocatorUnderTest] = [
            implementation.build(pool.num_blocks, pool.block_size, pool.enable_prefix_caching)
            for implementation in self.implementations
        ]
        self.monitors = [CheckedMonitor() for _ in self.allocators]
        self.block_size = pool.block_size
        # Longest prompt tried: a block more than the pool holds, so some never fit.
        self.max_prompt_tokens = (pool.num_blocks + 1) * pool.block_size
        self.stems = pool.stems
        initial = self._call_all("snapshot()", lambda allocator: allocator.snapshot())
        self.model = PoolModel.from_free_queue(pool.block_size, initial.free_block_ids, pool.enable_prefix_caching)

    # -- rules -------------------------------------------------------------------------------

    @rule(admission=admissions())
    @checked_step
    def start_request(self, admission: Admission) -> None:
        """Admit a prompt as the scheduler does: look up the prefix hit, check, hold it, grow, compute."""
        tokens = list(admission.tokens)
        hit = self._prefix_hit(tokens)
        cached_tokens = len(hit) * self.block_size
        chunk = admission.first_chunk
        call = f"can_admit({cached_tokens + chunk}, {hit})"
        admissible = self._call_all(call, lambda allocator: allocator.can_admit(cached_tokens + chunk, hit))
        expected = self.model.can_admit(cached_tokens + chunk, hit)
        if admissible != expected:
            raise violated(MODEL_AGREEMENT, f"{call} is {admissible}, model says {expected}")
        if not admissible:
            stats.bump(self.stats_label, "admissions_refused")
            return
        request_id = f"r{self.next_request_number}"
        self.next_request_number += 1
        self._call_all(f"admit({request_id!r}, {hit})", lambda allocator: allocator.admit(request_id, hit))
        self.model.admit(request_id, hit)
        call = f"allocate_slots({request_id!r}, {cached_tokens + chunk})"
        if not self._call_all(call, lambda allocator: allocator.allocate_slots(request_id, cached_tokens + chunk)):
            raise violated(MODEL_AGREEMENT, f"{call} refused after can_admit promised the blocks")
        self.model.grow(request_id, cached_tokens + chunk)
        self.live[request_id] = LiveRequest(tokens, cached_tokens)
        self._compute(request_id, chunk)
        stats.bump(self.stats_label, "admissions")
        stats.bump(self.stats_label, "prefix_hit_blocks", len(hit))

    @precondition(lambda self: bool(self.live))
    @rule(computation=computations())
    @checked_step
    def compute_tokens(self, computation: Computation) -> None:
        """Append sampled tokens (maybe none) and compute the next chunk, crossing block boundaries."""
        request_id, chunk = computation.request_id, computation.chunk
        request = self.live[request_id]
        request.tokens.extend(computation.appended)
        call = f"allocate_slots({request_id!r}, {request.computed + chunk})"
        grown = self._call_all(call, lambda allocator: allocator.allocate_slots(request_id, request.computed + chunk))
        expected = self.model.grow(request_id, request.computed + chunk)
        if grown != expected:
            raise violated(MODEL_AGREEMENT, f"{call} is {grown}, model says {expected}")
        if grown:
            self._compute(request_id, chunk)
        else:
            stats.bump(self.stats_label, "growths_refused")  # where the scheduler would preempt

    @precondition(lambda self: bool(self.live))
    @rule(request_id=live_requests())
    @checked_step
    def free_request(self, request_id: str) -> None:
        """A request finishes or is preempted: its blocks go back, hashed ones stay cached."""
        self._free(request_id)

    @rule(tokens=prompts())
    @checked_step
    def probe_prefix(self, tokens: tuple[int, ...]) -> None:
        """Ask which prefix of a sequence is cached, without admitting it."""
        self._prefix_hit(list(tokens))

    def check_at_teardown(self) -> None:
        if not hasattr(self, "allocators"):
            return  # nothing was built
        for request_id in sorted(self.live):
            self._free(request_id)
            self._check_state()
        for allocator in self.allocators:
            if allocator.num_free_blocks != len(self.model.ref_counts):
                raise violated(
                    MODEL_AGREEMENT, f"all requests freed but only {allocator.num_free_blocks} blocks are free"
                )
        stats.bump(self.stats_label, "evictions", self.model.evictions)

    # -- helpers -----------------------------------------------------------------------------

    def _call_all(self, call: str, operation: Callable[[AllocatorUnderTest], Any]) -> Any:
        """Make the same call on every implementation; they must all answer alike. The answer."""
        answers = [operation(allocator) for allocator in self.allocators]
        check_implementations_agree(call, [impl.name for impl in self.implementations], answers)
        return answers[0]

    def _prefix_hit(self, tokens: list[int]) -> list[int]:
        hit = list(self._call_all(f"cached_prefix({tokens})", lambda allocator: allocator.cached_prefix(tokens)))
        expected = self.model.cached_prefix(tokens)
        if hit != expected:
            raise violated(MODEL_AGREEMENT, f"cached_prefix of {len(tokens)} tokens is {hit}, model expects {expected}")
        return hit

    def _compute(self, request_id: str, chunk: int) -> None:
        request = self.live[request_id]
        old_computed = request.computed
        request.computed += chunk
        call = f"commit_tokens({request_id!r}, ..., {old_computed}, {request.computed})"
        self._call_all(
            call, lambda allocator: allocator.commit_tokens(request_id, request.tokens, old_computed, request.computed)
        )
        self.model.commit(request_id, request.tokens, request.computed)

    def _free(self, request_id: str) -> None:
        del self.live[request_id]
        self._call_all(f"free({request_id!r})", lambda allocator: allocator.free(request_id))
        self.model.free(request_id)
        stats.bump(self.stats_label, "frees")

    def check_after_step(self) -> None:
        self._check_state()

    def _check_state(self) -> None:
        snapshots = [allocator.snapshot() for allocator in self.allocators]
        all_equal = True
        for monitor, snapshot in zip(self.monitors, snapshots, strict=True):
            # The first snapshot passed the allocator invariants (or raised): an equal one shares its verdict
            # (fuzz/shared_checks.py says why that is exact); one that differs is checked in full.
            if not monitor.observe_allocator_like(snapshot, snapshots[0] if snapshot is not snapshots[0] else None):
                stats.bump(self.stats_label, "snapshot_verdicts_shared")
            elif snapshot is not snapshots[0]:
                all_equal = False
            stats.bump(self.stats_label, "snapshot_checks")
            stats.bump(self.stats_label, "invariant_evaluations", ALLOCATOR_INVARIANTS_PER_CHECK)
        if len(snapshots) > 1:
            if not all_equal:  # else every snapshot was just found equal to the first: they agree
                check_implementations_agree("allocator state", [impl.name for impl in self.implementations], snapshots)
            stats.bump(self.stats_label, "implementation_comparisons")
        # Every snapshot equals the first by now (or the agreement check raised), so the first agreeing with the
        # model is every one agreeing: check_agrees_with_model is a predicate of the snapshot's value.
        check_agrees_with_model(snapshots[0], self.model)
        for allocator in self.allocators:
            if allocator.num_free_blocks != self.model.num_free_blocks:
                raise violated(
                    MODEL_AGREEMENT,
                    f"{allocator.num_free_blocks} free blocks, model expects {self.model.num_free_blocks}",
                )
            stats.bump(self.stats_label, "model_comparisons")


def allocator_machine(
    implementations: tuple[AllocatorImplementation, ...], stats_label: str | None = None
) -> type[AllocatorMachine]:
    """The state machine class driving `implementations` side by side."""
    names = "+".join(impl.name for impl in implementations)
    return type(
        f"AllocatorMachine_{names.replace('+', '_')}",
        (AllocatorMachine,),
        {"implementations": implementations, "stats_label": stats_label or f"allocator[{names}]", "last_run_steps": 0},
    )
