"""twinfer's public entry point: `from twinfer import LLM, SamplingParams`."""

from spec.engine_config import EngineConfig
from spec.sampling_params import SamplingParams
from spec.speculative import SpeculativeConfig
from twinfer.llm import LLM

__all__ = ["LLM", "EngineConfig", "SamplingParams", "SpeculativeConfig"]
