"""Engine configuration shared by both engines: KV pool geometry and scheduler limits."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TypeVar

from spec.errors import ConfigError
from spec.model_config import ModelConfig
from spec.speculative import SpeculativeConfig

DEFAULT_NUM_BLOCKS = 1024


@dataclass(frozen=True)
class BatchDefaults:
    """What an engine uses where EngineConfig leaves a batch setting None: each engine passes its own,
    for its device, to `EngineConfig.resolved` (the fast engine's on CUDA are its measured fastest)."""

    max_num_seqs: int
    max_num_batched_tokens: int
    async_scheduling: bool


# The reference engine everywhere, and the fast engine through Triton's CPU interpreter: small batches,
# whose buffers and warm-up cost little where every step is slow anyway.
SMALL_BATCHES = BatchDefaults(max_num_seqs=64, max_num_batched_tokens=2048, async_scheduling=False)


@dataclass(frozen=True)
class EngineConfig:
    """Limits the scheduler and block allocator work within, validated at construction.

    block_size: tokens per KV block (a power of two).
    num_blocks: KV blocks in the pool (per layer); None: sized from GPU memory by the fast engine on CUDA.
        Every layer shares the block tables. None: the fast engine on a GPU sizes the pool from free
        memory (gpu_memory_utilization); every other engine and device uses DEFAULT_NUM_BLOCKS. Give
        the same number to engines compared side by side, so that their scheduling decisions are identical.
        A number given is the pool: on a GPU it must fit in the free memory (gpu_memory_utilization does not
        apply to it).
    max_num_seqs: most requests running at once; None: 256 for the fast engine on CUDA, else 64.
        None (the default): the engine's own for its device (BatchDefaults): 256 for the fast engine on
        CUDA, 64 for the reference engine and on the CPU. The engine's `config` holds the resolved value.
    max_num_batched_tokens: most tokens computed in one step; None: 16384 for the fast engine on CUDA, else 2048.
        Prefill chunks plus decodes. None (the default): the engine's own for its device (BatchDefaults).
    max_model_len: longest sequence (prompt plus output) a request may reach; None: the model's maximum.
        None means the model's max_position_embeddings (see `resolved`).
    enable_prefix_caching: reuse full KV blocks across requests by their chained content hash.
    check_invariants: check the spec invariants after every scheduling decision and step
        (slow; used by tests and fuzzers).
    gpu_memory_utilization: fraction of the GPU's memory the fast engine may use in all (weights,
        activations, KV pool) when it sizes the pool itself (num_blocks None).
    enable_cuda_graphs: the fast engine on a GPU replays decode steps from captured CUDA graphs.
    batch_invariant: the fast engine computes each request's output bit for bit the same whatever
        batch it runs in (its own matmul kernel with a fixed reduction order, one attention kernel
        with fixed tiles for prefill and decode); slower. The reference engine ignores it.
    tensor_parallel_size: GPUs (ranks, one process each) the fast engine splits the model across;
        1 is a single process.
    async_scheduling: the fast engine plans, loads and launches step n+1 while the device runs step n; None: on.
        None (the default): on for the fast engine on every device; the reference engine ignores it.
        It plans ahead in the steps where no request's finish depends on the value of the token step n
        samples (no stop or end-of-sequence id can end it: ignore_eos and no stop_token_ids), and
        loads step n+1's inputs then (its decode tokens filled in on the device); where step
        n asks no logprobs and step n+1 could go ahead too, step n+1 is launched before step n's
        tokens are read. Its plans are then those of the step-by-step engine, but for an abort,
        between steps, of a request in the plan made ahead (fast.scheduler.Scheduler.drop_from_plan)
        and a request added while a step is launched ahead (it joins the step after that one).
        The reference engine ignores it.
    programmatic_dependent_launch: Triton kernels start as the one before ends; None: where supported (sm90+).
        None (the default): on wherever the device supports it (CUDA, compute capability 9.0 or
        newer, a Triton with griddepcontrol); True: required (else a ConfigError at start); False:
        off. Each kernel waits for its predecessor's results before touching memory, so outputs
        are the same bits. The fast engine's `config` holds the resolved value. The reference
        engine ignores it.
    fused_all_reduce_norm: the fast engine's tensor-parallel all-reduces fused with the add + RMSNorm after them.
        The all-reduce after o_proj and after down runs in one kernel with the residual add +
        RMSNorm that follows it, where the symmetric-memory one-shot all-reduce is set up (CUDA
        GPUs of one host) and the message is decode-sized (fast/kernels/all_reduce_norm.py); the
        sum is taken in rank order in fp32 and rounded once. Elsewhere, and with one rank, it
        changes nothing. The reference engine ignores it.
    speculative: speculative decoding (spec.speculative.SpeculativeConfig); None: off.
        Decoding requests carry up to K drafted tokens, verified in one chunk by the model itself;
        the output is the output without speculation (spec.speculative says how exactly). With
        async scheduling, a step goes ahead only when it verifies no draft (its accepted count is
        known once its tokens are read) and no request can propose in the next step (told from
        counts: the acceptance gates and the step's decoding chunks); the others run step by step.
    """

    block_size: int = 16
    num_blocks: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    max_model_len: int | None = None
    enable_prefix_caching: bool = True
    check_invariants: bool = False
    gpu_memory_utilization: float = 0.9
    enable_cuda_graphs: bool = True
    batch_invariant: bool = False
    tensor_parallel_size: int = 1
    async_scheduling: bool | None = None
    programmatic_dependent_launch: bool | None = None
    fused_all_reduce_norm: bool = False
    speculative: SpeculativeConfig | None = None

    def __post_init__(self) -> None:
        for name in ("block_size", "num_blocks", "max_num_seqs", "max_num_batched_tokens", "tensor_parallel_size"):
            value = getattr(self, name)
            if value is None and name in _RESOLVED_BY_ENGINE:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"engine setting {name!r} must be a positive integer, got {value!r}")
        utilization = self.gpu_memory_utilization
        if isinstance(utilization, bool) or not isinstance(utilization, (int, float)) or not 0 < utilization <= 1:
            raise ConfigError(f"gpu_memory_utilization must be in (0, 1], got {utilization!r}")
        switches = (
            "enable_prefix_caching", "check_invariants", "enable_cuda_graphs", "batch_invariant", "async_scheduling",
            "programmatic_dependent_launch", "fused_all_reduce_norm",
        )  # fmt: skip
        for name in switches:
            value = getattr(self, name)
            if value is None and name in _RESOLVED_BY_ENGINE:
                continue
            if not isinstance(value, bool):
                also = f" (or None: {_RESOLVED_BY_ENGINE[name]})" if name in _RESOLVED_BY_ENGINE else ""
                raise ConfigError(f"engine setting {name!r} must be a bool{also}, got {value!r}")
        if self.block_size & (self.block_size - 1):
            raise ConfigError(f"block_size must be a power of two, got {self.block_size}")
        if self.max_model_len is not None and (not isinstance(self.max_model_len, int) or self.max_model_len < 2):
            raise ConfigError(f"max_model_len must be an integer >= 2, got {self.max_model_len!r}")
        if self.speculative is not None:
            if not isinstance(self.speculative, SpeculativeConfig):
                raise ConfigError(
                    f"engine setting 'speculative' must be a SpeculativeConfig or None, got {self.speculative!r}"
                )

    def resolved(
        self, model: ModelConfig, num_blocks: int | None = None, batches: BatchDefaults = SMALL_BATCHES
    ) -> EngineConfig:
        """This configuration with max_model_len (checked against the model), num_blocks and the batch
        settings left None filled in.

        num_blocks: the pool size an engine chose itself (used only when num_blocks is None here);
        otherwise DEFAULT_NUM_BLOCKS.
        batches: the engine's defaults for its device, for the batch settings left None.
        """
        max_model_len = self.max_model_len if self.max_model_len is not None else model.max_position_embeddings
        if max_model_len > model.max_position_embeddings:
            raise ConfigError(
                f"max_model_len {max_model_len} exceeds the model's max_position_embeddings "
                f"{model.max_position_embeddings}"
            )
        pool = self.num_blocks if self.num_blocks is not None else (num_blocks or DEFAULT_NUM_BLOCKS)
        return replace(
            self,
            max_model_len=max_model_len,
            num_blocks=pool,
            max_num_seqs=_given_or(self.max_num_seqs, batches.max_num_seqs),
            max_num_batched_tokens=_given_or(self.max_num_batched_tokens, batches.max_num_batched_tokens),
            async_scheduling=_given_or(self.async_scheduling, batches.async_scheduling),
        )

    def for_draft_model(self) -> EngineConfig:
        """The settings of the engine that runs a draft model (spec.speculative.DraftModelProposer) for an
        engine with these (resolved) settings: the same block size, pool size, batch limits, context and
        batch-invariant mode, on one device, with no speculation of its own and no invariant checks."""
        return replace(
            self, speculative=None, check_invariants=False, tensor_parallel_size=1, fused_all_reduce_norm=False
        )

    @property
    def pool_blocks(self) -> int:
        if self.num_blocks is None:
            raise ConfigError("num_blocks is unresolved: call EngineConfig.resolved(model_config) first")
        return self.num_blocks

    @property
    def model_len(self) -> int:
        if self.max_model_len is None:
            raise ConfigError("max_model_len is unresolved: call EngineConfig.resolved(model_config) first")
        return self.max_model_len

    def blocks_for_tokens(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)


T = TypeVar("T")

# Settings whose None an engine resolves, with what None means (for the validation errors).
_RESOLVED_BY_ENGINE = {
    "num_blocks": "the engine sizes the pool",
    "max_num_seqs": "the engine's default for its device",
    "max_num_batched_tokens": "the engine's default for its device",
    "async_scheduling": "the engine's default",
    "programmatic_dependent_launch": "where the device supports it",
}


def _given_or(value: T | None, default: T) -> T:
    return default if value is None else value
