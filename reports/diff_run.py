"""`twinfer diff`: run one prompt set through two engines and compare the traces."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import torch
from tqdm import tqdm

from reports.differential import DiffRecord, hf_greedy_trace, trace_from_output
from spec.agreement import Trace, compare_traces
from spec.checkpoint import parse_dtype, resolve_checkpoint
from spec.errors import ConfigError
from spec.sampling_params import SamplingParams

logger = logging.getLogger(__name__)

DIFF_ENGINES = ("reference", "hf")
TraceRunner = Callable[[Sequence[Sequence[int]]], list[Trace]]


def run_diff(
    model: str,
    engines: Sequence[str],
    dtype: str,
    device: str | None,
    max_new_tokens: int,
    top_k: int,
    logprob_tolerance: float,
    text_prompts: Sequence[str],
    token_prompts: Sequence[Sequence[int]],
) -> DiffRecord:
    if len(engines) != 2 or any(name not in DIFF_ENGINES for name in engines):
        raise ConfigError(f"--engines takes two of {', '.join(DIFF_ENGINES)}, got {','.join(engines)}")
    from reference.llm import LLM

    checkpoint = resolve_checkpoint(model)
    llm = LLM(checkpoint, engine="reference", dtype=dtype, device=device)
    prompts = [llm.encode(text) for text in text_prompts] + [list(p) for p in token_prompts]
    runners = {name: _runner(name, llm, max_new_tokens, top_k) for name in engines}
    traces = {name: runners[name](prompts) for name in engines}
    rule = "exact" if llm.dtype == torch.float32 else "near-tie"
    record = DiffRecord(engines=list(engines), model=str(checkpoint), dtype=str(llm.dtype).removeprefix("torch."),
                        max_new_tokens=max_new_tokens, top_k=top_k)
    candidate, baseline = engines
    for index, prompt in enumerate(prompts):
        comparison = compare_traces(traces[candidate][index], traces[baseline][index], logprob_tolerance, rule)
        record.prompts.append({"index": index, "num_prompt_tokens": len(prompt), "rule": rule, **comparison.to_dict()})
    return record


def _runner(name: str, llm, max_new_tokens: int, top_k: int) -> TraceRunner:
    if name == "reference":
        params = SamplingParams(temperature=0.0, max_tokens=max_new_tokens, ignore_eos=True, logprobs=top_k)

        def run_reference(prompts: Sequence[Sequence[int]]) -> list[Trace]:
            return [trace_from_output(output) for output in llm.engine.generate(prompts, params)]

        return run_reference

    def run_hf(prompts: Sequence[Sequence[int]]) -> list[Trace]:
        from transformers import AutoModelForCausalLM

        hf_model = AutoModelForCausalLM.from_pretrained(str(llm.checkpoint), dtype=parse_dtype(llm.dtype)).to(llm.device).eval()
        return [hf_greedy_trace(hf_model, p, max_new_tokens, top_k) for p in tqdm(prompts, desc="transformers", leave=False)]

    return run_hf
