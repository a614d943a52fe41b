"""The reference engine: scheduler + paged KV cache + the plain-PyTorch model, one step at a time."""

from __future__ import annotations

import itertools
import logging
import secrets
from collections.abc import Sequence
from pathlib import Path

import torch

from reference.kv_cache import PagedKVCache
from reference.model import CausalLM, ForwardBatch, SequenceSlice
from reference.scheduler import Scheduler
from spec.checkpoint import load_model_config, load_state_dict, parse_dtype, resolve_checkpoint
from spec.engine_config import EngineConfig
from spec.errors import InvalidRequestError
from spec.invariants import InvariantMonitor
from spec.model_config import ModelConfig
from spec.request import Request, RequestOutput, TokenLogprobs, check_request, prompt_logprob_positions
from spec.sampling import SamplingRow, sample_tokens, top_logprobs
from spec.sampling_params import MAX_SEED, SamplingParams
from spec.scheduling import StepPlan, slot_of

logger = logging.getLogger(__name__)


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


class ReferenceEngine:
    """add_request / step / abort / generate over token ids."""

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
        self.dtype = dtype
        self.device = torch.device(device) if device is not None else default_device()
        self.model = CausalLM(model_config).to(device=self.device, dtype=dtype)
        self.model.load_weights(state_dict)
        self.model.eval()
        self.cache = PagedKVCache(
            num_layers=model_config.num_hidden_layers,
            num_blocks=self.config.num_blocks,
            block_size=self.config.block_size,
            num_kv_heads=model_config.num_key_value_heads,
            head_dim=model_config.head_dim,
            dtype=dtype,
            device=self.device,
        )
        self.scheduler = Scheduler(self.config, model_config.eos_token_ids)
        self.monitor = InvariantMonitor() if self.config.check_invariants else None
        self._requests: dict[str, Request] = {}
        self._arrivals = itertools.count()
        self._auto_ids = itertools.count()

    @classmethod
    def from_pretrained(
        cls,
        model: str | Path,
        engine_config: EngineConfig | None = None,
        dtype: str | torch.dtype = "auto",
        device: torch.device | str | None = None,
    ) -> ReferenceEngine:
        checkpoint = resolve_checkpoint(model)
        model_config = load_model_config(checkpoint)
        torch_dtype = parse_dtype(dtype, model_config)
        target = torch.device(device) if device is not None else default_device()
        state_dict = load_state_dict(checkpoint, model_config, torch_dtype, target)
        return cls(model_config, state_dict, engine_config, torch_dtype, target)

    # -- requests ----------------------------------------------------------------------------

    @property
    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished

    def add_request(
        self, prompt_token_ids: Sequence[int], params: SamplingParams | None = None, request_id: str | None = None
    ) -> str:
        """Queue a request; raises InvalidRequestError (and changes nothing) if it can never be served."""
        params = params if params is not None else SamplingParams()
        if not isinstance(params, SamplingParams):
            raise InvalidRequestError(f"params must be a SamplingParams, got {type(params).__name__}")
        request_id = request_id if request_id is not None else f"request-{next(self._auto_ids)}"
        if request_id in self._requests:
            raise InvalidRequestError(f"request id {request_id!r} is already in use")
        prompt = check_request(request_id, prompt_token_ids, params, self.model_config.vocab_size, self.config)
        seed = params.seed if params.seed is not None else secrets.randbelow(MAX_SEED + 1)
        request = Request(request_id, prompt, params, seed, next(self._arrivals))
        self._requests[request_id] = request
        self.scheduler.add(request)
        return request_id

    def abort(self, request_id: str) -> RequestOutput:
        request = self._requests.pop(request_id, None)
        if request is None:
            raise KeyError(f"no unfinished request {request_id!r}")
        self.scheduler.abort(request)
        if self.monitor is not None:
            self.monitor.finished([request_id])
        return request.output()

    # -- stepping ----------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """Run one scheduling step; outputs of the requests that got a token (finished or not)."""
        plan = self.scheduler.schedule()
        self._check_invariants()
        if plan.is_empty:
            return []
        sampled = self._run_model(plan)
        finished = self.scheduler.update(plan, {request_id: token for request_id, (token, _) in sampled.items()})
        stepped = [self._requests[request_id] for request_id in sampled]
        for request in stepped:
            logprobs = sampled[request.request_id][1]
            if logprobs is not None:
                request.append_logprobs(logprobs)
        for request in finished:
            del self._requests[request.request_id]
        if self.monitor is not None:
            self.monitor.finished(r.request_id for r in finished)
        self._check_invariants()
        return [request.output() for request in stepped]

    def _check_invariants(self) -> None:
        if self.monitor is not None:
            self.monitor.observe(self.scheduler.snapshot())
            if not self.scheduler.has_unfinished:
                self.monitor.check_all_finished()

    @torch.inference_mode()
    def _run_model(self, plan: StepPlan) -> dict[str, tuple[int, TokenLogprobs | None]]:
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
            request = self._requests[chunk.request_id]
            table = self.scheduler.allocator.block_table(chunk.request_id)
            span = range(chunk.start, chunk.start + chunk.num_tokens)
            query_start = len(token_ids)
            all_tokens = request.all_token_ids
            token_ids.extend(all_tokens[p] for p in span)
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
            if chunk.samples:
                sampling_rows.append(query_start + chunk.num_tokens - 1)
                sampling_requests.append(request)

        def as_tensor(values: list[int]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.int64, device=self.device)

        logit_rows = as_tensor(sampling_rows + scoring_rows)
        batch = ForwardBatch(as_tensor(positions), as_tensor(slots), tuple(sequences), logit_rows)
        logits = self.model(as_tensor(token_ids), batch, self.cache)
        num_sampling = len(sampling_rows)
        self._record_prompt_logprobs(logits[num_sampling:], scored_positions)
        return self._sample(logits[:num_sampling], sampling_requests)

    def _record_prompt_logprobs(self, logits: torch.Tensor, scored_positions: list[tuple[Request, int]]) -> None:
        """Logits row i (at prompt position p) gives the logprobs of prompt token p + 1."""
        if not scored_positions:
            return
        next_tokens = [request.prompt_token_ids[position + 1] for request, position in scored_positions]
        wanted = max(request.params.prompt_logprobs or 0 for request, _ in scored_positions)
        chosen, top_ids, top_values = top_logprobs(
            logits, torch.tensor(next_tokens, dtype=torch.int64, device=logits.device), wanted
        )
        chosen_list, ids_list, values_list = chosen.tolist(), top_ids.tolist(), top_values.tolist()
        for row, (request, position) in enumerate(scored_positions):
            count = request.params.prompt_logprobs or 0
            top = tuple(zip(ids_list[row][:count], values_list[row][:count], strict=True))
            request.record_prompt_logprobs(position + 1, TokenLogprobs(next_tokens[row], chosen_list[row], top))

    def _sample(self, logits: torch.Tensor, requests: list[Request]) -> dict[str, tuple[int, TokenLogprobs | None]]:
        if not requests:
            return {}
        rows = [SamplingRow(r.params, r.seed, len(r.output_token_ids)) for r in requests]
        tokens = sample_tokens(logits, rows)
        wanted = max(r.params.logprobs for r in requests)
        chosen_logprob, top_ids, top_values = top_logprobs(logits, tokens, wanted)
        tokens_list = tokens.tolist()
        chosen_list, ids_list, values_list = chosen_logprob.tolist(), top_ids.tolist(), top_values.tolist()
        results: dict[str, tuple[int, TokenLogprobs | None]] = {}
        for row, request in enumerate(requests):
            logprobs = None
            if request.params.logprobs > 0:
                count = request.params.logprobs
                top = tuple(zip(ids_list[row][:count], values_list[row][:count], strict=True))
                logprobs = TokenLogprobs(tokens_list[row], chosen_list[row], top)
            results[request.request_id] = (tokens_list[row], logprobs)
        return results

    # -- convenience -------------------------------------------------------------------------

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        """Run prompts (token-id lists) to completion; outputs in prompt order."""
        params_list = _broadcast_params(params, len(prompts))
        request_ids = [self.add_request(prompt, p) for prompt, p in zip(prompts, params_list, strict=True)]
        wanted = set(request_ids)
        finished: dict[str, RequestOutput] = {}
        while len(finished) < len(wanted) and self.has_unfinished:
            for output in self.step():
                if output.finished and output.request_id in wanted:
                    finished[output.request_id] = output
        return [finished[request_id] for request_id in request_ids]


def _broadcast_params(params: SamplingParams | Sequence[SamplingParams] | None, count: int) -> list[SamplingParams]:
    if params is None:
        return [SamplingParams()] * count
    if isinstance(params, SamplingParams):
        return [params] * count
    params_list = list(params)
    if len(params_list) != count:
        raise InvalidRequestError(f"{len(params_list)} sampling params for {count} prompts")
    return params_list
