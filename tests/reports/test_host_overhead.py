"""reports.serving.host_overhead: the fast engine's host path with the device work stubbed, on a tiny workload."""

from __future__ import annotations

import json

import pytest
import torch

from fast.engine import FastEngine
from reports.bench.workloads import build_workload
from reports.serving import host_overhead
from spec.engine_config import EngineConfig
from spec.sampling_params import SamplingParams

SCALE = 0.05  # 13 requests of 5 to 51 prompt tokens and 5 to 51 output tokens


@pytest.fixture(scope="module")
def record(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    path = tmp_path_factory.mktemp("host") / "host.json"
    assert host_overhead.main(["--scale", str(SCALE), "--repeats", "2", "--profile", "--json", str(path)]) == 0
    return json.loads(path.read_text())


def test_record_fields(record: dict[str, object]) -> None:
    assert record["repeats"] == 2 and len(record["runs"]) == 2
    assert record["workload"]["name"] == "offline-256" and record["workload"]["scale"] == SCALE
    assert record["machine"]["cpu"] and record["machine"]["python"]
    assert "commit" in record and record["engine_config"]["max_num_seqs"] == 256
    for run in record["runs"]:
        assert run["host_s"] > 0 and run["num_steps"] > 0 and run["num_full_batch_steps"] > 0
        assert 0 < run["full_batch_step_median_ms"] <= run["full_batch_step_p90_ms"]
        timings = run["step_timings"]
        assert timings["num_steps"] == run["num_steps"]
        assert timings["schedule_s"] > 0 and timings["prepare_s"] > 0 and timings["forward_s"] > 0
    assert record["median_run"] in record["runs"]
    spread = record["spread"]["host_s"]
    assert spread["min"] <= spread["median"] <= spread["max"]


def test_every_request_finishes_with_its_tokens(record: dict[str, object]) -> None:
    phase = build_workload("offline-256", SCALE).phases[0]
    for run in record["runs"]:
        assert run["all_requests_complete"] is True
        assert run["num_requests_finished"] == len(phase.requests)
        assert run["num_output_tokens"] == phase.num_output_tokens


def test_profile_lists_the_top_functions(record: dict[str, object]) -> None:
    profile = record["profile"]
    for order, key in (("top_cumulative", "cumulative_s"), ("top_total", "total_s")):
        entries = profile[order]
        assert len(entries) == host_overhead.PROFILE_TOP
        assert [e[key] for e in entries] == sorted((e[key] for e in entries), reverse=True)
        assert {"function", "location", "calls", "total_s", "cumulative_s"} <= set(entries[0])
    locations = [entry["location"] for entry in profile["top_cumulative"]]
    assert any(location.startswith("spec/engine.py:") for location in locations)  # ScheduledEngine.step


@pytest.mark.interpreter
def test_stub_engine_sets_what_fast_engine_sets(tiny_weights) -> None:
    # HostOnlyFastEngine replaces FastEngine.__init__ on the CPU: it must leave the engine in the same shape.
    model_config, state_dict = tiny_weights
    real = FastEngine(model_config, state_dict, EngineConfig(), torch.float32, "cpu")
    stub = host_overhead.HostOnlyFastEngine(model_config, EngineConfig())
    assert set(vars(stub)) == set(vars(real))
    assert type(stub.scheduler) is type(real.scheduler)
    assert stub.runner.max_step_seqs == real.runner.max_step_seqs and stub.config == real.config


def test_stub_runner_pads_decode_steps_to_graph_sizes() -> None:
    # As ModelRunner.run with CUDA graphs: a decode step of 3 requests is loaded as the graph size 4.
    model_config = host_overhead.SHAPES[host_overhead.MODEL_SHAPE].model_config()
    engine = host_overhead.HostOnlyFastEngine(model_config, EngineConfig(max_num_seqs=32))
    inputs, loads = engine.runner.inputs, []
    load = inputs.load

    def recording_load(sequences, pad_to=None):
        loads.append((len(sequences), pad_to))
        return load(sequences, pad_to)

    inputs.load = recording_load
    outputs = engine.generate(
        [[1, 2, 3], [4, 5, 6], [7, 8, 9]], SamplingParams(temperature=0.6, max_tokens=3, ignore_eos=True)
    )
    assert loads == [(3, None), (3, 4), (3, 4)]  # the prefill step, then two decode steps
    assert [len(output.token_ids) for output in outputs] == [3, 3, 3]


def test_digest_is_recorded_and_repeatable(record: dict[str, object]) -> None:
    # The digests fingerprint every plan, runner input and output: two runs of one tree agree.
    digest = record["digest"]
    assert digest["num_outputs"] == build_workload("offline-256", SCALE).phases[0].num_output_tokens
    assert digest["num_plans"] == record["median_run"]["num_steps"]
    phase = build_workload("offline-256", SCALE).phases[0]
    assert host_overhead.digest_run(phase, host_overhead.HostSettings(scale=SCALE)) == digest


def test_a_reused_request_id_samples_with_its_own_params() -> None:
    # The engine keeps each request's sampler row from step to step; a new request that reuses the id of an
    # aborted one must sample with its own seed, as on a fresh engine.
    model_config = host_overhead.SHAPES[host_overhead.MODEL_SHAPE].model_config()

    def params(seed: int) -> SamplingParams:
        return SamplingParams(temperature=0.6, max_tokens=4, ignore_eos=True, seed=seed)

    engine = host_overhead.HostOnlyFastEngine(model_config, EngineConfig(max_num_seqs=8))
    engine.add_request([1, 2, 3], params(1), request_id="a")
    engine.step()
    engine.step()
    engine.abort("a")
    engine.add_request([1, 2, 3], params(2), request_id="a")
    while engine.has_unfinished:
        outputs = engine.step()
    fresh = host_overhead.HostOnlyFastEngine(model_config, EngineConfig(max_num_seqs=8))
    (expected,) = fresh.generate([[1, 2, 3]], params(2))
    assert outputs[0].token_ids == expected.token_ids
    assert len(engine._sampler_rows) == 0  # rows of finished and aborted requests are dropped
