"""KV block allocator with prefix caching, on constant-time structures.

The policy and every decision (which blocks, in which order, which hits) are those of the
reference allocator and spec.scheduling; only the structures differ:

- the free queue is a doubly linked list threaded through arrays indexed by block id, so taking
  a cached block back from the middle of the queue (a prefix hit on a block no one holds),
  appending a freed block and taking the least recently freed one are all O(1);
- a request's chained block hashes live in a `BlockHashChain` that hashes each full block once
  and is extended as the sequence grows; the scheduler keeps one per request from the moment it
  is added, so a request waiting at the head of the queue is not re-hashed each step it waits,
  and its hashes survive preemption;
- a block's token ids are stored once, when it is registered in the prefix cache (they are what
  a hit compares, to rule out hash collisions), instead of token by token;
- the spec's state view (`snapshot`) is built only when asked for;
- a request's block table is an int32 `array` (BLOCK_TABLE_TYPECODE), not a list: the input batch
  copies every decoding request's whole table each step, and from raw int32 memory that is one
  join instead of converting each Python int (at 256 requests ~0.3 ms of host time a step).
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Iterator, Sequence

from spec.block_hash import NO_PARENT, HashFunction, hash_block
from spec.invariants import AllocatorSnapshot, BlockState
from spec.scheduling import max_prefix_hit_blocks

BLOCK_TABLE_TYPECODE = "i"  # C int: 32 bits wherever torch runs (checked where the tables are copied as int32)


class BlockHashChain:
    """Chained hashes of the leading full blocks of one token sequence, each computed once.

    The sequence may only grow (a request's tokens are its prompt then its outputs), so hashes
    computed earlier stay valid and the chain is extended from its last hash.
    """

    __slots__ = ("block_size", "hash_function", "hashes")

    def __init__(self, block_size: int, hash_function: HashFunction = hash_block, hashes: Sequence[int] = ()) -> None:
        self.block_size = block_size
        self.hash_function = hash_function
        self.hashes: list[int] = list(hashes)

    def extend(self, token_ids: Sequence[int], num_blocks: int) -> None:
        """Hash blocks up to `num_blocks` of `token_ids` (which must hold that many full blocks)."""
        hashes, size = self.hashes, self.block_size
        parent = hashes[-1] if hashes else NO_PARENT
        for index in range(len(hashes), num_blocks):
            parent = self.hash_function(parent, token_ids[index * size : (index + 1) * size])
            hashes.append(parent)


class FreeBlockQueue:
    """Free block ids, least recently freed first, as a doubly linked list over arrays.

    Index `num_blocks` is a sentinel: its successor is the head, its predecessor the tail.
    """

    def __init__(self, num_blocks: int) -> None:
        self._sentinel = num_blocks
        order = [*range(num_blocks), num_blocks]  # every block free, in id order, closed by the sentinel
        self._next = [0] * (num_blocks + 1)
        self._prev = [0] * (num_blocks + 1)
        for position, node in enumerate(order):
            self._next[node] = order[(position + 1) % len(order)]
            self._prev[node] = order[position - 1]
        self._is_free = [True] * num_blocks
        self._length = num_blocks

    def __len__(self) -> int:
        return self._length

    def __contains__(self, block_id: int) -> bool:
        return self._is_free[block_id]

    def __iter__(self) -> Iterator[int]:
        # Bounded walk: links broken by a bug must raise, not loop forever (snapshots iterate this).
        node = self._next[self._sentinel]
        for _ in range(self._sentinel + 1):
            if node == self._sentinel:
                return
            yield node
            node = self._next[node]
        raise RuntimeError(
            f"the free queue's links are corrupt: no way back to its start within {self._sentinel} blocks"
        )

    def append(self, block_id: int) -> None:
        if self._is_free[block_id]:
            raise RuntimeError(f"block {block_id} is already in the free queue")
        tail = self._prev[self._sentinel]
        self._next[tail] = block_id
        self._prev[block_id] = tail
        self._next[block_id] = self._sentinel
        self._prev[self._sentinel] = block_id
        self._is_free[block_id] = True
        self._length += 1

    def prepend(self, block_id: int) -> None:
        """Put a block at the head of the queue: the next one taken."""
        if self._is_free[block_id]:
            raise RuntimeError(f"block {block_id} is already in the free queue")
        head = self._next[self._sentinel]
        self._prev[head] = block_id
        self._next[block_id] = head
        self._prev[block_id] = self._sentinel
        self._next[self._sentinel] = block_id
        self._is_free[block_id] = True
        self._length += 1

    def pop_head(self) -> int:
        """The least recently freed block, taken out of the queue (the caller checked it is not empty)."""
        head = self._next[self._sentinel]
        self.remove(head)
        return head

    def remove(self, block_id: int) -> None:
        if not self._is_free[block_id]:
            raise RuntimeError(f"block {block_id} is not in the free queue")
        before, after = self._prev[block_id], self._next[block_id]
        self._next[before] = after
        self._prev[after] = before
        self._is_free[block_id] = False
        self._length -= 1


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
        self._free = FreeBlockQueue(num_blocks)
        self._ref_counts = [0] * num_blocks
        # Set only while a block is registered in the prefix cache: its hash, the hash of the block
        # before it (NO_PARENT for a first block) and the token ids its K/V was computed from.
        self._block_hashes: list[int | None] = [None] * num_blocks
        self._parent_hashes: list[int | None] = [None] * num_blocks
        self._block_tokens: list[tuple[int, ...] | None] = [None] * num_blocks
        self._cached: dict[int, int] = {}  # block hash -> block id
        self._tables: dict[str, array[int]] = {}
        self._chains: dict[str, BlockHashChain] = {}
        # Leading blocks of each request already considered for the prefix cache (registered, or
        # found equal to a cached block): the admission hit, then grown by commit_tokens.
        self._blocks_considered: dict[str, int] = {}

    # -- queries -----------------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    def block_table(self, request_id: str) -> array[int]:
        """The request's block ids in order (the allocator's own table: read it, do not change it)."""
        table = self._tables.get(request_id)
        return table if table is not None else array(BLOCK_TABLE_TYPECODE)

    def block_tables(self, request_ids: Iterable[str]) -> list[array[int]]:
        """`block_table` of each request, which must hold blocks (one call a step instead of one a request)."""
        tables = self._tables
        return [tables[request_id] for request_id in request_ids]

    def cached_prefix(
        self, token_ids: Sequence[int], max_blocks: int | None = None, chain: BlockHashChain | None = None
    ) -> list[int]:
        """Block ids of the longest cached run of leading full blocks, at most `max_blocks` of them
        (default: `max_prefix_hit_blocks`). `chain`, the sequence's hash chain, is extended only as
        far as the lookup reaches; without one the hashes are computed for this call alone."""
        if not self.enable_prefix_caching:
            return []
        size = self.block_size
        limit = max_prefix_hit_blocks(len(token_ids), size) if max_blocks is None else max_blocks
        chain = chain if chain is not None else BlockHashChain(size, self.hash_function)
        hashes = chain.hashes
        hits: list[int] = []
        parent = NO_PARENT
        for index in range(limit):
            if index == len(hashes):
                chain.extend(token_ids, index + 1)
            block_hash = hashes[index]
            block_id = self._cached.get(block_hash)
            if block_id is None:
                break
            if self._parent_hashes[block_id] != parent or self._block_tokens[block_id] != tuple(
                token_ids[index * size : (index + 1) * size]
            ):
                break  # a hash collision: the cached block holds another prefix's K/V
            hits.append(block_id)
            parent = block_hash
        return hits

    def can_admit(self, num_tokens: int, cached_block_ids: Sequence[int]) -> bool:
        """Whether the pool can cover `num_tokens` tokens for a new request whose first blocks are the hit."""
        reclaimed_from_free = sum(1 for block_id in cached_block_ids if self._ref_counts[block_id] == 0)
        new_blocks = self._blocks_for(num_tokens) - len(cached_block_ids)
        return new_blocks <= len(self._free) - reclaimed_from_free

    # -- changes -----------------------------------------------------------------------------

    def admit(self, request_id: str, cached_block_ids: Sequence[int], chain: BlockHashChain | None = None) -> None:
        """Start a block table for a request, holding the prefix-cache hit blocks. `chain` is the
        request's hash chain (the scheduler's, shared so no block is hashed twice); without one the
        allocator starts its own from the hit blocks' hashes."""
        if request_id in self._tables:
            raise KeyError(f"request {request_id!r} already holds blocks")
        for block_id in cached_block_ids:
            self._hold(block_id)
        self._tables[request_id] = array(BLOCK_TABLE_TYPECODE, cached_block_ids)
        if chain is None:
            chain = BlockHashChain(
                self.block_size, self.hash_function, [self._block_hashes[b] for b in cached_block_ids]
            )  # type: ignore[misc]
        self._chains[request_id] = chain
        self._blocks_considered[request_id] = len(cached_block_ids)

    def allocate_slots(self, request_id: str, num_tokens: int) -> bool:
        """Grow the request's table to cover `num_tokens` tokens; False (and no change) if the pool is short."""
        table = self._tables[request_id]
        missing = self._blocks_for(num_tokens) - len(table)
        if missing <= 0:
            return True  # most steps: the last block has room for the new token
        if missing > len(self._free):
            return False
        for _ in range(missing):
            table.append(self._take_free_block())
        return True

    def commit_tokens(self, request_id: str, token_ids: Sequence[int], old_computed: int, new_computed: int) -> None:
        """Tokens [old_computed, new_computed) of `token_ids` now have K/V in the request's blocks:
        register the blocks that became full in the prefix cache (unless an equal block already is)."""
        if not self.enable_prefix_caching:
            return
        full_blocks = new_computed // self.block_size
        considered = self._blocks_considered[request_id]
        if full_blocks <= considered:
            return
        chain = self._chains[request_id]
        chain.extend(token_ids, full_blocks)
        table, hashes, size = self._tables[request_id], chain.hashes, self.block_size
        for index in range(considered, full_blocks):
            block_hash = hashes[index]
            if block_hash in self._cached:
                continue
            block_id = table[index]
            self._cached[block_hash] = block_id
            self._block_hashes[block_id] = block_hash
            self._parent_hashes[block_id] = hashes[index - 1] if index else NO_PARENT
            self._block_tokens[block_id] = tuple(token_ids[index * size : (index + 1) * size])
        self._blocks_considered[request_id] = full_blocks

    def free(self, request_id: str) -> None:
        """Release a request's blocks, last block first, so a prefix's head outlives its tail."""
        table = self._tables.pop(request_id)
        del self._chains[request_id]
        del self._blocks_considered[request_id]
        ref_counts = self._ref_counts
        for block_id in reversed(table):
            ref_counts[block_id] -= 1
            if ref_counts[block_id] == 0:
                self._free.append(block_id)  # a registered block keeps its cache entry while free

    def truncate(self, request_id: str, num_tokens: int) -> None:
        """Roll a request's table back to the blocks its first `num_tokens` tokens need (speculative
        decoding: the blocks of rejected draft positions). The freed blocks go to the head of the free
        queue, first block first: they hold no registered token, so reusing them first evicts nothing."""
        table = self._tables[request_id]
        keep = self._blocks_for(num_tokens)
        removed = table[keep:]
        del table[keep:]  # in place: the scheduler reads this same table
        for block_id in reversed(removed):
            if self._ref_counts[block_id] != 1 or self._block_hashes[block_id] is not None:
                raise RuntimeError(f"block {block_id} rolled back from {request_id!r} is shared or registered")
            self._ref_counts[block_id] = 0
            self._free.prepend(block_id)

    # -- internals ---------------------------------------------------------------------------

    def _blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def _hold(self, block_id: int) -> None:
        if self._ref_counts[block_id] == 0:
            self._free.remove(block_id)
        self._ref_counts[block_id] += 1

    def _take_free_block(self) -> int:
        block_id = self._free.pop_head()
        block_hash = self._block_hashes[block_id]
        if block_hash is not None:  # evict: the block is about to hold other tokens
            del self._cached[block_hash]
            self._block_hashes[block_id] = None
            self._parent_hashes[block_id] = None
            self._block_tokens[block_id] = None
        self._ref_counts[block_id] = 1
        return block_id

    def snapshot(self) -> AllocatorSnapshot:
        return AllocatorSnapshot(
            num_blocks=self.num_blocks,
            block_size=self.block_size,
            free_block_ids=tuple(self._free),
            blocks=tuple(
                BlockState(
                    block_id=block_id,
                    ref_count=self._ref_counts[block_id],
                    block_hash=self._block_hashes[block_id],
                    parent_hash=self._parent_hashes[block_id],
                    token_ids=self._block_tokens[block_id],
                )
                for block_id in range(self.num_blocks)
            ),
            cached_blocks=dict(self._cached),
            block_tables={request_id: tuple(table) for request_id, table in self._tables.items()},
            hash_function=self.hash_function,
        )
