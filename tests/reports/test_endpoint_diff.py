"""`twinfer diff` against an OpenAI endpoint: traces rebuilt from HTTP responses, compared with the local reference.

Against `twinfer serve` (fp32 tiny model, reference engine) the endpoint must agree exactly, free-running
and teacher-forced. Against a deliberately wrong server (one logit perturbed) the diff must flag it.
A stub server that refuses twinfer's extensions and has no echo logprobs exercises the fallbacks.
"""

from __future__ import annotations

import pytest

from tests.server_packages import missing

pytest.importorskip("fastapi", reason=missing("fastapi"))
pytest.importorskip("uvicorn", reason=missing("uvicorn"))
pytest.importorskip("pydantic", reason=missing("pydantic"))
pytest.importorskip("httpx", reason=missing("httpx"))

from collections.abc import Iterator
from pathlib import Path

import torch
from fastapi import FastAPI
from fastapi.responses import JSONResponse

from reference.engine import ReferenceEngine
from reports.diff.differential import trace_from_output
from reports.diff.endpoint import (
    EndpointClient,
    TokenResolver,
    endpoint_runner,
    endpoint_url,
    greedy_traces,
    run_greedy,
    teacher_forced_check,
)
from spec.agreement import Trace, compare_traces
from spec.engine_config import EngineConfig
from spec.errors import ConfigError
from spec.sampling_params import SamplingParams
from twinfer.server.launch import ServerThread, app_for_engine

MAX_NEW_TOKENS = 12
TOP_K = 5
TOLERANCE = 1e-4
PROMPTS = [[7], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17], [40, 299, 307, 266], [100, 3, 250] * 7]
PERTURBED_TOKEN = 7
PERTURBATION = 1.0


def build_engine(tiny_weights) -> ReferenceEngine:
    config, state_dict = tiny_weights
    return ReferenceEngine(config, state_dict, EngineConfig(block_size=4, num_blocks=256), torch.float32, "cpu")


@pytest.fixture(scope="module")
def reference_traces(tiny_weights) -> list[Trace]:
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW_TOKENS, ignore_eos=True, logprobs=TOP_K)
    return [trace_from_output(output) for output in build_engine(tiny_weights).generate(PROMPTS, params)]


@pytest.fixture(scope="module")
def honest_server(tiny_weights, tiny_checkpoint: Path) -> Iterator[str]:
    with ServerThread(app_for_engine(build_engine(tiny_weights), tiny_checkpoint, "honest")) as server:
        yield f"{server.base_url}/v1"


@pytest.fixture(scope="module")
def perturbed_server(tiny_weights, tiny_checkpoint: Path) -> Iterator[str]:
    """An engine whose model adds PERTURBATION to one token's logit everywhere: a subtle numerical bug."""
    engine = build_engine(tiny_weights)

    def perturb(_module, _inputs, logits: torch.Tensor) -> torch.Tensor:
        shifted = logits.clone()
        shifted[..., PERTURBED_TOKEN] += PERTURBATION
        return shifted

    engine.model.register_forward_hook(perturb)
    with ServerThread(app_for_engine(engine, tiny_checkpoint, "perturbed")) as server:
        yield f"{server.base_url}/v1"


def test_endpoint_names_parse() -> None:
    assert endpoint_url("openai:http://127.0.0.1:8000/v1/") == "http://127.0.0.1:8000/v1"
    with pytest.raises(ConfigError, match="openai:http"):
        endpoint_url("openai:localhost:8000")
    with pytest.raises(ConfigError, match="not an endpoint"):
        endpoint_url("reference")


def test_twinfer_serve_agrees_exactly_with_the_local_reference(
    honest_server: str, tiny_checkpoint: Path, reference_traces: list[Trace]
) -> None:
    traces = endpoint_runner(honest_server, tiny_checkpoint, MAX_NEW_TOKENS, TOP_K)(PROMPTS)
    for index, (candidate, baseline) in enumerate(zip(traces, reference_traces, strict=True)):
        assert candidate.token_ids == baseline.token_ids, index
        comparison = compare_traces(candidate, baseline, TOLERANCE, "exact")
        assert comparison.agree, (index, comparison)
        assert all(len(entry) >= TOP_K for entry in candidate.top_logprobs)
    forced = teacher_forced_check(honest_server, tiny_checkpoint, PROMPTS, reference_traces, TOP_K, TOLERANCE, "exact")
    assert forced.supported, forced.note
    assert forced.all_agree, forced.to_dict()
    assert len(forced.comparisons) == len(PROMPTS)


def test_a_server_with_one_perturbed_logit_is_flagged(
    perturbed_server: str, tiny_checkpoint: Path, reference_traces: list[Trace]
) -> None:
    traces = endpoint_runner(perturbed_server, tiny_checkpoint, MAX_NEW_TOKENS, TOP_K)(PROMPTS)
    comparisons = [compare_traces(c, b, TOLERANCE, "exact") for c, b in zip(traces, reference_traces, strict=True)]
    assert not any(c.agree for c in comparisons)
    assert all(c.max_logprob_error > TOLERANCE or c.first_divergence is not None for c in comparisons)
    forced = teacher_forced_check(
        perturbed_server, tiny_checkpoint, PROMPTS, reference_traces, TOP_K, TOLERANCE, "exact"
    )
    assert forced.supported and forced.all_agree is False
    assert all(c.max_logprob_error > TOLERANCE for c in forced.comparisons)


def test_token_resolver_maps_ids_and_unique_strings_only(tiny_checkpoint: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_checkpoint))
    resolver = TokenResolver(lambda: tokenizer)
    assert resolver.resolve("token_id:42") == 42
    strings: dict[str, list[int]] = {}
    for token_id in range(len(tokenizer)):
        strings.setdefault(tokenizer.decode([token_id]), []).append(token_id)
    unique = next(text for text, ids in strings.items() if len(ids) == 1 and len(text) > 2)
    ambiguous = next(text for text, ids in strings.items() if len(ids) > 1)
    assert resolver.resolve(unique) == strings[unique][0]
    assert resolver.resolve(ambiguous) is None


def openai_like_stub(tokens: list[str]) -> FastAPI:
    """A server with OpenAI's strictness: unknown fields are refused, echo brings no prompt logprobs."""
    app = FastAPI()

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": "stub", "object": "model"}]}

    @app.post("/v1/completions")
    async def completions(body: dict) -> JSONResponse:
        unknown = sorted(set(body) - {"model", "prompt", "max_tokens", "temperature", "logprobs", "echo"})
        if unknown:
            error = {
                "message": f"Unrecognized request argument supplied: {unknown[0]}",
                "type": "invalid_request_error",
            }
            return JSONResponse({"error": error}, status_code=400)
        count = 1 if body.get("echo") else len(tokens)
        logprobs = {
            "tokens": tokens[:count],
            "token_logprobs": [-0.5] * count,
            "top_logprobs": [{token: -0.5, "\ufffd": -1.0} for token in tokens[:count]],
        }
        return JSONResponse({"choices": [{"index": 0, "text": "".join(tokens[:count]), "logprobs": logprobs}]})

    return app


def test_a_strict_server_gets_plain_requests_and_token_strings_are_mapped(tiny_checkpoint: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_checkpoint))
    strings: dict[str, list[int]] = {}
    for token_id in range(len(tokenizer)):
        strings.setdefault(tokenizer.decode([token_id]), []).append(token_id)
    words = [text for text, ids in strings.items() if len(ids) == 1 and len(text) > 2][:2]
    ids = [strings[word] for word in words]
    with ServerThread(openai_like_stub(words)) as server:
        result = run_greedy(f"{server.base_url}/v1", tiny_checkpoint, [[1, 2]], len(words), 2)
        (trace,) = result.traces
        assert list(trace.token_ids) == [piece[0] for piece in ids]
        assert result.unmapped_alternatives == len(words)  # "\ufffd" matches many byte tokens
        assert any("refused the extension fields" in note for note in result.notes)
        forced = teacher_forced_check(
            f"{server.base_url}/v1", tiny_checkpoint, [[1, 2]], [trace], 2, TOLERANCE, "exact"
        )
    assert not forced.supported and "no prompt logprobs" in forced.note
    assert forced.to_dict()["all_agree"] is None


def test_greedy_traces_need_logprobs_in_the_response(tiny_checkpoint: Path) -> None:
    app = FastAPI()

    @app.get("/v1/models")
    async def models() -> dict:
        return {"data": [{"id": "bare"}]}

    @app.post("/v1/completions")
    async def completions(_: dict) -> dict:
        return {"choices": [{"index": 0, "text": "x", "logprobs": None}]}

    from reports.diff.endpoint import EndpointError

    with ServerThread(app) as server:
        client = EndpointClient(f"{server.base_url}/v1")
        with pytest.raises(EndpointError, match="no per-token logprobs"):
            greedy_traces(client, TokenResolver.for_checkpoint(tiny_checkpoint), [[1]], 2, 2)
        client.close()


@pytest.mark.parametrize("server_name, expected_exit", [("honest_server", 0), ("perturbed_server", 1)])
def test_twinfer_diff_command_against_an_endpoint(
    server_name: str,
    expected_exit: int,
    tiny_checkpoint: Path,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The CLI as the README shows it: `twinfer diff --engines reference,openai:URL --model CHECKPOINT`."""
    import json

    from twinfer.cli import main

    url = request.getfixturevalue(server_name)
    record_path = tmp_path / "diff.json"
    code = main(
        [
            "diff",
            "--engines",
            f"reference,openai:{url}",
            "--model",
            str(tiny_checkpoint),
            "--device",
            "cpu",
            "--max-new-tokens",
            "8",
            "--json",
            str(record_path),
        ]
    )
    out = capsys.readouterr().out
    assert code == expected_exit, out
    record = json.loads(record_path.read_text())
    forced = record["teacher_forced"][f"openai:{url}"]
    assert forced["supported"] and forced["all_agree"] is (expected_exit == 0)
    assert ("full agreement" in out) is (expected_exit == 0)
