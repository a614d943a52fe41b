"""Engines under test, by name, built on the CPU over an in-memory state dict.

Tests that hold every engine to the same rule are parametrized over ENGINE_NAMES and build their
engines here, so a new engine joins every such test by being added to this table.
"""

from __future__ import annotations

import torch

from spec.engine import Engine
from spec.engine_config import EngineConfig
from spec.model_config import ModelConfig
from spec.scheduling import StepPlan

ENGINE_NAMES = ("reference", "fast")


def build_engine(
    name: str,
    model_config: ModelConfig,
    state_dict: dict[str, torch.Tensor],
    engine_config: EngineConfig | None = None,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
) -> Engine:
    if name == "reference":
        from reference.engine import ReferenceEngine

        return ReferenceEngine(model_config, state_dict, engine_config, dtype, device)
    if name == "fast":
        from fast.engine import FastEngine

        return FastEngine(model_config, state_dict, engine_config, dtype, device)
    raise ValueError(f"unknown engine {name!r}; known: {ENGINE_NAMES}")


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
