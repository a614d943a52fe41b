"""The reference engine on CUDA against transformers on the same GPU.

fp32: identical tokens (the exact rule). bf16: the near-tie rule of spec.agreement, and the
record says how far identical output reaches. Set TWINFER_RESULTS_DIR to keep the JSON record.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest
import torch

from reference.engine import ReferenceEngine
from reports.diff.differential import hf_greedy_trace, trace_from_output
from spec.agreement import compare_traces
from spec.engine_config import EngineConfig
from spec.sampling_params import SamplingParams

pytestmark = [pytest.mark.gpu, pytest.mark.differential]

MAX_NEW_TOKENS = 64
_rng = random.Random(7)
PROMPTS = [[_rng.randrange(384) for _ in range(n)] for n in (1, 9, 33, 100)]


@pytest.mark.parametrize(("dtype", "rule"), [("float32", "exact"), ("bfloat16", "near-tie"), ("float16", "near-tie")])
def test_reference_on_cuda_matches_transformers(tiny_checkpoint: Path, dtype: str, rule: str) -> None:
    from transformers import Qwen3ForCausalLM

    torch_dtype = getattr(torch, dtype)
    hf = Qwen3ForCausalLM.from_pretrained(str(tiny_checkpoint), dtype=torch_dtype).to("cuda").eval()
    engine = ReferenceEngine.from_pretrained(
        tiny_checkpoint, EngineConfig(block_size=16, num_blocks=128), dtype, "cuda"
    )
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW_TOKENS, ignore_eos=True, logprobs=5)
    outputs = engine.generate(PROMPTS, params)
    comparisons = [
        compare_traces(
            trace_from_output(o), hf_greedy_trace(hf, p, MAX_NEW_TOKENS, 5), logprob_tolerance=1e-4, rule=rule
        )
        for o, p in zip(outputs, PROMPTS, strict=True)
    ]
    results_dir = os.environ.get("TWINFER_RESULTS_DIR")
    if results_dir:
        record = {
            "dtype": dtype,
            "rule": rule,
            "device": torch.cuda.get_device_name(),
            "prompts": [
                {"num_prompt_tokens": len(p), **c.to_dict()} for p, c in zip(PROMPTS, comparisons, strict=True)
            ],
        }
        Path(results_dir, f"reference_vs_hf_cuda_{dtype}.json").write_text(json.dumps(record, indent=2))
    assert all(c.agree for c in comparisons), comparisons
