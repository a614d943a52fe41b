"""The chained block hash of spec.block_hash: known answers, and the chain through the prefix.

The expected values were computed independently of spec.block_hash, with xxhash directly over
bytes packed by `struct`:
    xxhash.xxh64_intdigest(struct.pack("<Q", parent) + struct.pack(f"<{n}q", *token_ids))
"""

from __future__ import annotations

import struct

import xxhash

from spec.block_hash import NO_PARENT, hash_block, hash_full_blocks

FIRST_BLOCK = (1, 2, 3, 4)
SECOND_BLOCK = (5, 6, 7, 8)
HASH_OF_FIRST = 14376776624401366104  # hash_block(NO_PARENT, 1 2 3 4)
HASH_OF_SECOND_AFTER_FIRST = 6459216038710544038  # hash_block(HASH_OF_FIRST, 5 6 7 8)
HASH_OF_SECOND_ALONE = 17604407886773768188  # hash_block(NO_PARENT, 5 6 7 8)
HASH_OF_WIDE_IDS = 12169854685594692212  # hash_block(NO_PARENT, 151643 2**40 7 0): ids need all 64 bits


def test_known_answers() -> None:
    assert NO_PARENT == 0
    assert hash_block(NO_PARENT, FIRST_BLOCK) == HASH_OF_FIRST
    assert hash_block(HASH_OF_FIRST, SECOND_BLOCK) == HASH_OF_SECOND_AFTER_FIRST
    assert hash_block(NO_PARENT, SECOND_BLOCK) == HASH_OF_SECOND_ALONE
    assert hash_block(NO_PARENT, [151643, 2**40, 7, 0]) == HASH_OF_WIDE_IDS


def test_known_answers_match_the_byte_layout_the_docstring_states() -> None:
    """The literals above, recomputed here from the stated layout (a guard against a typo in them)."""
    packed = struct.pack("<Q", HASH_OF_FIRST) + struct.pack("<4q", *SECOND_BLOCK)
    assert xxhash.xxh64_intdigest(packed) == HASH_OF_SECOND_AFTER_FIRST


def test_token_id_container_does_not_matter() -> None:
    assert hash_block(NO_PARENT, list(FIRST_BLOCK)) == hash_block(NO_PARENT, tuple(FIRST_BLOCK)) == HASH_OF_FIRST


def test_full_blocks_are_chained_and_partial_blocks_ignored() -> None:
    tokens = [*FIRST_BLOCK, *SECOND_BLOCK, 9, 10]  # two full blocks of 4, then a partial one
    assert hash_full_blocks(tokens, 4) == [HASH_OF_FIRST, HASH_OF_SECOND_AFTER_FIRST]
    assert hash_full_blocks(tokens, 4, num_blocks=1) == [HASH_OF_FIRST]
    assert hash_full_blocks(tokens[:3], 4) == []


def test_equal_blocks_under_different_prefixes_hash_differently() -> None:
    after_first = hash_full_blocks([*FIRST_BLOCK, *SECOND_BLOCK], 4)[1]
    after_other = hash_full_blocks([9, 9, 9, 9, *SECOND_BLOCK], 4)[1]
    at_start = hash_full_blocks(list(SECOND_BLOCK), 4)[0]
    assert len({after_first, after_other, at_start}) == 3
    # The same block after the same prefix hashes alike, whatever follows it.
    assert hash_full_blocks([*FIRST_BLOCK, *SECOND_BLOCK, 1], 4)[1] == after_first


def test_order_within_a_block_matters() -> None:
    assert hash_block(NO_PARENT, (1, 2, 3, 4)) != hash_block(NO_PARENT, (2, 1, 3, 4))


def test_an_injected_hash_function_is_chained_the_same_way() -> None:
    calls: list[tuple[int, tuple[int, ...]]] = []

    def recording(parent: int, token_ids) -> int:
        calls.append((parent, tuple(token_ids)))
        return len(calls) * 100

    assert hash_full_blocks([1, 2, 3, 4, 5], 2, hash_function=recording) == [100, 200]
    assert calls == [(NO_PARENT, (1, 2)), (100, (3, 4))]
