"""`twinfer diff`: run one prompt set through two or more engines and compare every pair of traces."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path

import torch
from tqdm import tqdm

from reports.diff.differential import DiffRecord, PairComparison, hf_greedy_trace, trace_from_output
from reports.diff.endpoint import endpoint_url, is_endpoint, run_greedy, teacher_forced_check
from spec.agreement import Trace, compare_traces
from spec.checkpoint import load_model_config, parse_dtype, resolve_checkpoint
from spec.engine_config import EngineConfig
from spec.errors import ConfigError
from spec.sampling_params import SamplingParams
from twinfer.llm import load_tokenizer
from twinfer.registry import ENGINE_NAMES, build_engine, check_engine_can_run, resolve_device

HF = "hf"
DIFF_ENGINES = (*ENGINE_NAMES, HF)


def check_diff_engines(engines: Sequence[str]) -> None:
    """Two or more distinct engines: local ones (fast, reference, hf) or OpenAI endpoints
    (openai:http://HOST:PORT/v1, whose URL is checked here); at least one must be local."""
    known = all(name in DIFF_ENGINES or is_endpoint(name) for name in engines)
    if len(engines) < 2 or len(set(engines)) != len(engines) or not known:
        raise ConfigError(
            f"--engines takes two or more distinct engines of {', '.join(DIFF_ENGINES)} or "
            f"openai:http://HOST:PORT/v1, got {','.join(engines)}"
        )
    for name in engines:
        if is_endpoint(name):
            endpoint_url(name)  # a malformed URL fails now
    if all(is_endpoint(name) for name in engines):
        raise ConfigError("--engines needs at least one local engine to compare endpoints with")


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
    engine_config: EngineConfig | None = None,
) -> DiffRecord:
    """Greedy traces of every prompt from each engine, then every pair of engines compared (in the order named).
    engine_config: the local engines' settings (None: each engine's defaults)."""
    check_diff_engines(engines)
    target = resolve_device(device)
    for name in engines:  # fail before any engine runs, not after the first has taken minutes
        if name != HF and not is_endpoint(name):
            check_engine_can_run(name, target)
    checkpoint = resolve_checkpoint(model)
    torch_dtype = parse_dtype(dtype, load_model_config(checkpoint))
    tokenizer = load_tokenizer(checkpoint) if text_prompts else None
    prompts = [list(tokenizer.encode(text, add_special_tokens=False)) for text in text_prompts]
    prompts += [list(p) for p in token_prompts]
    traces: dict[str, list[Trace]] = {}
    endpoint_notes: dict[str, dict[str, object]] = {}
    for name in tqdm(engines, desc="engines", leave=False):
        if name == HF:
            traces[name] = _hf_traces(checkpoint, torch_dtype, target, prompts, max_new_tokens, top_k)
        elif is_endpoint(name):
            result = run_greedy(endpoint_url(name), checkpoint, prompts, max_new_tokens, top_k)
            traces[name] = result.traces
            endpoint_notes[name] = {"notes": result.notes, "unmapped_alternatives": result.unmapped_alternatives}
        else:
            traces[name] = _engine_traces(
                name, checkpoint, engine_config, torch_dtype, target, prompts, max_new_tokens, top_k
            )
    rule = "exact" if torch_dtype == torch.float32 else "near-tie"
    record = DiffRecord(
        engines=list(engines),
        model=str(checkpoint),
        dtype=str(torch_dtype).removeprefix("torch."),
        max_new_tokens=max_new_tokens,
        top_k=top_k,
        endpoints=endpoint_notes,
    )
    # Teacher-forced: each endpoint scores the first local engine's tokens (echo + prompt logprobs).
    baseline = next(name for name in engines if not is_endpoint(name))
    for name in engines:
        if is_endpoint(name):
            check = teacher_forced_check(
                endpoint_url(name), checkpoint, prompts, traces[baseline], top_k, logprob_tolerance, rule
            )
            record.teacher_forced[name] = {"baseline": baseline, **check.to_dict()}
    for candidate, baseline in itertools.combinations(engines, 2):
        comparison = PairComparison(candidate, baseline)
        for index, prompt in enumerate(prompts):
            agreement = compare_traces(traces[candidate][index], traces[baseline][index], logprob_tolerance, rule)
            comparison.prompts.append(
                {"index": index, "num_prompt_tokens": len(prompt), "rule": rule, **agreement.to_dict()}
            )
        record.comparisons.append(comparison)
    return record


def _engine_traces(
    name: str,
    checkpoint: Path,
    engine_config: EngineConfig | None,
    dtype: torch.dtype,
    device: torch.device,
    prompts: list[list[int]],
    max_new_tokens: int,
    top_k: int,
) -> list[Trace]:
    engine = build_engine(name, checkpoint, engine_config, dtype, device)
    params = SamplingParams(temperature=0.0, max_tokens=max_new_tokens, ignore_eos=True, logprobs=top_k)
    return [trace_from_output(output) for output in engine.generate(prompts, params)]


def _hf_traces(
    checkpoint: Path,
    dtype: torch.dtype,
    device: torch.device,
    prompts: list[list[int]],
    max_new_tokens: int,
    top_k: int,
) -> list[Trace]:
    from transformers import AutoModelForCausalLM

    hf_model = AutoModelForCausalLM.from_pretrained(str(checkpoint), dtype=dtype).to(device).eval()
    return [
        hf_greedy_trace(hf_model, p, max_new_tokens, top_k) for p in tqdm(prompts, desc="transformers", leave=False)
    ]
