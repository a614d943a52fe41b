"""The block allocators and schedulers the fuzzers drive.

Every registered implementation is fuzzed by the state machines, side by side with the others:
each is held to the plain pool model (allocators) or the oracle written from spec.scheduling
(schedulers), and all of them to the same observable decisions at every step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from fast.block_allocator import BlockAllocator as FastBlockAllocator
from fast.scheduler import Scheduler as FastScheduler
from reference.block_allocator import BlockAllocator
from reference.scheduler import Scheduler
from spec.engine_config import EngineConfig
from spec.invariants import AllocatorSnapshot, SchedulerSnapshot
from spec.request import Request
from spec.scheduling import StepPlan


class AllocatorUnderTest(Protocol):
    """The allocator API the scheduler uses (and so the fuzzer uses)."""

    @property
    def num_free_blocks(self) -> int: ...
    def cached_prefix(self, token_ids: Sequence[int], max_blocks: int | None = None) -> list[int]: ...
    def can_admit(self, num_tokens: int, cached_block_ids: Sequence[int]) -> bool: ...
    def admit(self, request_id: str, cached_block_ids: Sequence[int]) -> None: ...
    def allocate_slots(self, request_id: str, num_tokens: int) -> bool: ...
    def commit_tokens(
        self, request_id: str, token_ids: Sequence[int], old_computed: int, new_computed: int
    ) -> None: ...
    def free(self, request_id: str) -> None: ...
    def snapshot(self) -> AllocatorSnapshot: ...


class SchedulerUnderTest(Protocol):
    """The scheduler API an engine drives."""

    @property
    def has_unfinished(self) -> bool: ...
    def add(self, request: Request) -> None: ...
    def schedule(self) -> StepPlan: ...
    def update(self, plan: StepPlan, sampled: dict[str, int]) -> list[Request]: ...
    def abort(self, request: Request) -> None: ...
    def fail(self, request: Request) -> None: ...  # finish with ERROR (an unsampleable row: spec.request)
    def snapshot(self) -> SchedulerSnapshot: ...


# (num_blocks, block_size, enable_prefix_caching) -> allocator
AllocatorFactory = Callable[[int, int, bool], AllocatorUnderTest]
# (engine config with max_model_len set, end-of-sequence token ids) -> scheduler
SchedulerFactory = Callable[[EngineConfig, Sequence[int]], SchedulerUnderTest]


@dataclass(frozen=True)
class AllocatorImplementation:
    name: str
    build: AllocatorFactory


@dataclass(frozen=True)
class SchedulerImplementation:
    name: str
    build: SchedulerFactory


ALLOCATORS: dict[str, AllocatorImplementation] = {}
SCHEDULERS: dict[str, SchedulerImplementation] = {}


def register_allocator(name: str, build: AllocatorFactory) -> None:
    if name in ALLOCATORS:
        raise ValueError(f"an allocator named {name!r} is already registered")
    ALLOCATORS[name] = AllocatorImplementation(name, build)


def register_scheduler(name: str, build: SchedulerFactory) -> None:
    if name in SCHEDULERS:
        raise ValueError(f"a scheduler named {name!r} is already registered")
    SCHEDULERS[name] = SchedulerImplementation(name, build)


register_allocator("reference", BlockAllocator)
register_scheduler("reference", Scheduler)
register_allocator("fast", FastBlockAllocator)
register_scheduler("fast", FastScheduler)
