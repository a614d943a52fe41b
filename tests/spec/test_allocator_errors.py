"""The allocators' guards: tokens committed out of order are refused with an error that says where the
token belongs, and a prefix hit ends at a hash collision (found missing by the mutation run, fuzz/mutation:
the fuzzers' real hash never collides)."""

from __future__ import annotations

import pytest

from fast.block_allocator import BlockAllocator as FastBlockAllocator
from reference.block_allocator import BlockAllocator
from spec.block_hash import NO_PARENT, hash_block


def test_a_token_committed_past_a_gap_is_refused_naming_its_offset() -> None:
    allocator = BlockAllocator(4, 4, True)
    allocator.admit("r", [])
    assert allocator.allocate_slots("r", 4)
    allocator.commit_tokens("r", [10, 11, 12, 13], 0, 2)
    with pytest.raises(RuntimeError, match=r"holds 2 tokens; token 3 belongs at offset 3"):
        allocator.commit_tokens("r", [10, 11, 12, 13], 3, 4)


@pytest.mark.parametrize("allocator_class", [BlockAllocator, FastBlockAllocator], ids=["reference", "fast"])
def test_a_hit_stops_at_a_colliding_block_even_where_a_later_block_matches(allocator_class: type) -> None:
    """Requests a = [1, 2] [3, 4] and c = [1, 2] [5, 6] are cached. The hash is rigged so that in a lookup of
    [1, 2] [7, 8] [5, 6], [7, 8] collides with a's [3, 4] and the next block's hash is c's [5, 6]: a block whose
    tokens and parent hash match the lookup's first block. The hit must stop at the collision ([1, 2] only):
    going on would serve c's K/V for positions it never held."""
    first = hash_block(NO_PARENT, [1, 2])
    colliding_parent = hash_block(first, [3, 4])

    def rigged(parent: int, token_ids) -> int:
        tokens = list(token_ids)
        if tokens == [7, 8]:
            return colliding_parent
        if parent == colliding_parent and tokens == [5, 6]:
            return hash_block(first, [5, 6])
        return hash_block(parent, tokens)

    allocator = allocator_class(8, 2, True, rigged)
    for request_id, tokens in (("a", [1, 2, 3, 4, 9]), ("c", [1, 2, 5, 6, 9])):
        hit = allocator.cached_prefix(tokens)
        allocator.admit(request_id, hit)
        assert allocator.allocate_slots(request_id, len(tokens))
        allocator.commit_tokens(request_id, tokens, 2 * len(hit), len(tokens))
    first_block = allocator.cached_prefix([1, 2, 0])
    assert len(first_block) == 1 and len(allocator.cached_prefix([1, 2, 5, 6, 0])) == 2
    assert allocator.cached_prefix([1, 2, 7, 8, 5, 6, 0]) == first_block


@pytest.mark.parametrize("allocator_class", [BlockAllocator, FastBlockAllocator], ids=["reference", "fast"])
def test_a_rollback_refuses_a_registered_block_held_once(allocator_class: type) -> None:
    """Speculative decoding rolls back only the blocks of rejected draft positions, which no request shares
    and the prefix cache never registered. A registered block held by one request is refused too (found
    missing by the mutation run: the guard with `and` for `or` let it through, its K/V left cached for a
    position rolled back); an unregistered one is rolled back."""
    allocator = allocator_class(8, 2, True)
    allocator.admit("r", [])
    assert allocator.allocate_slots("r", 5)
    allocator.commit_tokens("r", [1, 2, 3], 0, 3)  # the first block is full: registered, held once
    allocator.truncate("r", 3)  # the third block: unregistered, held once
    assert len(allocator.block_table("r")) == 2
    with pytest.raises(RuntimeError, match="rolled back from 'r' is shared or registered"):
        allocator.truncate("r", 0)
