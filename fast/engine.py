"""The fast engine: the spec's scheduler and request bookkeeping over `ModelRunner` and the GPU sampler.

Same public API as the reference engine (spec.engine.ScheduledEngine: add_request, step, abort,
generate, has_unfinished); it differs only in how one step executes: the plan's chunks go into
persistent device buffers (fast.input_batch), one forward pass computes logits only for the rows
that sample or score prompt positions, and the sampler picks tokens on the device.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from fast.input_batch import SequenceInput
from fast.model_runner import ModelRunner
from fast.sampler import Sampler
from fast.scheduler import Scheduler
from spec.checkpoint import load_model_config, load_state_dict, parse_dtype, resolve_checkpoint
from spec.engine import SampledToken, ScheduledEngine, default_device
from spec.engine_config import EngineConfig
from spec.errors import ConfigError
from spec.model_config import ModelConfig
from spec.request import Request, RequestOutput, TokenLogprobs, prompt_logprob_positions
from spec.sampling import SamplingRow, top_logprobs
from spec.scheduling import StepPlan

logger = logging.getLogger(__name__)


@dataclass
class StepTimings:
    """Wall time spent per phase, summed over steps (the forward phase ends when the sampled
    tokens reach the host, so it includes the GPU's work)."""

    num_steps: int = 0
    schedule_s: float = 0.0
    prepare_s: float = 0.0
    forward_s: float = 0.0

    def reset(self) -> None:
        self.num_steps, self.schedule_s, self.prepare_s, self.forward_s = 0, 0.0, 0.0, 0.0


class FastEngine(ScheduledEngine):
    def __init__(
        self,
        model_config: ModelConfig,
        state_dict: dict[str, torch.Tensor],
        engine_config: EngineConfig | None = None,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> None:
        self.device = torch.device(device) if device is not None else default_device()
        _check_device(self.device)
        self.model_config = model_config
        self.dtype = dtype
        self.runner = ModelRunner(model_config, state_dict, engine_config or EngineConfig(), dtype, self.device)
        self.config = self.runner.config
        self.scheduler = Scheduler(self.config, model_config.eos_token_ids)
        self.sampler = Sampler(self.runner.max_step_seqs, model_config.vocab_size, self.device)
        self.step_timings = StepTimings()
        self._execute_s = 0.0  # the current step's time in execute(), to split out scheduling time
        self._init_requests()

    @classmethod
    def from_pretrained(
        cls,
        model: str | Path,
        engine_config: EngineConfig | None = None,
        dtype: str | torch.dtype = "auto",
        device: torch.device | str | None = None,
    ) -> FastEngine:
        checkpoint = resolve_checkpoint(model)
        model_config = load_model_config(checkpoint)
        torch_dtype = parse_dtype(dtype, model_config)
        target = torch.device(device) if device is not None else default_device()
        _check_device(target)
        state_dict = load_state_dict(checkpoint, model_config, torch_dtype, target)
        return cls(model_config, state_dict, engine_config, torch_dtype, target)

    def step(self) -> list[RequestOutput]:
        started = time.perf_counter()
        self._execute_s = 0.0
        outputs = super().step()
        self.step_timings.num_steps += 1
        # Everything but execute(): scheduling, applying results, building outputs.
        self.step_timings.schedule_s += time.perf_counter() - started - self._execute_s
        return outputs

    # -- one step --------------------------------------------------------------------------------

    def execute(self, plan: StepPlan) -> dict[str, SampledToken]:
        started = time.perf_counter()
        sequences, sampling_requests, scored = self._sequences(plan)
        prepared = time.perf_counter()
        logits = self.runner.run(sequences)
        sample_rows = torch.tensor([row for row, _ in sampling_requests], dtype=torch.int64, device=self.device) \
            if scored else None
        results = self._sample(logits if sample_rows is None else logits[sample_rows], sampling_requests)
        if scored:
            self._record_prompt_logprobs(logits, scored)
        finished = time.perf_counter()
        self.step_timings.prepare_s += prepared - started
        self.step_timings.forward_s += finished - prepared
        self._execute_s = finished - started
        return results

    def _sequences(
        self, plan: StepPlan
    ) -> tuple[list[SequenceInput], list[tuple[int, Request]], list[tuple[int, Request, int]]]:
        """The chunks as runner inputs; (logit row, request) of each sampling chunk; and
        (logit row, request, prompt position) of each prompt position to score."""
        sequences: list[SequenceInput] = []
        sampling: list[tuple[int, Request]] = []
        scored: list[tuple[int, Request, int]] = []
        logit_row = 0
        allocator = self.scheduler.allocator
        for chunk in plan.chunks:
            request = self.request(chunk.request_id)
            offsets: list[int] = []
            for position in prompt_logprob_positions(request, chunk.start, chunk.num_tokens):
                offsets.append(position - chunk.start)
                scored.append((logit_row, request, position + 1))
                logit_row += 1
            if chunk.samples:
                offsets.append(chunk.num_tokens - 1)
                sampling.append((logit_row, request))
                logit_row += 1
            sequences.append(
                SequenceInput(
                    request.token_span(chunk.start, chunk.num_tokens),
                    chunk.start,
                    allocator.block_table(chunk.request_id),
                    offsets,
                )
            )
        return sequences, sampling, scored

    def _sample(self, logits: torch.Tensor, sampling: list[tuple[int, Request]]) -> dict[str, SampledToken]:
        if not sampling:
            return {}
        requests = [request for _, request in sampling]
        rows = [SamplingRow(r.params, r.seed, len(r.output_token_ids)) for r in requests]
        self.sampler.set_rows(rows)
        tokens = self.sampler.sample(logits)
        wanted = max(r.params.logprobs for r in requests)
        token_list = tokens.tolist()
        if not any(r.params.logprobs > 0 for r in requests):
            return {r.request_id: SampledToken(token, None) for r, token in zip(requests, token_list, strict=True)}
        chosen, top_ids, top_values = self.sampler.logprobs(logits, tokens, wanted)
        chosen_list, ids_list, values_list = chosen.tolist(), top_ids.tolist(), top_values.tolist()
        results = {}
        for row, request in enumerate(requests):
            logprobs = None
            if request.params.logprobs > 0:
                count = request.params.logprobs
                top = tuple(zip(ids_list[row][:count], values_list[row][:count], strict=True))
                logprobs = TokenLogprobs(token_list[row], chosen_list[row], top)
            results[request.request_id] = SampledToken(token_list[row], logprobs)
        return results

    def _record_prompt_logprobs(self, logits: torch.Tensor, scored: list[tuple[int, Request, int]]) -> None:
        rows = torch.tensor([row for row, _, _ in scored], dtype=torch.int64, device=self.device)
        targets = torch.tensor(
            [request.prompt_token_ids[position] for _, request, position in scored], dtype=torch.int64,
            device=self.device,
        )
        wanted = max(request.params.prompt_logprobs or 0 for _, request, _ in scored)
        chosen, top_ids, top_values = top_logprobs(logits[rows], targets, wanted)
        chosen_list, ids_list, values_list = chosen.tolist(), top_ids.tolist(), top_values.tolist()
        target_list = targets.tolist()
        for index, (_, request, position) in enumerate(scored):
            count = request.params.prompt_logprobs or 0
            top = tuple(zip(ids_list[index][:count], values_list[index][:count], strict=True))
            request.record_prompt_logprobs(position, TokenLogprobs(target_list[index], chosen_list[index], top))


def _check_device(device: torch.device) -> None:
    """The fast engine runs on CUDA, or on the CPU through Triton's interpreter when asked for."""
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError("the fast engine was asked for device cuda, but CUDA is not available")
        return
    if device.type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1":
        return
    raise ConfigError(
        f"the fast engine runs on CUDA; on {device.type} it runs only through Triton's interpreter: set "
        "TRITON_INTERPRET=1 before importing twinfer (slow; for tests), or use engine='reference'"
    )
