"""A hypothesis state machine over one block allocator, driven the way the scheduler drives it.

Tiny pools (2 to 16 blocks of 1 to 16 tokens) make exhaustion and eviction routine; prompts
start with pieces of a few shared stems so prefix-cache hits are routine too. After every
step the spec's allocator invariants are checked, and the whole state is compared with the
plain model in fuzz/pool_model.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import hypothesis.strategies as st
from hypothesis.stateful import initialize, precondition, rule

from spec.invariants import InvariantMonitor

from fuzz import stats
from fuzz.implementations import AllocatorImplementation, AllocatorUnderTest
from fuzz.pool_model import PoolModel
from fuzz.properties import MODEL_AGREEMENT, check_agrees_with_model, violated
from fuzz.strategies import BLOCK_SIZES, CountedMachine, checked_step, draw_tokens, prefix_stems
from fuzz.workload import PROMPT_ALPHABET

# check_allocator's three invariants plus the monitor's hashed-block-immutable.
ALLOCATOR_INVARIANTS_PER_CHECK = 4


@dataclass
class LiveRequest:
    tokens: list[int]
    computed: int

    @property
    def uncomputed(self) -> int:
        return len(self.tokens) - self.computed


class AllocatorMachine(CountedMachine):
    implementation: ClassVar[AllocatorImplementation]

    def __init__(self) -> None:
        super().__init__()
        self.live: dict[str, LiveRequest] = {}
        self.next_request_number = 0

    # -- set-up ------------------------------------------------------------------------------

    @initialize(
        num_blocks=st.integers(2, 16),
        block_size=st.sampled_from(BLOCK_SIZES),
        enable_prefix_caching=st.booleans().map(lambda disabled: not disabled),  # shrinks to caching on
        data=st.data(),
    )
    @checked_step
    def build_pool(self, num_blocks: int, block_size: int, enable_prefix_caching: bool, data: st.DataObject) -> None:
        self.allocator: AllocatorUnderTest = self.implementation.build(num_blocks, block_size, enable_prefix_caching)
        self.block_size = block_size
        # Longest prompt tried: a block more than the pool holds, so some never fit.
        self.max_prompt_tokens = (num_blocks + 1) * block_size
        self.stems = data.draw(prefix_stems(4 * block_size), label="stems")
        self.monitor = InvariantMonitor()
        initial = self.allocator.snapshot()
        self.model = PoolModel.from_free_queue(block_size, initial.free_block_ids, enable_prefix_caching)

    # -- rules -------------------------------------------------------------------------------

    @rule(data=st.data())
    @checked_step
    def start_request(self, data: st.DataObject) -> None:
        """Admit a prompt as the scheduler does: look up the prefix hit, check, hold it, grow, compute."""
        tokens = draw_tokens(data, self.stems, self.max_prompt_tokens)
        hit = self._prefix_hit(tokens)
        cached_tokens = len(hit) * self.block_size
        chunk = data.draw(st.integers(1, len(tokens) - cached_tokens), label="first chunk")
        admissible = self.allocator.can_admit(cached_tokens + chunk, hit)
        expected = self.model.can_admit(cached_tokens + chunk, hit)
        if admissible != expected:
            raise violated(MODEL_AGREEMENT, f"can_admit({cached_tokens + chunk}, {hit}) is {admissible}, model says {expected}")
        if not admissible:
            stats.bump(self.stats_label, "admissions_refused")
            return
        request_id = f"r{self.next_request_number}"
        self.next_request_number += 1
        self.allocator.admit(request_id, hit)
        self.model.admit(request_id, hit)
        if not self.allocator.allocate_slots(request_id, cached_tokens + chunk):
            raise violated(MODEL_AGREEMENT, f"allocate_slots refused {cached_tokens + chunk} tokens after can_admit promised them")
        self.model.grow(request_id, cached_tokens + chunk)
        self.live[request_id] = LiveRequest(tokens, cached_tokens)
        self._compute(request_id, chunk)
        stats.bump(self.stats_label, "admissions")
        stats.bump(self.stats_label, "prefix_hit_blocks", len(hit))

    @precondition(lambda self: bool(self.live))
    @rule(data=st.data())
    @checked_step
    def compute_tokens(self, data: st.DataObject) -> None:
        """Append sampled tokens (maybe none) and compute the next chunk, crossing block boundaries."""
        request_id = data.draw(st.sampled_from(sorted(self.live)), label="request")
        request = self.live[request_id]
        appended = data.draw(
            st.lists(st.sampled_from(PROMPT_ALPHABET), min_size=0 if request.uncomputed else 1, max_size=self.block_size + 1),
            label="sampled tokens",
        )
        request.tokens.extend(appended)
        chunk = data.draw(st.integers(1, request.uncomputed), label="chunk")
        grown = self.allocator.allocate_slots(request_id, request.computed + chunk)
        expected = self.model.grow(request_id, request.computed + chunk)
        if grown != expected:
            raise violated(MODEL_AGREEMENT, f"allocate_slots({request_id!r}, {request.computed + chunk}) is {grown}, model says {expected}")
        if grown:
            self._compute(request_id, chunk)
        else:
            stats.bump(self.stats_label, "growths_refused")  # where the scheduler would preempt

    @precondition(lambda self: bool(self.live))
    @rule(data=st.data())
    @checked_step
    def free_request(self, data: st.DataObject) -> None:
        """A request finishes or is preempted: its blocks go back, hashed ones stay cached."""
        request_id = data.draw(st.sampled_from(sorted(self.live)), label="request")
        self._free(request_id)

    @rule(data=st.data())
    @checked_step
    def probe_prefix(self, data: st.DataObject) -> None:
        """Ask which prefix of a sequence is cached, without admitting it."""
        self._prefix_hit(draw_tokens(data, self.stems, self.max_prompt_tokens))

    def teardown(self) -> None:
        super().teardown()
        if not self.healthy or not hasattr(self, "allocator"):
            return  # a check already failed (or nothing was built): report that failure alone
        for request_id in sorted(self.live):
            self._free(request_id)
            self._check_state()
        if self.allocator.num_free_blocks != len(self.model.ref_counts):
            raise violated(MODEL_AGREEMENT, f"all requests freed but only {self.allocator.num_free_blocks} blocks are free")
        stats.bump(self.stats_label, "evictions", self.model.evictions)

    # -- helpers -----------------------------------------------------------------------------

    def _prefix_hit(self, tokens: list[int]) -> list[int]:
        hit = list(self.allocator.cached_prefix(tokens))
        expected = self.model.cached_prefix(tokens)
        if hit != expected:
            raise violated(MODEL_AGREEMENT, f"cached_prefix of {len(tokens)} tokens is {hit}, model expects {expected}")
        return hit

    def _compute(self, request_id: str, chunk: int) -> None:
        request = self.live[request_id]
        old_computed = request.computed
        request.computed += chunk
        self.allocator.commit_tokens(request_id, request.tokens, old_computed, request.computed)
        self.model.commit(request_id, request.tokens, request.computed)

    def _free(self, request_id: str) -> None:
        del self.live[request_id]
        self.allocator.free(request_id)
        self.model.free(request_id)
        stats.bump(self.stats_label, "frees")

    def check_after_step(self) -> None:
        self._check_state()

    def _check_state(self) -> None:
        snapshot = self.allocator.snapshot()
        self.monitor.observe_allocator(snapshot)
        stats.bump(self.stats_label, "snapshot_checks")
        stats.bump(self.stats_label, "invariant_evaluations", ALLOCATOR_INVARIANTS_PER_CHECK)
        check_agrees_with_model(snapshot, self.model)
        if self.allocator.num_free_blocks != self.model.num_free_blocks:
            raise violated(MODEL_AGREEMENT, f"{self.allocator.num_free_blocks} free blocks, model expects {self.model.num_free_blocks}")
        stats.bump(self.stats_label, "model_comparisons")


def allocator_machine(implementation: AllocatorImplementation, stats_label: str | None = None) -> type[AllocatorMachine]:
    """The state machine class for one allocator implementation."""
    label = stats_label or f"allocator[{implementation.name}]"
    return type(
        f"AllocatorMachine_{implementation.name}",
        (AllocatorMachine,),
        {"implementation": implementation, "stats_label": label, "last_run_steps": 0},
    )
