"""Fuzz whole engines: random requests, steps and aborts on the tiny fp32 Qwen3 model, every
request held to the same request run alone on a fresh reference engine (fuzz/engine_machine.py).

The reference engine runs in every profile. The fast engine runs too, much smaller on a CPU
(Triton's interpreter costs about a second per step of the tiny model) and larger on a GPU.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass

import pytest
import torch
from hypothesis import HealthCheck, Phase, settings
from hypothesis.reporting import with_reporter
from hypothesis.stateful import run_state_machine_as_test

from fuzz import planted_bugs, stats
from fuzz.engine_machine import SOLO_AGREEMENT, EngineMachine, SoloRuns, TinyModel, WorkloadLimits
from fuzz.strategies import ignore
from spec.checkpoint import load_model_config, load_state_dict
from spec.engine_config import EngineConfig
from spec.errors import InvariantViolation
from spec.model_config import ModelConfig
from spec.sampling_params import SamplingParams
from tests.engines import ENGINE_NAMES, build_engine, logits_in_one_buffer
from twinfer.models.tiny_model import write_tiny_model

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
NUM_LIKELY_TOKENS = 8


@dataclass(frozen=True)
class EngineFuzzSize:
    max_examples: int
    steps: int  # rules per example, besides the final drain
    limits: WorkloadLimits


SMALL = WorkloadLimits(max_prompt_tokens=8, max_new_tokens=3, max_requests_per_add=2, max_steps_per_rule=2)
MEDIUM = WorkloadLimits(max_prompt_tokens=14, max_new_tokens=6, max_requests_per_add=3, max_steps_per_rule=3)

# (hypothesis profile, engine, on a GPU) -> size; the interpreter makes the fast engine on a CPU ~500x slower.
SIZES = {
    ("ci", "reference", False): EngineFuzzSize(40, 20, MEDIUM),
    ("ci", "fast", False): EngineFuzzSize(8, 10, SMALL),
    ("deep", "reference", False): EngineFuzzSize(400, 40, MEDIUM),
    ("deep", "fast", False): EngineFuzzSize(12, 8, SMALL),
}
GPU_SIZE = {"ci": EngineFuzzSize(40, 20, MEDIUM), "deep": EngineFuzzSize(400, 40, MEDIUM)}
# The soak profile: examples until $TWINFER_FUZZ_MAX_EXAMPLES or the run's time limit, counters written as
# they go. Its examples are long (SOAK_RULES rules) so that an engine's build, which captures its CUDA
# graphs, is shared by more steps; one process per GPU, since two on one H200 made fewer steps together
# than one alone (reports/results/fuzz/engine_fuzz_profile/).
SOAK_EXAMPLES_VARIABLE = "TWINFER_FUZZ_MAX_EXAMPLES"
SOAK_DEFAULT_EXAMPLES = 100_000
SOAK_RULES = 100

# What a run must have reached for its pass to mean much (the small fast run: finishing at all).
REQUIRED_SITUATIONS = {
    MEDIUM: (
        "solo_comparisons",
        "finished_length",
        "finished_stop",
        "aborts",
        "requests_rejected",
        "preemptions",
        "chunked_prefills",
        "admissions_with_prefix_hit",
    ),
    SMALL: ("solo_comparisons",),
}


def fuzz_size(engine_name: str) -> EngineFuzzSize:
    profile = settings.get_current_profile_name()
    if profile == "soak":
        return EngineFuzzSize(int(os.environ.get(SOAK_EXAMPLES_VARIABLE, SOAK_DEFAULT_EXAMPLES)), SOAK_RULES, MEDIUM)
    profile = profile if profile in GPU_SIZE else "ci"
    if DEVICE == "cuda":
        return GPU_SIZE[profile]
    return SIZES[(profile, engine_name, False)]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> TinyModel:
    checkpoint = write_tiny_model(tmp_path_factory.mktemp("engine-fuzz") / "qwen3", seed=0)
    config = load_model_config(checkpoint)
    state_dict = load_state_dict(checkpoint, config, torch.float32)
    return TinyModel(config, state_dict, likely_tokens(config, state_dict))


def likely_tokens(config: ModelConfig, state_dict: dict[str, torch.Tensor]) -> tuple[int, ...]:
    """Tokens the model generates often from prompts like the fuzzer's: stop tokens that do stop requests."""
    engine = build_engine("reference", config, state_dict, EngineConfig(num_blocks=64), device="cpu")
    prompts = [[first, first + 1, first + 2] for first in range(1, 38)]
    outputs = engine.generate(prompts, SamplingParams(temperature=0.0, max_tokens=4))
    counts = Counter(token for output in outputs for token in output.token_ids)
    return tuple(sorted(token for token, _ in counts.most_common(NUM_LIKELY_TOKENS)))


def engine_machine(engine_name: str, model: TinyModel, limits: WorkloadLimits) -> type[EngineMachine]:
    def build(model_config: ModelConfig, state_dict: dict[str, torch.Tensor], config: EngineConfig):
        engine = build_engine(engine_name, model_config, state_dict, config, device=DEVICE)
        if engine_name == "fast":  # on the CPU too, a step's logits are rewritten by the next launch, as by graphs
            logits_in_one_buffer(engine)
        return engine

    def build_solo(model_config: ModelConfig, state_dict: dict[str, torch.Tensor], config: EngineConfig):
        return build_engine("reference", model_config, state_dict, config, device="cpu")

    return type(
        f"EngineMachine_{engine_name}",
        (EngineMachine,),
        {
            "engine_name": engine_name,
            "build_engine": staticmethod(build),
            "model": model,
            "solo": SoloRuns(model, build_solo),
            "limits": limits,
            "stats_label": f"engine[{engine_name}]",
            "last_run_steps": 0,
        },
    )


@pytest.mark.parametrize("engine_name", ENGINE_NAMES)
def test_engine_outputs_equal_solo_reference_runs(engine_name: str, tiny_model: TinyModel) -> None:
    size = fuzz_size(engine_name)
    machine = engine_machine(engine_name, tiny_model, size.limits)
    run_state_machine_as_test(
        machine, settings=settings(settings.default, max_examples=size.max_examples, stateful_step_count=size.steps)
    )

    seen = stats.counters(machine.stats_label)
    missing = [situation for situation in REQUIRED_SITUATIONS[size.limits] if not seen.get(situation)]
    assert not missing, f"the engine fuzzer never reached {missing}: {seen}"


def test_engine_fuzzer_catches_a_scheduler_that_truncates_prompts(tiny_model: TinyModel) -> None:
    """Teeth: a reference engine whose scheduler drops the part of a prompt the token budget cut
    off still runs without error, breaks no invariant, but generates other tokens; the solo
    comparison finds it."""

    def build(model_config: ModelConfig, state_dict: dict[str, torch.Tensor], config: EngineConfig):
        engine = build_engine("reference", model_config, state_dict, config, device="cpu")
        engine.scheduler = planted_bugs.TruncatesPromptToBudget(engine.config, model_config.eos_token_ids)
        return engine

    machine = engine_machine("reference", tiny_model, MEDIUM)
    machine.build_engine = staticmethod(build)
    machine.stats_label = "planted/engine truncates prompts"
    planted_settings = settings(
        max_examples=50,
        stateful_step_count=10,
        derandomize=True,
        database=None,
        deadline=None,
        phases=(Phase.generate,),
        suppress_health_check=list(HealthCheck),
    )
    with with_reporter(ignore), pytest.raises(InvariantViolation) as caught:
        run_state_machine_as_test(machine, settings=planted_settings)
    assert caught.value.invariant == SOLO_AGREEMENT, str(caught.value)
