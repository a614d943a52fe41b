"""`twinfer report --endpoint openai:URL`: an OpenAI endpoint as an engine of the differential matrix.

Against `twinfer serve` on loopback (fp32 tiny model, reference engine) every endpoint cell passes,
free-running and teacher-forced; a server with one perturbed logit fails them; a server without echo
prompt logprobs leaves the teacher-forced cells not run, saying so; an endpoint that is not there
leaves its cells not run and one that answers HTTP 500 fails them, while the other cells still run.
Only hf, the reference engine and the endpoint run here (the fast engine on the CPU is slow).
"""

from __future__ import annotations

import pytest

from tests.server_packages import missing

pytest.importorskip("fastapi", reason=missing("fastapi"))
pytest.importorskip("uvicorn", reason=missing("uvicorn"))
pytest.importorskip("pydantic", reason=missing("pydantic"))
pytest.importorskip("httpx", reason=missing("httpx"))

import json
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from html.parser import HTMLParser
from pathlib import Path

import torch
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from reports.report import command, workloads
from reports.report.correctness import CorrectnessOptions, run_correctness
from reports.report.records import Cell, CorrectnessSection, Status
from reports.report.schema import validate_report
from tests.reports.test_endpoint_diff import PERTURBATION, PERTURBED_TOKEN, build_engine, openai_like_stub
from twinfer.server.launch import ServerThread, app_for_engine

MODES = workloads.MODES
BASELINES = workloads.ENDPOINT_BASELINES
AS_SERVED = workloads.AS_SERVED.name


@contextmanager
def serving(app: FastAPI) -> Iterator[str]:
    with ServerThread(app) as server:
        yield f"openai:{server.base_url}/v1"


def count_completions(app: FastAPI) -> list[str]:
    """Every /v1/completions request the app gets, by its path (the list grows as they arrive)."""
    calls: list[str] = []

    @app.middleware("http")
    async def count(request: Request, call_next):
        if request.url.path.endswith("/completions"):
            calls.append(request.url.path)
        return await call_next(request)

    return calls


def endpoint_cells(
    checkpoint: Path, endpoint: str, dtypes: tuple[torch.dtype, ...] = (torch.float32,)
) -> tuple[CorrectnessSection, dict[tuple[str, str, str], Cell]]:
    """The matrix with only the endpoint's pairs; cells by (baseline, dtype, mode)."""
    options = CorrectnessOptions(
        checkpoint, torch.device("cpu"), dtypes, quick=True, pairs=workloads.endpoint_pairs(endpoint), features=()
    )
    section = run_correctness(options)
    return section, {(c.baseline, c.dtype, c.mode): c for c in section.cells}


def expected_keys(dtypes: tuple[str, ...] = ("float32",)) -> set[tuple[str, str, str]]:
    return {(baseline, dtype, mode) for baseline in BASELINES for dtype in dtypes for mode in MODES}


class MatrixRows(HTMLParser):
    """The header cells (pair, dtype) and the cell classes of each row of the page's matrix table."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.rows: list[tuple[list[str], list[str]]] = []
        self._in_matrix = self._in_body = self._in_th = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = dict(attrs)
        if tag == "table":
            self._in_matrix = attributes.get("class") == "matrix"
        elif self._in_matrix and tag == "tbody":
            self._in_body = True
        elif self._in_body and tag == "tr":
            self.rows.append(([], []))
        elif self._in_body and tag == "th":
            self._in_th = True
            self.rows[-1][0].append("")
        elif self._in_body and tag == "td":
            self.rows[-1][1].append(attributes.get("class") or "")

    def handle_endtag(self, tag: str) -> None:
        if tag == "th":
            self._in_th = False
        elif tag in ("tbody", "table"):
            self._in_body = self._in_matrix = False

    def handle_data(self, data: str) -> None:
        if self._in_th:
            self.rows[-1][0][-1] += data


@pytest.fixture(scope="module")
def honest_endpoint(tiny_weights, tiny_checkpoint: Path) -> Iterator[str]:
    with serving(app_for_engine(build_engine(tiny_weights), tiny_checkpoint, "honest")) as endpoint:
        yield endpoint


def test_honest_server_is_a_row_of_the_report_and_agrees_exactly(
    honest_endpoint: str, tiny_checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The command as the README shows it, with the local pairs left out (the fast engine is slow on the CPU)."""
    monkeypatch.setattr(workloads, "PAIRS", ())
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the command sets it on the CPU; restored after the test
    out = tmp_path / "report"
    arguments = ["--model", str(tiny_checkpoint), "--device", "cpu", "--quick", "--dtype", "float32"]
    code = command.main([*arguments, "--sections", "correctness", "--endpoint", honest_endpoint, "--out", str(out)])
    document = json.loads((out / "report.json").read_text())
    validate_report(document)
    correctness = document["correctness"]
    assert code == 0, correctness["detail"]
    assert correctness["pairs"] == [f"{honest_endpoint}-{baseline}" for baseline in BASELINES]
    assert AS_SERVED in correctness["features"]
    cells = {(c["baseline"], c["dtype"], c["mode"]): c for c in correctness["cells"]}
    assert set(cells) == expected_keys()
    for cell in cells.values():
        assert cell["status"] == "passed", (cell["id"], cell["detail"])
        assert cell["rule"] == "exact" and cell["num_positions"] > 0 and cell["feature"] == AS_SERVED
        assert "queried once for every dtype" in cell["feature_evidence"]
    rows = MatrixRows()
    rows.feed((out / "report.html").read_text())
    shown = {tuple(headers): classes for headers, classes in rows.rows}
    # Only as-served has cells in an endpoint's row; the other features' columns are empty there.
    expected = ["passed" if feature == AS_SERVED else "none" for feature in correctness["features"] for _ in MODES]
    for baseline in BASELINES:
        assert shown[(f"{honest_endpoint}-{baseline}", "float32")] == expected


def test_a_server_with_one_perturbed_logit_fails_its_cells(tiny_weights, tiny_checkpoint: Path) -> None:
    engine = build_engine(tiny_weights)
    vocab_size = tiny_weights[0].vocab_size
    shift = PERTURBATION * torch.nn.functional.one_hot(torch.tensor(PERTURBED_TOKEN), vocab_size).float()
    engine.model.register_forward_hook(lambda _module, _inputs, logits: logits + shift)
    app = app_for_engine(engine, tiny_checkpoint, "perturbed")
    calls = count_completions(app)
    with serving(app) as endpoint:
        section, cells = endpoint_cells(tiny_checkpoint, endpoint, (torch.float32, torch.bfloat16))
    assert set(cells) == expected_keys(("float32", "bfloat16"))
    for baseline in BASELINES:
        for mode in MODES:
            cell = cells[(baseline, "float32", mode)]
            assert cell.status is Status.FAILED, (cell.id, cell.detail)
            # Beyond the fp32 rule's 1e-4: how far beyond depends on the perturbed token's probability.
            assert cell.num_disagreements > 0 and cell.max_logprob_error > 1e-4
    assert section.status is Status.FAILED
    # Queried once whatever the dtype: one free-running and one echo request per prompt.
    assert len(calls) == 2 * len(section.prompts)


def unique_token_strings(checkpoint: Path, count: int) -> list[str]:
    """Token strings that exactly one token id decodes to, so a server may answer with them."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(checkpoint))
    decoded = [tokenizer.decode([token_id]) for token_id in range(len(tokenizer))]
    return [text for text in dict.fromkeys(decoded) if decoded.count(text) == 1 and len(text) > 2][:count]


def test_a_server_without_echo_logprobs_leaves_teacher_forced_not_run(tiny_checkpoint: Path) -> None:
    with serving(openai_like_stub(unique_token_strings(tiny_checkpoint, 2))) as endpoint:
        _, cells = endpoint_cells(tiny_checkpoint, endpoint)
    assert set(cells) == expected_keys()
    for baseline in BASELINES:
        forced = cells[(baseline, "float32", "teacher-forced")]
        assert forced.status is Status.NOT_RUN
        assert "does not support echo with prompt logprobs" in forced.detail
        free = cells[(baseline, "float32", "free-running")]
        assert free.status is not Status.NOT_RUN and free.num_prompts > 0, free.detail
        assert "refused the extension fields" in free.feature_evidence


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def failing_server() -> FastAPI:
    """Lists a model, then answers every completion with HTTP 500."""
    app = FastAPI()
    app.add_api_route("/v1/models", lambda: {"data": [{"id": "broken"}]})
    failure = {"error": {"message": "the engine fell over"}}
    app.add_api_route("/v1/completions", lambda: JSONResponse(failure, status_code=500), methods=["POST"])
    return app


def test_an_unreachable_endpoint_is_not_run_and_an_http_error_fails(tiny_checkpoint: Path) -> None:
    _, unreachable = endpoint_cells(tiny_checkpoint, f"openai:http://127.0.0.1:{closed_port()}/v1")
    assert {cell.status for cell in unreachable.values()} == {Status.NOT_RUN}
    assert all("cannot reach" in cell.detail for cell in unreachable.values())
    with serving(failing_server()) as endpoint:
        _, broken = endpoint_cells(tiny_checkpoint, endpoint)
    assert {cell.status for cell in broken.values()} == {Status.FAILED}
    assert all("HTTP 500" in cell.detail for cell in broken.values())


@pytest.mark.parametrize(
    "arguments",
    [
        ["--endpoint", "localhost:8000"],
        ["--endpoint", "openai:localhost:8000"],
        ["--endpoint-model", "m"],
        ["--endpoint", "openai:http://127.0.0.1:9/v1"],  # valid, but --sections fuzz has no matrix for it
    ],
    ids=["no-prefix", "no-scheme", "model-without-endpoint", "correctness-left-out"],
)
def test_report_refuses_a_bad_endpoint(arguments: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    from twinfer.cli import main

    assert main(["report", *arguments, "--sections", "fuzz"]) == 2
    assert "--endpoint" in capsys.readouterr().err
