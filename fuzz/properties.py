"""Properties the fuzzers check beyond spec.invariants, named like the spec's invariants.

A broken one raises spec.errors.InvariantViolation (an AssertionError) whose `invariant` is one
of the names below, so a test can tell which property a failure is about.
"""

from __future__ import annotations

from spec.errors import InvariantViolation
from spec.invariants import AllocatorSnapshot

from fuzz.pool_model import PoolModel

# The allocator disagrees with the plain model of the pool (free queue, tables, prefix cache).
MODEL_AGREEMENT = "model-agreement"
# An added request was lost, came back twice, or came back with the wrong tokens or reason.
CONSERVATION = "conservation"
# A request that fits alone did not finish within the bound derived from the workload.
LIVENESS = "liveness"
# An idle engine holds blocks other than through the prefix cache.
IDLE_POOL_FREE = "idle-pool-free"
# A scheduler made a different decision from the oracle written from spec.scheduling.
TWIN_DECISIONS = "twin-decisions"

FUZZ_PROPERTIES = (MODEL_AGREEMENT, CONSERVATION, LIVENESS, IDLE_POOL_FREE, TWIN_DECISIONS)


def violated(name: str, detail: str) -> InvariantViolation:
    return InvariantViolation(name, detail)


def check_agrees_with_model(snapshot: AllocatorSnapshot, model: PoolModel) -> None:
    """The allocator's whole observable state equals the model's, block id for block id."""
    if snapshot.free_block_ids != tuple(model.free_queue):
        raise violated(MODEL_AGREEMENT, f"free queue {list(snapshot.free_block_ids)}, model expects {model.free_queue}")
    tables = {request_id: list(table) for request_id, table in snapshot.block_tables.items()}
    if tables != model.tables:
        raise violated(MODEL_AGREEMENT, f"block tables {tables}, model expects {model.tables}")
    if snapshot.cached_blocks != model.cached:
        raise violated(MODEL_AGREEMENT, f"prefix cache {snapshot.cached_blocks}, model expects {model.cached}")
    for block in snapshot.blocks:
        if block.ref_count != model.ref_counts[block.block_id]:
            raise violated(
                MODEL_AGREEMENT,
                f"block {block.block_id} has ref count {block.ref_count}, model expects {model.ref_counts[block.block_id]}",
            )
        entry = model.content.get(block.block_id)
        expected = (None, None) if entry is None else (entry.block_hash, entry.token_ids)
        if (block.block_hash, block.token_ids) != expected:
            raise violated(
                MODEL_AGREEMENT,
                f"block {block.block_id} is cached as {(block.block_hash, block.token_ids)}, model expects {expected}",
            )
