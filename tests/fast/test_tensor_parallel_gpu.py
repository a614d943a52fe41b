"""Tensor parallelism on two GPUs: NCCL, the symmetric-memory one-shot all-reduce, CUDA graphs with
their all-reduces inside. Marker `gpu`; skipped unless at least 2 GPUs are visible.

* fp32, qwen3-0.6b shape, random weights: 2 ranks against the reference engine on one GPU, on the
  differential cases (mixed lengths, prefix hits, chunked prefill, preemption): identical tokens and
  top-5 logprobs within 1e-4; a divergence is excused only at an fp32 near-tie (top-two gap below
  1e-3) and reported. The weights come from a safetensors checkpoint (each rank reads its slices),
  and once from a state dict in GPU memory (handed to rank 1 through CUDA IPC): the same outputs.
* fp32: CUDA graphs on against off, 2 ranks, batch sizes that need padding: identical.
* fp32: async scheduling and programmatic dependent launch on 2 ranks (steps launched ahead, sampled
  tokens shared on the GPUs) against step by step without PDL: identical.
* fp32: the one-shot path against NCCL (in a fresh process, whose first engine sets up the one-shot
  path and whose second runs on NCCL alone): identical outputs, since 2 ranks sum a + b either way.
  The same for the fused all-reduce + add + RMSNorm kernel, with async scheduling and PDL.
* bf16, qwen3-8b shape: 2 ranks against the reference by the spec's near-tie rule.
* A worker killed mid-generation: rank 0 raises TensorParallelError within a bounded time and no
  process is left; also with the fused kernel, whose barrier wait no NCCL abort ends (its own timeout
  must). Run in a subprocess, so a hang fails the test instead of stalling the run.

Random checkpoints are written once (reports.bench.tensor_parallel.random_checkpoint; $TWINFER_CHECKPOINT_DIR).
Measurements go to $TWINFER_RESULTS_DIR as JSON when it is set.
"""

from __future__ import annotations

import gc
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fast.engine import FastEngine
from reports.bench.shapes import SHAPES, random_state_dict
from reports.bench.tensor_parallel import WEIGHT_SEED, random_checkpoint
from reports.diff.differential import trace_from_output
from spec.agreement import compare_traces
from spec.engine_config import EngineConfig
from spec.sampling_params import SamplingParams
from tests.engines import build_engine
from tests.gpu_checks import compare_fp32, prompts_of, record

_VISIBLE_GPUS = torch.cuda.device_count()
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.large_gpu,
    pytest.mark.differential,
    pytest.mark.skipif(_VISIBLE_GPUS < 2, reason=f"needs 2 CUDA GPUs for 2 ranks; {_VISIBLE_GPUS} visible"),
]

SMALL, LARGE = SHAPES["qwen3-0.6b"], SHAPES["qwen3-8b"]
BLOCK_SIZE = 16
GREEDY_32 = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True, logprobs=5)
REPO_ROOT = Path(__file__).resolve().parents[2]
SUBPROCESS_TIMEOUT_S = 300


def settings(**overrides: object) -> EngineConfig:
    values: dict[str, object] = {"block_size": BLOCK_SIZE, "num_blocks": 1024, "max_model_len": 4096}
    return EngineConfig(**(values | overrides))  # type: ignore[arg-type]


def two_ranks(checkpoint: Path, dtype: torch.dtype, **overrides: object) -> FastEngine:
    return FastEngine.from_pretrained(checkpoint, settings(**overrides), dtype, "cuda", tensor_parallel_size=2)


@pytest.fixture(scope="module")
def small_checkpoint() -> Path:
    return random_checkpoint(SMALL, torch.float32)


@pytest.fixture(scope="module")
def small_weights():
    config = SMALL.model_config()
    return config, random_state_dict(config, torch.float32, torch.device("cuda"), WEIGHT_SEED)


CASE_PROMPTS = prompts_of([1, 16, 17, 100, 300], seed=1)


def test_fp32_two_ranks_against_the_reference(small_checkpoint: Path, small_weights) -> None:
    config, state_dict = small_weights
    shared = prompts_of([3 * BLOCK_SIZE + 5], seed=2)[0]
    cases = {
        "mixed": ({}, CASE_PROMPTS),
        "prefix-shared": ({"max_num_seqs": 1}, [shared + tail for tail in prompts_of([4, 9, 30], seed=3)]),
        "chunked": ({"max_num_batched_tokens": 64}, CASE_PROMPTS),
        "preemption": ({"num_blocks": 30}, CASE_PROMPTS[:4]),
    }
    results: dict[str, object] = {}
    outputs_by_case = {}
    for name, (overrides, prompts) in cases.items():
        reference = build_engine("reference", config, state_dict, settings(**overrides), torch.float32, "cuda")
        theirs = reference.generate(prompts, GREEDY_32)
        del reference
        with two_ranks(small_checkpoint, torch.float32, **overrides) as fast:
            ours = fast.generate(prompts, GREEDY_32)
            info = fast.tensor_parallel_info()
        outputs_by_case[name] = ours
        rows = []
        for prompt, mine, expected in zip(prompts, ours, theirs, strict=True):
            assert mine.num_cached_prompt_tokens == expected.num_cached_prompt_tokens
            rows.append(
                {
                    "prompt_len": len(prompt),
                    "vs_reference": compare_fp32(trace_from_output(mine), trace_from_output(expected)),
                    "cached_prompt_tokens": mine.num_cached_prompt_tokens,
                }
            )
        if name == "prefix-shared":
            assert [row["cached_prompt_tokens"] for row in rows] == [0, 3 * BLOCK_SIZE, 3 * BLOCK_SIZE]
        results[name] = {"tensor_parallel": info, "prompts": rows}
    # The same weights from GPU memory (rank 1 reads rank 0's tensors through CUDA IPC): the same outputs.
    with FastEngine(config, state_dict, settings(), torch.float32, "cuda", tensor_parallel_size=2) as fast:
        in_memory = fast.generate(CASE_PROMPTS, GREEDY_32)
    assert [o.token_ids for o in in_memory] == [o.token_ids for o in outputs_by_case["mixed"]]
    assert [o.logprobs for o in in_memory] == [o.logprobs for o in outputs_by_case["mixed"]]
    record("tp2_fp32_qwen3_0.6b", results)


def test_fp32_async_scheduling_with_two_ranks_identical_to_step_by_step(small_checkpoint: Path) -> None:
    """Async scheduling on 2 ranks, CUDA graphs on, with programmatic dependent launch: without logprobs
    each step is launched before the last one's tokens are read (rank 1 fills its pending rows from the
    tokens rank 0 shares through NCCL), with logprobs it is launched after; both give the tokens and
    logprobs of the step-by-step engine without PDL."""
    no_logprobs = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    seeded = SamplingParams(temperature=0.8, max_tokens=32, ignore_eos=True, seed=5)
    cases = (GREEDY_32, no_logprobs, seeded)
    with two_ranks(
        small_checkpoint, torch.float32, async_scheduling=False, programmatic_dependent_launch=False
    ) as step_by_step:
        expected = [step_by_step.generate(CASE_PROMPTS, params) for params in cases]
    with two_ranks(small_checkpoint, torch.float32, async_scheduling=True, programmatic_dependent_launch=True) as ahead:
        outputs = [ahead.generate(CASE_PROMPTS, params) for params in cases]
        timings = ahead.step_timings
    for params, ours, theirs in zip(cases, outputs, expected, strict=True):
        assert [(o.token_ids, o.logprobs) for o in ours] == [(t.token_ids, t.logprobs) for t in theirs], params
    assert timings.launched_ahead_steps > 32 and timings.prepared_ahead_steps > timings.launched_ahead_steps


def test_fp32_cuda_graphs_on_and_off_identical_with_two_ranks(small_checkpoint: Path) -> None:
    batches = {size: prompts_of([20 + i for i in range(size)], seed=size) for size in (3, 5, 17)}
    outputs = {}
    for graphs in (True, False):
        with two_ranks(small_checkpoint, torch.float32, enable_cuda_graphs=graphs) as fast:
            assert (fast.runner.graphs is not None) == graphs
            outputs[graphs] = {size: fast.generate(prompts, GREEDY_32) for size, prompts in batches.items()}
    for size in batches:
        on, off = outputs[True][size], outputs[False][size]
        assert [o.token_ids for o in on] == [o.token_ids for o in off], f"batch {size}"
        pairs = [pair for x, y in zip(on, off, strict=True) for pair in zip(x.logprobs, y.logprobs, strict=True)]
        errors = [abs(a.logprob - b.logprob) for a, b in pairs]
        assert max(errors) <= 1e-4, f"batch {size}"


_ONE_SHOT_SCRIPT = """
import json, sys
from fast.engine import FastEngine
from spec.engine_config import EngineConfig
from spec.sampling_params import SamplingParams

checkpoint, prompts, first_settings = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True, logprobs=5)
runs = []
for settings in (first_settings, {}):  # this process's second engine runs every all-reduce on NCCL (fast.parallel)
    config = EngineConfig(block_size=16, num_blocks=512, max_model_len=2048, tensor_parallel_size=2, **settings)
    with FastEngine.from_pretrained(checkpoint, config, "float32", "cuda") as engine:
        outputs = engine.generate(prompts, params)
        runs.append({
            "info": engine.tensor_parallel_info(),
            "tokens": [list(o.token_ids) for o in outputs],
            "logprobs": [[[e.token_id, e.logprob, [list(t) for t in e.top]] for e in o.logprobs] for o in outputs],
        })
print("RESULT " + json.dumps(runs))
"""


def _run_script(script: str, *args: str) -> str:
    environment = os.environ | {"PYTHONPATH": str(REPO_ROOT)}
    try:
        done = subprocess.run(
            [sys.executable, "-c", script, *args], capture_output=True, text=True, cwd=REPO_ROOT, env=environment,
            timeout=SUBPROCESS_TIMEOUT_S,
        )  # fmt: skip
    except subprocess.TimeoutExpired as error:
        pytest.fail(f"the script neither finished nor failed in {SUBPROCESS_TIMEOUT_S} s (a hang): {error.stderr}")
    assert done.returncode == 0, done.stderr[-4000:]
    return done.stdout


def _first_engine_against_nccl(checkpoint: Path, settings: dict[str, bool]) -> tuple[dict, dict]:
    """A fresh process's first 2-rank engine (symmetric memory set up) with `settings`, then its
    second, whose every all-reduce runs on NCCL, on the same prompts."""
    prompts = prompts_of([5, 40, 77], seed=21)
    stdout = _run_script(_ONE_SHOT_SCRIPT, str(checkpoint), json.dumps(prompts), json.dumps(settings))
    first, nccl = json.loads(next(line for line in stdout.splitlines() if line.startswith("RESULT "))[7:])
    return first, nccl


def test_one_shot_all_reduce_equals_nccl_in_fp32(small_checkpoint: Path) -> None:
    one_shot, nccl = _first_engine_against_nccl(small_checkpoint, {})
    record("tp2_one_shot_vs_nccl", {"one_shot_engine": one_shot["info"], "nccl_engine": nccl["info"]})
    assert one_shot["info"]["small_all_reduce"] == "symm_mem_one_shot", one_shot["info"]
    assert one_shot["info"]["all_reduce_calls_issued"].get("symm_mem_one_shot", 0) > 0
    assert nccl["info"]["small_all_reduce"] == "nccl", nccl["info"]
    assert one_shot["tokens"] == nccl["tokens"]
    assert one_shot["logprobs"] == nccl["logprobs"]


def test_fused_all_reduce_norm_equals_nccl_in_fp32(small_checkpoint: Path) -> None:
    """The fused all-reduce + add + RMSNorm kernel (with async scheduling and PDL, the best settings)
    against NCCL followed by add_rmsnorm: identical, since it sums a + b and normalises the same way."""
    best = {"fused_all_reduce_norm": True, "async_scheduling": True, "programmatic_dependent_launch": True}
    fused, nccl = _first_engine_against_nccl(small_checkpoint, best)
    record("tp2_fused_vs_nccl", {"fused_engine": fused["info"], "nccl_engine": nccl["info"]})
    assert fused["info"]["fused_all_reduce_add_rmsnorm"] == "on", fused["info"]
    assert fused["info"]["all_reduce_calls_issued"].get("fused_all_reduce_add_rmsnorm", 0) > 0
    assert nccl["info"]["fused_all_reduce_add_rmsnorm"] == "off: disabled", nccl["info"]
    assert fused["tokens"] == nccl["tokens"]
    assert fused["logprobs"] == nccl["logprobs"]


def test_bf16_two_ranks_near_tie_rule_qwen3_8b() -> None:
    checkpoint = random_checkpoint(LARGE, torch.bfloat16)
    config = LARGE.model_config()
    prompts = prompts_of([128] * 32, seed=11)
    params = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True, logprobs=5)
    state_dict = random_state_dict(config, torch.bfloat16, torch.device("cuda"), WEIGHT_SEED)
    reference = build_engine("reference", config, state_dict, settings(max_num_seqs=32), torch.bfloat16, "cuda")
    theirs = reference.generate(prompts, params)
    del reference, state_dict
    gc.collect()
    torch.cuda.empty_cache()
    with two_ranks(checkpoint, torch.bfloat16, max_num_seqs=32) as fast:
        ours = fast.generate(prompts, params)
        info = fast.tensor_parallel_info()
    reach = []
    for mine, expected in zip(ours, theirs, strict=True):
        comparison = compare_traces(trace_from_output(mine), trace_from_output(expected), rule="near-tie")
        assert comparison.agree, comparison
        reach.append(comparison.first_divergence if comparison.first_divergence is not None else 64)
    record(
        "tp2_bf16_free_running_qwen3_8b",
        {
            "tensor_parallel": info,
            "vs_reference": {
                "identical_tokens_per_prompt": reach,
                "median": statistics.median(reach),
                "min": min(reach),
            },
        },
    )


_KILL_SCRIPT = """
import json, os, signal, sys, threading, time
from fast.engine import FastEngine
from fast.parallel import TensorParallelError
from spec.engine_config import EngineConfig
from spec.sampling_params import SamplingParams

config = EngineConfig(
    block_size=16, num_blocks=1024, max_model_len=4096, tensor_parallel_size=2, **json.loads(sys.argv[2])
)
engine = FastEngine.from_pretrained(sys.argv[1], config, "float32", "cuda")
pid = engine.tensor_parallel.workers.pids[0]
paths = engine.tensor_parallel_info()
engine.generate([[1, 2, 3]], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
killed = {}

def kill():
    killed["at"] = time.monotonic()
    os.kill(pid, signal.SIGKILL)

threading.Timer(2.0, kill).start()  # mid-generation: rank 0 is inside a step, waiting on NCCL
try:
    engine.generate([[7] * 50] * 8, SamplingParams(temperature=0.0, max_tokens=3000, ignore_eos=True))
    print("NOT RAISED")
except TensorParallelError as error:
    seconds = time.monotonic() - killed["at"]
    print("RAISED " + json.dumps({"seconds_after_kill": seconds, "message": str(error), "paths": paths}))
engine.shutdown()
try:
    os.kill(pid, 0)
    print("WORKER ALIVE")
except ProcessLookupError:
    print("WORKER GONE")
"""


@pytest.mark.parametrize("fused", [False, True], ids=["unfused", "fused_all_reduce_norm"])
def test_a_worker_killed_mid_generation_makes_rank_0_raise(small_checkpoint: Path, fused: bool) -> None:
    """fused: rank 0 may be waiting inside the fused kernel's barrier, which no NCCL abort reaches; its
    bounded wait (fast/kernels/all_reduce_norm.py, BARRIER_TIMEOUT_S = 30 s) must end it."""
    settings = {"fused_all_reduce_norm": True, "async_scheduling": True} if fused else {}
    stdout = _run_script(_KILL_SCRIPT, str(small_checkpoint), json.dumps(settings))
    raised = [line for line in stdout.splitlines() if line.startswith("RAISED ")]
    assert raised, stdout
    outcome = json.loads(raised[0][7:])
    record("tp2_killed_worker" + ("_fused" if fused else ""), outcome)
    if fused:
        assert outcome["paths"]["fused_all_reduce_add_rmsnorm"] == "on", outcome
    assert "killed by SIGKILL" in outcome["message"]
    assert outcome["seconds_after_kill"] < 60
    assert "WORKER GONE" in stdout
