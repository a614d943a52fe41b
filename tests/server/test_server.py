"""`twinfer serve`: the real server on a loopback port, driven by the official openai client and raw HTTP.

One server (reference engine, fp32, CPU, the tiny model with a chat template added) serves the
module. Expected outputs come from a second engine of the same kind over the same weights, run
directly with `generate`: the server must return exactly those tokens.
"""

from __future__ import annotations

import pytest

from tests.server_packages import missing

pytest.importorskip("fastapi", reason=missing("fastapi"))
pytest.importorskip("uvicorn", reason=missing("uvicorn"))
pytest.importorskip("pydantic", reason=missing("pydantic"))
pytest.importorskip("httpx", reason=missing("httpx"))
pytest.importorskip("openai", reason=missing("openai"))

import asyncio
import functools
import json
import random
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import torch

from reference.engine import ReferenceEngine
from spec.engine_config import EngineConfig
from spec.request import RequestOutput
from spec.sampling_params import SamplingParams
from twinfer.server.app import create_app
from twinfer.server.detokenize import IncrementalDetokenizer, StopStringMatcher, TokenizerCodec
from twinfer.server.engine_process import EngineProcess
from twinfer.server.launch import ServerThread, app_for_engine, checkpoint_engine_factory, load_text_support

MODEL_NAME = "tiny-test"
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
SERVER_CONFIG = EngineConfig(
    block_size=4, num_blocks=512, max_num_seqs=64, max_num_batched_tokens=512, check_invariants=True
)


@pytest.fixture(scope="module")
def chat_checkpoint(tiny_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny checkpoint plus a chat template (the built-in one has none)."""
    from transformers import AutoTokenizer

    directory = tmp_path_factory.mktemp("tiny-chat") / "checkpoint"
    shutil.copytree(tiny_checkpoint, directory)
    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(str(directory))
    return directory


@pytest.fixture(scope="module")
def server_engine(tiny_weights) -> ReferenceEngine:
    config, state_dict = tiny_weights
    return ReferenceEngine(config, state_dict, SERVER_CONFIG, torch.float32, "cpu")


@pytest.fixture(scope="module")
def server(server_engine: ReferenceEngine, chat_checkpoint: Path) -> Iterator[ServerThread]:
    with ServerThread(app_for_engine(server_engine, chat_checkpoint, MODEL_NAME)) as running:
        yield running


@pytest.fixture(scope="module")
def direct(tiny_weights):
    """generate() on a fresh engine of the same kind: what the server must reproduce."""
    config, state_dict = tiny_weights

    def run(prompts: list[list[int]], params: list[SamplingParams]) -> list[RequestOutput]:
        engine = ReferenceEngine(config, state_dict, EngineConfig(block_size=4, num_blocks=512), torch.float32, "cpu")
        return engine.generate(prompts, params)

    return run


@pytest.fixture(scope="module")
def codec(chat_checkpoint: Path) -> TokenizerCodec:
    from transformers import AutoTokenizer

    return TokenizerCodec(AutoTokenizer.from_pretrained(str(chat_checkpoint)))


def client(server: ServerThread) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=60)


def metric(server: ServerThread, name: str) -> float:
    text = httpx.get(f"{server.base_url}/metrics", timeout=10).text
    match = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
    if match is None:
        raise AssertionError(f"metric {name} missing from /metrics:\n{text}")
    return float(match.group(1))


def wait_until_idle(server: ServerThread, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while metric(server, "twinfer_requests_running") or metric(server, "twinfer_requests_waiting"):
        if time.monotonic() > deadline:
            raise AssertionError("the engine still has requests after every client finished")
        time.sleep(0.05)


def assert_pool_empty(engine: ReferenceEngine) -> None:
    """Every KV block is free (cached blocks with no holder count as free)."""
    allocator = engine.scheduler.allocator
    assert allocator.num_free_blocks == engine.config.num_blocks
    assert not allocator.snapshot().block_tables


# -- unit: text ------------------------------------------------------------------------------------


def test_incremental_detokenizer_concatenates_to_the_full_decode(codec: TokenizerCodec) -> None:
    generator = random.Random(0)
    vocab = len(codec.tokenizer)
    for _ in range(20):
        ids = [generator.randrange(vocab) for _ in range(generator.randint(1, 30))]
        detokenizer = IncrementalDetokenizer(codec)
        pieces = [detokenizer.add(token) for token in ids]
        assert "".join(pieces) + detokenizer.flush() == codec.decode(ids)


@pytest.mark.parametrize(
    ("pieces", "stops", "released", "stopped"),
    [
        (["Hel", "lo wo", "rld"], ["lo w"], "Hel", True),
        (["ab", "c", "d"], ["cd", "bc"], "a", True),  # the earliest occurrence wins
        (["abc", "def"], ["xyz"], "abcdef", False),
        (["a", "b"], [], "ab", False),
    ],
)
def test_stop_string_matcher(pieces: list[str], stops: list[str], released: str, stopped: bool) -> None:
    matcher = StopStringMatcher(stops)
    text, hit = "", False
    for piece in pieces:
        part, hit = matcher.feed(piece)
        text += part
        if hit:
            break
    if not hit:
        text += matcher.flush()
    assert (text, hit) == (released, stopped)


# -- the server ------------------------------------------------------------------------------------


def test_health_and_models(server: ServerThread) -> None:
    assert httpx.get(f"{server.base_url}/health", timeout=10).json() == {"status": "ok"}
    models = client(server).models.list()
    assert [model.id for model in models.data] == [MODEL_NAME]


def test_completion_matches_direct_generate(server: ServerThread, direct, codec: TokenizerCodec) -> None:
    prompt_text = "Once upon a time"
    prompt_ids = codec.encode(prompt_text)
    greedy = client(server).completions.create(
        model=MODEL_NAME,
        prompt=prompt_text,
        max_tokens=12,
        temperature=0,
        logprobs=3,
        extra_body={"ignore_eos": True, "return_token_ids": True},
    )
    sampled = client(server).completions.create(
        model=MODEL_NAME,
        prompt=[5, 6, 7, 8],
        max_tokens=10,
        temperature=0.9,
        top_p=0.9,
        seed=11,
        extra_body={"top_k": 50, "min_p": 0.01, "return_token_ids": True},
    )
    expected = direct(
        [prompt_ids, [5, 6, 7, 8]],
        [
            SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=3),
            SamplingParams(temperature=0.9, top_p=0.9, top_k=50, min_p=0.01, seed=11, max_tokens=10),
        ],
    )
    for response, want in zip((greedy, sampled), expected, strict=True):
        choice = response.choices[0]
        assert choice.model_extra["token_ids"] == list(want.token_ids)
        assert choice.model_extra["prompt_token_ids"] == list(want.prompt_token_ids)
        assert choice.text == codec.decode(want.token_ids)
        assert choice.finish_reason == want.finish_reason.value
        assert response.usage.completion_tokens == len(want.token_ids)
    logprobs = greedy.choices[0].logprobs
    assert logprobs.token_logprobs == pytest.approx([entry.logprob for entry in expected[0].logprobs], abs=1e-5)
    assert logprobs.tokens == [codec.token_string(entry.token_id) for entry in expected[0].logprobs]
    assert all(len(top) <= 3 for top in logprobs.top_logprobs)


def test_echo_returns_prompt_logprobs_as_the_engine_scores_them(server: ServerThread, direct) -> None:
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    response = httpx.post(
        f"{server.base_url}/v1/completions",
        json={
            "prompt": prompt,
            "max_tokens": 2,
            "temperature": 0,
            "logprobs": 2,
            "echo": True,
            "return_tokens_as_token_ids": True,
            "ignore_eos": True,
        },
        timeout=30,
    ).json()
    (want,) = direct(
        [prompt], [SamplingParams(temperature=0, max_tokens=2, ignore_eos=True, logprobs=2, prompt_logprobs=2)]
    )
    logprobs = response["choices"][0]["logprobs"]
    assert logprobs["tokens"] == [f"token_id:{t}" for t in [*prompt, *want.token_ids]]
    assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"][0] is None
    expected_prompt = [entry.logprob for entry in want.prompt_logprobs[1:]]
    assert logprobs["token_logprobs"][1 : len(prompt)] == pytest.approx(expected_prompt, abs=1e-5)
    top_of_second = {int(k.removeprefix("token_id:")): v for k, v in logprobs["top_logprobs"][1].items()}
    second = want.prompt_logprobs[1]  # OpenAI's shape: the top alternatives and the token itself
    assert top_of_second == pytest.approx(dict(second.top) | {second.token_id: second.logprob}, abs=1e-5)


def test_stop_strings_and_stop_token_ids(server: ServerThread, direct, codec: TokenizerCodec) -> None:
    prompt = [10, 20, 30]
    (free,) = direct([prompt], [SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)])
    full_text = codec.decode(free.token_ids)
    stop_token = free.token_ids[5]
    by_token = (
        client(server)
        .completions.create(
            model=MODEL_NAME,
            prompt=prompt,
            max_tokens=24,
            temperature=0,
            stop=None,
            extra_body={"ignore_eos": True, "stop_token_ids": [stop_token], "return_token_ids": True},
        )
        .choices[0]
    )
    first_stop = free.token_ids.index(stop_token)
    assert by_token.model_extra["token_ids"] == list(free.token_ids[: first_stop + 1])
    assert by_token.finish_reason == "stop"
    stop_text = full_text[len(full_text) // 2 : len(full_text) // 2 + 2]
    if not stop_text.strip() or "\ufffd" in stop_text:
        pytest.fail(f"pick another stop string: {stop_text!r} is not a usable one in {full_text!r}")
    by_text = (
        client(server)
        .completions.create(
            model=MODEL_NAME,
            prompt=prompt,
            max_tokens=24,
            temperature=0,
            stop=[stop_text],
            extra_body={"ignore_eos": True},
        )
        .choices[0]
    )
    assert by_text.text == full_text[: full_text.index(stop_text)]
    assert by_text.finish_reason == "stop"
    streamed = client(server).completions.create(
        model=MODEL_NAME,
        prompt=prompt,
        max_tokens=24,
        temperature=0,
        stop=stop_text,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    chunks = [chunk for chunk in streamed if chunk.choices]
    assert "".join(chunk.choices[0].text for chunk in chunks) == by_text.text
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_chat_completion_applies_the_chat_template(server: ServerThread, direct, codec: TokenizerCodec) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello world!"}]
    rendered = "<|system|>Be brief.\n<|user|>Hello world!\n<|assistant|>"
    (want,) = direct([codec.encode(rendered)], [SamplingParams(temperature=0, max_tokens=8, seed=1, logprobs=2)])
    response = client(server).chat.completions.create(
        model=MODEL_NAME,
        messages=messages,
        max_tokens=8,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
        extra_body={"return_token_ids": True},
    )
    choice = response.choices[0]
    assert choice.model_extra["prompt_token_ids"] == codec.encode(rendered)
    assert choice.model_extra["token_ids"] == list(want.token_ids)
    assert choice.message.content == codec.decode(want.token_ids)
    assert [entry.logprob for entry in choice.logprobs.content] == pytest.approx(
        [e.logprob for e in want.logprobs], abs=1e-5
    )
    assert all(len(entry.top_logprobs) == 2 for entry in choice.logprobs.content)
    stream = client(server).chat.completions.create(
        model=MODEL_NAME,
        messages=messages,
        max_tokens=8,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == choice.message.content
    assert chunks[-1].usage.completion_tokens == len(want.token_ids)


def test_chat_without_a_template_is_an_openai_error(tiny_weights, tiny_checkpoint: Path) -> None:
    config, state_dict = tiny_weights
    engine = ReferenceEngine(config, state_dict, EngineConfig(num_blocks=32), torch.float32, "cpu")
    with ServerThread(app_for_engine(engine, tiny_checkpoint, MODEL_NAME)) as bare:
        with pytest.raises(openai.BadRequestError) as error:
            client(bare).chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "hi"}])
    assert error.value.status_code == 400
    assert error.value.body["param"] == "messages" and "chat template" in error.value.body["message"]


BAD_COMPLETIONS = [
    ({"prompt": [1, 2], "temperature": -0.5}, "temperature"),
    ({"prompt": [1, 2], "temperature": "hot"}, "temperature"),
    ({"prompt": [1, 2], "top_p": 0}, "top_p"),
    ({"prompt": [1, 2], "top_k": -3}, "top_k"),
    ({"prompt": [1, 2], "min_p": 2}, "min_p"),
    ({"prompt": [1, 2], "max_tokens": 0}, "max_tokens"),
    ({"prompt": [1, 2], "max_tokens": 2.5}, "max_tokens"),
    ({"prompt": [1, 2], "logprobs": 6}, "logprobs"),
    ({"prompt": [1, 2], "logprobs": -1}, "logprobs"),
    ({"prompt": [1, 2], "seed": -1}, "seed"),
    ({"prompt": [1, 2], "stop": [""]}, "stop"),
    ({"prompt": [1, 2], "n": 0}, "n"),
    ({"prompt": [1, 2], "n": 129}, "n"),
    ({"prompt": [1, 2], "stream_options": {"include_usage": True}}, "stream_options"),
    ({"prompt": [1, 2], "frequency_penalty": 0.5}, "frequency_penalty"),
    ({"prompt": [1, 2], "unknown_option": 1}, "unknown_option"),
    ({"prompt": []}, "prompt"),
    ({"prompt": [1, 999999]}, "prompt"),
    ({"prompt": list(range(1, 1100))}, "prompt"),
    ({"prompt": [1, 2], "model": "another-model"}, "model"),
    ({"max_tokens": 3}, "prompt"),
]


@pytest.mark.parametrize(("body", "param"), BAD_COMPLETIONS, ids=[param for _, param in BAD_COMPLETIONS])
def test_bad_completion_requests_get_an_openai_error_naming_the_field(
    server: ServerThread, body: dict, param: str
) -> None:
    response = httpx.post(f"{server.base_url}/v1/completions", json=body, timeout=30)
    expected_status = 404 if param == "model" else 400
    assert response.status_code == expected_status, response.text
    error = response.json()["error"]
    assert error["param"] == param, error
    assert param in error["message"] or param in ("prompt", "model"), error
    assert set(error) == {"message", "type", "param", "code"}


def test_malformed_json_and_bad_chat_bodies_get_400(server: ServerThread) -> None:
    raw = httpx.post(
        f"{server.base_url}/v1/completions", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert raw.status_code == 400 and "JSON" in raw.json()["error"]["message"]
    empty = httpx.post(f"{server.base_url}/v1/chat/completions", json={"messages": []}, timeout=30)
    assert empty.status_code == 400 and empty.json()["error"]["param"] == "messages"
    top = httpx.post(
        f"{server.base_url}/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2},
        timeout=30,
    )
    assert top.status_code == 400 and top.json()["error"]["param"] == "top_logprobs"


def test_a_bad_request_leaves_a_running_stream_untouched(server: ServerThread, direct) -> None:
    params = SamplingParams(temperature=0.7, seed=5, max_tokens=20, ignore_eos=True)
    (want,) = direct([[9, 8, 7]], [params])
    stream = client(server).completions.create(
        model=MODEL_NAME,
        prompt=[9, 8, 7],
        max_tokens=20,
        temperature=0.7,
        seed=5,
        stream=True,
        extra_body={"ignore_eos": True, "return_token_ids": True},
    )
    tokens: list[int] = []
    for index, chunk in enumerate(stream):
        if index == 1:
            bad = httpx.post(f"{server.base_url}/v1/completions", json={"prompt": [1, 10**6]}, timeout=30)
            assert bad.status_code == 400
        for choice in chunk.choices:
            tokens += choice.model_extra["token_ids"]
    assert tokens == list(want.token_ids)


def run_streaming_clients(server: ServerThread, direct, num_clients: int) -> None:
    """Every client that stays gets exactly its direct-generate tokens; leavers (one in 8) are aborted; the
    pool ends empty."""
    generator = random.Random(1)
    leavers = set(range(0, num_clients, 8))
    prompts = [[generator.randrange(1, 380) for _ in range(generator.randint(1, 24))] for _ in range(num_clients)]
    params = [
        SamplingParams(
            temperature=0.8,
            top_k=40,
            seed=1000 + index,
            max_tokens=500 if index in leavers else generator.randint(4, 16),
            ignore_eos=index in leavers,
        )
        for index in range(num_clients)
    ]
    aborted_before = metric(server, "twinfer_requests_aborted_total")
    async_client = openai.AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=60)

    async def one_client(index: int) -> list[int] | None:
        p = params[index]
        stream = await async_client.completions.create(
            model=MODEL_NAME,
            prompt=prompts[index],
            max_tokens=p.max_tokens,
            temperature=p.temperature,
            seed=p.seed,
            stream=True,
            extra_body={"top_k": p.top_k, "ignore_eos": p.ignore_eos, "return_token_ids": True},
        )
        tokens: list[int] = []
        async for chunk in stream:
            for choice in chunk.choices:
                tokens += choice.model_extra["token_ids"]
            if index in leavers and len(tokens) >= 2:
                await stream.close()  # disconnect midway
                return None
        return tokens

    async def all_clients() -> list[list[int] | None]:
        async with async_client:
            return await asyncio.wait_for(asyncio.gather(*(one_client(i) for i in range(num_clients))), timeout=120)

    results = asyncio.run(all_clients())
    stayers = [i for i in range(num_clients) if i not in leavers]
    expected = direct([prompts[i] for i in stayers], [params[i] for i in stayers])
    for index, want in zip(stayers, expected, strict=True):
        assert results[index] == list(want.token_ids), f"client {index}"
    wait_until_idle(server)
    assert metric(server, "twinfer_requests_aborted_total") - aborted_before == len(leavers)
    assert metric(server, "twinfer_kv_blocks_used") == 0


def test_64_concurrent_streaming_clients_some_disconnecting(
    server: ServerThread, server_engine: ReferenceEngine, direct
) -> None:
    batch_sizes: list[int] = []
    engine_step = server_engine.step

    def counted_step() -> list[RequestOutput]:  # runs on the engine thread; only it calls step
        outputs = engine_step()
        batch_sizes.append(len(outputs))
        return outputs

    server_engine.step = counted_step  # type: ignore[method-assign]
    try:
        run_streaming_clients(server, direct, num_clients=64)
    finally:
        del server_engine.step  # back to the class's method
    assert max(batch_sizes) >= 32, "requests of concurrent clients were not batched together"
    assert_pool_empty(server_engine)


def single_threaded_engine(checkpoint: Path) -> ReferenceEngine:
    """Runs in the child process. One torch thread: the CI machine's few cores are shared with the clients."""
    torch.set_num_threads(1)
    return checkpoint_engine_factory("reference", checkpoint, SERVER_CONFIG, torch.float32, torch.device("cpu"))()


def test_concurrent_streaming_clients_with_the_engine_in_a_child_process(chat_checkpoint: Path, direct) -> None:
    factory = functools.partial(single_threaded_engine, chat_checkpoint)
    codec, tokenizer = load_text_support(chat_checkpoint)
    with ServerThread(create_app(EngineProcess(factory), codec, tokenizer, MODEL_NAME)) as in_process:
        run_streaming_clients(in_process, direct, num_clients=16)
        bad = httpx.post(f"{in_process.base_url}/v1/completions", json={"prompt": [1, 10**6]}, timeout=30)
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "prompt"


def test_non_streaming_client_that_leaves_is_aborted(server: ServerThread, server_engine: ReferenceEngine) -> None:
    aborted_before = metric(server, "twinfer_requests_aborted_total")
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            f"{server.base_url}/v1/completions",
            json={"prompt": [4, 4, 4], "max_tokens": 900, "ignore_eos": True},
            timeout=httpx.Timeout(30, read=0.5),
        )
    deadline = time.monotonic() + 10
    while metric(server, "twinfer_requests_aborted_total") == aborted_before:
        assert time.monotonic() < deadline, "the request of a client that left was not aborted"
        time.sleep(0.05)
    wait_until_idle(server)
    assert_pool_empty(server_engine)


def test_metrics_report_load_latency_and_the_prefix_cache(server: ServerThread) -> None:
    shared = list(range(1, 33))  # 8 full blocks of 4: the second request reuses them
    for suffix in ([40], [41]):
        client(server).completions.create(model=MODEL_NAME, prompt=shared + suffix, max_tokens=3, temperature=0)
    text = httpx.get(f"{server.base_url}/metrics", timeout=10).text
    for name in (
        "twinfer_requests_running",
        "twinfer_requests_waiting",
        "twinfer_kv_blocks_used",
        "twinfer_kv_blocks_total",
        "twinfer_prefix_cache_hit_rate",
        "twinfer_generation_tokens_per_second",
        "twinfer_generation_tokens_total",
        "twinfer_time_to_first_token_seconds_count",
        "twinfer_time_per_output_token_seconds_count",
    ):
        assert re.search(rf"^{name} \S+$", text, re.MULTILINE), name
    assert metric(server, "twinfer_prompt_tokens_cached_total") >= 32
    assert 0 < metric(server, "twinfer_prefix_cache_hit_rate") < 1
    assert metric(server, "twinfer_kv_blocks_total") == SERVER_CONFIG.num_blocks
    assert metric(server, "twinfer_time_to_first_token_seconds_count") >= 2


def test_a_list_of_prompts_gets_one_choice_each(server: ServerThread, direct) -> None:
    prompts = [[11, 12, 13], [14, 15], [16]]
    params = SamplingParams(temperature=0.5, seed=3, max_tokens=6, ignore_eos=True)
    expected = direct(prompts, [params] * len(prompts))
    body = {
        "prompt": prompts,
        "max_tokens": 6,
        "temperature": 0.5,
        "seed": 3,
        "ignore_eos": True,
        "return_token_ids": True,
    }
    response = httpx.post(f"{server.base_url}/v1/completions", json=body, timeout=30).json()
    assert [c["index"] for c in response["choices"]] == [0, 1, 2]
    assert [c["token_ids"] for c in response["choices"]] == [list(want.token_ids) for want in expected]
    assert response["usage"]["prompt_tokens"] == 6 and response["usage"]["completion_tokens"] == 18
    streamed: dict[int, list[int]] = {0: [], 1: [], 2: []}
    with httpx.stream("POST", f"{server.base_url}/v1/completions", json={**body, "stream": True}, timeout=30) as events:
        for line in events.iter_lines():
            if line.startswith("data: {"):
                for choice in json.loads(line.removeprefix("data: "))["choices"]:
                    streamed[choice["index"]] += choice["token_ids"]
    assert list(streamed.values()) == [list(want.token_ids) for want in expected]


class FailingEngine(ReferenceEngine):
    """Breaks on its third step, as an engine bug would."""

    steps = 0

    def step(self) -> list[RequestOutput]:
        self.steps += 1
        if self.steps == 3:
            raise RuntimeError("planted engine failure")
        return super().step()


def test_an_engine_failure_fails_open_requests_and_health(tiny_weights, tiny_checkpoint: Path) -> None:
    config, state_dict = tiny_weights
    engine = FailingEngine(config, state_dict, EngineConfig(num_blocks=32), torch.float32, "cpu")
    with ServerThread(app_for_engine(engine, tiny_checkpoint, MODEL_NAME)) as failing:
        body = {"prompt": [1, 2, 3], "max_tokens": 10, "ignore_eos": True}
        response = httpx.post(f"{failing.base_url}/v1/completions", json=body, timeout=30)
        assert response.status_code == 500 and "planted engine failure" in response.json()["error"]["message"]
        assert httpx.get(f"{failing.base_url}/health", timeout=10).status_code == 503
        after = httpx.post(f"{failing.base_url}/v1/completions", json=body, timeout=30)
        assert after.status_code == 503 and after.json()["error"]["type"] == "service_unavailable"


def test_a_stopped_server_lets_its_engine_go(tiny_weights, tiny_checkpoint: Path) -> None:
    """After the server stops nothing keeps its engine (and so its KV pool) alive, even though the web
    framework keeps the route handlers: a second engine in the same process gets the memory back."""
    import gc
    import weakref

    config, state_dict = tiny_weights
    engine = ReferenceEngine(config, state_dict, EngineConfig(block_size=4, num_blocks=64), torch.float32, "cpu")
    alive = weakref.ref(engine)
    app = app_for_engine(engine, tiny_checkpoint, "released")
    del engine
    with ServerThread(app) as server:
        body = {"model": "released", "prompt": [1, 2, 3], "max_tokens": 2, "temperature": 0}
        assert httpx.post(f"{server.base_url}/v1/completions", json=body, timeout=60).status_code == 200
    del app, server
    gc.collect()
    assert alive() is None, "the stopped server's engine is still reachable"
