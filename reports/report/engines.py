"""The engines a report compares, built by name; an engine that cannot be built says why.

"hf" is Hugging Face transformers (the outside baseline); "reference" and "fast" are twinfer's
twins, built through the engine registry (twinfer.registry).
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from spec.engine import Engine
from spec.engine_config import EngineConfig
from spec.errors import TwinferError

logger = logging.getLogger(__name__)

HF = "hf"


class EngineUnavailable(Exception):
    """An engine cannot run here; the message is shown in the report as the reason ("not run")."""


class EngineCrashed(Exception):
    """An engine that can run here raised while starting: a bug, shown as a failure."""


def check_available(name: str, dtype: torch.dtype, device: torch.device) -> None:
    """Raise EngineUnavailable naming why `name` cannot run in `dtype` on `device`."""
    if name == HF:
        return
    from twinfer import registry

    try:
        entry = registry.engine_entry(name)
        registry.check_engine_can_run(name, device)
    except Exception as error:  # the registry's errors name the problem; the page shows them
        raise EngineUnavailable(str(error)) from error
    if entry.runs_on_cpu_only_through_triton_interpreter and device.type == "cpu" and dtype == torch.bfloat16:
        raise EngineUnavailable(f"engine {name!r} on the CPU runs Triton's interpreter, which has no bfloat16")


def build_engine(
    name: str, checkpoint: Path, engine_config: EngineConfig, dtype: torch.dtype, device: torch.device
) -> Engine:
    from twinfer import registry

    try:
        return registry.build_engine(name, checkpoint, engine_config, dtype, device)
    except TwinferError as error:  # a configuration this engine refuses, named by the engine
        raise EngineUnavailable(f"engine {name!r} refused this configuration: {error}") from error
    except Exception as error:
        logger.exception("engine %s crashed while starting", name)
        raise EngineCrashed(f"engine {name!r} crashed while starting: {type(error).__name__}: {error}") from error


def load_hf_model(checkpoint: Path, dtype: torch.dtype, device: torch.device) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(checkpoint), dtype=dtype).to(device).eval()


def release_device_memory(device: torch.device) -> None:
    """Return cached blocks after an engine is dropped, so the next one (which may size its KV pool
    from free memory) sees the whole GPU."""
    if device.type == "cuda":
        torch.cuda.empty_cache()
