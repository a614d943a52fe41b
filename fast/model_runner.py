"""Owns the fast model on its device: weights, KV pool, input buffers, attention, CUDA graphs.

`run(sequences)` computes one step's logits, only for the rows that sample (and the prompt rows
whose logprobs were asked for): eagerly for mixed steps, from a captured graph for decode steps. They
come as fast.logits.StepLogits: the fp32 rows, and each row's max and argmax where the LM head computed
them (fast.model.HEAD_WITH_ROW_MAX), for the sampler.

On a GPU with `EngineConfig.num_blocks` None, the KV pool is sized from free memory: a warm-up
forward of a full token budget (max_num_batched_tokens in one chunk) measures the activation
peak, and the pool takes what `gpu_memory_utilization` leaves after weights and that peak.

Tensor parallelism (`groups` given): every rank builds a runner over its shard (fast.weights.ShardLayout)
in the same order, so their collectives meet: the pool size is agreed (the smallest wins), and the
decode graphs are captured with their all-reduces inside. Rank 0 calls `run`, which sends the
step's packed inputs to the other ranks once (fast.parallel.StepChannel) before its forward; the
other ranks sit in `serve`, replaying each step from those inputs, until rank 0 sends stop.
"""

from __future__ import annotations

import functools
import gc
import logging
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import NamedTuple

import torch
import triton

from fast.attention import PagedAttention, StepMetadata
from fast.cuda_graphs import DecodeGraphs
from fast.input_batch import InputBatch, SequenceInput, StepShape
from fast.kernels.pdl import resolve_pdl
from fast.kv_cache import KVCache
from fast.logits import StepLogits
from fast.model import SMALL_BATCH_ROWS, FastCausalLM
from fast.parallel import Collectives, ProcessGroups, StepChannel, StepCommand, StepHeader, TensorParallelError
from fast.sharded_loading import WeightSource
from fast.weights import ModelWeights, ShardLayout, pack_weights
from spec.engine_config import SMALL_BATCHES, BatchDefaults, EngineConfig
from spec.errors import ConfigError
from spec.model_config import ModelConfig

logger = logging.getLogger(__name__)


def small_batch_gemv_enabled(device: torch.device, batch_invariant: bool) -> bool:
    """Whether the model runs decode-sized projections through the GEMV kernel (fast.model).

    On CUDA only (on the CPU Triton interprets each program in Python, far slower than torch's
    matmul), and never in batch-invariant mode (the GEMV's reduction order depends on the rows).
    """
    return device.type == "cuda" and not batch_invariant


@dataclass
class StartupTimings:
    """Seconds each phase of a runner's start-up took (on a GPU each ends synchronised): packing the
    weights, sizing the KV pool (its warm-up forward of a full token budget), capturing the decode
    graphs and compiling the kernels' remaining variants. Logged at INFO; the bench records keep them."""

    weights_s: float = 0.0
    pool_s: float = 0.0
    graphs_s: float = 0.0
    kernels_s: float = 0.0
    num_graphs: int = 0

    @property
    def total_s(self) -> float:
        return self.weights_s + self.pool_s + self.graphs_s + self.kernels_s

    @contextmanager
    def timing(self, phase: str) -> Iterator[None]:
        """Adds the seconds of the block to the field `phase` (weights_s, pool_s, graphs_s or kernels_s)."""
        started = time.perf_counter()
        yield
        setattr(self, phase, getattr(self, phase) + time.perf_counter() - started)


class PoolRoom(NamedTuple):
    """KV blocks that fit beside weights and activations: within gpu_memory_utilization of the GPU's memory (the
    pool the engine sizes itself), and in the memory free now (the most a pool given explicitly may take)."""

    utilization_blocks: int
    free_blocks: int


@dataclass(frozen=True)
class PreparedStep:
    """A step whose inputs `load_step` loaded: its shape, the CUDA-graph batch size it replays (0: an
    eager forward pass), the logit rows it returns, and whether its graph is a verify graph."""

    shape: StepShape
    graph_size: int
    num_rows: int
    verify: bool = False


# Verify graphs (speculative decoding) are captured for steps of up to this many sequences. Every chunk of
# such a step is padded to 1 + K tokens, so a plain decode row costs K more rows there: worth it in
# small steps, where launching each kernel costs more than the rows (an eager verify step took about 9 ms
# at qwen3-0.6b's shape on an H200 against 0.94 ms for a graph-replayed decode step:
# reports/results/bench/final_session3/); the acceptance gate keeps large steps (32 decoding requests,
# spec.speculative.AcceptanceGate) from proposing anyway.
MAX_VERIFY_GRAPH_BATCH = 32


def verify_graph_batch(max_step_seqs: int, max_num_batched_tokens: int, num_speculative_tokens: int) -> int:
    """The largest verify graph's batch size (0: none): every sequence of it brings 1 + K tokens."""
    if num_speculative_tokens < 1:
        return 0
    return min(max_step_seqs, MAX_VERIFY_GRAPH_BATCH, max_num_batched_tokens // (1 + num_speculative_tokens))


def load_step(
    inputs: InputBatch,
    sequences: list[SequenceInput],
    decode_graphs: DecodeGraphs | None,
    verify_graphs: DecodeGraphs | None = None,
) -> PreparedStep:
    """Load a step's inputs into `inputs`, padded to the CUDA graph it will replay, if one fits:
    - a decode step (one token and one logit row per sequence) of at most decode_graphs' largest size:
      padding sequences up to the next captured size;
    - else a step whose every chunk has at most 1 + K tokens (verify chunks of speculative decoding,
      decode rows beside them, short prompts) and whose padded chunks stay within max_model_len, of
      at most verify_graphs' largest size: every chunk padded to 1 + K tokens and padding sequences
      up to the next captured size (InputBatch.load with query_len).
    Otherwise the step runs eagerly, unpadded."""
    is_decode = all(len(s.token_ids) == 1 and len(s.logit_offsets) == 1 for s in sequences)
    if decode_graphs is not None and is_decode and len(sequences) <= decode_graphs.max_batch:
        size = decode_graphs.size_for(len(sequences))
        return PreparedStep(inputs.load(sequences, pad_to=size), size, len(sequences))
    if verify_graphs is not None and len(sequences) <= verify_graphs.max_batch:
        query_len = verify_graphs.query_len
        longest = inputs.max_seq_len
        if all(len(s.token_ids) <= query_len and s.start + query_len <= longest for s in sequences):
            size = verify_graphs.size_for(len(sequences))
            num_rows = sum(len(s.logit_offsets) for s in sequences)
            return PreparedStep(inputs.load(sequences, pad_to=size, query_len=query_len), size, num_rows, True)
    shape = inputs.load(sequences)
    return PreparedStep(shape, 0, shape.num_logit_rows)


# The fast engine's batch settings where EngineConfig leaves them None. On CUDA: the settings measured
# fastest on an H200 for offline-256 and decode-bs1 (reports/results/bench/defaults_f76b950/: a 16384-token
# budget gave 23,200 tok/s against 22,114 with 8192; decode-bs1 did not move); the budget and the batch
# limit cost memory (input buffers, the warm-up's logits, CUDA graphs), nothing per step. Through the
# interpreter: small batches, and async scheduling as on CUDA, so that the CPU tests take the users' path.
CUDA_BATCHES = BatchDefaults(max_num_seqs=256, max_num_batched_tokens=16384, async_scheduling=True)
INTERPRETER_BATCHES = replace(SMALL_BATCHES, async_scheduling=True)


def device_settings(
    engine_config: EngineConfig, model_config: ModelConfig, device: torch.device, num_blocks: int | None = None
) -> EngineConfig:
    """engine_config resolved for the model and the device (EngineConfig.resolved, with the batch defaults
    of the device), and programmatic dependent launch as the device allows (None becomes True or False;
    True where it cannot run is a ConfigError)."""
    pdl = resolve_pdl(engine_config.programmatic_dependent_launch, device)
    batches = CUDA_BATCHES if device.type == "cuda" else INTERPRETER_BATCHES
    return replace(engine_config.resolved(model_config, num_blocks, batches), programmatic_dependent_launch=pdl)


class ModelRunner:
    def __init__(
        self,
        model_config: ModelConfig,
        weights: Mapping[str, torch.Tensor] | WeightSource,
        engine_config: EngineConfig,
        dtype: torch.dtype,
        device: torch.device,
        groups: ProcessGroups | None = None,
        allow_one_shot: bool = True,
    ) -> None:
        """weights: the checked state dict, or a source each rank packs its own shard from.
        groups: this rank's tensor-parallel process groups; None for a single process.
        allow_one_shot: False keeps every all-reduce on NCCL (for measurements)."""
        self.model_config = model_config
        self.device = device
        self.dtype = dtype
        self.groups = groups
        if groups is None:
            self.layout, self.collectives = ShardLayout.single(model_config), None
        else:
            self.layout = ShardLayout.for_rank(model_config, groups.rank, groups.world_size)
            self.collectives = Collectives(
                groups, dtype, model_config.vocab_size, allow_one_shot, engine_config.fused_all_reduce_norm
            )
        # Its pool size is provisional until measured; a ConfigError for PDL asked for and impossible
        # comes here, before anything is built.
        settings = device_settings(engine_config, model_config, device)
        pdl = settings.programmatic_dependent_launch
        self.block_size = settings.block_size
        self.max_blocks_per_seq = triton.cdiv(settings.model_len, settings.block_size)
        # Every sequence in a step brings at least one token, and at most max_num_seqs run.
        self.max_step_seqs = min(settings.max_num_seqs, settings.max_num_batched_tokens)
        # Rows a step samples: one per sequence, or with speculative decoding one per verify position.
        drafts = settings.speculative.num_speculative_tokens if settings.speculative is not None else 0
        self.max_sample_rows = min(self.max_step_seqs * (1 + drafts), settings.max_num_batched_tokens)
        # Verify steps of padded chunks (speculative decoding), in CUDA graphs on one device only: the other
        # ranks of a tensor-parallel group replay what rank 0 names by batch size, which would not tell them
        # from decode graphs. Their attention's workspace is sized for them wherever they can run.
        graphs_on = device.type == "cuda" and settings.enable_cuda_graphs
        verify_batch = verify_graph_batch(self.max_step_seqs, settings.max_num_batched_tokens, drafts)
        verify_batch = verify_batch if groups is None else 0
        self.startup = StartupTimings()
        with self.startup.timing("weights_s"):
            packed = self._pack(weights)
        self.model = FastCausalLM(
            model_config,
            packed,
            settings.model_len,
            device,
            settings.batch_invariant,
            self.layout,
            self.collectives,
            small_batch_gemv=small_batch_gemv_enabled(device, settings.batch_invariant),
            pdl=pdl,
        )
        self.attention = PagedAttention(
            self.layout.num_heads,
            self.layout.num_kv_heads,
            model_config.head_dim,
            self.max_step_seqs,
            settings.model_len,
            device,
            settings.batch_invariant,
            pdl=pdl,
            verify_seqs=verify_batch,
            verify_query_len=1 + drafts,
        )
        with self.startup.timing("pool_s"):
            pool_blocks = self._pool_blocks(engine_config, settings)
        self.config = device_settings(engine_config, model_config, device, pool_blocks)
        self.cache = self._make_cache(self.config.pool_blocks)
        self.inputs = InputBatch(
            settings.max_num_batched_tokens,
            self.max_step_seqs,
            self.max_blocks_per_seq,
            self.block_size,
            self.cache.padding_block,
            device,
            settings.model_len,
        )
        self.channel = StepChannel(groups) if groups is not None else None
        # Ranks > 0: the sampled tokens rank 0 shares after a step (async scheduling), which the
        # pending rows of the step after it are filled from. None without tensor parallelism.
        self._shared_tokens: torch.Tensor | None = None
        if groups is not None:
            self._shared_tokens = torch.zeros(self.max_step_seqs, dtype=torch.int64, device=device)
        self.graphs: DecodeGraphs | None = None
        self.verify_graphs: DecodeGraphs | None = None
        if graphs_on:
            with self.startup.timing("graphs_s"):
                self.graphs = DecodeGraphs(self.max_step_seqs)
                self.graphs.capture(self._load_padding, self._decode_forward, self.attention.graph_contexts)
                if verify_batch:  # one tensor-parallel rank, with speculative decoding
                    self.verify_graphs = DecodeGraphs(verify_batch, query_len=1 + drafts)
                    self.verify_graphs.capture(
                        self._load_verify_padding,
                        self._verify_forward,
                        functools.partial(self.attention.graph_contexts, query_len=1 + drafts),
                    )
            self.startup.num_graphs = self.graphs.num_graphs + (
                self.verify_graphs.num_graphs if self.verify_graphs is not None else 0
            )
        if device.type == "cuda":
            with self.startup.timing("kernels_s"):
                self._compile_kernels()
        self._log_startup()
        if self.collectives is not None:
            self._check_ranks_agree()

    def _log_startup(self) -> None:
        timings = self.startup
        logger.info(
            "runner started in %.2f s: weights %.2f s, KV pool sizing %.2f s, %d CUDA graphs %.2f s, kernels %.2f s",
            timings.total_s,
            timings.weights_s,
            timings.pool_s,
            timings.num_graphs,
            timings.graphs_s,
            timings.kernels_s,
        )

    def _pack(self, weights: Mapping[str, torch.Tensor] | WeightSource) -> ModelWeights:
        if isinstance(weights, Mapping):
            return pack_weights(self.model_config, weights, self.dtype, self.device, self.layout)
        return weights.pack(self.model_config, self.dtype, self.device, self.layout)

    def _check_ranks_agree(self) -> None:
        """Start-up barrier: every rank has built its runner, with the same pool."""
        pool = self.config.pool_blocks
        if self.collectives.agree_min(pool) != pool or -self.collectives.agree_min(-pool) != pool:
            raise TensorParallelError(
                f"rank {self.layout.rank} built a KV pool of {pool} blocks; another rank's differs"
            )

    # -- one step ------------------------------------------------------------------------------

    @torch.inference_mode()
    def run(self, sequences: list[SequenceInput]) -> StepLogits:
        """The sequences' logit rows, in order: fp32 logits [R, vocab] and, where the head computed it, their RowMax."""
        return self.launch(self.prepare(sequences))

    def prepare(self, sequences: list[SequenceInput]) -> PreparedStep:
        """Load the step's inputs into the device buffers (queued); `launch` runs it. Between the two,
        the inputs may be completed on the device (InputBatch.set_pending_tokens)."""
        return load_step(self.inputs, sequences, self.graphs, self.verify_graphs)

    def launch(self, prepared: PreparedStep, num_shared: int = 0) -> StepLogits:
        """The forward pass of the step `prepare` loaded last (a graph replay for graph-sized decode steps).
        num_shared: under tensor parallelism, the number of tokens `share_tokens` will share after this
        step (the other ranks wait for them once they have run it)."""
        if self.channel is not None:
            self._send_step(prepared.shape, prepared.graph_size, num_shared)
        if prepared.verify:
            size, query_len = prepared.graph_size, self.verify_graphs.query_len
            context = self.attention.decode_context(size, prepared.shape.max_seq_len, query_len)
            step = self.verify_graphs.replay(size, context)
        elif prepared.graph_size:
            step = self._replay(prepared.graph_size, prepared.shape.max_seq_len)
        else:
            step = self._forward(prepared.shape)
        return step.rows(slice(None, prepared.num_rows))  # a padded graph's real rows, head_max's too

    def _replay(self, size: int, max_seq_len: int) -> StepLogits:
        """The decode graph of this batch size for a step whose longest sequence has max_seq_len keys."""
        return self.graphs.replay(size, self.attention.decode_context(size, max_seq_len))

    def _forward(self, shape: StepShape) -> StepLogits:
        inputs = self.inputs
        return self.model.forward(
            inputs.token_ids[: shape.num_tokens],
            inputs.positions[: shape.num_tokens],
            inputs.slots[: shape.num_tokens],
            self.attention.for_step(self._metadata(shape)),
            self.cache,
            inputs.logit_indices[: shape.num_logit_rows],
        )

    # -- tensor parallelism ------------------------------------------------------------------------

    def _send_step(self, shape: StepShape, graph_size: int, num_shared: int) -> None:
        """Rank 0: the step's packed inputs (and its pending rows) to the other ranks, before its own forward."""
        inputs = self.inputs
        words = inputs.words_to_send()
        header = StepHeader(
            StepCommand.STEP,
            shape.num_tokens,
            shape.num_logit_rows,
            shape.num_seqs,
            inputs.table_width,
            shape.max_query_len,
            shape.max_seq_len,
            graph_size,
            words,
            inputs.num_pending,
            num_shared,
        )
        self.channel.send(header, inputs.host)

    def share_tokens(self, tokens: torch.Tensor) -> None:
        """Rank 0, after sampling a step launched with num_shared = len(tokens): the tokens to the other ranks."""
        if self.collectives is not None:
            self.collectives.share_tokens(tokens)

    @torch.inference_mode()
    def serve(self) -> None:
        """Ranks > 0: run each step rank 0 sends, until it sends stop. The logits are dropped (rank 0 samples)."""
        if self.channel is None:
            raise TensorParallelError("serve() is for the ranks > 0 of a tensor-parallel group")
        inputs = self.inputs
        while True:
            inputs.wait_for_upload()
            header = self.channel.receive(inputs.host)
            if header.command is StepCommand.STOP:
                return
            inputs.load_received(header.num_tokens, header.num_logit_rows, header.num_seqs, header.table_width)
            inputs.apply_received_pending(header.num_pending, self._shared_tokens)
            if header.graph_size:
                if self.graphs is None:
                    raise TensorParallelError("rank 0 replays a CUDA graph that this rank did not capture")
                self._replay(header.graph_size, header.max_seq_len)
            else:
                decode = header.max_query_len == 1
                self._forward(
                    StepShape(
                        header.num_tokens,
                        header.num_seqs,
                        header.num_logit_rows,
                        header.max_query_len,
                        decode,
                        header.max_seq_len,
                    )
                )
            if header.num_shared:
                self.collectives.share_tokens(self._shared_tokens[: header.num_shared])

    def release_graphs(self, synchronize: bool = True) -> None:
        """Destroy the decode graphs (before tensor parallelism's process groups are destroyed: see
        DecodeGraphs.release). Decode steps run eagerly afterwards. Without synchronize (a rank has
        failed, and the device may be waiting for it) the graphs go without waiting for the GPU."""
        if self.graphs is None:
            return
        if synchronize:
            torch.cuda.synchronize(self.device)
        self.graphs.release()
        self.graphs = None

    def describe_parallel(self) -> dict[str, object]:
        """Tensor-parallel facts for records: the size, and which all-reduce paths were set up and issued."""
        if self.collectives is None:
            return {"world_size": 1}
        return self.collectives.describe()

    def _metadata(self, shape: StepShape) -> StepMetadata:
        inputs = self.inputs
        query_len = 1 if shape.is_decode else shape.padded_query_len
        return StepMetadata(
            query_len=query_len,
            num_seqs=shape.num_seqs,
            max_query_len=shape.max_query_len,
            decode_context=self.attention.decode_context(shape.num_seqs, shape.max_seq_len, max(1, query_len)),
            block_tables=inputs.block_tables[: shape.num_seqs],
            seq_lens=inputs.seq_lens[: shape.num_seqs],
            cu_seqlens_q=inputs.cu_seqlens_q[: shape.num_seqs + 1],
        )

    # -- CUDA graphs -----------------------------------------------------------------------------

    def _load_padding(self, size: int) -> None:
        self.inputs.load([], pad_to=size)

    def _decode_forward(self, size: int, context: int) -> StepLogits:
        # A step whose longest sequence fills the context: the graph's decode launch bound is `context`.
        metadata = self._metadata(StepShape(size, size, size, 1, True, context))
        inputs = self.inputs
        return self.model.forward(
            inputs.token_ids[:size],
            inputs.positions[:size],
            inputs.slots[:size],
            self.attention.for_step(metadata),
            self.cache,
            None,
        )

    def _load_verify_padding(self, size: int) -> None:
        self.inputs.load([], pad_to=size, query_len=self.verify_graphs.query_len)

    def _verify_forward(self, size: int, context: int) -> StepLogits:
        """The forward of `size` padded chunks of 1 + K tokens, logits for all of their rows (the real ones
        first: InputBatch._load_padded_chunks), the decode attention launched for keys up to context (the
        prefill kernel's grid, where the decode kernel does not take the step, depends on the sizes alone)."""
        query_len = self.verify_graphs.query_len
        num_tokens = size * query_len
        return self._forward(StepShape(num_tokens, size, num_tokens, query_len, False, context, query_len))

    @torch.inference_mode()
    def _compile_kernels(self) -> None:
        """Eager forwards that launch each Triton kernel with every argument pattern a step can give it.

        Triton compiles one variant per pattern of its integer arguments (equal to 1, a multiple of 16,
        other); the prefill kernel's query-block count takes all three across a workload. Compiling here,
        at start-up, keeps a second of compilation out of the first steps that meet a new pattern. The
        forwards use only the padding block (outside the allocator), so no request's cache is touched;
        every rank runs them in the same order (their all-reduces meet).
        """
        longest = min(self.inputs.max_num_tokens, self.config.model_len)
        middle = min(200, longest - 1)  # 200 queries: 2..13 query blocks for blocks of 16..128
        step_lengths = [[1], [longest], [max(1, middle)]]
        if self.max_step_seqs >= 2 and middle >= 1:
            step_lengths.append([middle, 1])  # a mixed step: a prefill chunk beside a decode row
        if self.model.small_batch_gemv:
            step_lengths.extend(self._small_batch_steps(longest))
        padding = self.cache.padding_block
        for lengths in step_lengths:
            sequences = [
                SequenceInput([0] * length, 0, [padding] * triton.cdiv(length, self.block_size), [length - 1])
                for length in lengths
            ]
            self._forward(self.inputs.load(sequences))
        torch.cuda.synchronize(self.device)

    def _small_batch_steps(self, longest: int) -> list[list[int]]:
        """Steps of 2..SMALL_BATCH_ROWS tokens, so every GEMV variant an eager step can meet is compiled.

        small_batch_linear compiles one variant per row tile (BLOCK_M = 1, 2, 4, 8, 16) and per
        Triton specialisation of the row count (1, a multiple of 16, other), for each projection
        shape. Graph capture compiles the graph sizes (DecodeGraphs.capture runs each size's forward
        eagerly before capturing it), but an eager step (a short prompt alone, or every decode step
        with CUDA graphs off) may bring any row count up to the limit: every count is run here
        (a few milliseconds each once compiled, rather than reasoning about which ones share a
        variant). Decode-shaped (one token per sequence, as eager decode runs them) where the step
        holds that many sequences, else one prefill chunk of that many tokens.
        """
        steps = []
        for rows in range(2, SMALL_BATCH_ROWS + 1):
            if rows <= self.max_step_seqs:
                steps.append([1] * rows)
            elif rows <= longest:
                steps.append([rows])
        return steps

    # -- memory ------------------------------------------------------------------------------------

    def _make_cache(self, num_blocks: int) -> KVCache:
        config = self.model_config
        return KVCache(
            config.num_hidden_layers,
            num_blocks,
            self.block_size,
            self.layout.num_kv_heads,
            config.head_dim,
            self.dtype,
            self.device,
        )

    def _pool_blocks(self, requested: EngineConfig, settings: EngineConfig) -> int | None:
        """The pool size: as requested (it must fit in the GPU's free memory), or sized from
        gpu_memory_utilization (EngineConfig). None on CPU (the default)."""
        if self.device.type != "cuda":
            return None
        # Collecting garbage (an engine dropped in a reference cycle holds its pool until collected) costs
        # ~0.3 s in a process with a large heap: an explicit pool collects only when it seems not to fit.
        # Ranks collect alike, since each room takes one collective per field.
        always_collect = requested.num_blocks is None or self.collectives is not None
        room = self._pool_room(settings, collect_garbage=always_collect)
        if self.collectives is not None:  # every rank gets the same pool: the smallest room wins
            room = PoolRoom(*(self.collectives.agree_min(blocks) for blocks in room))
        if requested.num_blocks is not None:
            if requested.num_blocks > room.free_blocks and not always_collect:
                room = self._pool_room(settings, collect_garbage=True)
            # A pool given explicitly is the user's own choice: gpu_memory_utilization sizes only the pool the
            # engine chooses (so a small pool on a GPU other processes share is not refused for their memory).
            if requested.num_blocks > room.free_blocks:
                raise ConfigError(
                    f"num_blocks {requested.num_blocks} does not fit in GPU memory: the free memory after weights "
                    f"and activations holds {room.free_blocks} blocks"
                )
            return requested.num_blocks
        affordable = room.utilization_blocks
        needed = triton.cdiv(settings.model_len, settings.block_size)
        if affordable < needed:
            raise ConfigError(
                f"the KV pool fits {affordable} blocks ({affordable * settings.block_size} tokens) in "
                f"gpu_memory_utilization {settings.gpu_memory_utilization}, less than one request of max_model_len "
                f"{settings.model_len} needs ({needed} blocks); lower max_model_len or raise gpu_memory_utilization"
            )
        return affordable

    def _pool_room(self, settings: EngineConfig, collect_garbage: bool) -> PoolRoom:
        """Blocks that fit after weights and a full-budget warm-up forward: within gpu_memory_utilization,
        and in the memory free now (after collecting garbage, if asked)."""
        config = self.model_config
        torch.cuda.synchronize(self.device)
        if collect_garbage:
            gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(self.device)
        before = torch.cuda.memory_allocated(self.device)
        # Sequences of at most max_model_len tokens: each may end in a partly filled block.
        warmup_blocks = triton.cdiv(settings.max_num_batched_tokens, settings.block_size) + triton.cdiv(
            settings.max_num_batched_tokens, settings.model_len
        )
        self._warmup(replace(settings, num_blocks=warmup_blocks))
        peak = torch.cuda.max_memory_allocated(self.device)
        torch.cuda.empty_cache()
        free, total = torch.cuda.mem_get_info(self.device)
        block_bytes = KVCache.bytes_per_block(
            config.num_hidden_layers, settings.block_size, self.layout.num_kv_heads, config.head_dim, self.dtype
        )
        warmup_cache_bytes = (warmup_blocks + 1) * block_bytes
        activation_peak = max(0, peak - before - warmup_cache_bytes)
        used = total - free  # weights, CUDA context, other processes
        budget = total * settings.gpu_memory_utilization - used - activation_peak
        blocks = int(budget // block_bytes) - 1  # one block is the padding block
        free_blocks = int((free - activation_peak) // block_bytes) - 1
        logger.info(
            "KV pool room: %d blocks (%.2f GiB) within gpu_memory_utilization, %d in free memory; "
            "activation peak %.2f GiB",
            blocks,
            blocks * block_bytes / 2**30,
            free_blocks,
            activation_peak / 2**30,
        )
        return PoolRoom(max(0, blocks), max(0, free_blocks))

    @torch.inference_mode()
    def _warmup(self, settings: EngineConfig) -> None:
        """One forward of max_num_batched_tokens tokens in a single chunk, on a throwaway cache."""
        cache = self._make_cache(settings.pool_blocks)
        budget = settings.max_num_batched_tokens
        # The budget's tokens as sequences of at most max_model_len each, every position asking for
        # logits (a step scoring prompt logprobs can), so the peak covers the largest possible step.
        lengths = [min(settings.model_len, budget - start) for start in range(0, budget, settings.model_len)]
        sequences, first_block = [], 0
        for length in lengths:
            num_blocks = triton.cdiv(length, self.block_size)
            sequences.append(
                SequenceInput([0] * length, 0, list(range(first_block, first_block + num_blocks)), list(range(length)))
            )
            first_block += num_blocks
        inputs = InputBatch(
            budget, len(sequences), self.max_blocks_per_seq, self.block_size, cache.padding_block, self.device
        )
        shape = inputs.load(sequences)
        attention = PagedAttention(
            self.layout.num_heads,
            self.layout.num_kv_heads,
            self.model_config.head_dim,
            len(sequences),
            settings.model_len,
            self.device,
        )
        metadata = StepMetadata(
            0,
            shape.num_seqs,
            shape.max_query_len,
            settings.model_len,
            inputs.block_tables[: shape.num_seqs],
            inputs.seq_lens[: shape.num_seqs],
            inputs.cu_seqlens_q[: shape.num_seqs + 1],
        )
        self.model.forward(
            inputs.token_ids[: shape.num_tokens],
            inputs.positions[: shape.num_tokens],
            inputs.slots[: shape.num_tokens],
            attention.for_step(metadata),
            cache,
            inputs.logit_indices[: shape.num_logit_rows],
        )
        # The sampler's peak: sorting fp32 logits of a full decode batch (top-k / top-p filters).
        logits = torch.zeros(
            (self.max_sample_rows, self.model_config.vocab_size), dtype=torch.float32, device=self.device
        )
        torch.sort(logits, dim=-1, descending=True, stable=True)
        torch.cuda.synchronize(self.device)
        del cache, inputs
