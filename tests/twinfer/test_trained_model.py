"""The differential checks on the shipped trained model (stdlib-tiny), in fp32 on CPU: the reference
engine against transformers, and the fast engine (Triton interpreter) against both. Its predictions
are peaked, so agreement here is a strong witness, unlike on random weights."""

from __future__ import annotations

import pytest
import torch

from reports.diff.differential import hf_greedy_trace, trace_from_output
from spec.agreement import compare_traces
from spec.checkpoint import load_model_config, load_state_dict
from spec.engine_config import EngineConfig
from spec.sampling_params import SamplingParams
from tests.engines import build_engine
from twinfer.default_model import default_model

pytestmark = pytest.mark.differential

PROMPTS = (
    "def ",
    "import os\nimport sys\n\n\ndef main(argv):\n    ",
    "class Queue:\n    def __init__(self, maxsize=0):",
)


@pytest.fixture(scope="module")
def trained():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    checkpoint = default_model()
    config = load_model_config(checkpoint)
    tokenizer = AutoTokenizer.from_pretrained(str(checkpoint))
    prompts = [tokenizer.encode(text, add_special_tokens=False) for text in PROMPTS]
    hf = AutoModelForCausalLM.from_pretrained(str(checkpoint), dtype=torch.float32).eval()
    return config, load_state_dict(checkpoint, config, torch.float32), hf, prompts


@pytest.mark.parametrize("engine_name, max_tokens", [("reference", 48), ("fast", 8)])
def test_trained_model_agrees_with_transformers(trained, engine_name: str, max_tokens: int) -> None:
    config, state_dict, hf, prompts = trained
    engine = build_engine(engine_name, config, state_dict, EngineConfig(block_size=16, num_blocks=64))
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, logprobs=5)
    for prompt, output in zip(prompts, engine.generate(prompts, params), strict=True):
        comparison = compare_traces(trace_from_output(output), hf_greedy_trace(hf, prompt, max_tokens, 5))
        assert comparison.agree, (engine_name, len(prompt), comparison)


def test_trained_model_predictions_are_peaked(trained) -> None:
    """What makes it a witness: most greedy steps have a clear winner (top-two gap above 0.25)."""
    config, state_dict, _, prompts = trained
    engine = build_engine("reference", config, state_dict, EngineConfig(block_size=16, num_blocks=64))
    outputs = engine.generate(prompts, SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True, logprobs=2))
    gaps = [entry.top[0][1] - entry.top[1][1] for output in outputs for entry in output.logprobs]
    assert sum(gap > 0.25 for gap in gaps) / len(gaps) > 0.7, gaps
