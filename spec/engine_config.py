"""Engine configuration shared by both engines: KV pool geometry and scheduler limits."""

from __future__ import annotations

from dataclasses import dataclass, replace

from spec.errors import ConfigError
from spec.model_config import ModelConfig


@dataclass(frozen=True)
class EngineConfig:
    """Limits the scheduler and block allocator work within, validated at construction.

    block_size: tokens per KV block (a power of two).
    num_blocks: KV blocks in the pool (per layer; every layer shares the block tables).
    max_num_seqs: most requests running at once.
    max_num_batched_tokens: most tokens computed in one step (prefill chunks plus decodes).
    max_model_len: longest sequence (prompt plus output) a request may reach; None means the
        model's max_position_embeddings (see `resolved`).
    enable_prefix_caching: reuse full KV blocks across requests by their chained content hash.
    check_invariants: check the spec invariants after every scheduling decision and step
        (slow; used by tests and fuzzers).
    """

    block_size: int = 16
    num_blocks: int = 1024
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    max_model_len: int | None = None
    enable_prefix_caching: bool = True
    check_invariants: bool = False

    def __post_init__(self) -> None:
        for name in ("block_size", "num_blocks", "max_num_seqs", "max_num_batched_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"engine setting {name!r} must be a positive integer, got {value!r}")
        if self.block_size & (self.block_size - 1):
            raise ConfigError(f"block_size must be a power of two, got {self.block_size}")
        if self.max_model_len is not None and (not isinstance(self.max_model_len, int) or self.max_model_len < 2):
            raise ConfigError(f"max_model_len must be an integer >= 2, got {self.max_model_len!r}")

    def resolved(self, model: ModelConfig) -> "EngineConfig":
        """This configuration with max_model_len filled in and checked against the model."""
        if self.max_model_len is None:
            return replace(self, max_model_len=model.max_position_embeddings)
        if self.max_model_len > model.max_position_embeddings:
            raise ConfigError(
                f"max_model_len {self.max_model_len} exceeds the model's max_position_embeddings "
                f"{model.max_position_embeddings}"
            )
        return self

    @property
    def model_len(self) -> int:
        if self.max_model_len is None:
            raise ConfigError("max_model_len is unresolved: call EngineConfig.resolved(model_config) first")
        return self.max_model_len

    def blocks_for_tokens(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)
