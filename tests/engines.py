"""Engines under test, by name, built on the CPU over an in-memory state dict.

Tests that hold every engine to the same rule are parametrized over ENGINE_NAMES and build their
engines here, so a new engine joins every such test by being added to this table.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

import torch

from fast.logits import RowMax, StepLogits
from spec.engine import Engine, sampling_positions
from spec.engine_config import DEFAULT_NUM_BLOCKS, EngineConfig
from spec.model_config import ModelConfig
from spec.request import Request
from spec.scheduling import StepPlan

ENGINE_NAMES = ("reference", "fast")

# Where the fast engine's tests run: on the GPU when there is one (the same assertions, on CUDA), else
# through Triton's CPU interpreter (tests/conftest.py sets TRITON_INTERPRET=1 only on a machine without
# CUDA). The reference engine's tests stay on the CPU: it is the specification, not what is under test.
FAST_DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def build_engine(
    name: str,
    model_config: ModelConfig,
    state_dict: dict[str, torch.Tensor],
    engine_config: EngineConfig | None = None,
    dtype: torch.dtype = torch.float32,
    device: str | None = None,
) -> Engine:
    """Engine `name` over an in-memory state dict; device None: FAST_DEVICE for the fast engine, the CPU
    for the reference. A fast engine on CUDA gets DEFAULT_NUM_BLOCKS where its config leaves num_blocks
    to the engine, as on the CPU: sized from free GPU memory, one test engine would take the memory of
    every other pytest worker."""
    if name == "reference":
        from reference.engine import ReferenceEngine

        return ReferenceEngine(model_config, state_dict, engine_config, dtype, device or "cpu")
    if name == "fast":
        from fast.engine import FastEngine

        device = device or FAST_DEVICE
        return FastEngine(model_config, state_dict, engine_config_on(engine_config, device), dtype, device)
    raise ValueError(f"unknown engine {name!r}; known: {ENGINE_NAMES}")


def record_executed_plans(engine: Engine) -> list[StepPlan]:
    """The plans a fast engine executes, in order (however early async scheduling made them)."""
    plans: list[StepPlan] = []
    execute = engine.execute  # type: ignore[attr-defined]

    def recording_execute(plan: StepPlan, meanwhile=None):
        plans.append(plan)
        return execute(plan, meanwhile)

    engine.execute = recording_execute  # type: ignore[attr-defined]
    return plans


def record_plans(engine: Engine) -> list[StepPlan]:
    """Spy on an engine's scheduling plans without changing what its scheduler does."""
    plans: list[StepPlan] = []
    schedule = engine.scheduler.schedule  # type: ignore[attr-defined]

    def recording_schedule() -> StepPlan:
        plan = schedule()
        plans.append(plan)
        return plan

    engine.scheduler.schedule = recording_schedule  # type: ignore[attr-defined]
    return plans


def engine_config_on(engine_config: EngineConfig | None, device: str | torch.device) -> EngineConfig:
    """engine_config for a test engine on `device`: on CUDA a pool of DEFAULT_NUM_BLOCKS where num_blocks is
    left to the engine (see build_engine)."""
    config = engine_config or EngineConfig()
    if torch.device(device).type == "cuda" and config.num_blocks is None:
        return replace(config, num_blocks=DEFAULT_NUM_BLOCKS)
    return config


def logits_in_one_buffer(engine: Engine) -> None:
    """Make a fast engine's runner return each step's logits as a view of one persistent buffer that every
    launch rewrites, as a CUDA graph's replay rewrites the graph's own output buffer on a GPU. On the CPU,
    where each eager forward returns a new tensor, a host read of a step's logits after the next step's
    launch then reads the next step's logits, as it would on a GPU (a stricter model: on a GPU only
    graph-replayed steps share a buffer). Nothing on CUDA, where the graphs are real."""
    runner = engine.runner  # type: ignore[attr-defined]
    if runner.device.type == "cuda":
        return
    buffer = torch.empty(runner.inputs.max_num_tokens, runner.model_config.vocab_size)
    head_max_buffer = RowMax(
        torch.empty(runner.inputs.max_num_tokens), torch.empty(runner.inputs.max_num_tokens, dtype=torch.int64)
    )
    launch = runner.launch

    def launch_into_buffer(prepared, num_shared: int = 0) -> StepLogits:
        step = launch(prepared, num_shared)
        count = step.logits.shape[0]
        rows = buffer[:count]
        rows.copy_(step.logits)
        if step.head_max is None:
            return StepLogits(rows)
        head_max = head_max_buffer.rows(slice(None, count))
        for persistent, computed in zip(head_max, step.head_max, strict=True):
            persistent.copy_(computed)
        return StepLogits(rows, head_max)

    runner.launch = launch_into_buffer


NON_FINITE_KINDS = ("nan", "+inf", "-inf")  # what plant_non_finite writes into a row


def plant_non_finite(
    engine: Engine, kind: str, output_position: int, chooses: Callable[[Request], bool] = lambda request: True
) -> None:
    """Make the logits row that samples output `output_position` of the requests `chooses` picks non-finite,
    just before sampling (the model itself is untouched): "nan" puts a NaN at token 1, "+inf" puts +inf at
    token 2, "-inf" makes every value -inf (see plant_rows)."""
    if kind not in NON_FINITE_KINDS:
        raise ValueError(f"kind must be one of {NON_FINITE_KINDS}, got {kind!r}")

    def edit(row: torch.Tensor) -> None:
        if kind == "nan":
            row[1] = float("nan")
        elif kind == "+inf":
            row[2] = float("inf")
        else:
            row.fill_(float("-inf"))

    plant_rows(engine, edit, output_position, chooses)


def plant_rows(
    engine: Engine,
    edit: Callable[[torch.Tensor], None],
    output_position: int,
    chooses: Callable[[Request], bool] = lambda request: True,
) -> None:
    """edit(row) changes, in place and just before sampling, the logits row [V] that samples output
    `output_position` of the requests `chooses` picks (the model itself is untouched). The reference
    engine's rows are planted in `_sample`; the fast engine's in its sampler's `sample`, after
    `_set_sampler_rows` said which request and position each row is (a verify chunk's rows count on from
    the request's outputs: spec.engine.sampling_positions)."""

    def plant(logits: torch.Tensor, requests: Sequence[Request]) -> torch.Tensor:
        positions = sampling_positions(requests)
        rows = [
            row
            for row, (r, p) in enumerate(zip(requests, positions, strict=True))
            if p == output_position and chooses(r)
        ]
        if not rows:
            return logits
        logits = logits.clone()
        for row in rows:
            edit(logits[row])
        return logits

    if hasattr(engine, "sampler"):  # the fast engine
        rows_set: list[Request] = []
        set_rows, sample = engine._set_sampler_rows, engine.sampler.sample  # type: ignore[attr-defined]

        def recording_set_rows(sampling: list[tuple[int, Request]]) -> None:
            rows_set[:] = [request for _, request in sampling]
            set_rows(sampling)

        def planted_sample(logits: torch.Tensor, head_max: RowMax | None = None) -> torch.Tensor:
            planted = plant(logits, rows_set)
            # The head's row max and argmax are of the logits before the edit: the sampler must reduce the edited
            # rows itself.
            return sample(planted, head_max if planted is logits else None)

        engine._set_sampler_rows = recording_set_rows  # type: ignore[attr-defined]
        engine.sampler.sample = planted_sample  # type: ignore[attr-defined]
        return
    sample_rows = engine._sample  # type: ignore[attr-defined]
    engine._sample = lambda logits, requests, plan: sample_rows(plant(logits, requests), requests, plan)  # type: ignore[attr-defined]
