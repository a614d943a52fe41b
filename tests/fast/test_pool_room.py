"""How the fast runner sizes an explicit KV pool on a GPU (fast.model_runner.ModelRunner._pool_blocks), on
a stand-in runner: garbage is collected (costly in a large heap) only when an explicit pool seems not to
fit, always when the engine sizes the pool itself, and the pool is refused only if it still does not fit."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from fast.model_runner import ModelRunner, PoolRoom
from spec.engine_config import EngineConfig
from spec.errors import ConfigError


def stand_in_runner(rooms: dict[bool, PoolRoom], collects: list[bool]) -> SimpleNamespace:
    """A runner on CUDA whose room is rooms[collect_garbage]; every call's collect_garbage goes to `collects`."""

    def pool_room(settings: EngineConfig, collect_garbage: bool) -> PoolRoom:
        collects.append(collect_garbage)
        return rooms[collect_garbage]

    return SimpleNamespace(device=torch.device("cuda"), collectives=None, _pool_room=pool_room)


def pool_blocks(runner: SimpleNamespace, config: EngineConfig) -> int | None:
    return ModelRunner._pool_blocks(runner, config, config)  # type: ignore[arg-type]


def test_an_explicit_pool_that_fits_is_taken_without_collecting_garbage() -> None:
    collects: list[bool] = []
    runner = stand_in_runner({False: PoolRoom(utilization_blocks=10, free_blocks=100)}, collects)
    assert pool_blocks(runner, EngineConfig(num_blocks=100, block_size=16, max_model_len=64)) == 100
    assert collects == [False]


def test_an_explicit_pool_that_fits_only_after_collecting_garbage_is_taken() -> None:
    collects: list[bool] = []
    rooms = {False: PoolRoom(utilization_blocks=10, free_blocks=99), True: PoolRoom(10, 100)}
    runner = stand_in_runner(rooms, collects)
    assert pool_blocks(runner, EngineConfig(num_blocks=100, block_size=16, max_model_len=64)) == 100
    assert collects == [False, True]


def test_an_explicit_pool_that_does_not_fit_after_collecting_is_refused() -> None:
    collects: list[bool] = []
    runner = stand_in_runner({False: PoolRoom(10, 50), True: PoolRoom(10, 99)}, collects)
    with pytest.raises(ConfigError, match="num_blocks 100 does not fit in GPU memory.*holds 99 blocks"):
        pool_blocks(runner, EngineConfig(num_blocks=100, block_size=16, max_model_len=64))
    assert collects == [False, True]


def test_a_pool_the_engine_sizes_collects_garbage_first() -> None:
    collects: list[bool] = []
    runner = stand_in_runner({True: PoolRoom(utilization_blocks=40, free_blocks=100)}, collects)
    assert pool_blocks(runner, EngineConfig(block_size=16, max_model_len=64)) == 40
    assert collects == [True]
