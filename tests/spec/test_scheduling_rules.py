"""spec.scheduling's small rules by known answers: the KV slot of a position, the longest prefix hit a
request may take, and plans as immutable values. Both schedulers and the fuzzers' oracle call these
same functions, so a slip in one would pass the twin checks: the mutation run (fuzz/mutation) showed
these lines surviving the scheduler tests; they are pinned here where it is cheap."""

from __future__ import annotations

import dataclasses

import pytest

from spec.scheduling import ScheduledChunk, StepPlan, max_prefix_hit_blocks, slot_of


@pytest.mark.parametrize(
    ("position", "expected"),
    [(0, 7 * 4), (3, 7 * 4 + 3), (4, 2 * 4), (6, 2 * 4 + 2), (8, 5 * 4), (11, 5 * 4 + 3)],
)
def test_slot_is_the_block_id_times_block_size_plus_the_offset(position: int, expected: int) -> None:
    assert slot_of([7, 2, 5], position, 4) == expected


def test_a_position_past_the_table_has_no_slot() -> None:
    with pytest.raises(IndexError):
        slot_of([7, 2], 8, 4)


@pytest.mark.parametrize(
    ("num_tokens", "expected"),
    [(1, 0), (4, 0), (5, 1), (8, 1), (9, 2), (12, 2), (13, 3)],
)
def test_a_prefix_hit_leaves_at_least_one_token_to_compute(num_tokens: int, expected: int) -> None:
    """(num_tokens - 1) // block_size: a prompt of whole blocks leaves its last block to compute."""
    assert max_prefix_hit_blocks(num_tokens, 4) == expected


@pytest.mark.parametrize("num_tokens", [1, 5, 9, 100])
def test_a_request_asking_for_prompt_logprobs_takes_no_hit(num_tokens: int) -> None:
    assert max_prefix_hit_blocks(num_tokens, 4, wants_prompt_logprobs=True) == 0


def test_plans_are_immutable_values() -> None:
    """A runner reading a plan cannot change what the scheduler decided (and plans compare by value)."""
    chunk = ScheduledChunk("r1", 0, 4, samples=True)
    plan = StepPlan(chunks=(chunk,), preempted=(), admitted=("r1",))
    with pytest.raises(dataclasses.FrozenInstanceError):
        chunk.num_tokens = 5  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.chunks = ()  # type: ignore[misc]
    assert plan == StepPlan((ScheduledChunk("r1", 0, 4, True),), (), ("r1",)) and hash(plan) == hash(
        StepPlan((chunk,), (), ("r1",))
    )
