"""A plain-Python model of the KV block pool, written from the spec, not from reference/.

The fuzzers compare every allocator with it, and the scheduler oracle plans with it. It is
deliberately naive: lists and dicts, linear scans, hashes recomputed from scratch. What it
encodes (spec.scheduling and the reference allocator's contract):

- a block is free exactly when no request holds it; free blocks wait in a queue, least
  recently freed first, and allocation takes the head of that queue;
- a request frees its blocks last to first, so a prefix's head outlives its tail;
- a full, computed block is registered in the prefix cache under its chained hash unless an
  equal block already is; it keeps that entry while free and loses it when reallocated;
- a prefix hit is the longest run of leading full blocks found in the cache whose stored
  tokens are the request's, limited so that at least one token is left to compute.

Block ids are the implementation's: the model starts from the implementation's initial free
queue, so it predicts exact block ids without assuming any numbering convention.

Hashes are spec.block_hash.hash_block's, through a memo (fuzz/shared_checks.py): the model still hashes
every prefix from scratch; the memo only spares recomputing a pure function's value for arguments seen.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from fuzz.shared_checks import memoized_hash_block
from spec.block_hash import hash_full_blocks


@dataclass
class CachedContent:
    """What a block registered in the prefix cache holds."""

    block_hash: int
    token_ids: tuple[int, ...]


@dataclass
class PoolModel:
    block_size: int
    free_queue: list[int]  # least recently freed first: the head is reused first
    enable_prefix_caching: bool = True
    ref_counts: dict[int, int] = field(default_factory=dict)
    cached: dict[int, int] = field(default_factory=dict)  # block hash -> block id
    content: dict[int, CachedContent] = field(default_factory=dict)  # block id -> its cache entry
    tables: dict[str, list[int]] = field(default_factory=dict)
    hashed_blocks: dict[str, int] = field(default_factory=dict)  # request -> leading blocks already considered
    evictions: int = 0  # cached blocks reallocated: proof the fuzzers reach eviction

    @classmethod
    def from_free_queue(
        cls, block_size: int, free_queue: Sequence[int], enable_prefix_caching: bool = True
    ) -> PoolModel:
        return cls(
            block_size=block_size,
            free_queue=list(free_queue),
            enable_prefix_caching=enable_prefix_caching,
            ref_counts={block_id: 0 for block_id in free_queue},
        )

    # -- queries -----------------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_queue)

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def cached_prefix(self, token_ids: Sequence[int]) -> list[int]:
        if not self.enable_prefix_caching:
            return []
        # In the model's own words, not spec.scheduling.max_prefix_hit_blocks: both schedulers call that
        # function, so a slip in it would pass every twin check (the mutation run showed one surviving).
        limit = (len(token_ids) - 1) // self.block_size  # at least one token left to compute
        hits: list[int] = []
        for index, block_hash in enumerate(hash_full_blocks(token_ids, self.block_size, limit, memoized_hash_block)):
            block_id = self.cached.get(block_hash)
            block_tokens = tuple(token_ids[index * self.block_size : (index + 1) * self.block_size])
            if block_id is None or self.content[block_id].token_ids != block_tokens:
                break  # not cached, or cached under a colliding hash
            hits.append(block_id)
        return hits

    def can_admit(self, num_tokens: int, hit: Sequence[int]) -> bool:
        """Whether the free blocks, less the free hit blocks admission takes out of the queue,
        cover the blocks `num_tokens` tokens need beyond the hit."""
        free_hits = [block_id for block_id in hit if self.ref_counts[block_id] == 0]
        return self.blocks_for(num_tokens) - len(hit) <= self.num_free_blocks - len(free_hits)

    def can_grow(self, request_id: str, num_tokens: int) -> bool:
        return self.blocks_for(num_tokens) - len(self.tables[request_id]) <= self.num_free_blocks

    # -- changes -----------------------------------------------------------------------------

    def admit(self, request_id: str, hit: Sequence[int]) -> None:
        assert request_id not in self.tables, f"model: {request_id!r} admitted twice"
        for block_id in hit:
            if self.ref_counts[block_id] == 0:
                self.free_queue.remove(block_id)
            self.ref_counts[block_id] += 1
        self.tables[request_id] = list(hit)
        self.hashed_blocks[request_id] = len(hit)

    def grow(self, request_id: str, num_tokens: int) -> bool:
        """Extend the table to cover `num_tokens`; False, changing nothing, when the pool is short."""
        if not self.can_grow(request_id, num_tokens):
            return False
        table = self.tables[request_id]
        while len(table) < self.blocks_for(num_tokens):
            table.append(self._take_head_of_free_queue())
        return True

    def commit(self, request_id: str, token_ids: Sequence[int], num_computed: int) -> None:
        """Tokens [0, num_computed) of the request are computed: register its newly full blocks."""
        table = self.tables[request_id]
        full_blocks = num_computed // self.block_size
        chain = hash_full_blocks(token_ids, self.block_size, full_blocks, memoized_hash_block)
        for index in range(self.hashed_blocks[request_id], full_blocks):
            block_hash = chain[index]
            if self.enable_prefix_caching and block_hash not in self.cached:
                block_id = table[index]
                self.cached[block_hash] = block_id
                block_tokens = tuple(token_ids[index * self.block_size : (index + 1) * self.block_size])
                self.content[block_id] = CachedContent(block_hash, block_tokens)
        self.hashed_blocks[request_id] = max(self.hashed_blocks[request_id], full_blocks)

    def free(self, request_id: str) -> None:
        table = self.tables.pop(request_id)
        del self.hashed_blocks[request_id]
        for block_id in reversed(table):
            self.ref_counts[block_id] -= 1
            if self.ref_counts[block_id] == 0:
                self.free_queue.append(block_id)

    def truncate(self, request_id: str, num_tokens: int) -> None:
        """Speculative roll back: blocks past the first `num_tokens` tokens' go to the head of the free
        queue, first block first (they hold nothing registered)."""
        table = self.tables[request_id]
        keep = self.blocks_for(num_tokens)
        rolled_back = table[keep:]
        del table[keep:]
        for block_id in rolled_back:
            assert self.ref_counts[block_id] == 1 and block_id not in self.content, (
                "model: a rolled-back block is shared"
            )
            self.ref_counts[block_id] = 0
        self.free_queue[:0] = rolled_back

    def _take_head_of_free_queue(self) -> int:
        block_id = self.free_queue.pop(0)
        entry = self.content.pop(block_id, None)
        if entry is not None:
            del self.cached[entry.block_hash]
            self.evictions += 1
        self.ref_counts[block_id] = 1
        return block_id
