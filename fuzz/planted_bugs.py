"""Realistic bugs planted in subclasses of the reference allocator and scheduler.

Each is a small, plausible slip (an off-by-one, a missing line, a forgotten reset); the
planted-bug tests check that the state machines find each one, name the right invariant or
property, and shrink it to a short counterexample.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from reference.block_allocator import BlockAllocator
from reference.scheduler import Scheduler
from spec.block_hash import NO_PARENT, hash_block
from spec.engine_config import EngineConfig
from spec.invariants import SchedulerSnapshot
from spec.request import Request, RequestStatus
from spec.scheduling import StepPlan

# -- allocator bugs --------------------------------------------------------------------------


class FreesBlocksStillHeld(BlockAllocator):
    """free() queues every block it releases, even one another request still holds."""

    def free(self, request_id: str) -> None:
        table = self._tables.pop(request_id)
        self._chain_hashes.pop(request_id)
        for block_id in reversed(table):
            block = self._blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0 and block.block_hash is None:
                block.reset()
            self._free[block_id] = None  # bug: not only when the count reaches 0


class ReleasesSharedBlocksTwice(BlockAllocator):
    """free() drops a shared cached block's count once for the request and once more 'for the cache'."""

    def free(self, request_id: str) -> None:
        table = self._tables.pop(request_id)
        self._chain_hashes.pop(request_id)
        for block_id in reversed(table):
            block = self._blocks[block_id]
            block.ref_count -= 1
            if block.ref_count > 0 and block.block_hash is not None:
                block.ref_count -= 1  # bug: decremented twice
            if block.ref_count == 0:
                if block.block_hash is None:
                    block.reset()
                self._free[block_id] = None


class ReusesCachedBlockWithoutEvicting(BlockAllocator):
    """Reallocating a free cached block refills it but leaves its hash and cache entry behind."""

    def _take_free_block(self) -> int:
        block_id, _ = self._free.popitem(last=False)
        block = self._blocks[block_id]
        block.token_ids = []  # bug: new content, while the prefix cache still serves the old
        block.ref_count = 1
        return block_id


class HitsTheLastBlockToo(BlockAllocator):
    """cached_prefix may cover every token (floor instead of leaving a token to compute)."""

    def cached_prefix(self, token_ids: Sequence[int]) -> list[int]:
        return super().cached_prefix([*token_ids, 0])  # bug: as if one more token followed


class FloorsBlockCount(BlockAllocator):
    """Blocks needed for n tokens computed with floor division: a partial last block is never allocated."""

    def _blocks_for(self, num_tokens: int) -> int:
        return num_tokens // self.block_size  # bug: should round up


class RegistersUnchainedHashes(BlockAllocator):
    """commit_tokens hashes each newly full block on its own, forgetting the chain through its parent."""

    def commit_tokens(self, request_id: str, token_ids: Sequence[int], old_computed: int, new_computed: int) -> None:
        table = self._tables[request_id]
        for position in range(old_computed, new_computed):
            self._blocks[table[position // self.block_size]].token_ids.append(token_ids[position])
        chain = self._chain_hashes[request_id]
        for index in range(len(chain), new_computed // self.block_size):
            block = self._blocks[table[index]]
            block_hash = hash_block(NO_PARENT, block.token_ids)  # bug: the parent should be chain[-1]
            chain.append(block_hash)
            if self.enable_prefix_caching and block_hash not in self._cached:
                block.block_hash = block_hash
                block.parent_hash = NO_PARENT
                self._cached[block_hash] = block.block_id


def scheduler_over(allocator_class: type[BlockAllocator]) -> type[Scheduler]:
    """The reference scheduler, over a (buggy) allocator."""

    class SchedulerOverAllocator(Scheduler):
        def __init__(self, config: EngineConfig, eos_token_ids: Sequence[int] = ()) -> None:
            super().__init__(config, eos_token_ids)
            self.allocator = allocator_class(config.num_blocks, config.block_size, config.enable_prefix_caching)

    SchedulerOverAllocator.__name__ = f"SchedulerOver{allocator_class.__name__}"
    return SchedulerOverAllocator


# -- scheduler bugs --------------------------------------------------------------------------


class DropsPreemptedRequests(Scheduler):
    """Preemption frees the victim and takes it off the running list, but never requeues it."""

    def _grow_or_preempt(self, request: Request, num_tokens: int, preempted: list[str]) -> bool:
        while not self.allocator.allocate_slots(request.request_id, num_tokens):
            victim = self.running.pop()
            self.allocator.free(victim.request_id)
            victim.preempt()
            self._admission.pop(victim.request_id, None)
            preempted.append(victim.request_id)  # bug: missing self.waiting.appendleft(victim)
            if victim is request:
                return False
        return True


class KeepsComputedTokensOnPreemption(Scheduler):
    """Preemption requeues the victim but forgets to reset its computed count."""

    def _grow_or_preempt(self, request: Request, num_tokens: int, preempted: list[str]) -> bool:
        while not self.allocator.allocate_slots(request.request_id, num_tokens):
            victim = self.running.pop()
            self.allocator.free(victim.request_id)
            victim.status = RequestStatus.WAITING  # bug: Request.preempt() would also reset the count
            self._admission.pop(victim.request_id, None)
            self.waiting.appendleft(victim)
            preempted.append(victim.request_id)
            if victim is request:
                return False
        return True


class TruncatesPromptToBudget(Scheduler):
    """When the budget cuts an admitted prompt short, the rest of the prompt is dropped."""

    def _try_admit(self, request: Request, budget: int) -> int | None:
        num_tokens = super()._try_admit(request, budget)
        if num_tokens is not None:
            end = request.num_computed_tokens + num_tokens
            if end < len(request.prompt_token_ids):
                request.prompt_token_ids = request.prompt_token_ids[:end]  # bug: truncated, not chunked
        return num_tokens


class IgnoresBudgetForLastPrompt(Scheduler):
    """Admission schedules the whole uncached prompt, whatever budget is left."""

    def _try_admit(self, request: Request, budget: int) -> int | None:
        return super()._try_admit(request, budget=1 << 30)  # bug: the budget is not passed on


class AdmitsOnePastMaxNumSeqs(Scheduler):
    """Admission compares with <= max_num_seqs, so one sequence too many runs."""

    def __init__(self, config: EngineConfig, eos_token_ids: Sequence[int] = ()) -> None:
        super().__init__(config, eos_token_ids)
        # bug: the admission loop reads a limit one too high
        self.config = replace(config, max_num_seqs=config.max_num_seqs + 1)
        self._true_config = config

    def snapshot(self) -> SchedulerSnapshot:
        return replace(super().snapshot(), config=self._true_config)


class LosesSequencesPastMaxNumSeqs(AdmitsOnePastMaxNumSeqs):
    """Admits one too many, then trims the running list back to max_num_seqs, losing the newest."""

    def schedule(self) -> StepPlan:
        plan = super().schedule()
        lost: set[str] = set()
        while len(self.running) > self._true_config.max_num_seqs:
            request = self.running.pop()  # bug: dropped, neither requeued nor finished
            self.allocator.free(request.request_id)
            self._scheduled.pop(request.request_id, None)
            lost.add(request.request_id)
        return StepPlan(
            chunks=tuple(chunk for chunk in plan.chunks if chunk.request_id not in lost),
            preempted=plan.preempted,
            admitted=tuple(request_id for request_id in plan.admitted if request_id not in lost),
        )


class NotBlockAlignedPrefixHit(Scheduler):
    """A hit covering the whole sequence is backed off by one token, not one block, so that a
    token is left to compute: the last hit block is recomputed from the middle."""

    def _try_admit(self, request: Request, budget: int) -> int | None:
        token_ids = request.all_token_ids
        hit_blocks = self.allocator.cached_prefix([*token_ids, 0])  # every full block may hit
        num_cached = len(hit_blocks) * self.config.block_size
        if num_cached == len(token_ids):
            num_cached -= 1  # bug: should drop the whole last block
            hit_blocks = hit_blocks[:-1]
        num_tokens = min(len(token_ids) - num_cached, budget)
        if not self.allocator.can_admit(num_cached + num_tokens, hit_blocks):
            return None
        self.allocator.admit(request.request_id, hit_blocks)
        if not self.allocator.allocate_slots(request.request_id, num_cached + num_tokens):
            raise RuntimeError("allocator refused blocks that can_admit promised")
        request.admit(num_cached)
        self._admission[request.request_id] = (num_cached, len(token_ids))
        return num_tokens


class NeverChunksNewPrompts(Scheduler):
    """A waiting request is admitted only if all its uncached tokens fit the budget left."""

    def _try_admit(self, request: Request, budget: int) -> int | None:
        hit_blocks = self.allocator.cached_prefix(request.all_token_ids)
        remaining = request.num_tokens - len(hit_blocks) * self.config.block_size
        if remaining > budget:
            return None  # bug: long prompts wait forever once they exceed max_num_batched_tokens
        return super()._try_admit(request, budget)


class SkipsHeadOfQueue(Scheduler):
    """When the head of the waiting queue does not fit, admission tries the requests behind it."""

    def schedule(self) -> StepPlan:
        plan = super().schedule()
        if plan.preempted or not self.waiting:
            return plan
        budget = self.config.max_num_batched_tokens - plan.num_batched_tokens
        chunks, admitted = list(plan.chunks), list(plan.admitted)
        for request in list(self.waiting)[1:]:  # bug: the head of the queue must never be skipped
            if budget <= 0 or len(self.running) >= self.config.max_num_seqs:
                break
            num_tokens = self._try_admit(request, budget)
            if num_tokens is None:
                continue
            self.waiting.remove(request)
            self.running.append(request)
            admitted.append(request.request_id)
            chunks.append(self._chunk(request, num_tokens))
            budget -= num_tokens
        return StepPlan(chunks=tuple(chunks), preempted=plan.preempted, admitted=tuple(admitted))


class ReportsFinishedRequestsAgain(Scheduler):
    """update() collects finished requests in a list that is never cleared between steps."""

    def __init__(self, config: EngineConfig, eos_token_ids: Sequence[int] = ()) -> None:
        super().__init__(config, eos_token_ids)
        self._finished_so_far: list[Request] = []

    def update(self, plan: StepPlan, sampled: dict[str, int]) -> list[Request]:
        self._finished_so_far.extend(super().update(plan, sampled))
        return list(self._finished_so_far)  # bug: should return this step's finishes only
