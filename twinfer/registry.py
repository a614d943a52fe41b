"""twinfer's engines by name: the one table that `LLM`, the CLI, `twinfer diff` and `twinfer bench` use.

Each engine is a class satisfying `spec.engine.Engine`, built either by
`from_pretrained(model, engine_config, dtype, device)` or by its constructor
`(model_config, state_dict, engine_config, dtype, device)`. Classes are imported only when an
engine is asked for, so `import twinfer` stays light and a machine without a GPU never loads
the fast engine by accident.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

import torch

from spec.engine import Engine, default_device
from spec.engine_config import EngineConfig
from spec.errors import ConfigError


@dataclass(frozen=True)
class EngineEntry:
    """Where an engine's class lives, and what it needs to run."""

    name: str
    module: str
    class_name: str
    summary: str
    runs_on_cpu_only_through_triton_interpreter: bool
    # With EngineConfig.num_blocks None, sizes its KV pool from free GPU memory on CUDA
    # (otherwise every engine uses spec.engine_config.DEFAULT_NUM_BLOCKS).
    sizes_kv_pool_from_gpu_memory: bool

    def load(self) -> type:
        try:
            module = importlib.import_module(self.module)
        except ModuleNotFoundError as error:
            if error.name != self.module:
                raise
            raise ConfigError(f"engine {self.name!r} is not available: module {self.module} is missing") from error
        return getattr(module, self.class_name)


ENGINES: Mapping[str, EngineEntry] = MappingProxyType(
    {
        "fast": EngineEntry(
            name="fast",
            module="fast.engine",
            class_name="FastEngine",
            summary="Triton kernels, paged KV cache, prefix caching, chunked prefill, CUDA Graphs, GPU sampler",
            runs_on_cpu_only_through_triton_interpreter=True,
            sizes_kv_pool_from_gpu_memory=True,
        ),
        "reference": EngineEntry(
            name="reference",
            module="reference.engine",
            class_name="ReferenceEngine",
            summary="plain PyTorch, obviously correct: the executable specification",
            runs_on_cpu_only_through_triton_interpreter=False,
            sizes_kv_pool_from_gpu_memory=False,
        ),
    }
)
ENGINE_NAMES: tuple[str, ...] = tuple(ENGINES)


def resolve_device(device: str | torch.device | None) -> torch.device:
    """The device asked for, or CUDA when available, else the CPU."""
    return torch.device(device) if device is not None else default_device()


def default_engine_name(device: torch.device) -> str:
    """The fast engine on CUDA; the reference engine elsewhere (the fast one would need Triton's slow interpreter)."""
    return "fast" if device.type == "cuda" else "reference"


def triton_interpreter_enabled() -> bool:
    """TRITON_INTERPRET=1, read when Triton defines a kernel, sends every launch to its CPU interpreter."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def engine_entry(name: str) -> EngineEntry:
    if name not in ENGINES:
        raise ConfigError(f"unknown engine {name!r}; available: {', '.join(ENGINE_NAMES)}")
    return ENGINES[name]


def check_engine_can_run(name: str, device: torch.device) -> None:
    """Raise ConfigError when engine `name` cannot run on `device` in this process."""
    entry = engine_entry(name)
    if entry.runs_on_cpu_only_through_triton_interpreter and device.type != "cuda" and not triton_interpreter_enabled():
        raise ConfigError(
            f"engine {name!r} runs Triton kernels, which need a CUDA device; on {device.type} use "
            "engine='reference' (`--engine reference`), or set TRITON_INTERPRET=1 in the environment before "
            "starting Python to run the kernels through Triton's (slow) CPU interpreter"
        )


def engine_class(name: str, device: torch.device) -> type:
    """The class of engine `name`, after checking it can run on `device`."""
    check_engine_can_run(name, device)
    return engine_entry(name).load()


def build_engine(
    name: str,
    model: str | Path,
    engine_config: EngineConfig | None,
    dtype: str | torch.dtype,
    device: torch.device,
) -> Engine:
    """Engine `name` loaded from a checkpoint directory or hub id."""
    return engine_class(name, device).from_pretrained(model, engine_config, dtype, device)
