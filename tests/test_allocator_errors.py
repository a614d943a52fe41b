"""The reference allocator's own guard: tokens committed out of order are refused with an error that
says where the token belongs (a diagnostic the engines rely on when a runner skips a position)."""

from __future__ import annotations

import pytest

from reference.block_allocator import BlockAllocator


def test_a_token_committed_past_a_gap_is_refused_naming_its_offset() -> None:
    allocator = BlockAllocator(4, 4, True)
    allocator.admit("r", [])
    assert allocator.allocate_slots("r", 4)
    allocator.commit_tokens("r", [10, 11, 12, 13], 0, 2)
    with pytest.raises(RuntimeError, match=r"holds 2 tokens; token 3 belongs at offset 3"):
        allocator.commit_tokens("r", [10, 11, 12, 13], 3, 4)
