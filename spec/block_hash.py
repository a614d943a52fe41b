"""Chained content hash of full KV blocks, shared by both engines' prefix caches.

Block i's hash covers its own token ids and, through the previous block's hash, every token
before it: two blocks hash alike only if the whole prefix up to and including them matches
(barring a collision, which is why a prefix-cache hit also compares the cached block's stored
token ids with the request's before reusing it; see spec.scheduling).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import xxhash

NO_PARENT = 0  # the "previous hash" of a sequence's first block

# (parent hash, the block's token ids) -> the block's hash. Allocators take one as a constructor
# argument (default `hash_block`) so that tests can force collisions.
HashFunction = Callable[[int, Sequence[int]], int]


def hash_block(parent_hash: int, token_ids: Sequence[int]) -> int:
    """xxh64 (seed 0) over the parent hash (8 bytes, little endian) then the token ids as little-endian int64."""
    digest = xxhash.xxh64()
    digest.update(parent_hash.to_bytes(8, "little", signed=False))
    digest.update(np.asarray(token_ids, dtype="<i8").tobytes())
    return digest.intdigest()


def hash_full_blocks(
    token_ids: Sequence[int], block_size: int, num_blocks: int | None = None, hash_function: HashFunction = hash_block
) -> list[int]:
    """Chained hashes of the first `num_blocks` full blocks of `token_ids` (default: all full ones)."""
    full = len(token_ids) // block_size
    count = full if num_blocks is None else min(num_blocks, full)
    hashes: list[int] = []
    parent = NO_PARENT
    for index in range(count):
        parent = hash_function(parent, token_ids[index * block_size : (index + 1) * block_size])
        hashes.append(parent)
    return hashes
