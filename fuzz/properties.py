"""Properties the fuzzers check beyond spec.invariants, named like the spec's invariants.

A broken one raises spec.errors.InvariantViolation (an AssertionError) whose `invariant` is one
of the names below, so a test can tell which property a failure is about.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from fuzz.pool_model import PoolModel
from spec.errors import InvariantViolation
from spec.invariants import AllocatorSnapshot

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
# Two implementations (reference and fast) fed the same operations answered or decided differently:
# a plan, a prefix hit, a preemption, a block id, a free-queue order, a cache entry.
IMPLEMENTATIONS_AGREE = "implementations-agree"

FUZZ_PROPERTIES = (MODEL_AGREEMENT, CONSERVATION, LIVENESS, IDLE_POOL_FREE, TWIN_DECISIONS, IMPLEMENTATIONS_AGREE)


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
                f"block {block.block_id} has ref count {block.ref_count}, "
                f"model expects {model.ref_counts[block.block_id]}",
            )
        entry = model.content.get(block.block_id)
        expected = (None, None) if entry is None else (entry.block_hash, entry.token_ids)
        if (block.block_hash, block.token_ids) != expected:
            raise violated(
                MODEL_AGREEMENT,
                f"block {block.block_id} is cached as {(block.block_hash, block.token_ids)}, model expects {expected}",
            )


def check_implementations_agree(what: str, names: Sequence[str], values: Sequence[Any]) -> None:
    """Every implementation gave the first one's answer (a call's result, a plan, a snapshot)."""
    for name, value in zip(names[1:], values[1:], strict=True):
        if value != values[0]:
            raise violated(
                IMPLEMENTATIONS_AGREE,
                f"{what}: {name} differs from {names[0]} at {first_difference(values[0], value)}",
            )


def first_difference(expected: Any, actual: Any, path: str = "") -> str:
    """Where two equal-typed values (dataclasses, dicts, sequences) first differ, and how."""
    if dataclasses.is_dataclass(expected) and type(expected) is type(actual):
        for field in dataclasses.fields(expected):
            left, right = getattr(expected, field.name), getattr(actual, field.name)
            if left != right:
                return first_difference(left, right, f"{path}.{field.name}")
    elif isinstance(expected, dict) and isinstance(actual, dict):
        if expected.keys() != actual.keys():
            return f"{path or 'value'}: keys {sorted(map(str, expected))} vs {sorted(map(str, actual))}"
        for key in expected:
            if expected[key] != actual[key]:
                return first_difference(expected[key], actual[key], f"{path}[{key!r}]")
    elif isinstance(expected, (list, tuple)) and isinstance(actual, (list, tuple)) and len(expected) == len(actual):
        for index, (left, right) in enumerate(zip(expected, actual, strict=True)):
            if left != right:
                return first_difference(left, right, f"{path}[{index}]")
    return f"{path or 'value'}: {expected!r} vs {actual!r}"
