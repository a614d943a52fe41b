"""Fixtures: the built-in tiny checkpoint (written once per session) and a transformers twin."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from reference.engine import ReferenceEngine
from spec.engine_config import EngineConfig
from twinfer.models.tiny_model import TinyModelShape, write_tiny_model

# The tests' model: the built-in tiny shape with two layers, not three. Through Triton's interpreter a
# step's cost goes by layers (each layer's kernels run program by program in Python), and two layers
# still tell each layer's weights, KV cache and block tables apart.
TEST_SHAPE = TinyModelShape(num_hidden_layers=2)


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("tiny-qwen3") / "seed0", seed=0, shape=TEST_SHAPE)


@pytest.fixture(scope="session")
def hf_model(tiny_checkpoint: Path) -> torch.nn.Module:
    from transformers import Qwen3ForCausalLM

    return Qwen3ForCausalLM.from_pretrained(str(tiny_checkpoint), dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def tiny_weights(tiny_checkpoint: Path):
    from spec.checkpoint import load_model_config, load_state_dict

    config = load_model_config(tiny_checkpoint)
    return config, load_state_dict(tiny_checkpoint, config, torch.float32)


@pytest.fixture
def make_engine(tiny_weights):
    """Build a CPU fp32 reference engine over the tiny model with invariant checks on."""

    def build(**settings: object) -> ReferenceEngine:
        config, state_dict = tiny_weights
        settings.setdefault("check_invariants", True)
        engine_config = EngineConfig(**settings)  # type: ignore[arg-type]
        return ReferenceEngine(config, state_dict, engine_config, torch.float32, "cpu")

    return build
