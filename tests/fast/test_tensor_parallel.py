"""Tensor parallelism on the CPU: two gloo ranks, each a process running Triton's interpreter.

The fast engine split over 2 ranks against the reference engine and transformers (fp32, tiny
models): identical greedy tokens and top-5 logprobs within 1e-4, identical scheduling decisions, on
the differential cases of tests/fast/test_fast_engine.py: a batch of mixed lengths, prefix hits, chunked
prefill and preemption. The models cover a tied Qwen3 (2 KV heads, one per rank) and a Llama with
one KV head (fewer than ranks: replicated), biases on every projection (row-parallel biases added
once), an untied LM head and a vocabulary of 383 rows (the second rank's shard padded).

Faults: a size that does not split the model, and weights that a fresh process could not import,
are ConfigErrors before any process starts; a worker that raises at start-up, or is killed between
steps or while a step is launched ahead, makes rank 0 raise TensorParallelError naming it, and no
process stays behind. (tests/fast/test_tp_teardown.py tests the worker processes' machinery alone.)

Programs of their own: the ranks start from a script on standard input, `python -c` and an
interactive session, and from the environment as torchrun sets it, each generating the reference's
tokens. These run in subprocesses on the CPU, so also on a CUDA machine; the tests that run the
engine in this process need the interpreter here (marker `interpreter`: skipped on a CUDA machine,
where tests/fast/test_tensor_parallel_gpu.py runs the same cases on NCCL).

Each decode step costs about a second per rank in the interpreter: sequences are short.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from fast import tp_launch
from fast.engine import FastEngine
from fast.parallel import TensorParallelError
from fast.sharded_loading import CheckpointWeights, StateDictWeights, open_checkpoint_slices
from fast.tp_worker import WorkerSpec
from fast.weights import ShardLayout, check_tensor_parallel_size, pack_weights
from reference.engine import ReferenceEngine
from reports.diff.differential import hf_greedy_trace, trace_from_output
from spec.agreement import compare_traces
from spec.checkpoint import load_model_config, load_state_dict
from spec.engine_config import EngineConfig
from spec.errors import CheckpointError, ConfigError
from spec.model_config import ModelConfig
from spec.sampling_params import SamplingParams
from tests.engines import FAST_DEVICE, record_plans
from tests.fast.tp_faults import ExplodingStateDict
from twinfer.models.tiny_model import TinyModelShape, write_tiny_model

pytestmark = pytest.mark.differential

# The interpreter's time goes by the tokens computed and the decode steps (by sequence and layer): the
# smallest blocks keep the prompts short, and four new tokens still decode across a block (see below).
BLOCK_SIZE = 4
MAX_NEW_TOKENS = 4
TOP_K = 5
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_NEW_TOKENS, ignore_eos=True, logprobs=TOP_K)
REPO_ROOT = Path(__file__).resolve().parents[2]

_rng = random.Random(1010)


def _prompt(length: int) -> list[int]:
    return [_rng.randrange(383) for _ in range(length)]


# 1 token, exactly a block, one past, several blocks. The decode of the second opens a new block with its
# first token, that of the last one with its third.
MIXED_PROMPTS = [_prompt(n) for n in (1, BLOCK_SIZE, BLOCK_SIZE + 1, 3 * BLOCK_SIZE + 2)]
SHARED_PREFIX = _prompt(3 * BLOCK_SIZE + 2)
PREFIX_PROMPTS = [SHARED_PREFIX + _prompt(n) for n in (1, 5)]

# Two layers, not the tiny model's three: the interpreter's cost goes by layers and kernel launches, and
# two still tell each layer's weights and KV cache apart.
QWEN3_SHAPE = TinyModelShape(num_hidden_layers=2)
LLAMA_SHAPE = TinyModelShape(
    num_hidden_layers=2, num_key_value_heads=1, tie_word_embeddings=False, attention_bias=True, mlp_bias=True,
    tokenizer_vocab_size=383,
)  # fmt: skip


@pytest.fixture(scope="module")
def qwen3_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Without a tokenizer, so that the programs below that use LLM return token ids without importing
    transformers."""
    checkpoint = write_tiny_model(tmp_path_factory.mktemp("tp-qwen3") / "kv2", seed=3, shape=QWEN3_SHAPE)
    for tokenizer_file in checkpoint.glob("tokenizer*"):
        tokenizer_file.unlink()
    return checkpoint


@pytest.fixture(scope="module")
def llama_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(
        tmp_path_factory.mktemp("tp-llama") / "kv1", seed=5, shape=LLAMA_SHAPE, architecture="llama"
    )


def _hf_model(checkpoint: Path) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(checkpoint), dtype=torch.float32).eval()


def _weights(checkpoint: Path) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    config = load_model_config(checkpoint)
    return config, load_state_dict(checkpoint, config, torch.float32)


def _assert_three_way(parallel_outputs, reference_outputs, prompts, hf_model) -> None:
    for parallel, reference, prompt in zip(parallel_outputs, reference_outputs, prompts, strict=True):
        assert list(parallel.prompt_token_ids) == prompt
        assert len(parallel.token_ids) == MAX_NEW_TOKENS
        hf_trace = hf_greedy_trace(hf_model, prompt, MAX_NEW_TOKENS, TOP_K)
        for name, baseline in (("hf", hf_trace), ("reference", trace_from_output(reference))):
            comparison = compare_traces(trace_from_output(parallel), baseline, logprob_tolerance=1e-4)
            assert comparison.agree, f"2 ranks vs {name}, prompt of {len(prompt)} tokens: {comparison}"
        assert parallel.num_cached_prompt_tokens == reference.num_cached_prompt_tokens


def _run_staggered(engine, first: list[int], later: list[list[int]]) -> list:
    """`first` alone for one step (its prompt's blocks enter the prefix cache), then `later` join."""
    ids = [engine.add_request(first, GREEDY)]
    engine.step()
    ids += [engine.add_request(prompt, GREEDY) for prompt in later]
    finished = {}
    while engine.has_unfinished:
        finished.update({output.request_id: output for output in engine.step() if output.finished})
    return [finished[request_id] for request_id in ids]


def _assert_gone(pids: list[int]) -> None:
    """Every worker process has ended (and been reaped: no zombie left either)."""
    assert pids
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def _assert_raises_that_rank_1_was_killed(step: Callable[[], object]) -> None:
    started = time.monotonic()
    with pytest.raises(TensorParallelError, match=r"rank 1 \(pid \d+\) was killed by SIGKILL"):
        step()
    assert time.monotonic() - started < 30


def _run_to_the_end(engine: FastEngine) -> None:
    while engine.has_unfinished:
        engine.step()


def _worker_pids(engine: FastEngine) -> list[int]:
    assert engine.tensor_parallel is not None and engine.tensor_parallel.workers is not None
    return engine.tensor_parallel.workers.pids


# ----------------------------------------------------------------------------- layout and loading (no processes)


def test_layouts_split_heads_intermediate_and_vocabulary(tiny_weights, llama_checkpoint: Path) -> None:
    qwen, _ = tiny_weights
    ranks = [ShardLayout.for_rank(qwen, rank, 2) for rank in range(2)]
    assert [(r.head_start, r.num_heads, r.kv_head_start, r.num_kv_heads) for r in ranks] == [(0, 2, 0, 1), (2, 2, 1, 1)]
    assert [(r.intermediate_start, r.intermediate_size) for r in ranks] == [(0, 64), (64, 64)]
    llama = load_model_config(llama_checkpoint)
    ranks = [ShardLayout.for_rank(llama, rank, 2) for rank in range(2)]
    # One KV head, two ranks: both keep KV head 0, which all four query heads read.
    assert [(r.head_start, r.kv_head_start, r.num_kv_heads) for r in ranks] == [(0, 0, 1), (2, 0, 1)]
    assert [(r.vocab_start, r.vocab_rows, r.vocab_shard_size) for r in ranks] == [(0, 192, 192), (192, 191, 192)]


@pytest.mark.parametrize(
    "field, value, size, message",
    [
        ("num_attention_heads", 4, 3, "does not divide the model's 4 attention heads"),
        ("intermediate_size", 130, 4, "does not divide the model's intermediate_size 130"),
        ("num_key_value_heads", 3, 2, "cannot share the model's 3 KV heads"),
    ],
)
def test_sizes_that_do_not_split_the_model_are_refused(
    tiny_weights, field: str, value: int, size: int, message: str
) -> None:
    config, _ = tiny_weights
    changed = {"num_attention_heads": 6} if field == "num_key_value_heads" else {}
    bad = dataclasses.replace(config, **changed, **{field: value})
    with pytest.raises(ConfigError, match=message):
        check_tensor_parallel_size(bad, size)


def test_each_rank_reads_only_its_slices_and_they_rebuild_the_model(llama_checkpoint: Path) -> None:
    config, state_dict = _weights(llama_checkpoint)
    read_shapes: list[tuple[str, tuple[int, ...]]] = []
    shards = []
    for rank in range(2):
        layout = ShardLayout.for_rank(config, rank, 2)
        with open_checkpoint_slices(llama_checkpoint, config) as read:

            def recording_read(name: str, dim: int, span: tuple[int, int] | None):
                tensor = read(name, dim, span)
                read_shapes.append((name, tuple(tensor.shape)))
                return tensor

            from_file = pack_weights(config, recording_read, torch.float32, torch.device("cpu"), layout)
        from_memory = pack_weights(config, state_dict, torch.float32, torch.device("cpu"), layout)
        for a, b in zip(_flat(from_file), _flat(from_memory), strict=True):
            assert torch.equal(a, b)
        shards.append(from_file)
    # Every matrix was read as a slice, never whole; whole are only the norms, the row-parallel biases
    # (added once, after the all-reduce) and the single KV head that both ranks keep.
    replicated = ("norm.weight", "o_proj.bias", "down_proj.bias", "k_proj.weight", "k_proj.bias", "v_proj.weight",
                  "v_proj.bias")  # fmt: skip
    for name, shape in read_shapes:
        full = tuple(state_dict[name].shape)
        assert (shape == full) if name.endswith(replicated) else (shape != full), (name, shape)
    whole = pack_weights(config, state_dict, torch.float32, torch.device("cpu"))
    layer, halves = whole.layers[1], [shard.layers[1] for shard in shards]
    assert torch.equal(torch.cat([h.o_proj for h in halves], dim=1), layer.o_proj)
    assert torch.equal(torch.cat([h.down for h in halves], dim=1), layer.down)
    assert torch.equal(torch.cat([shard.lm_head for shard in shards])[: config.vocab_size], whole.lm_head)
    assert torch.count_nonzero(shards[1].embed_tokens[-1]) == 0  # the padding row


def _flat(weights) -> list[torch.Tensor]:
    tensors = [weights.embed_tokens, weights.final_norm, weights.lm_head]
    for layer in weights.layers:
        tensors += [t for t in vars(layer).values() if t is not None]
    return tensors


def test_sharded_loading_refuses_a_transposed_tensor(tmp_path: Path, llama_checkpoint: Path) -> None:
    from safetensors.torch import save_file

    config, state_dict = _weights(llama_checkpoint)
    name = "model.layers.0.mlp.down_proj.weight"  # [64, 128] stored as [128, 64]: same element count
    broken = dict(state_dict) | {name: state_dict[name].t().contiguous()}
    (tmp_path / "config.json").write_text((llama_checkpoint / "config.json").read_text())
    save_file(broken, str(tmp_path / "model.safetensors"))
    layout = ShardLayout.for_rank(config, 0, 2)
    with pytest.raises(CheckpointError, match=r"down_proj.weight.*shape \(128, 64\).*implies \(64, 128\)"):
        CheckpointWeights(tmp_path).pack(config, torch.float32, torch.device("cpu"), layout)


# ----------------------------------------------------------------------------- two ranks against the reference


@pytest.mark.interpreter
def test_two_ranks_match_reference_and_transformers_qwen3(qwen3_checkpoint: Path) -> None:
    """Sharded loading from the checkpoint; a mixed batch, then prefix hits. Then rank 1 is killed between
    steps: the next step raises, naming it, within a bound, and no process is left."""
    config, state_dict = _weights(qwen3_checkpoint)
    hf_model = _hf_model(qwen3_checkpoint)
    # Step by step: under async scheduling (the next test) a request that arrives while a step is launched
    # ahead joins the step after it, so the staggered arrivals below would not give the reference's plans.
    engine_config = EngineConfig(block_size=BLOCK_SIZE, num_blocks=64, check_invariants=True, async_scheduling=False)
    reference = ReferenceEngine(config, state_dict, engine_config, torch.float32, "cpu")
    fast = FastEngine.from_pretrained(qwen3_checkpoint, engine_config, "float32", "cpu", tensor_parallel_size=2)
    with fast:
        pids = _worker_pids(fast)
        assert fast.tensor_parallel_info()["small_all_reduce"] == "gloo"
        fast_plans, reference_plans = record_plans(fast), record_plans(reference)
        outputs = fast.generate(MIXED_PROMPTS, GREEDY)
        _assert_three_way(outputs, reference.generate(MIXED_PROMPTS, GREEDY), MIXED_PROMPTS, hf_model)
        assert max(len(plan.chunks) for plan in fast_plans) == len(MIXED_PROMPTS)

        prompts = [PREFIX_PROMPTS[0], PREFIX_PROMPTS[1], PREFIX_PROMPTS[1]]
        outputs = _run_staggered(fast, prompts[0], prompts[1:])
        _assert_three_way(outputs, _run_staggered(reference, prompts[0], prompts[1:]), prompts, hf_model)
        assert [o.num_cached_prompt_tokens for o in outputs] == [0, 3 * BLOCK_SIZE, 3 * BLOCK_SIZE]
        assert fast_plans == reference_plans, "rank 0's scheduler decided differently from the reference"

        os.kill(pids[0], signal.SIGKILL)
        _assert_raises_that_rank_1_was_killed(lambda: fast.generate([MIXED_PROMPTS[2]], GREEDY))
    _assert_gone(pids)
    fast.shutdown()  # idempotent after a failure (the block's exit has called it once more already)


@pytest.mark.interpreter
def test_two_ranks_with_async_scheduling_match_the_reference(qwen3_checkpoint: Path) -> None:
    """Steps loaded ahead on rank 0 (their decode tokens filled in on its device) reach rank 1 with the
    rows to fill in, which it fills from the sampled tokens rank 0 shares: greedy and seeded sampling in
    one batch (each prompt greedy in one run, seeded in the other), with logprobs (each step launched
    once the last one's tokens are read) and without (launched before), and requests that join while a
    plan is made ahead, equal to the reference engine. Then rank 1 dies while rank 0 has a step launched
    ahead (its words sent, its sampled tokens still to share): the next step raises the clear error
    within the bound, and no process is left."""
    config, state_dict = _weights(qwen3_checkpoint)
    engine_config = EngineConfig(block_size=BLOCK_SIZE, num_blocks=64, check_invariants=True)
    reference = ReferenceEngine(config, state_dict, engine_config, torch.float32, "cpu")
    seeded = dataclasses.replace(GREEDY, temperature=0.9, seed=11)
    alternating = [(GREEDY, seeded)[i % 2] for i in range(len(MIXED_PROMPTS))]
    swapped = [(seeded, GREEDY)[i % 2] for i in range(len(MIXED_PROMPTS))]
    ahead = dataclasses.replace(engine_config, async_scheduling=True)
    with FastEngine.from_pretrained(qwen3_checkpoint, ahead, "float32", "cpu", tensor_parallel_size=2) as fast:
        pids = _worker_pids(fast)
        outputs = fast.generate(MIXED_PROMPTS, alternating)
        expected = reference.generate(MIXED_PROMPTS, alternating)
        for parallel, theirs, params in zip(outputs, expected, alternating, strict=True):
            comparison = compare_traces(trace_from_output(parallel), trace_from_output(theirs), 1e-4)
            assert comparison.agree, f"async 2 ranks vs reference ({params.temperature}): {comparison}"
        decode_steps = MAX_NEW_TOKENS - 1
        assert fast.step_timings.prepared_ahead_steps >= decode_steps, "no step was launched from inputs loaded ahead"
        assert fast.step_timings.launched_ahead_steps == 0, "a step with logprobs had its logits rewritten"

        tokens_only = [dataclasses.replace(params, logprobs=0) for params in swapped]
        outputs = fast.generate(MIXED_PROMPTS, tokens_only)
        expected = reference.generate(MIXED_PROMPTS, tokens_only)
        assert [o.token_ids for o in outputs] == [o.token_ids for o in expected]
        assert fast.step_timings.launched_ahead_steps >= decode_steps, "no step was launched ahead"

        staggered = _run_staggered(fast, PREFIX_PROMPTS[0], PREFIX_PROMPTS[1:])
        for parallel, expected in zip(
            staggered, _run_staggered(reference, PREFIX_PROMPTS[0], PREFIX_PROMPTS[1:]), strict=True
        ):
            assert parallel.token_ids == expected.token_ids

        fast.add_request(MIXED_PROMPTS[1], tokens_only[0])
        fast.step()
        fast.step()
        assert fast._in_flight is not None, "no step was launched ahead"
        os.kill(pids[0], signal.SIGKILL)
        _assert_raises_that_rank_1_was_killed(lambda: _run_to_the_end(fast))
    _assert_gone(pids)


@pytest.mark.interpreter
def test_two_ranks_chunked_prefill_and_preemption_llama_with_one_kv_head(llama_checkpoint: Path) -> None:
    """State dict in memory (handed to the worker process as shared memory); a budget of 10 tokens and a
    pool of 7 blocks. Shutdown ends every rank, and the engine refuses to step afterwards."""
    config, state_dict = _weights(llama_checkpoint)
    hf = _hf_model(llama_checkpoint)
    engine_config = EngineConfig(block_size=BLOCK_SIZE, num_blocks=7, max_num_batched_tokens=10, check_invariants=True)
    reference = ReferenceEngine(config, state_dict, engine_config, torch.float32, "cpu")
    prompts = MIXED_PROMPTS[1:]
    with FastEngine(config, state_dict, engine_config, torch.float32, "cpu", tensor_parallel_size=2) as fast:
        pids = _worker_pids(fast)
        fast_plans, reference_plans = record_plans(fast), record_plans(reference)
        outputs = fast.generate(prompts, GREEDY)
        _assert_three_way(outputs, reference.generate(prompts, GREEDY), prompts, hf)
    _assert_gone(pids)
    assert fast_plans == reference_plans
    assert any(not c.samples and c.num_tokens > 1 for plan in fast_plans for c in plan.chunks), "nothing was chunked"
    assert any(plan.preempted for plan in fast_plans), "the pool never ran short"
    with pytest.raises(TensorParallelError, match="shut down"):
        fast.generate([MIXED_PROMPTS[0]], GREEDY)


# ----------------------------------------------------------------------------- faults


def _no_worker_may_start(monkeypatch: pytest.MonkeyPatch) -> None:
    def start(rank: int, payload: bytes) -> None:
        pytest.fail(f"a worker process was started for rank {rank}")

    monkeypatch.setattr(tp_launch.WorkerProcess, "start", start)


def test_a_size_that_does_not_divide_the_heads_fails_before_any_process_starts(
    tiny_weights, monkeypatch: pytest.MonkeyPatch
) -> None:
    config, state_dict = tiny_weights
    _no_worker_may_start(monkeypatch)
    with pytest.raises(ConfigError, match="tensor_parallel_size 3 does not divide the model's 4 attention heads"):
        FastEngine(config, state_dict, EngineConfig(num_blocks=8), torch.float32, FAST_DEVICE, tensor_parallel_size=3)


class WeightsOfTheMainProgram(dict):
    """A state dict whose class, as if defined in a script or a notebook, only the main module holds."""


def test_weights_a_fresh_process_could_not_import_are_refused_before_any_process_starts(
    tiny_weights, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker process imports the modules that its spec's pickle names, never the main program: rank 0
    says so, and what to do instead, rather than leaving the worker to fail."""
    config, state_dict = tiny_weights
    monkeypatch.setattr(WeightsOfTheMainProgram, "__module__", "__main__")
    monkeypatch.setattr(sys.modules["__main__"], "WeightsOfTheMainProgram", WeightsOfTheMainProgram, raising=False)
    _no_worker_may_start(monkeypatch)
    spec = WorkerSpec(
        config, StateDictWeights(WeightsOfTheMainProgram(state_dict)), EngineConfig(tensor_parallel_size=2),
        torch.float32, "cpu", "tcp://127.0.0.1:1", 1,
    )  # fmt: skip
    with pytest.raises(ConfigError, match=r"cannot import 'WeightsOfTheMainProgram'.*plain dict of tensors"):
        tp_launch.WorkerProcesses(spec)


@pytest.mark.interpreter
def test_a_worker_that_raises_makes_rank_0_raise_with_its_error_and_nothing_is_left(tiny_weights) -> None:
    """Start-up: rank 1 fails while packing its shard (rank 0 meanwhile waits in a start-up collective)."""
    config, state_dict = tiny_weights
    weights = StateDictWeights(ExplodingStateDict(state_dict))
    started = time.monotonic()
    with pytest.raises(
        TensorParallelError, match=r"(?s)rank 1 \(pid \d+\) failed:.*planted failure while reading"
    ) as raised:
        FastEngine(config, weights, EngineConfig(num_blocks=8), torch.float32, "cpu", tensor_parallel_size=2)
    assert time.monotonic() - started < 60
    _assert_gone([int(pid) for pid in re.findall(r"\(pid (\d+)\)", str(raised.value))])


# ----------------------------------------------------------------------------- programs of their own

# Programs run as subprocesses on the CPU (gloo, Triton's interpreter): they prove how the ranks start and
# end; the tests above prove the numerics. Interpreter tests too: on a CUDA machine the interpreter is
# that machine's Triton, not the one the CPU suite pins, and the H200 image's (3.6) cannot run the prefill
# kernel ("only 0-dimensional arrays can be converted to Python scalars",
# reports/results/fast_gpu/suite_7a3acee/); there the launch is the same `python -m` worker start.
SCRIPT_TIMEOUT_S = 300
SCRIPT_PROMPTS = MIXED_PROMPTS[:2]
SCRIPT_MAX_TOKENS = 2  # a prefill step and a decode step


@pytest.fixture(scope="module")
def script_tokens(qwen3_checkpoint: Path) -> list[list[int]]:
    """The reference engine's greedy tokens for SCRIPT_PROMPTS."""
    config, state_dict = _weights(qwen3_checkpoint)
    reference = ReferenceEngine(config, state_dict, EngineConfig(block_size=8, num_blocks=16), torch.float32, "cpu")
    greedy = SamplingParams(temperature=0.0, max_tokens=SCRIPT_MAX_TOKENS, ignore_eos=True)
    return [list(output.token_ids) for output in reference.generate(SCRIPT_PROMPTS, greedy)]


def _start_on_the_cpu(
    command: list[str], cwd: Path, environment: dict[str, str] | None = None, stdin: bool = False
) -> subprocess.Popen:
    """`command` with this checkout's code on the CPU; its output captured."""
    cpu = {"CUDA_VISIBLE_DEVICES": "", "TRITON_INTERPRET": "1", "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.Popen(
        command, env=os.environ | cpu | (environment or {}), cwd=cwd, text=True, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
    )  # fmt: skip


def _printed(stdout: str, label: str) -> list[str]:
    return [line.removeprefix(label + " ") for line in stdout.splitlines() if line.startswith(label + " ")]


_TORCHRUN_SCRIPT = """
import json, os, sys, time, torch
from fast.engine import FastEngine
from spec.engine_config import EngineConfig
from spec.sampling_params import SamplingParams
def threads():
    return len(os.listdir("/proc/self/task"))
torch.set_num_threads(1)
threads_before = threads()
engine = FastEngine.from_pretrained(sys.argv[1], EngineConfig(block_size=8, num_blocks=16), "float32", "cpu",
                                    tensor_parallel_size=2)
# Only rank 0 gets here: the other rank served inside the constructor and left with exit code 0.
greedy = SamplingParams(temperature=0.0, max_tokens=int(sys.argv[3]), ignore_eos=True)
outputs = engine.generate(json.loads(sys.argv[2]), greedy)
engine.shutdown()
print("TOKENS", json.dumps([list(output.token_ids) for output in outputs]))
deadline = time.monotonic() + 10  # the teardown thread's OS thread may take a moment to be reaped
while threads() > threads_before and time.monotonic() < deadline:
    time.sleep(0.05)
print("THREADS", threads_before, threads())
"""


@pytest.mark.interpreter
def test_ranks_from_the_environment_as_torchrun_sets_them(qwen3_checkpoint: Path, script_tokens) -> None:
    port = _free_port()
    processes = []
    for rank in range(2):
        torchrun = {
            "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
        }  # fmt: skip
        arguments = [str(qwen3_checkpoint), json.dumps(SCRIPT_PROMPTS), str(SCRIPT_MAX_TOKENS)]
        processes.append(_start_on_the_cpu([sys.executable, "-c", _TORCHRUN_SCRIPT, *arguments], REPO_ROOT, torchrun))
    results = [process.communicate(timeout=SCRIPT_TIMEOUT_S) for process in processes]
    for rank, (process, (_, stderr)) in enumerate(zip(processes, results, strict=True)):
        assert process.returncode == 0, f"rank {rank}: {stderr[-3000:]}"
    # The engine, still referenced, keeps no gloo threads after shutdown: threads alive at
    # interpreter exit could end rank 0 in std::terminate (ProcessGroups.destroy says why).
    threads = [line.split() for line in _printed(results[0][0], "THREADS")]
    assert len(threads) == 1 and threads[0][0] == threads[0][1], threads
    printed = _printed(results[0][0], "TOKENS")
    assert len(printed) == 1 and "TOKENS" not in results[1][0]
    assert json.loads(printed[0]) == script_tokens


# A user's program that builds a 2-rank engine, run as a main module that no worker could import. A
# script on standard input (what multiprocessing's spawn could not start: it re-imported the main module
# from "<stdin>") builds it through twinfer's LLM and shuts it down. `python -i -c` builds one in its code,
# shuts it down, then one more in the interactive session that follows (a main module without a file, as
# a notebook's kernel runs code), left to interpreter exit.
_SETTINGS = [
    "import json",
    "from spec.engine_config import EngineConfig",
    "from spec.sampling_params import SamplingParams",
    "settings = EngineConfig(block_size=8, num_blocks=16, tensor_parallel_size=2)",
    "greedy = SamplingParams(temperature=0.0, max_tokens={max_tokens}, ignore_eos=True)",
]
_BY_LLM = [
    "from twinfer import LLM",
    "llm = LLM({checkpoint!r}, engine='fast', dtype='float32', device='cpu', engine_config=settings)",
    "outputs = llm.generate({prompts!r}, greedy)",
    "print('PIDS', json.dumps(llm.engine.tensor_parallel.workers.pids))",
]
_BY_FAST_ENGINE = [
    "from fast.engine import FastEngine",
    "engine = FastEngine.from_pretrained({checkpoint!r}, settings, 'float32', 'cpu')",
    "outputs = engine.generate({prompts!r}, greedy)",
    "print('PIDS', json.dumps(engine.tensor_parallel.workers.pids))",
]
_PRINT_TOKENS = ["print('TOKENS', json.dumps([list(output.token_ids) for output in outputs]))"]


@pytest.mark.interpreter
def test_two_ranks_start_from_any_main(qwen3_checkpoint: Path, script_tokens, tmp_path: Path) -> None:
    """Both programs at once, run from a directory of their own: each engine generates the reference's
    tokens, and once a program has exited none of its worker processes is left."""
    values = {"checkpoint": str(qwen3_checkpoint), "prompts": SCRIPT_PROMPTS, "max_tokens": SCRIPT_MAX_TOKENS}

    def program(*parts: list[str]) -> str:
        return "\n".join(line for part in parts for line in part).format(**values) + "\n"

    script = program(_SETTINGS, _BY_LLM, _PRINT_TOKENS, ["llm.shutdown()"])
    code = program(_SETTINGS, _BY_FAST_ENGINE, _PRINT_TOKENS, ["engine.shutdown()"])
    session = program(_BY_FAST_ENGINE, _PRINT_TOKENS)
    runs = {  # what runs it, what it reads on standard input, how many engines it builds
        "a script on standard input": ([sys.executable, "-"], script, 1),
        "python -c, then an interactive session": ([sys.executable, "-q", "-i", "-c", code], session, 2),
    }
    running = {kind: _start_on_the_cpu(command, tmp_path, stdin=True) for kind, (command, _, _) in runs.items()}
    for kind, process in running.items():
        _, stdin, engines = runs[kind]
        stdout, stderr = process.communicate(stdin, timeout=SCRIPT_TIMEOUT_S)
        assert process.returncode == 0 and "Traceback" not in stderr, f"{kind}: {stderr[-3000:]}"
        tokens, pids = _printed(stdout, "TOKENS"), _printed(stdout, "PIDS")
        assert [json.loads(line) for line in tokens] == [script_tokens] * engines, f"{kind}: {stdout[-2000:]}"
        _assert_gone([pid for line in pids for pid in json.loads(line)])


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
