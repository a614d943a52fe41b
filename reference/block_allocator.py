"""KV block allocator with prefix caching (reference implementation).

Blocks are shared by reference count. A block whose K/V is complete (full) is hashed with the
chained content hash of spec.block_hash and entered in the prefix cache; when its last holder
lets go it joins the free queue but keeps its hash, so a later request with the same prefix
reuses it. The free queue is least-recently-freed first: allocation takes its head and evicts
that block's cache entry if it has one. A prefix hit reuses a cached block only if the token
ids it holds and the hash of the block before it are the request's: a hash collision ends the hit.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

from spec.block_hash import NO_PARENT, HashFunction, hash_block
from spec.invariants import AllocatorSnapshot, BlockState
from spec.scheduling import max_prefix_hit_blocks


@dataclass
class _Block:
    block_id: int
    ref_count: int = 0
    block_hash: int | None = None
    parent_hash: int | None = None
    token_ids: list[int] = field(default_factory=list)  # tokens whose K/V this block holds

    def reset(self) -> None:
        self.block_hash = None
        self.parent_hash = None
        self.token_ids = []


class BlockAllocator:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_prefix_caching: bool = True,
        hash_function: HashFunction = hash_block,
    ) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.hash_function = hash_function
        self._blocks = [_Block(block_id) for block_id in range(num_blocks)]
        self._free: OrderedDict[int, None] = OrderedDict((block_id, None) for block_id in range(num_blocks))
        self._cached: dict[int, int] = {}  # block hash -> block id
        self._tables: dict[str, list[int]] = {}
        self._chain_hashes: dict[str, list[int]] = {}  # request id -> hashes of its full blocks

    # -- queries -----------------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    def block_table(self, request_id: str) -> list[int]:
        return self._tables.get(request_id, [])

    def cached_prefix(self, token_ids: Sequence[int], max_blocks: int | None = None) -> list[int]:
        """Block ids of the longest cached run of leading full blocks, at most `max_blocks` of them
        (default: `max_prefix_hit_blocks`, which leaves at least one token to compute)."""
        if not self.enable_prefix_caching:
            return []
        limit = max_prefix_hit_blocks(len(token_ids), self.block_size) if max_blocks is None else max_blocks
        hits: list[int] = []
        parent = NO_PARENT
        for index in range(limit):
            block_tokens = list(token_ids[index * self.block_size : (index + 1) * self.block_size])
            block_hash = self.hash_function(parent, block_tokens)
            block_id = self._cached.get(block_hash)
            if block_id is None:
                break
            block = self._blocks[block_id]
            if block.token_ids != block_tokens or block.parent_hash != parent:
                break  # a hash collision: the cached block holds another prefix's K/V
            hits.append(block_id)
            parent = block_hash
        return hits

    def can_admit(self, num_tokens: int, cached_block_ids: Sequence[int]) -> bool:
        """Whether the pool can cover `num_tokens` tokens for a new request whose first blocks are the hit."""
        reclaimed_from_free = sum(1 for block_id in cached_block_ids if self._blocks[block_id].ref_count == 0)
        new_blocks = self._blocks_for(num_tokens) - len(cached_block_ids)
        return new_blocks <= self.num_free_blocks - reclaimed_from_free

    # -- changes -----------------------------------------------------------------------------

    def admit(self, request_id: str, cached_block_ids: Sequence[int]) -> None:
        """Start a block table for a request, holding the prefix-cache hit blocks."""
        if request_id in self._tables:
            raise KeyError(f"request {request_id!r} already holds blocks")
        for block_id in cached_block_ids:
            self._hold(block_id)
        self._tables[request_id] = list(cached_block_ids)
        self._chain_hashes[request_id] = [self._blocks[b].block_hash for b in cached_block_ids]  # type: ignore[misc]

    def allocate_slots(self, request_id: str, num_tokens: int) -> bool:
        """Grow the request's table to cover `num_tokens` tokens; False (and no change) if the pool is short."""
        table = self._tables[request_id]
        missing = self._blocks_for(num_tokens) - len(table)
        if missing > self.num_free_blocks:
            return False
        for _ in range(missing):
            table.append(self._take_free_block())
        return True

    def commit_tokens(self, request_id: str, token_ids: Sequence[int], old_computed: int, new_computed: int) -> None:
        """Record that tokens [old_computed, new_computed) now have K/V in the request's blocks,
        and register the blocks that became full in the prefix cache."""
        table = self._tables[request_id]
        for position in range(old_computed, new_computed):
            block = self._blocks[table[position // self.block_size]]
            if len(block.token_ids) != position % self.block_size:
                raise RuntimeError(
                    f"block {block.block_id} of request {request_id!r} holds {len(block.token_ids)} tokens; "
                    f"token {position} belongs at offset {position % self.block_size}"
                )
            block.token_ids.append(token_ids[position])
        chain = self._chain_hashes[request_id]
        for index in range(len(chain), new_computed // self.block_size):
            block = self._blocks[table[index]]
            parent = chain[-1] if chain else NO_PARENT
            block_hash = self.hash_function(parent, block.token_ids)
            chain.append(block_hash)
            if self.enable_prefix_caching and block_hash not in self._cached:
                block.block_hash = block_hash
                block.parent_hash = parent
                self._cached[block_hash] = block.block_id

    def free(self, request_id: str) -> None:
        """Release a request's blocks, last block first, so a prefix's head outlives its tail."""
        table = self._tables.pop(request_id)
        self._chain_hashes.pop(request_id)
        for block_id in reversed(table):
            block = self._blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                if block.block_hash is None:
                    block.reset()
                self._free[block_id] = None

    def truncate(self, request_id: str, num_tokens: int) -> None:
        """Roll a request's table back to the blocks its first `num_tokens` tokens need (speculative
        decoding: the blocks of rejected draft positions). The freed blocks go to the head of the free
        queue, first block first: they hold no registered token, so reusing them first evicts nothing."""
        table = self._tables[request_id]
        keep = self._blocks_for(num_tokens)
        removed = table[keep:]
        del table[keep:]
        for block_id in reversed(removed):
            block = self._blocks[block_id]
            if block.ref_count != 1 or block.block_hash is not None:
                raise RuntimeError(f"block {block_id} rolled back from {request_id!r} is shared or registered")
            block.ref_count = 0
            block.reset()
            self._free[block_id] = None
            self._free.move_to_end(block_id, last=False)

    # -- internals ---------------------------------------------------------------------------

    def _blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def _hold(self, block_id: int) -> None:
        block = self._blocks[block_id]
        if block.ref_count == 0:
            del self._free[block_id]
        block.ref_count += 1

    def _take_free_block(self) -> int:
        block_id, _ = self._free.popitem(last=False)
        block = self._blocks[block_id]
        if block.block_hash is not None:
            del self._cached[block.block_hash]  # evict
        block.reset()
        block.ref_count = 1
        return block_id

    def snapshot(self) -> AllocatorSnapshot:
        return AllocatorSnapshot(
            num_blocks=self.num_blocks,
            block_size=self.block_size,
            free_block_ids=tuple(self._free),
            blocks=tuple(
                BlockState(
                    block_id=b.block_id,
                    ref_count=b.ref_count,
                    block_hash=b.block_hash,
                    parent_hash=b.parent_hash,
                    token_ids=tuple(b.token_ids) if b.block_hash is not None else None,
                )
                for b in self._blocks
            ),
            cached_blocks=dict(self._cached),
            block_tables={request_id: tuple(table) for request_id, table in self._tables.items()},
            hash_function=self.hash_function,
        )
