"""`twinfer bench`: the standard workloads exactly as benchmarks.md writes them, the shapes and
their physical floors, and the harness end to end on the CPU (tiny shape, scaled-down workloads,
reference engine and transformers), down to the fields of the JSON record."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from fast.weights import ShardLayout
from reports.bench import harness
from reports.bench.harness import decode_read_bytes, phase_metrics
from reports.bench.profile import (
    KernelInterval,
    busy_time_us,
    busy_us_by_name,
    host_call_summary,
    kernel_kind,
    summarise,
)
from reports.bench.runners import PhaseRun, RequestRun, _step_timings_since, _step_timings_snapshot
from reports.bench.shapes import SHAPES, build_hf_model, random_state_dict
from reports.bench.workloads import WORKLOADS, build_workload
from spec.checkpoint import expected_weight_shapes
from spec.errors import ConfigError
from twinfer.cli import main

# Figures stated in ../shared/benchmarks.md.
H200_COPY_BANDWIDTH = 4.27e12  # bytes/s


# ----------------------------------------------------------------------------- workloads as written


def test_offline_256_is_nano_vllms_workload() -> None:
    workload = build_workload("offline-256")
    (phase,) = workload.phases
    assert len(phase.requests) == 256 and phase.temperature == 0.6
    assert phase.num_prompt_tokens == 142_827 and phase.num_output_tokens == 133_966
    assert all(0 <= i <= 10000 for r in phase.requests for i in r.prompt_token_ids)
    assert workload.standard and not workload.latency


def test_decode_workloads() -> None:
    (phase,) = build_workload("decode-bs1").phases
    (request,) = phase.requests
    assert len(request.prompt_token_ids) == 128 and request.max_tokens == 256 and phase.temperature == 0
    assert max(request.prompt_token_ids) < 10000

    sweep = build_workload("decode-sweep")
    assert [len(p.requests) for p in sweep.phases] == [1, 8, 32, 128, 256]
    for phase in sweep.phases:
        assert {(len(r.prompt_token_ids), r.max_tokens) for r in phase.requests} == {(1024, 128)}
        assert len({r.prompt_token_ids for r in phase.requests}) == len(phase.requests)  # distinct prompts


def test_prefix_shared_and_long_context() -> None:
    on, off = build_workload("prefix-shared").phases
    assert (on.prefix_caching, off.prefix_caching) == (True, False) and on.requests == off.requests
    assert len(on.requests) == 64
    prefix = on.requests[0].prompt_token_ids[:2048]
    assert all(len(r.prompt_token_ids) == 2048 + 128 and r.prompt_token_ids[:2048] == prefix for r in on.requests)
    assert len({r.prompt_token_ids[2048:] for r in on.requests}) == 64 and {r.max_tokens for r in on.requests} == {128}

    (phase,) = build_workload("long-context").phases
    assert [(len(r.prompt_token_ids), r.max_tokens) for r in phase.requests] == [(16384, 256)] * 8


def test_scaled_workloads_are_marked_and_bounded() -> None:
    for name in WORKLOADS:
        workload = build_workload(name, 0.01)
        assert not workload.standard
        assert "NOT the standard workload" in workload.record()["scale_note"]
        assert all(r.prompt_token_ids and r.max_tokens >= 1 for p in workload.phases for r in p.requests)
    for scale in (0.0, -1.0, 1.5):
        with pytest.raises(ConfigError, match="--scale must be in"):
            build_workload("decode-bs1", scale)
    with pytest.raises(ConfigError, match="unknown workload"):
        build_workload("offline-512")


# ----------------------------------------------------------------------------- shapes and floors


def test_shapes_match_the_table() -> None:
    assert SHAPES["qwen3-0.6b"].num_parameters() == 596_049_920
    assert round(SHAPES["qwen3-8b"].num_parameters() / 1e9, 2) == 8.19
    config = SHAPES["qwen3-8b"].model_config()
    assert (config.hidden_size, config.num_hidden_layers, config.num_key_value_heads, config.tie_word_embeddings) == (
        4096,
        36,
        8,
        False,
    )
    assert config.rope_theta == 1e6 and config.rms_norm_eps == 1e-6 and config.max_position_embeddings == 40960


def test_rank_share_is_what_one_tensor_parallel_rank_holds() -> None:
    full = SHAPES["qwen3-8b"]
    share = full.rank_share(2)
    layout = ShardLayout.for_rank(full.model_config(), 0, 2)
    assert (share.num_attention_heads, share.num_key_value_heads, share.intermediate_size, share.vocab_size) == (
        layout.num_heads,
        layout.num_kv_heads,
        layout.intermediate_size,
        layout.vocab_shard_size,
    )
    assert (share.num_attention_heads, share.num_key_value_heads, share.intermediate_size, share.vocab_size) == (
        16,
        4,
        6144,
        75968,
    )
    assert (share.hidden_size, share.num_hidden_layers, share.head_dim) == (4096, 36, 128)
    # Everything but the unsharded norms and the embedding read once: half the decode step's weight bytes.
    ratio = share.weight_bytes_read_per_decode_step(torch.bfloat16) / full.weight_bytes_read_per_decode_step(
        torch.bfloat16
    )
    assert ratio == pytest.approx(0.5, abs=1e-4)
    assert full.rank_share(1) is full
    assert SHAPES["qwen3-0.6b"].rank_share(16).num_key_value_heads == 1  # fewer KV heads than ranks: replicated
    with pytest.raises(ValueError, match="do not divide"):
        full.rank_share(3)


def test_floors_reproduce_benchmarks_md() -> None:
    bf16 = torch.bfloat16
    assert SHAPES["qwen3-0.6b"].weight_bytes_read_per_decode_step(bf16) / H200_COPY_BANDWIDTH == pytest.approx(
        0.28e-3, rel=0.01
    )
    assert SHAPES["qwen3-8b"].weight_bytes_read_per_decode_step(bf16) / H200_COPY_BANDWIDTH == pytest.approx(
        3.5e-3, rel=0.02
    )
    assert SHAPES["qwen3-0.6b"].kv_bytes_per_token(bf16) == 114_688
    (phase,) = build_workload("offline-256").phases
    floor_s = decode_read_bytes(SHAPES["qwen3-0.6b"], bf16, phase) / H200_COPY_BANDWIDTH
    assert floor_s == pytest.approx(3.5, rel=0.02)
    assert phase.num_output_tokens / floor_s == pytest.approx(38_000, rel=0.02)


def test_prefill_flops_count_projections_and_causal_attention() -> None:
    shape = SHAPES["tiny"]
    one_token = shape.prefill_flops(1)
    attention_one_pair = 2 * 2 * shape.head_dim * shape.num_attention_heads * shape.num_hidden_layers
    assert one_token == 2 * shape.layer_matmul_parameters() + attention_one_pair
    assert shape.prefill_flops(4) == 4 * 2 * shape.layer_matmul_parameters() + 10 * attention_one_pair


def test_random_weights_are_deterministic_and_shared_with_transformers() -> None:
    shape = SHAPES["tiny"]
    config = shape.model_config()
    first = random_state_dict(config, torch.float32, torch.device("cpu"), seed=3)
    again = random_state_dict(config, torch.float32, torch.device("cpu"), seed=3)
    other = random_state_dict(config, torch.float32, torch.device("cpu"), seed=4)
    assert first.keys() == expected_weight_shapes(config).keys()
    assert all(torch.equal(first[name], again[name]) for name in first)
    assert not torch.equal(first["model.embed_tokens.weight"], other["model.embed_tokens.weight"])
    assert torch.equal(first["model.norm.weight"], torch.ones(shape.hidden_size))
    hf = build_hf_model(shape, torch.float32, torch.device("cpu"), seed=3, attn_implementation="sdpa")
    hf_weights = hf.state_dict()
    assert all(torch.equal(hf_weights[name], tensor) for name, tensor in first.items())


# ----------------------------------------------------------------------------- figures from timings


def test_metrics_from_timings() -> None:
    """Two requests, times known: TPOT is (last - first) / (n - 1), the median over requests,
    then over runs; throughput and prefill come from the first run."""
    first = PhaseRun(
        wall_s=2.0,
        requests=[
            RequestRun(10, (1, 2, 3), (0.5, 0.7, 0.9), num_cached_prompt_tokens=0),  # TPOT 0.2
            RequestRun(6, (4, 5), (1.0, 1.4), num_cached_prompt_tokens=4),  # TPOT 0.4
        ],
    )
    second = PhaseRun(
        wall_s=1.0, requests=[RequestRun(10, (1, 2), (0.1, 0.2), 8), RequestRun(6, (4, 5), (0.1, 0.2), 4)]
    )
    metrics = phase_metrics([first, second])
    assert metrics["output_tokens"] == 5 and metrics["output_tokens_per_s"] == 2.5
    assert metrics["prompt_tokens"] == 16 and metrics["prompt_tokens_served_from_cache"] == 4
    assert metrics["prompt_tokens_computed"] == 12
    assert metrics["time_to_last_first_token_s"] == 1.0 and metrics["prefill_tokens_per_s"] == 16.0
    assert metrics["tpot_s_per_run"] == pytest.approx([0.3, 0.1])
    assert metrics["tpot_s"] == pytest.approx(0.2)


def test_independent_runs_take_their_throughput_from_the_median_run() -> None:
    """Runs each on a fresh engine (a throughput workload's): throughput and prefill from the run of median wall
    time, whichever came first; TPOT as before."""
    runs = [
        PhaseRun(wall_s=wall, requests=[RequestRun(10, (1, 2, 3), (0.5, 0.7, 0.9), num_cached_prompt_tokens=0)])
        for wall in (3.0, 1.0, 2.0)
    ]
    metrics = phase_metrics(runs, independent=True)
    assert metrics["throughput_run"] == 2 and metrics["wall_s"] == 2.0 and metrics["output_tokens_per_s"] == 1.5
    assert phase_metrics(runs[:2], independent=True)["throughput_run"] == 0  # of two, the slower
    assert phase_metrics(runs)["throughput_run"] == 0  # on one engine: the first, the only one with no cache hits


@dataclass
class _RunningTotals:
    num_steps: int = 0
    schedule_s: float = 0.0
    prepare_s: float = 0.0
    forward_s: float = 0.0


class _EngineWithTotals:
    def __init__(self) -> None:
        self.step_timings = _RunningTotals(num_steps=5, schedule_s=1.0, prepare_s=2.0, forward_s=3.0)


class _EngineWithEntries:
    def __init__(self) -> None:
        self.step_timings: list[tuple[float, float, float]] = [(9.0, 9.0, 9.0)]


def test_engine_step_timings_are_read_for_the_run_only() -> None:
    engine = _EngineWithTotals()
    before = _step_timings_snapshot(engine)
    engine.step_timings.num_steps += 2
    engine.step_timings.schedule_s += 0.25
    engine.step_timings.forward_s += 0.5
    split = _step_timings_since(engine, before)
    assert split["num_steps"] == 2 and split["schedule_s"] == 0.25 and split["prepare_s"] == 0.0
    assert split["forward_s"] == 0.5

    listed = _EngineWithEntries()
    before = _step_timings_snapshot(listed)
    listed.step_timings += [(0.1, 0.2, 0.3), (0.3, 0.2, 0.1)]
    split = _step_timings_since(listed, before)
    assert split["num_steps"] == 2
    assert split["schedule_s"] == pytest.approx(0.4) and split["median_forward_s"] == pytest.approx(0.2)

    assert _step_timings_since(object(), _step_timings_snapshot(object())) is None


# ----------------------------------------------------------------------------- end to end on the CPU


def _bench(tmp_path: Path, workload: str, *extra: str) -> dict:
    path = tmp_path / f"{workload}.json"
    code = main(
        [
            "bench",
            workload,
            "--shape",
            "tiny",
            "--dtype",
            "float32",
            "--device",
            "cpu",
            "--no-progress",
            "--json",
            str(path),
            *extra,
        ]
    )
    assert code == 0
    return json.loads(path.read_text())


def _positive(value: object) -> bool:
    return isinstance(value, int | float) and math.isfinite(value) and value > 0


def test_decode_bs1_record_with_transformers_baseline(tmp_path: Path) -> None:
    record = _bench(
        tmp_path, "decode-bs1", "--engine", "reference", "--baseline", "hf", "--scale", "0.05", "--repeats", "2"
    )
    environment = record["environment"]
    for key in ("torch", "triton", "transformers", "commit", "gpu", "gpu_driver", "device", "command"):
        assert key in environment
    assert environment["torch"] == torch.__version__ and environment["device"] == "cpu"
    assert _positive(record["ceilings"]["copy_bandwidth"]["value"]) and _positive(
        record["ceilings"]["matmul_bf16"]["value"]
    )
    assert len(record["ceilings"]["copy_bandwidth"]["samples_s"]) >= 3
    assert record["shape"]["name"] == "tiny" and record["dtype"] == "float32"
    assert record["workload"]["standard_workload"] is False and record["workload"]["scale"] == 0.05
    assert record["runs_per_phase"] == 2

    reference, hf = record["results"]
    assert (reference["engine"], hf["engine"]) == ("reference", "hf")
    expected_tokens = record["workload"]["phases"][0]["num_output_tokens"]
    for result in (reference, hf):
        (phase,) = result["phases"]
        metrics = phase["metrics"]
        assert metrics["output_tokens"] == expected_tokens and len(phase["runs"]) == 2
        assert (
            _positive(metrics["tpot_s"]) and _positive(metrics["wall_s"]) and _positive(metrics["output_tokens_per_s"])
        )
        assert metrics["tpot_s"] < metrics["wall_s"]
        assert metrics["tokens_per_s_per_request_from_tpot"] == pytest.approx(1 / metrics["tpot_s"])
        assert _positive(metrics["floors"]["decode_step_floor_s"]) and _positive(
            metrics["floors"]["tpot_over_decode_step_floor"]
        )
    engine_phase = reference["phases"][0]
    assert engine_phase["engine_config"]["block_size"] == 16 and engine_phase["engine_config"]["num_blocks"] >= 1
    # The engine's build time; the reference engine keeps no start-up phases (the fast engine's: test_fast_engine).
    assert list(engine_phase["start_up"]) == ["build_s"] and _positive(engine_phase["start_up"]["build_s"])
    assert engine_phase["metrics"]["num_full_batch_decode_steps"] == 2 * (expected_tokens - 1)
    assert engine_phase["runs"][0]["num_steps"] >= expected_tokens
    assert hf["phases"][0]["method"] == "generate"


def test_the_edit_workload_on_the_shipped_model_beside_transformers_prompt_lookup(tmp_path: Path) -> None:
    """decode-bs1-edit (speculative decoding's workload: a module, then its start again) with --model: the shipped
    checkpoint's weights in both engines (its shape recorded, its small vocabulary's own warm-up prompt), and
    transformers' assisted generation by prompt lookup beside it (several tokens a step, each one timed)."""
    (phase,) = build_workload("decode-bs1-edit").phases
    (request,) = phase.requests
    assert len(request.prompt_token_ids) == 707 and request.max_tokens == 256 and phase.temperature == 0
    model = "twinfer/models/stdlib-tiny"
    record = _bench(
        tmp_path, "decode-bs1-edit", "--model", model, "--engine", "reference", "--baseline", "hf",
        "--hf-prompt-lookup", "3", "--scale", "0.1", "--repeats", "1", "--speculative-method", "ngram",
        "--num-speculative-tokens", "3",
    )  # fmt: skip
    assert record["model"] == model and record["shape"]["name"] == "stdlib-tiny"
    assert record["shape"]["vocab_size"] == 4096 and record["shape"]["max_position_embeddings"] == 1024
    reference, hf = record["results"]
    assert hf["transformers_settings"]["prompt_lookup_num_tokens"] == 3
    expected_tokens = record["workload"]["phases"][0]["num_output_tokens"]
    for result in (reference, hf):
        (result_phase,) = result["phases"]
        assert result_phase["metrics"]["output_tokens"] == expected_tokens
        # A time per output token needs one time per token: transformers' assisted steps hand several at once.
        assert _positive(result_phase["metrics"]["tpot_s"])


def test_rank_share_runs_the_smaller_shape(tmp_path: Path) -> None:
    record = _bench(
        tmp_path, "decode-bs1", "--engine", "reference", "--scale", "0.02", "--repeats", "1", "--rank-share", "2"
    )
    shape = record["shape"]
    assert shape["name"] == "tiny/rank-share-of-2"
    assert (shape["num_attention_heads"], shape["num_key_value_heads"], shape["intermediate_size"]) == (2, 1, 64)
    assert shape["num_parameters"] < SHAPES["tiny"].num_parameters()
    assert record["results"][0]["phases"][0]["metrics"]["output_tokens"] > 0


def test_offline_through_continuous_batching(tmp_path: Path) -> None:
    record = _bench(tmp_path, "offline-256", "--engine", "reference", "--baseline", "hf", "--scale", "0.01")
    (phase,) = record["workload"]["phases"]
    assert phase["temperature"] == 0.6 and phase["num_requests"] == 3
    for result in record["results"]:
        metrics = result["phases"][0]["metrics"]
        assert metrics["output_tokens"] == phase["num_output_tokens"]  # ignore_eos held on both
        assert metrics["prompt_tokens"] == phase["num_prompt_tokens"]
        assert _positive(metrics["output_tokens_per_s"])
    assert record["results"][1]["phases"][0]["method"] == "continuous_batching"


def test_a_throughput_workload_runs_each_time_on_a_fresh_engine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """offline-256's figure counts its prefill: a second run on one engine would find every prompt in the prefix
    cache. So each of --repeats runs, and the profile, gets an engine of its own, and no run finds a prompt
    cached; the figures are the median run's (two runs: the slower)."""
    built = []
    monkeypatch.setattr(harness, "build_random_engine", _counting(harness.build_random_engine, built))
    # 4-token blocks: the scaled prompts (5 to 10 tokens) fill whole blocks, which a second run on one engine would
    # find in its prefix cache.
    record = _bench(
        tmp_path, "offline-256", "--engine", "reference", "--scale", "0.01", "--repeats", "2", "--profile",
        "--block-size", "4",
    )  # fmt: skip
    assert (record["runs_per_phase"], record["hf_runs_per_phase"]) == (2, 1)
    (phase,) = record["results"][0]["phases"]
    assert len(built) == 3  # two timed runs and the profile
    assert len(phase["runs"]) == 2 and all(run["prompt_tokens_served_from_cache"] == 0 for run in phase["runs"])
    walls = [run["wall_s"] for run in phase["runs"]]
    assert phase["metrics"]["wall_s"] == max(walls) == walls[phase["metrics"]["throughput_run"]]
    assert phase["profile"]["num_steps"] == phase["runs"][0]["num_steps"]


def test_a_latency_workload_runs_on_one_engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """decode-bs1's runs and its profile on one engine, its throughput from the first run."""
    built = []
    monkeypatch.setattr(harness, "build_random_engine", _counting(harness.build_random_engine, built))
    record = _bench(tmp_path, "decode-bs1", "--engine", "reference", "--scale", "0.05", "--repeats", "2", "--profile")
    (phase,) = record["results"][0]["phases"]
    assert len(built) == 1 and len(phase["runs"]) == 2 and phase["metrics"]["throughput_run"] == 0


def _counting(function, calls: list):  # type: ignore[no-untyped-def]
    def wrapper(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(args)
        return function(*args, **kwargs)

    return wrapper


def test_prefix_shared_counts_cached_tokens_and_compares_outputs(tmp_path: Path) -> None:
    # A small step budget admits the requests one after another, so later ones find the prefix cached.
    record = _bench(
        tmp_path, "prefix-shared", "--engine", "reference", "--scale", "0.05", "--max-num-batched-tokens", "32"
    )
    (result,) = record["results"]
    on, off = result["phases"]
    assert (on["phase"], off["phase"]) == ("prefix-caching-on", "prefix-caching-off")
    assert on["engine_config"]["enable_prefix_caching"] and not off["engine_config"]["enable_prefix_caching"]
    assert on["engine_config"]["max_num_batched_tokens"] == 32
    assert on["metrics"]["prompt_tokens_served_from_cache"] > 0
    assert off["metrics"]["prompt_tokens_served_from_cache"] == 0
    assert on["metrics"]["prompt_tokens_computed"] < off["metrics"]["prompt_tokens_computed"]
    assert result["comparisons"]["outputs_identical"] is True


def test_sweep_and_long_context_run(tmp_path: Path) -> None:
    sweep = _bench(tmp_path, "decode-sweep", "--engine", "reference", "--scale", "0.01", "--repeats", "1")
    labels = [phase["phase"] for phase in sweep["results"][0]["phases"]]
    assert labels == [phase["label"] for phase in sweep["workload"]["phases"]] == ["batch-1", "batch-3"]
    long_context = _bench(tmp_path, "long-context", "--engine", "reference", "--scale", "0.01", "--repeats", "1")
    metrics = long_context["results"][0]["phases"][0]["metrics"]
    assert _positive(metrics["prefill_tokens_per_s"]) and _positive(metrics["floors"]["prefill_tflops"])


def test_bench_refuses_what_cannot_run(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    common = ["bench", "decode-bs1", "--shape", "tiny", "--device", "cpu", "--scale", "0.01"]
    assert main([*common, "--engine", "fast"]) == 2
    assert "set TRITON_INTERPRET=1" in capsys.readouterr().err
    assert main([*common, "--engine", "hf", "--baseline", "hf"]) == 2
    assert "is the engine benchmarked already" in capsys.readouterr().err
    assert main([*common, "--engine", "reference", "--block-size", "3"]) == 2
    assert "block_size must be a power of two" in capsys.readouterr().err
    assert main([*common, "--engine", "reference", "--rank-share", "3"]) == 2
    assert "--rank-share 3: 3 ranks do not divide tiny's attention heads" in capsys.readouterr().err


# ----------------------------------------------------------------------------- --profile


def test_gpu_busy_time_counts_overlapping_kernels_once() -> None:
    kernels = [
        KernelInterval("a", 0.0, 10.0),
        KernelInterval("b", 5.0, 12.0),  # overlaps a: only 10..12 is new
        KernelInterval("c", 20.0, 25.0),
        KernelInterval("d", 21.0, 22.0),  # inside c
    ]
    assert busy_time_us(kernels) == 17.0
    assert busy_time_us([]) == 0.0


def test_busy_time_goes_to_the_kernel_the_others_wait_for() -> None:
    """Under programmatic dependent launch a kernel starts while its predecessor runs and waits for it: the
    overlap is the predecessor's busy time, not the waiter's, and busy times add up to the union."""
    gemv, norm, copy = "_gemv_kernel", "_add_rmsnorm_kernel", "Memcpy DtoD (Device -> Device)"
    kernels = [
        KernelInterval(gemv, 0.0, 10.0),
        KernelInterval(norm, 4.0, 13.0),  # launched early: waits until 10, then works 10..13
        KernelInterval(gemv, 11.0, 20.0),  # launched early again: 13..20 is its own
        KernelInterval(copy, 15.0, 16.0),  # inside the second gemv, on another stream
        KernelInterval(copy, 30.0, 31.0),
    ]
    busy = busy_us_by_name(kernels)
    assert busy == pytest.approx({gemv: 17.0, norm: 3.0, copy: 1.0})
    assert sum(busy.values()) == busy_time_us(kernels) == pytest.approx(21.0)
    run = PhaseRun(wall_s=1e-4, requests=[], step_wall_s=[5e-5], engine_step_timings={"num_steps": 1})
    summary = summarise(kernels, run)
    assert summary["kernel_time_s_by_kind"]["norm"] == pytest.approx(9e-6), "its whole interval"
    assert summary["gpu_busy_s_by_kind"]["norm"] == pytest.approx(3e-6), "what it adds to the union"
    assert summary["gpu_busy_s_by_kind"]["matmul (GEMV)"] == pytest.approx(17e-6)
    assert sum(summary["gpu_busy_s_by_kind"].values()) == pytest.approx(summary["gpu_busy_s"])
    assert {k["name"]: k["busy_s"] for k in summary["top_kernels"]} == pytest.approx(
        {gemv: 17e-6, norm: 3e-6, copy: 1e-6}
    )


def test_kernel_kinds() -> None:
    assert kernel_kind("_decode_split_kernel") == "attention (decode)"
    assert kernel_kind("nvjet_tst_128x64_64x4_1x2_h_bz_coopA_NTN") == "matmul"
    assert kernel_kind("_add_rmsnorm_kernel") == "norm"
    assert kernel_kind("void at::native::reduce_kernel<512, 1>") == "sampling and logits (reductions, sort, top-k)"
    assert kernel_kind("something_new") == "other"
    assert kernel_kind("_gemv_kernel") == "matmul (GEMV)"
    for communication in ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "ncclDevKernel_AllGather_RING_LL"):
        assert kernel_kind(communication) == "all-reduce / communication"
    assert kernel_kind("void c10d::symmetric_memory::one_shot_all_reduce_kernel<bf16, 2>") == (
        "all-reduce / communication"
    )


def test_host_communication_calls_are_summed_by_name() -> None:
    calls = [KernelInterval("gloo:broadcast", 0.0, 100.0), KernelInterval("gloo:broadcast", 200.0, 250.0)]
    (summary,) = host_call_summary(calls)
    assert summary == {"name": "gloo:broadcast", "calls": 2, "total_s": 150e-6, "mean_us": 75.0}


def test_profile_summary_from_intervals() -> None:
    run = PhaseRun(wall_s=1e-4, requests=[], step_wall_s=[5e-5, 5e-5], engine_step_timings={"num_steps": 2})
    summary = summarise([KernelInterval("_decode_split_kernel", 0.0, 30.0), KernelInterval("gemm", 40.0, 50.0)], run)
    assert summary["gpu_busy_s"] == pytest.approx(40e-6)
    assert summary["gpu_busy_fraction_of_wall"] == pytest.approx(0.4)
    assert summary["gpu_busy_s_per_step"] == pytest.approx(20e-6)
    assert summary["kernel_time_s_by_kind"] == pytest.approx({"attention (decode)": 30e-6, "matmul": 10e-6})
    assert summary["gpu_busy_s_by_kind"] == pytest.approx({"attention (decode)": 30e-6, "matmul": 10e-6})
    assert [k["name"] for k in summary["top_kernels"]] == ["_decode_split_kernel", "gemm"]
    assert summary["top_kernels"][0]["share_of_kernel_time"] == pytest.approx(0.75)
    waits = [
        KernelInterval("one_shot_all_reduce", start, start + length) for start, length in ((0, 6), (10, 6), (20, 90))
    ]
    (all_reduce,) = summarise(waits, run)["top_kernels"]
    assert (all_reduce["median_us"], all_reduce["max_us"], all_reduce["mean_us"]) == (6, 90, 34)


def test_bench_profile_records_a_profile_per_phase(tmp_path: Path) -> None:
    record = _bench(tmp_path, "decode-bs1", "--engine", "reference", "--scale", "0.05", "--repeats", "1", "--profile")
    (phase,) = record["results"][0]["phases"]
    profile = phase["profile"]
    assert profile["num_steps"] == phase["runs"][0]["num_steps"]  # the profiled run did the same work
    assert profile["num_kernels"] == 0 and profile["gpu_busy_s"] == 0.0  # the CPU has no CUDA kernels
    assert _positive(profile["wall_s"])


def test_tp_bench_summary_sets_two_ranks_against_one() -> None:
    from reports.bench.tensor_parallel import summary

    def engine(tpot_s: float, tokens_per_s: float, communication_s: float) -> dict:
        profile = {
            "num_steps": 4,
            "gpu_busy_s_per_step": 2e-3,
            "kernel_time_s_by_kind": {"all-reduce / communication": communication_s},
        }
        return {
            "batch-1": {"metrics": {"tpot_s": tpot_s}, "profile": profile},
            "offline": {"metrics": {"output_tokens_per_s": tokens_per_s}},
        }

    result = summary({"2": engine(3.4e-3, 9000.0, 2e-3), "1": engine(5e-3, 8000.0, 0.0)})
    assert result["decode_bs1_tpot_ratio_2_over_1"] == pytest.approx(0.68) and result["meets_target"]
    assert result["offline_256_output_tokens_per_s"] == {"2": 9000.0, "1": 8000.0}
    assert result["decode_bs1_rank0_per_step_ms"]["2"] == pytest.approx({"gpu_busy": 2.0, "communication_kernels": 0.5})
