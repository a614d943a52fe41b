"""twinfer's specification: the data model and the rules both engines obey.

Everything the reference engine and the fast engine must agree on lives here: the model
configuration, checkpoint reading, sampling parameters and their exact semantics, the request
lifecycle and outputs, the engine configuration, the scheduling policy, and the block-allocator
and scheduler invariants as executable checks.
"""

from spec.engine_config import EngineConfig
from spec.errors import (
    CheckpointError,
    ConfigError,
    InvalidRequestError,
    InvariantViolation,
    SamplingParamsError,
    TwinferError,
)
from spec.model_config import ModelConfig, RopeScaling
from spec.request import FinishReason, RequestOutput, RequestStatus, TokenLogprobs
from spec.sampling_params import SamplingParams
from spec.speculative import SpeculativeConfig

__all__ = [
    "CheckpointError",
    "ConfigError",
    "EngineConfig",
    "FinishReason",
    "InvalidRequestError",
    "InvariantViolation",
    "ModelConfig",
    "RequestOutput",
    "RequestStatus",
    "RopeScaling",
    "SamplingParams",
    "SamplingParamsError",
    "SpeculativeConfig",
    "TokenLogprobs",
    "TwinferError",
]
