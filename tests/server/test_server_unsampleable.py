"""A request whose logits turn non-finite (spec.sampling: unsampleable) gets OpenAI's error shape from the
server: HTTP 500 when not streamed, an error event before [DONE] when streamed; requests beside it are served
as usual. The reference engine's rows are planted just before sampling (tests.engines.plant_non_finite)."""

from __future__ import annotations

import pytest

from tests.server_packages import missing

pytest.importorskip("fastapi", reason=missing("fastapi"))
pytest.importorskip("uvicorn", reason=missing("uvicorn"))
pytest.importorskip("pydantic", reason=missing("pydantic"))
pytest.importorskip("httpx", reason=missing("httpx"))

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import torch

from reference.engine import ReferenceEngine
from spec.engine_config import EngineConfig
from spec.sampling_params import SamplingParams
from tests.engines import plant_non_finite
from twinfer.server.launch import ServerThread, app_for_engine

MODEL_NAME = "tiny-test"
FAILING_PROMPT = [7, 8, 9]  # its logits at output position POSITION are NaN
POSITION = 3
MESSAGE = f"the model produced non-finite logits (NaN) at output position {POSITION}"
BODY = {"model": MODEL_NAME, "max_tokens": 8, "temperature": 0.0, "ignore_eos": True, "return_token_ids": True}


@pytest.fixture(scope="module")
def engine(tiny_weights) -> ReferenceEngine:
    config, state_dict = tiny_weights
    engine = ReferenceEngine(config, state_dict, EngineConfig(block_size=4, num_blocks=256), torch.float32, "cpu")
    plant_non_finite(engine, "nan", POSITION, lambda request: list(request.prompt_token_ids) == FAILING_PROMPT)
    return engine


@pytest.fixture(scope="module")
def server(engine: ReferenceEngine, tiny_checkpoint: Path) -> Iterator[ServerThread]:
    with ServerThread(app_for_engine(engine, tiny_checkpoint, MODEL_NAME)) as running:
        yield running


@pytest.fixture(scope="module")
def expected(tiny_weights) -> dict[tuple[int, ...], tuple[int, ...]]:
    """Each prompt's tokens from a clean engine (greedy, 8 tokens)."""
    config, state_dict = tiny_weights
    clean = ReferenceEngine(config, state_dict, EngineConfig(block_size=4, num_blocks=256), torch.float32, "cpu")
    prompts = [FAILING_PROMPT, [1, 2, 3], [4, 5, 6, 7]]
    outputs = clean.generate(prompts, SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True))
    return {tuple(prompt): output.token_ids for prompt, output in zip(prompts, outputs, strict=True)}


def complete(server: ServerThread, prompt: list[int]) -> httpx.Response:
    return httpx.post(f"{server.base_url}/v1/completions", json={**BODY, "prompt": prompt}, timeout=60)


def stream_events(server: ServerThread, prompt: list[int]) -> list[str]:
    body = {**BODY, "prompt": prompt, "stream": True}
    with httpx.stream("POST", f"{server.base_url}/v1/completions", json=body, timeout=60) as response:
        assert response.status_code == 200
        return [line.removeprefix("data: ") for line in response.iter_lines() if line.startswith("data: ")]


def test_a_non_streamed_request_gets_an_openai_error_and_its_neighbours_their_tokens(server, expected) -> None:
    with ThreadPoolExecutor(3) as pool:
        failing = pool.submit(complete, server, FAILING_PROMPT)
        others = [pool.submit(complete, server, prompt) for prompt in ([1, 2, 3], [4, 5, 6, 7])]
        response = failing.result()
        for future, prompt in zip(others, ([1, 2, 3], [4, 5, 6, 7]), strict=True):
            answer = future.result()
            assert answer.status_code == 200
            assert tuple(answer.json()["choices"][0]["token_ids"]) == expected[tuple(prompt)]
    assert response.status_code == 500
    error = response.json()["error"]
    assert error["message"] == MESSAGE
    assert (error["type"], error["code"]) == ("server_error", "unsampleable_logits")


def test_a_streamed_request_sends_its_tokens_then_an_error_event_before_done(server, expected) -> None:
    events = stream_events(server, FAILING_PROMPT)
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert (error["message"], error["code"]) == (MESSAGE, "unsampleable_logits")
    chunks = [json.loads(event) for event in events[:-2]]
    tokens = [token for chunk in chunks for choice in chunk["choices"] for token in choice["token_ids"]]
    assert tuple(tokens) == expected[tuple(FAILING_PROMPT)][:POSITION]
    assert all(choice.get("finish_reason") is None for chunk in chunks for choice in chunk["choices"])
    # The server goes on serving.
    assert tuple(complete(server, [1, 2, 3]).json()["choices"][0]["token_ids"]) == expected[(1, 2, 3)]
