"""The reference engine: scheduler + paged KV cache + the plain-PyTorch model, one step at a time."""

from __future__ import annotations

from pathlib import Path

import torch

from reference.kv_cache import PagedKVCache
from reference.model import CausalLM, ForwardBatch, SequenceSlice
from reference.scheduler import Scheduler
from spec.checkpoint import load_state_dict, open_checkpoint
from spec.engine import SampledToken, ScheduledEngine, default_device, sampling_positions, step_results, token_logprobs
from spec.engine_config import EngineConfig
from spec.errors import ConfigError
from spec.model_config import ModelConfig
from spec.request import FinishLimits, Request, prompt_logprob_positions
from spec.sampling import SamplingRow, sample_tokens
from spec.scheduling import StepPlan, slot_of
from spec.speculative import DRAFT_MODEL, DraftModelProposer, DraftProposer, check_draft_vocabulary


class ReferenceEngine(ScheduledEngine):
    """add_request / step / abort / generate over token ids (spec.engine.ScheduledEngine), on the
    plain-PyTorch model: one forward pass per step, then spec.sampling on its logits."""

    def __init__(
        self,
        model_config: ModelConfig,
        state_dict: dict[str, torch.Tensor],
        engine_config: EngineConfig | None = None,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> None:
        self.model_config = model_config
        self.config = (engine_config or EngineConfig()).resolved(model_config)
        if self.config.tensor_parallel_size != 1:
            raise ConfigError(
                f"the reference engine runs on one device; tensor_parallel_size {self.config.tensor_parallel_size} "
                "is for the fast engine"
            )
        self.dtype = dtype
        self.device = torch.device(device) if device is not None else default_device()
        self.model = CausalLM(model_config).to(device=self.device, dtype=dtype)
        self.model.load_weights(state_dict)
        self.model.eval()
        self.cache = PagedKVCache(
            num_layers=model_config.num_hidden_layers,
            num_blocks=self.config.pool_blocks,
            block_size=self.config.block_size,
            num_kv_heads=model_config.num_key_value_heads,
            head_dim=model_config.head_dim,
            dtype=dtype,
            device=self.device,
        )
        self.scheduler = Scheduler(self.config, model_config.eos_token_ids, proposer=self._draft_model_proposer())
        self._init_requests()

    def _draft_model_proposer(self) -> DraftProposer | None:
        """speculative method "draft-model": the draft checkpoint in a reference engine of its own. None
        otherwise (the scheduler builds prompt lookup itself)."""
        speculative = self.config.speculative
        if speculative is None or speculative.method != DRAFT_MODEL:
            return None
        draft = ReferenceEngine.from_pretrained(
            speculative.draft_model, self.config.for_draft_model(), self.dtype, self.device
        )
        check_draft_vocabulary(draft.model_config.vocab_size, self.model_config.vocab_size, speculative.draft_model)
        return DraftModelProposer(draft)

    @classmethod
    def from_pretrained(
        cls,
        model: str | Path,
        engine_config: EngineConfig | None = None,
        dtype: str | torch.dtype = "auto",
        device: torch.device | str | None = None,
    ) -> ReferenceEngine:
        opened = open_checkpoint(model, dtype, device)
        state_dict = load_state_dict(opened.path, opened.config, opened.dtype, opened.device)
        return cls(opened.config, state_dict, engine_config, opened.dtype, opened.device)

    @torch.inference_mode()
    def execute(self, plan: StepPlan) -> dict[str, SampledToken]:
        """One forward pass over the plan's chunks: prompt positions that ask for prompt logprobs are
        scored, and the chunks that end a request's tokens sample its next token."""
        token_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        sequences: list[SequenceSlice] = []
        sampling_rows: list[int] = []
        sampling_requests: list[Request] = []
        scoring_rows: list[int] = []
        scored_positions: list[tuple[Request, int]] = []  # (request, prompt position whose logits score the next)
        block_size = self.config.block_size
        for chunk in plan.chunks:
            request = self.request(chunk.request_id)
            table = self.scheduler.allocator.block_table(chunk.request_id)
            span = range(chunk.start, chunk.start + chunk.num_tokens)
            query_start = len(token_ids)
            draft = chunk.draft_token_ids
            token_ids.extend(request.token_span(chunk.start, chunk.num_tokens - len(draft)))
            token_ids.extend(draft)  # a verify chunk: its last len(draft) tokens are the draft
            positions.extend(span)
            slots.extend(slot_of(table, p, block_size) for p in span)
            sequences.append(
                SequenceSlice(
                    query_start=query_start,
                    query_len=chunk.num_tokens,
                    context_len=chunk.start + chunk.num_tokens,
                    block_table=torch.tensor(table, dtype=torch.int64, device=self.device),
                )
            )
            for position in prompt_logprob_positions(request, chunk.start, chunk.num_tokens):
                scoring_rows.append(query_start + position - chunk.start)
                scored_positions.append((request, position))
            if chunk.samples:  # a verify chunk samples at its last token and at each draft position
                for offset in range(chunk.num_tokens - 1 - len(draft), chunk.num_tokens):
                    sampling_rows.append(query_start + offset)
                    sampling_requests.append(request)

        def as_tensor(values: list[int]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.int64, device=self.device)

        logit_rows = as_tensor(sampling_rows + scoring_rows)
        batch = ForwardBatch(as_tensor(positions), as_tensor(slots), tuple(sequences), logit_rows)
        logits = self.model(as_tensor(token_ids), batch, self.cache)
        num_sampling = len(sampling_rows)
        self._record_prompt_logprobs(logits[num_sampling:], scored_positions)
        return self._sample(logits[:num_sampling], sampling_requests, plan)

    def _record_prompt_logprobs(self, logits: torch.Tensor, scored_positions: list[tuple[Request, int]]) -> None:
        """Logits row i (at prompt position p) gives the logprobs of prompt token p + 1."""
        if not scored_positions:
            return
        next_tokens = [request.prompt_token_ids[position + 1] for request, position in scored_positions]
        counts = [request.params.prompt_logprobs or 0 for request, _ in scored_positions]
        entries = token_logprobs(logits, next_tokens, counts)
        for (request, position), entry in zip(scored_positions, entries, strict=True):
            request.record_prompt_logprobs(position + 1, entry)

    def _sample(self, logits: torch.Tensor, requests: list[Request], plan: StepPlan) -> dict[str, SampledToken]:
        """One token per sampling row; a verify chunk's rows are consecutive, the j-th of them at output
        position len(outputs) + j, and its tokens are the ones spec.speculative.accepted_tokens keeps."""
        if not requests:
            return {}
        positions = sampling_positions(requests)
        rows = [SamplingRow(r.params, r.seed, position) for r, position in zip(requests, positions, strict=True)]
        tokens = sample_tokens(logits, rows).tolist()
        counts = [r.params.logprobs for r in requests]
        entries = token_logprobs(logits, tokens, counts) if any(counts) else [None] * len(requests)
        entries = [entry if count > 0 else None for entry, count in zip(entries, counts, strict=True)]
        eos, model_len = self.model_config.eos_token_ids, self.config.model_len

        def stop_token_ids(request: Request) -> frozenset[int]:
            return FinishLimits.of(request.params, len(request.prompt_token_ids), eos, model_len).stop_token_ids

        return step_results(plan, requests, tokens, entries, stop_token_ids)
