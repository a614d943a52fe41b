"""The engine protocol both engines satisfy: what `twinfer.LLM`, the CLI, the fuzzers and the
server drive. Token ids in, `RequestOutput`s out; text lives above this layer."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

import torch

from spec.engine_config import EngineConfig
from spec.model_config import ModelConfig
from spec.request import RequestOutput
from spec.sampling_params import SamplingParams


@runtime_checkable
class Engine(Protocol):
    """add_request / step / abort / generate; `has_unfinished` says whether `step` has work.

    Every engine is also built by `from_pretrained(model, engine_config, dtype, device)`.
    """

    model_config: ModelConfig
    config: EngineConfig  # resolved: max_model_len is set

    @property
    def has_unfinished(self) -> bool: ...

    def add_request(
        self, prompt_token_ids: Sequence[int], params: SamplingParams | None = None, request_id: str | None = None
    ) -> str: ...

    def step(self) -> list[RequestOutput]: ...

    def abort(self, request_id: str) -> RequestOutput: ...

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[RequestOutput]: ...


class EngineFactory(Protocol):
    def from_pretrained(
        self,
        model: str | Path,
        engine_config: EngineConfig | None = None,
        dtype: str | torch.dtype = "auto",
        device: torch.device | str | None = None,
    ) -> Engine: ...
