"""`LLM`: the user-facing entry point. Text or token-id prompts in, RequestOutputs out."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import torch

from spec.checkpoint import load_model_config, parse_dtype, resolve_checkpoint
from spec.engine_config import EngineConfig
from spec.errors import ConfigError, InvalidRequestError
from spec.request import RequestOutput
from spec.sampling_params import SamplingParams
from twinfer.registry import build_engine, default_engine_name, resolve_device

Prompt = str | Sequence[int]


class LLM:
    """LLM(model, engine=None, dtype="auto", device=None, engine_config=None, tensor_parallel_size=None).

    model: a checkpoint directory or a Hugging Face hub id.
    engine: "fast" (Triton kernels; needs CUDA, or TRITON_INTERPRET=1 on the CPU) or "reference"
        (plain PyTorch). Default: "fast" on CUDA, "reference" elsewhere.
    dtype: "auto" (the checkpoint's), "float32", "float16" or "bfloat16".
    device: "cpu", "cuda", ...; default CUDA when available.
    engine_config: KV pool and scheduler limits (spec.engine_config.EngineConfig).
    tensor_parallel_size: split the fast engine's model over this many GPUs (one process each);
        overrides engine_config.tensor_parallel_size. `shutdown()` (or `with LLM(...) as llm`) ends
        every rank; interpreter exit does too.
    """

    def __init__(
        self,
        model: str | Path,
        engine: str | None = None,
        dtype: str | torch.dtype = "auto",
        device: str | torch.device | None = None,
        engine_config: EngineConfig | None = None,
        tensor_parallel_size: int | None = None,
    ) -> None:
        if tensor_parallel_size is not None:
            engine_config = replace(engine_config or EngineConfig(), tensor_parallel_size=tensor_parallel_size)
        self.checkpoint = resolve_checkpoint(model)
        self.dtype = parse_dtype(dtype, load_model_config(self.checkpoint))
        self.device = resolve_device(device)
        self.engine_name = engine if engine is not None else default_engine_name(self.device)
        self.engine = build_engine(self.engine_name, self.checkpoint, engine_config, self.dtype, self.device)
        self._tokenizer = None

    def shutdown(self) -> None:
        """End the engine's worker processes (tensor parallelism); a no-op for single-process engines."""
        shutdown = getattr(self.engine, "shutdown", None)
        if shutdown is not None:
            shutdown()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown()

    @property
    def tokenizer(self):  # -> transformers.PreTrainedTokenizerBase
        if self._tokenizer is None:
            self._tokenizer = load_tokenizer(self.checkpoint)
        return self._tokenizer

    def has_tokenizer(self) -> bool:
        return has_tokenizer(self.checkpoint)

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
        return [replace(output, text=self.tokenizer.decode(list(output.token_ids))) for output in outputs]


def has_tokenizer(checkpoint: Path) -> bool:
    return any(checkpoint.glob("tokenizer*"))


def load_tokenizer(checkpoint: Path):  # -> transformers.PreTrainedTokenizerBase
    """The checkpoint's own tokenizer, through transformers."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(checkpoint))
    except Exception as error:  # transformers raises many types here; all mean "no usable tokenizer"
        raise ConfigError(f"checkpoint {checkpoint} has no usable tokenizer: {error}") from error


def _as_prompt_list(prompts: Prompt | Sequence[Prompt]) -> list[Prompt]:
    if isinstance(prompts, str):
        return [prompts]
    prompts = list(prompts)
    if not prompts:
        raise InvalidRequestError("no prompts given")
    if all(isinstance(p, int) and not isinstance(p, bool) for p in prompts):
        return [prompts]  # a single prompt of token ids
    return prompts
