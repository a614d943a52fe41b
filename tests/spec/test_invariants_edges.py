"""The invariant checks at their edges, on states built by hand: each boundary state a correct engine can
reach is accepted, and each state just past it is refused with the invariant's name and a message naming
what is wrong (what an engine's author reads). Written from the surviving mutants of spec/invariants.py
(reports/results/mutation/local_2core_r.json); tests/spec/test_invariants.py breaks a real engine's state.
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from collections.abc import Sequence

import pytest

from spec import invariants as inv
from spec.block_hash import NO_PARENT, HashFunction, hash_block
from spec.engine_config import EngineConfig
from spec.errors import InvariantViolation
from spec.invariants import (
    AllocatorSnapshot,
    BlockState,
    InvariantMonitor,
    RequestState,
    SchedulerSnapshot,
    check_allocator,
    check_scheduler,
)
from spec.speculative import SpeculativeConfig

BLOCK = 4
NUM_BLOCKS = 8
CONFIG = EngineConfig(
    block_size=BLOCK, num_blocks=NUM_BLOCKS, max_num_seqs=4, max_num_batched_tokens=64, max_model_len=64
)
SPECULATIVE = dataclasses.replace(CONFIG, speculative=SpeculativeConfig("ngram", 3))
TOKENS = (1, 2, 3, 4, 5, 6)  # a block and a half


def pool(
    tables: dict[str, tuple[int, ...]] | None = None,
    hashed: dict[int, tuple[int, ...]] | None = None,
    hash_function: HashFunction = hash_block,
) -> AllocatorSnapshot:
    """A consistent pool: ref counts from the tables, the rest free in id order; `hashed` maps a block id to
    the content of a first block (no parent) registered in the prefix cache."""
    tables = tables or {}
    hashed = hashed or {}
    holders = Counter(block for table in tables.values() for block in table)
    blocks, cached = [], {}
    for block_id in range(NUM_BLOCKS):
        if block_id in hashed:
            content = hashed[block_id]
            block_hash = hash_function(NO_PARENT, content)
            blocks.append(BlockState(block_id, holders[block_id], block_hash, None, content))
            cached[block_hash] = block_id
        else:
            blocks.append(BlockState(block_id, holders[block_id]))
    free = tuple(block_id for block_id in range(NUM_BLOCKS) if holders[block_id] == 0)
    return AllocatorSnapshot(NUM_BLOCKS, BLOCK, free, tuple(blocks), cached, tables, hash_function)


def request(
    request_id: str = "a",
    tokens: Sequence[int] = TOKENS,
    computed: int = 4,
    scheduled: int = 0,
    drafts: int = 0,
    cached: int = 0,
) -> RequestState:
    return RequestState(request_id, tuple(tokens), computed, scheduled, cached, len(tokens), drafts)


def state(
    requests: Sequence[RequestState],
    allocator: AllocatorSnapshot,
    config: EngineConfig = CONFIG,
    waiting: tuple[str, ...] = (),
) -> SchedulerSnapshot:
    running = tuple(r.request_id for r in requests if r.request_id not in waiting)
    return SchedulerSnapshot(config, waiting, running, {r.request_id: r for r in requests}, allocator)


def violated(invariant: str, check, snapshot, match: str) -> None:
    with pytest.raises(InvariantViolation, match=match) as error:
        check(snapshot)
    assert error.value.invariant == invariant


def with_blocks(allocator: AllocatorSnapshot, **changed: BlockState) -> AllocatorSnapshot:
    blocks = list(allocator.blocks)
    for block in changed.values():
        blocks[block.block_id] = block
    return dataclasses.replace(allocator, blocks=tuple(blocks))


# -- a request's token counts ------------------------------------------------------------------------


def test_a_request_built_without_draft_fields_has_none_and_is_valid() -> None:
    """num_draft_tokens defaults to 0 (and draft_gate to None): a snapshot of an engine without speculation
    need not name them."""
    a = RequestState("a", TOKENS, 4, 2, 0, len(TOKENS))
    assert a.num_draft_tokens == 0 and a.draft_gate is None
    check_scheduler(state([a], pool({"a": (0, 1)})))


@pytest.mark.parametrize("drafts", [1, 2, 3])
def test_a_verify_chunk_of_the_last_token_and_up_to_k_drafts_is_valid(drafts: int) -> None:
    """A verify chunk: every token but the last computed, the last and `drafts` draft tokens scheduled; its
    blocks cover the drafts too (6 + drafts tokens)."""
    a = request(computed=5, scheduled=1 + drafts, drafts=drafts)
    table = tuple(range(-(-(6 + drafts) // BLOCK)))
    check_scheduler(state([a], pool({"a": table}), SPECULATIVE))


BROKEN_COUNTS = {
    # name: (request, its block table, config)
    "drafts-after-an-uncomputed-token": (request(computed=4, scheduled=2, drafts=1), (0, 1), SPECULATIVE),
    "drafts-without-the-last-token": (request(computed=5, scheduled=1, drafts=1), (0, 1), SPECULATIVE),
    "more-drafts-than-k": (request(computed=5, scheduled=5, drafts=4), (0, 1, 2), SPECULATIVE),
    "drafts-without-speculation": (request(computed=5, scheduled=2, drafts=1), (0, 1), CONFIG),
    "negative-drafts": (request(computed=5, scheduled=0, drafts=-1), (0, 1), SPECULATIVE),
    "computed-past-the-tokens": (request(computed=7), (0, 1), CONFIG),
    "negative-computed": (request(computed=-1, scheduled=1), (), CONFIG),
    "negative-scheduled": (request(computed=4, scheduled=-1), (0,), CONFIG),
}


@pytest.mark.parametrize("case", BROKEN_COUNTS)
def test_token_counts_just_past_a_bound_are_refused(case: str) -> None:
    """Each state differs from a valid one in one count (its block table fits what it covers, so only the
    counts are wrong): computed-within-tokens, naming the request and its counts."""
    a, table, config = BROKEN_COUNTS[case]
    snapshot = state([a], pool({"a": table}), config)
    violated(inv.COMPUTED_WITHIN_TOKENS, check_scheduler, snapshot, r"request 'a': -?\d+ computed \+ -?\d+ scheduled")


def test_a_chunked_prefill_is_checked_against_its_computed_blocks_only() -> None:
    """Between two steps of a chunked prefill (4 of 8 prompt tokens computed, nothing scheduled) the request
    holds one block: only that computed block is checked against the request's content, not the second full
    block of its prompt, which it holds no block for yet."""
    tokens = (1, 2, 3, 4, 5, 6, 7, 8)
    a = request(tokens=tokens, computed=4)
    check_scheduler(state([a], pool({"a": (0,)}, hashed={0: tokens[:4]})))


def test_computed_blocks_need_not_be_in_the_prefix_cache() -> None:
    """Without prefix caching no block is hashed: a request's computed full blocks carry no hash, and that is
    valid (only a hash of other tokens is wrong)."""
    a = request(tokens=(1, 2, 3, 4, 5, 6, 7, 8, 9), computed=8, scheduled=1)
    check_scheduler(state([a], pool({"a": (0, 1, 2)}), dataclasses.replace(CONFIG, enable_prefix_caching=False)))


def test_a_computed_block_cached_under_other_tokens_is_refused() -> None:
    """The request's first block is a valid prefix-cache entry, but of other tokens (9, 9, 9, 9)."""
    a = request(tokens=(1, 2, 3, 4, 5, 6, 7, 8), computed=8)
    snapshot = state([a], pool({"a": (0, 1)}, hashed={0: (9, 9, 9, 9)}))
    check_allocator(snapshot.allocator)  # the pool alone is consistent
    violated(
        inv.TABLE_CONTENT_MATCHES_REQUEST,
        check_scheduler,
        snapshot,
        r"request 'a' block 0 \(id 0\) is cached under a hash of other tokens",
    )


def test_exactly_max_num_seqs_running_is_valid() -> None:
    config = dataclasses.replace(CONFIG, max_num_seqs=2)
    a, b = request("a"), request("b")
    check_scheduler(state([a, b], pool({"a": (0,), "b": (1,)}), config))
    c = request("c")
    violated(
        inv.RUNNING_WITHIN_MAX_NUM_SEQS,
        check_scheduler,
        state([a, b, c], pool({"a": (0,), "b": (1,), "c": (2,)}), config),
        "3 running > max_num_seqs 2",
    )


# -- the block pool ----------------------------------------------------------------------------------


def test_the_free_queue_message_names_exactly_the_blocks_it_holds_twice() -> None:
    allocator = pool({"a": (0, 1)})
    assert allocator.free_block_ids == (2, 3, 4, 5, 6, 7)
    twice = dataclasses.replace(allocator, free_block_ids=(2, 3, 4, 3, 5, 6, 7))
    violated(inv.BLOCKS_PARTITIONED, check_allocator, twice, r"^.*the free queue holds a block twice: \[3\]$")


@pytest.mark.parametrize("block_id", [NUM_BLOCKS, -1], ids=["one-past-the-end", "negative"])
def test_a_free_queue_entry_outside_the_pool_is_refused(block_id: int) -> None:
    """Every block of the pool is accounted for (free or held), and the queue holds one id more."""
    allocator = pool({"a": (0, 1)})
    outside = dataclasses.replace(allocator, free_block_ids=(*allocator.free_block_ids, block_id))
    violated(inv.BLOCKS_PARTITIONED, check_allocator, outside, rf"free queue holds unknown blocks \[{block_id}\]")


def test_a_negative_ref_count_is_named_as_such() -> None:
    """A block out of the free queue with ref count -1 breaks the partition (it is neither free nor used), and
    is reported as negative, not as a ref count the tables disagree with."""
    allocator = pool({"a": (0, 1)})
    broken = with_blocks(allocator, b2=BlockState(2, -1))
    broken = dataclasses.replace(broken, free_block_ids=tuple(b for b in allocator.free_block_ids if b != 2))
    violated(inv.BLOCKS_PARTITIONED, check_allocator, broken, "block 2 has negative ref count -1")


@pytest.mark.parametrize("block_id", [NUM_BLOCKS, -1], ids=["one-past-the-end", "negative"])
def test_a_hash_map_entry_outside_the_pool_is_refused(block_id: int) -> None:
    allocator = pool({"a": (0, 1)}, hashed={0: (1, 2, 3, 4)})
    outside = dataclasses.replace(allocator, cached_blocks={**allocator.cached_blocks, 0x1234: block_id})
    violated(
        inv.HASH_MAP_MATCHES_CONTENT, check_allocator, outside, rf"hash map points 0x1234 at unknown block {block_id}$"
    )


def test_a_hash_map_entry_at_a_block_without_that_hash_is_refused() -> None:
    """Every hashed block is in the map; the map has one entry more, at an unhashed free block."""
    allocator = pool({"a": (0, 1)}, hashed={0: (1, 2, 3, 4)})
    check_allocator(allocator)
    extra = dataclasses.replace(allocator, cached_blocks={**allocator.cached_blocks, 0x1234: 5})
    violated(
        inv.HASH_MAP_MATCHES_CONTENT, check_allocator, extra, "hash map points 0x1234 at block 5, whose hash is None"
    )


def test_every_hashed_block_is_checked_after_an_unhashed_one() -> None:
    """Block 0 carries no hash; block 1, a cached free block after it, has content its hash is not of."""
    allocator = pool(hashed={1: (1, 2, 3, 4)})
    check_allocator(allocator)
    broken = with_blocks(allocator, b1=dataclasses.replace(allocator.blocks[1], token_ids=(1, 2, 3, 5)))
    violated(inv.HASH_MAP_MATCHES_CONTENT, check_allocator, broken, "block 1's hash does not match its content")


@pytest.mark.parametrize("content", [(1, 2, 3), None], ids=["three-of-four-tokens", "no-content"])
def test_a_hashed_block_that_is_not_full_is_refused(content: tuple[int, ...] | None) -> None:
    """Its hash is of the tokens it holds (a partial block hashed by mistake), or it holds none."""
    block_hash = hash_block(NO_PARENT, content or ())
    allocator = dataclasses.replace(pool(), cached_blocks={block_hash: 3})
    partial = with_blocks(allocator, b3=BlockState(3, 0, block_hash, None, content))
    violated(
        inv.HASH_MAP_MATCHES_CONTENT, check_allocator, partial, re.escape(f"hashed block 3 is not full: {content}")
    )


# -- history: hashed blocks never change -----------------------------------------------------------


def order_blind_hash(parent: int, token_ids: Sequence[int]) -> int:
    """A colliding hash: a block's tokens in any order hash alike, so a reordered block passes the pool's own
    hash check and only the history can tell it changed."""
    return hash_block(parent, sorted(token_ids))


def test_a_hashed_block_whose_content_changes_under_the_same_hash_is_caught_by_the_history() -> None:
    """Block 0 (unhashed) comes before the hashed block 1, whose tokens are reordered, keeping its hash."""
    before = pool(hashed={1: (1, 2, 3, 4)}, hash_function=order_blind_hash)
    after = with_blocks(before, b1=dataclasses.replace(before.blocks[1], token_ids=(4, 3, 2, 1)))
    check_allocator(after)  # each snapshot alone is consistent
    monitor = InvariantMonitor()
    monitor.observe_allocator(before)
    violated(
        inv.HASHED_BLOCK_IMMUTABLE,
        monitor.observe_allocator,
        after,
        "hashed block 1 changed content while keeping its hash",
    )


def test_a_hashed_block_reused_under_a_new_hash_is_valid_history() -> None:
    """A cached block evicted and filled again is registered under its new content's hash: not a change."""
    monitor = InvariantMonitor()
    a = request(tokens=(1, 2, 3, 4, 5), computed=4)
    monitor.observe(state([a], pool({"a": (0,)}, hashed={0: (1, 2, 3, 4)})))
    b = request("b", tokens=(5, 6, 7, 8, 9), computed=4)
    monitor.observe(state([b], pool({"b": (0,)}, hashed={0: (5, 6, 7, 8)})))
    monitor.finished(["a", "b"])
    monitor.check_all_finished()


# -- snapshots are values ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "snapshot, field",
    [
        (BlockState(0, 0), "ref_count"),
        (pool(), "num_blocks"),
        (request(), "num_computed_tokens"),
        (state([request()], pool({"a": (0,)})), "running"),
    ],
    ids=["block", "allocator", "request", "scheduler"],
)
def test_snapshots_are_frozen(snapshot: object, field: str) -> None:
    """A monitor keeps what it observed: a snapshot cannot be changed after it was taken."""
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(snapshot, field, getattr(snapshot, field))
