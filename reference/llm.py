"""`LLM`: the user-facing entry point. Text or token-id prompts in, RequestOutputs out."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import torch

from reference.engine import ReferenceEngine
from spec.engine import default_device
from spec.checkpoint import load_model_config, parse_dtype, resolve_checkpoint
from spec.engine_config import EngineConfig
from spec.errors import ConfigError, InvalidRequestError
from spec.request import RequestOutput
from spec.sampling_params import SamplingParams

logger = logging.getLogger(__name__)

ENGINES = ("reference",)

Prompt = str | Sequence[int]


class LLM:
    """LLM(model, engine="reference", dtype="auto", device=None, engine_config=None).

    model: a checkpoint directory or a Hugging Face hub id.
    engine: "reference" (the pure-PyTorch engine). The fast engine is not built yet.
    dtype: "auto" (the checkpoint's), "float32", "float16" or "bfloat16".
    device: "cpu", "cuda", ...; default CUDA when available.
    """

    def __init__(
        self,
        model: str | Path,
        engine: str = "reference",
        dtype: str | torch.dtype = "auto",
        device: str | torch.device | None = None,
        engine_config: EngineConfig | None = None,
    ) -> None:
        if engine not in ENGINES:
            raise ConfigError(f"unknown engine {engine!r}; available: {', '.join(ENGINES)}")
        self.checkpoint = resolve_checkpoint(model)
        model_config = load_model_config(self.checkpoint)
        self.dtype = parse_dtype(dtype, model_config)
        self.device = torch.device(device) if device is not None else default_device()
        self.engine = ReferenceEngine.from_pretrained(self.checkpoint, engine_config, self.dtype, self.device)
        self._tokenizer = None

    @property
    def tokenizer(self):  # -> transformers.PreTrainedTokenizerBase
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            try:
                self._tokenizer = AutoTokenizer.from_pretrained(str(self.checkpoint))
            except Exception as error:
                raise ConfigError(f"checkpoint {self.checkpoint} has no usable tokenizer: {error}") from error
        return self._tokenizer

    def has_tokenizer(self) -> bool:
        return any(self.checkpoint.glob("tokenizer*"))

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        """Generate for one prompt or a list; each prompt is text or a list of token ids.
        Outputs come back in prompt order, with `text` decoded when the checkpoint has a tokenizer."""
        prompt_list = _as_prompt_list(prompts)
        token_prompts = [self.encode(p) if isinstance(p, str) else list(p) for p in prompt_list]
        outputs = self.engine.generate(token_prompts, sampling_params)
        if not self.has_tokenizer():
            return outputs
        return [_with_text(output, self.tokenizer.decode(list(output.token_ids))) for output in outputs]


def _as_prompt_list(prompts: Prompt | Sequence[Prompt]) -> list[Prompt]:
    if isinstance(prompts, str):
        return [prompts]
    prompts = list(prompts)
    if not prompts:
        raise InvalidRequestError("no prompts given")
    if all(isinstance(p, int) and not isinstance(p, bool) for p in prompts):
        return [prompts]  # a single prompt of token ids
    return prompts


def _with_text(output: RequestOutput, text: str) -> RequestOutput:
    return replace(output, text=text)
