"""The server's streaming fast paths: chunk text equal to the pydantic models' JSON, one hand-off per step,
tokens of steps a stream fell behind on grouped into one event, the engine process's framing, the load
generator's event parsing, and `reports.serving.server_overhead` run small (real server, stub engine, both modes)."""

from __future__ import annotations

import pytest

from tests.server_packages import missing

pytest.importorskip("fastapi", reason=missing("fastapi"))
pytest.importorskip("uvicorn", reason=missing("uvicorn"))
pytest.importorskip("pydantic", reason=missing("pydantic"))
pytest.importorskip("httpx", reason=missing("httpx"))

import asyncio
import random
import socket
from pathlib import Path

from reports.serving.server_load import LoadRequest, _read_events, _Stream
from reports.serving.server_overhead import OverheadSettings, StubEngine, StubTiming, run_overhead, summary_lines
from spec.engine_config import EngineConfig
from spec.request import FinishReason
from spec.sampling_params import SamplingParams
from twinfer.server import responses
from twinfer.server.choice import ChoiceDelta, ChoiceSpec, ChoiceState
from twinfer.server.detokenize import IdOnlyCodec
from twinfer.server.engine_loop import OutputSink, SinkTable, TokenDelta
from twinfer.server.engine_process import FrameReader, frame
from twinfer.server.launch import ServerThread
from twinfer.server.metrics import ServerMetrics

TEXTS = [
    "",
    "plain",
    'quote " and \\ backslash',
    "tab\tnew\nline\r\x08\x0c",
    "\x00\x01\x1f\x7f",
    "héllo 世界 🙂",
    "\u2028",
]


def choice_state(index: int, prompt: tuple[int, ...], logprobs: int | None = None) -> ChoiceState:
    spec = ChoiceSpec(index, f"r-{index}", prompt, SamplingParams(), (), None, logprobs, False)
    return ChoiceState(spec, IdOnlyCodec())


@pytest.mark.parametrize("with_ids", [False, True])
def test_chunk_text_is_the_models_json(with_ids: bool) -> None:
    rng = random.Random(0)
    for text in TEXTS:
        advanced = []
        for index in range(rng.randint(1, 3)):
            choice = choice_state(index, tuple(rng.randrange(1000) for _ in range(rng.randint(1, 5))))
            token_ids = [rng.randrange(1000) for _ in range(rng.randint(0, 3))]
            choice.token_ids = list(token_ids) if index % 2 else [7, *token_ids]  # first chunk of choice 1 only
            delta = ChoiceDelta(text=text, token_ids=token_ids, finish_reason=rng.choice([None, "stop", "length"]))
            advanced.append((choice, delta))
        args = ('cmpl-\u00e9"x', 1_700_000_000, "model/ü", advanced, with_ids)
        completion = responses.CompletionChunkText(*args[:3], with_ids)(advanced)
        assert completion == responses.completion_chunk(*args).model_dump_json()
        chat = responses.ChatChunkText(*args[:3], with_ids)(advanced)
        assert chat == responses.chat_chunk(*args).model_dump_json()


def test_chunk_text_leaves_logprobs_to_the_models() -> None:
    choice = choice_state(0, (1, 2), logprobs=2)
    advanced = [(choice, ChoiceDelta(text="a", token_ids=[3]))]
    assert responses.CompletionChunkText("id", 1, "m", False)(advanced) is None
    assert responses.ChatChunkText("id", 1, "m", False)(advanced) is None


def delta(request_id: str, token: int, finish: FinishReason | None = None) -> TokenDelta:
    return TokenDelta(request_id, (token,), (), finish, 3, 0, None, token == 0)


class CountingLoop:
    """Stands in for an event loop on another thread: counts the hand-offs, runs them when asked."""

    def __init__(self) -> None:
        self.calls: list = []

    def call_soon_threadsafe(self, callback, *args) -> None:
        self.calls.append((callback, args))

    def run(self) -> None:
        calls, self.calls = self.calls, []
        for callback, args in calls:
            callback(*args)


def test_a_step_reaches_every_sink_of_a_loop_in_one_hand_off() -> None:
    loop = CountingLoop()
    table = SinkTable(ServerMetrics())
    sinks = [OutputSink(loop) for _ in range(50)]  # type: ignore[arg-type]
    for index, sink in enumerate(sinks):
        table.register([f"r{index}"], sink)
    for step in range(3):
        table.dispatch([delta(f"r{index}", step) for index in range(50)])
        assert len(loop.calls) == 1
        loop.run()
    assert all(sink._items == [delta(f"r{i}", s) for s in range(3)] for i, sink in enumerate(sinks))


def test_a_stream_that_fell_behind_takes_all_waiting_steps_at_once() -> None:
    async def scenario() -> list[list]:
        sink = OutputSink()
        sink.deliver([delta("r", 0)])
        sink.deliver([delta("r", 1)])
        first = await sink.next_batch()
        waiter = asyncio.ensure_future(sink.next_batch())
        await asyncio.sleep(0)
        sink.deliver([delta("r", 2, FinishReason.LENGTH)])
        return [first, await waiter]

    first, second = asyncio.run(scenario())
    assert [d.token_ids for d in first] == [(0,), (1,)]
    assert [d.finish_reason for d in second] == [FinishReason.LENGTH]


def test_engine_process_frames_survive_any_split() -> None:
    messages = [("step", [delta("r", i) for i in range(i % 5)], None) for i in range(40)] + [("stop",)]
    data = b"".join(frame(message) for message in messages)
    rng = random.Random(1)
    reader, received, position = FrameReader(), [], 0
    while position < len(data):
        size = rng.choice([1, 3, 8, 50, 4096])
        received += reader.feed(data[position : position + size])
        position += size
    assert received == messages


def test_the_load_generator_parses_chunked_events_split_anywhere() -> None:
    events = [b'data: {"choices":[{"index":0,"token_ids":[%d,%d]}]}\n\n' % (i, i + 1) for i in range(20)]
    events += [b'data: {"choices":[],"usage":{}}\n\n', b"data: [DONE]\n\n"]
    body = b"".join(b"%x\r\n%s\r\n" % (len(event), event) for event in events) + b"0\r\n\r\n"

    async def parse() -> _Stream:
        reader = asyncio.StreamReader()
        rng = random.Random(2)
        position = 0
        while position < len(body):
            size = rng.randint(1, 40)
            reader.feed_data(body[position : position + size])
            position += size
        reader.feed_eof()
        stream = _Stream()
        await _read_events(reader, stream)
        return stream

    stream = asyncio.run(parse())
    assert stream.tokens == [t for i in range(20) for t in (i, i + 1)]
    assert stream.events == 20 and stream.error is None


def test_the_stub_engine_batches_and_chunks_prompts() -> None:
    config = EngineConfig(max_num_seqs=2, max_num_batched_tokens=8, max_model_len=64, num_blocks=64)
    engine = StubEngine(config, StubTiming().scaled(0.0))
    params = SamplingParams(max_tokens=3, ignore_eos=True, seed=1)
    outputs = engine.generate([[1] * 10, [2] * 3, [3] * 4], params)
    assert [len(o.token_ids) for o in outputs] == [3, 3, 3]
    assert outputs[0].token_ids == outputs[1].token_ids  # the same seed: the same tokens
    assert engine.steps > 3


def test_server_thread_turns_nagle_off() -> None:
    """The listening socket says TCP, so asyncio sets TCP_NODELAY on every connection it accepts."""
    from fastapi import FastAPI

    server = ServerThread(FastAPI())
    try:
        assert server._socket.proto == socket.IPPROTO_TCP
    finally:
        server._socket.close()


@pytest.mark.slow
def test_server_overhead_harness_runs_small(tmp_path: Path) -> None:
    settings = OverheadSettings(
        clients=(1, 6),
        modes=("thread", "process"),
        prompt_len=(4, 40),
        output_len=(6, 6),
        seed=0,
        timing=StubTiming().scaled(0.5),
        engine_config=EngineConfig(max_num_seqs=8, max_num_batched_tokens=64, max_model_len=128, num_blocks=256),
        clients_per_process=4,
    )
    record = run_overhead(settings)
    for result in record["results"]:
        for mode, server in result["server"].items():
            assert server["failed_clients"] == 0, (mode, server["first_errors"])
            assert server["outputs_identical_to_offline"] == result["clients"]
            assert server["client_processes"] == -(-result["clients"] // 4)
            assert server["cpu_us_per_token"]["event loop"] > 0
            assert server["tokens_per_event"] >= 1
    assert len(summary_lines(record)) == 1 + 2 * 2


def test_load_request_is_plain_data() -> None:
    """LoadRequest crosses to the client processes by pickling."""
    import pickle

    request = LoadRequest((1, 2), 3, 4)
    assert pickle.loads(pickle.dumps(request)) == request


class FailingStub(StubEngine):
    """Breaks on its third step, as an engine bug would."""

    def step(self):
        if self.steps == 2:
            raise RuntimeError("planted engine failure")
        return super().step()


def failing_stub() -> FailingStub:  # module-level: the engine process builds it
    config = EngineConfig(max_num_seqs=8, max_num_batched_tokens=64, max_model_len=128, num_blocks=256)
    return FailingStub(config, StubTiming().scaled(0.1))


def test_an_engine_process_failure_fails_open_streams_and_health() -> None:
    import httpx

    from twinfer.server.app import create_app
    from twinfer.server.engine_process import EngineProcess

    body = {"prompt": [1, 2, 3], "max_tokens": 10, "ignore_eos": True, "stream": True}
    with ServerThread(create_app(EngineProcess(failing_stub), IdOnlyCodec(), None, "stub")) as server:
        with httpx.stream("POST", f"{server.base_url}/v1/completions", json=body, timeout=30) as events:
            lines = [line for line in events.iter_lines() if line.startswith("data: ")]
        assert "planted engine failure" in lines[-2] and lines[-1] == "data: [DONE]"
        assert httpx.get(f"{server.base_url}/health", timeout=10).status_code == 503
        after = httpx.post(f"{server.base_url}/v1/completions", json=body, timeout=30)
        assert after.status_code == 503 and after.json()["error"]["type"] == "service_unavailable"
