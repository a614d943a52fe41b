"""Realistic bugs planted in subclasses of the fast allocator and scheduler.

They are slips in what the fast implementations add over the reference ones (the linked free
queue, the incremental hash chains, the running dict, the per-request registration count);
the planted-bug tests check that the state machines find each one and name the right check.
"""

from __future__ import annotations

from collections.abc import Sequence

from fast.block_allocator import BlockAllocator, BlockHashChain, FreeBlockQueue
from fast.scheduler import RequestTokens, Scheduler, _Tracked
from spec.block_hash import NO_PARENT, HashFunction, hash_block
from spec.engine_config import EngineConfig
from spec.request import Request

# -- free queue ------------------------------------------------------------------------------


class UnlinkLeavesBackLink(FreeBlockQueue):
    """Removing a block mends its predecessor's forward link but not its successor's back link."""

    def remove(self, block_id: int) -> None:
        if not self._is_free[block_id]:
            raise RuntimeError(f"block {block_id} is not in the free queue")
        before, after = self._prev[block_id], self._next[block_id]
        self._next[before] = after  # bug: self._prev[after] = before is missing
        self._is_free[block_id] = False
        self._length -= 1


class PopsTheTail(FreeBlockQueue):
    """Allocation takes the most recently freed block instead of the least recently freed one."""

    def pop_head(self) -> int:
        tail = self._prev[self._sentinel]  # bug: the head is self._next[self._sentinel]
        self.remove(tail)
        return tail


def allocator_with_queue(queue_class: type[FreeBlockQueue]) -> type[BlockAllocator]:
    class AllocatorWithQueue(BlockAllocator):
        def __init__(
            self,
            num_blocks: int,
            block_size: int,
            enable_prefix_caching: bool = True,
            hash_function: HashFunction = hash_block,
        ) -> None:
            super().__init__(num_blocks, block_size, enable_prefix_caching, hash_function)
            self._free = queue_class(num_blocks)

    AllocatorWithQueue.__name__ = f"FastAllocatorWith{queue_class.__name__}"
    return AllocatorWithQueue


# -- allocator -------------------------------------------------------------------------------


class KeepsCacheEntryOnReuse(BlockAllocator):
    """Reallocating a free cached block forgets to evict it: the cache still serves the old tokens."""

    def _take_free_block(self) -> int:
        block_id = self._free.pop_head()
        self._ref_counts[block_id] = 1  # bug: the block's hash, tokens and cache entry stay
        return block_id


class KeepsRegistrationCountAcrossFree(BlockAllocator):
    """The count of blocks already considered for the cache survives a free (preemption), so a
    readmitted request with a shorter hit never registers the blocks in between."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True) -> None:
        super().__init__(num_blocks, block_size, enable_prefix_caching)
        self._counts_at_free: dict[str, int] = {}

    def admit(self, request_id: str, cached_block_ids: Sequence[int], chain: BlockHashChain | None = None) -> None:
        super().admit(request_id, cached_block_ids, chain)
        kept = self._counts_at_free.get(request_id, 0)
        self._blocks_considered[request_id] = max(kept, len(cached_block_ids))  # bug: should restart at the hit

    def free(self, request_id: str) -> None:
        self._counts_at_free[request_id] = self._blocks_considered[request_id]
        super().free(request_id)


class ChainExtendedFromScratch(BlockHashChain):
    """Extending a hash chain restarts from NO_PARENT instead of the chain's last hash."""

    def extend(self, token_ids: Sequence[int], num_blocks: int) -> None:
        hashes, size = self.hashes, self.block_size
        parent = NO_PARENT  # bug: should be hashes[-1] when the chain is not empty
        for index in range(len(hashes), num_blocks):
            parent = self.hash_function(parent, token_ids[index * size : (index + 1) * size])
            hashes.append(parent)


def fast_scheduler_over(allocator_class: type[BlockAllocator]) -> type[Scheduler]:
    """The fast scheduler, over a (buggy) fast allocator."""

    class FastSchedulerOverAllocator(Scheduler):
        def __init__(self, config: EngineConfig, eos_token_ids: Sequence[int] = ()) -> None:
            super().__init__(config, eos_token_ids)
            self.allocator = allocator_class(config.num_blocks, config.block_size, config.enable_prefix_caching)

    FastSchedulerOverAllocator.__name__ = f"FastSchedulerOver{allocator_class.__name__}"
    return FastSchedulerOverAllocator


# -- scheduler -------------------------------------------------------------------------------


class ChainsRestartWhenExtended(Scheduler):
    """The scheduler's per-request hash chains have the restart bug above."""

    def add(self, request: Request) -> None:
        chain = ChainExtendedFromScratch(self.config.block_size, self.allocator.hash_function)
        self._tracked[request.request_id] = _Tracked(request, RequestTokens(request), chain)
        self.waiting.append(request)


class PreemptsTheOldest(Scheduler):
    """Preemption pops the running dict from the wrong end: the oldest request is the victim."""

    def _grow_or_preempt(self, request: Request, num_tokens: int, preempted: list[str]) -> bool:
        while not self.allocator.allocate_slots(request.request_id, num_tokens):
            victim = self._running.pop(next(iter(self._running)))  # bug: popitem() takes the newest
            self.allocator.free(victim.request_id)
            victim.preempt()
            self._admission.pop(victim.request_id, None)
            self.waiting.appendleft(victim)
            preempted.append(victim.request_id)
            if victim is request:
                return False
        return True
