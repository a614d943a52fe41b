"""A prefix-cache hit never serves another prompt's K/V, even when block hashes collide.

The allocators take their block hash as a constructor argument; here it is a constant, so every
block collides with every other. A cached block may then be reused only where its stored token
ids and its parent's hash are the request's: the test shows a colliding block is not reused
(reference and fast allocators and schedulers), that equal blocks still are, and, end to end,
that each engine produces the tokens a fresh engine produces. A collision-blind lookup, planted
in the reference engine, produces other logprobs: the end-to-end check can fail.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Sequence

import pytest

from fast.block_allocator import BlockAllocator as FastBlockAllocator
from fast.scheduler import Scheduler as FastScheduler
from reference.block_allocator import BlockAllocator as ReferenceBlockAllocator
from reference.scheduler import Scheduler as ReferenceScheduler
from spec.block_hash import NO_PARENT
from spec.engine_config import EngineConfig
from spec.request import Request
from spec.sampling_params import SamplingParams
from spec.scheduling import max_prefix_hit_blocks
from tests.engines import ENGINE_NAMES, build_engine

BLOCK_SIZE = 4
COLLIDING_HASH = 0xC0FFEE  # not NO_PARENT, so a first block's parent differs from any later block's


def colliding_hash(parent_hash: int, token_ids: Sequence[int]) -> int:
    """Every block hashes alike."""
    return COLLIDING_HASH


ALLOCATORS = {"reference": ReferenceBlockAllocator, "fast": FastBlockAllocator}
SCHEDULERS = {"reference": ReferenceScheduler, "fast": FastScheduler}
ENGINE_SCHEDULERS = {"reference": ("reference.engine", ReferenceScheduler), "fast": ("fast.engine", FastScheduler)}


def compute_whole_prompt(allocator, request_id: str, tokens: list[int]) -> list[int]:
    """Admit `tokens` as the scheduler would and compute them all; the prefix hit."""
    hit = allocator.cached_prefix(tokens)
    assert allocator.can_admit(len(tokens), hit)
    allocator.admit(request_id, hit)
    assert allocator.allocate_slots(request_id, len(tokens))
    allocator.commit_tokens(request_id, tokens, len(hit) * BLOCK_SIZE, len(tokens))
    return hit


@pytest.mark.parametrize("name", ALLOCATORS)
def test_allocator_does_not_reuse_a_colliding_block(name: str) -> None:
    allocator = ALLOCATORS[name](8, BLOCK_SIZE, True, colliding_hash)
    assert compute_whole_prompt(allocator, "a", [1, 2, 3, 4, 9]) == []
    cached_block = allocator.block_table("a")[0]
    allocator.free("a")
    # The collision is real: the lookup of any block finds `cached_block` under the same hash.
    assert allocator.snapshot().cached_blocks == {COLLIDING_HASH: cached_block}

    assert allocator.cached_prefix([5, 6, 7, 8, 9]) == []  # other tokens: not reused
    assert allocator.cached_prefix([1, 2, 3, 4, 9]) == [cached_block]  # the same tokens are
    # The same tokens again as a second block: equal content, but its parent differs (position 1, not 0).
    assert allocator.cached_prefix([1, 2, 3, 4, 1, 2, 3, 4, 9]) == [cached_block]

    assert compute_whole_prompt(allocator, "b", [5, 6, 7, 8, 9]) == []
    assert cached_block not in allocator.block_table("b")
    cached = allocator.snapshot().blocks[cached_block]
    assert (cached.block_hash, cached.token_ids) == (COLLIDING_HASH, (1, 2, 3, 4))
    assert cached.parent_hash == NO_PARENT


@pytest.mark.parametrize("name", SCHEDULERS)
def test_scheduler_admits_a_colliding_prompt_without_a_hit(name: str) -> None:
    # A scheduler takes a resolved configuration: every setting an engine would fill in is given.
    config = EngineConfig(
        block_size=BLOCK_SIZE, num_blocks=8, max_num_seqs=4, max_num_batched_tokens=32, max_model_len=64
    )
    scheduler = SCHEDULERS[name](config, (), colliding_hash)
    params = SamplingParams(temperature=0.0, max_tokens=1)

    def run_alone(request_id: str, prompt: tuple[int, ...]) -> Request:
        request = Request(request_id, prompt, params, seed=0, arrival_index=0)
        scheduler.add(request)
        plan = scheduler.schedule()
        finished = scheduler.update(plan, {request_id: 10})
        assert finished == [request]
        return request

    assert run_alone("first", (1, 2, 3, 4, 9)).num_cached_prompt_tokens == 0
    assert run_alone("colliding", (5, 6, 7, 8, 9)).num_cached_prompt_tokens == 0
    assert run_alone("same", (1, 2, 3, 4, 9)).num_cached_prompt_tokens == BLOCK_SIZE


def test_a_prompt_logprobs_request_gets_no_hit() -> None:
    """max_prefix_hit_blocks, as both schedulers use it (the other cases are in the fuzzers)."""
    assert max_prefix_hit_blocks(9, BLOCK_SIZE) == 2
    assert max_prefix_hit_blocks(8, BLOCK_SIZE) == 1
    assert max_prefix_hit_blocks(9, BLOCK_SIZE, wants_prompt_logprobs=True) == 0


# -- end to end ----------------------------------------------------------------------------------

FIRST_PROMPT = [11, 12, 13, 14, 20, 21, 22]  # one full block, then three tokens
COLLIDING_PROMPT = [31, 32, 33, 34, 20, 21, 22]  # another first block, the same tail
GREEDY = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True, logprobs=3)
ENGINE_CONFIG = EngineConfig(block_size=BLOCK_SIZE, num_blocks=16, check_invariants=True)


class CollisionBlindAllocator(ReferenceBlockAllocator):
    """The planted bug: a hit trusts the hash alone."""

    def cached_prefix(self, token_ids: Sequence[int], max_blocks: int | None = None) -> list[int]:
        limit = max_prefix_hit_blocks(len(token_ids), self.block_size) if max_blocks is None else max_blocks
        hits: list[int] = []
        parent = NO_PARENT
        for index in range(limit):
            parent = self.hash_function(parent, token_ids[index * self.block_size : (index + 1) * self.block_size])
            if parent not in self._cached:
                break
            hits.append(self._cached[parent])
        return hits


@pytest.fixture
def engines(tiny_weights, monkeypatch: pytest.MonkeyPatch):
    """name -> a fresh engine whose scheduler hashes every block alike, and a normal one."""
    model_config, state_dict = tiny_weights

    def build(name: str, colliding: bool = True):
        if colliding:
            module, scheduler_class = ENGINE_SCHEDULERS[name]
            importlib.import_module(module)
            monkeypatch.setattr(f"{module}.Scheduler", functools.partial(scheduler_class, hash_function=colliding_hash))
        engine = build_engine(name, model_config, state_dict, ENGINE_CONFIG)
        monkeypatch.undo()
        return engine

    return build


def _tokens_and_logprobs(output) -> tuple[tuple[int, ...], list[float]]:
    return output.token_ids, [entry.logprob for entry in output.logprobs]


@pytest.mark.parametrize("name", ENGINE_NAMES)
def test_engine_with_colliding_hashes_gives_the_tokens_of_a_fresh_engine(engines, name: str) -> None:
    colliding = engines(name)
    [first] = colliding.generate([FIRST_PROMPT], GREEDY)
    [second] = colliding.generate([COLLIDING_PROMPT], GREEDY)
    [again] = colliding.generate([FIRST_PROMPT], GREEDY)
    assert (first.num_cached_prompt_tokens, second.num_cached_prompt_tokens) == (0, 0)
    assert again.num_cached_prompt_tokens == BLOCK_SIZE  # equal blocks are still served from the cache

    [alone] = engines(name, colliding=False).generate([COLLIDING_PROMPT], GREEDY)
    tokens, logprobs = _tokens_and_logprobs(second)
    expected_tokens, expected_logprobs = _tokens_and_logprobs(alone)
    assert tokens == expected_tokens
    assert logprobs == pytest.approx(expected_logprobs, abs=1e-4)
    assert _tokens_and_logprobs(again)[1] == pytest.approx(_tokens_and_logprobs(first)[1], abs=1e-4)


def test_a_collision_blind_lookup_serves_the_wrong_kv(engines) -> None:
    """Without the token comparison the colliding prompt is served the first prompt's K/V, and
    its logprobs move: the end-to-end test above would fail."""
    blind = engines("reference")
    blind.monitor = None  # the planted bug also breaks invariants; here only the output matters
    blind.scheduler.allocator = CollisionBlindAllocator(ENGINE_CONFIG.num_blocks, BLOCK_SIZE, True, colliding_hash)
    blind.generate([FIRST_PROMPT], GREEDY)
    [second] = blind.generate([COLLIDING_PROMPT], GREEDY)
    assert second.num_cached_prompt_tokens == BLOCK_SIZE
    [alone] = engines("reference", colliding=False).generate([COLLIDING_PROMPT], GREEDY)
    difference = max(
        abs(a - b) for a, b in zip(_tokens_and_logprobs(second)[1], _tokens_and_logprobs(alone)[1], strict=True)
    )
    assert difference > 1e-3
