"""The official `openai` client, used the way its users write code, against `twinfer serve` on loopback.

One server serves the module: the reference engine (fp32, CPU) over the tiny model with a chat
template, an API key, a small body limit, a short context (so a chat without max_tokens reaches its
end quickly) and a small n x max_tokens bound. What it returns is checked against a direct `generate`
of a second engine over the same weights, and against OpenAI's API reference for the shapes.
"""

# ruff: noqa: F811 -- the module fixtures imported from tests.server.test_server are the tests' parameters

from __future__ import annotations

import pytest

from tests.server_packages import missing

pytest.importorskip("fastapi", reason=missing("fastapi"))
pytest.importorskip("uvicorn", reason=missing("uvicorn"))
pytest.importorskip("pydantic", reason=missing("pydantic"))
pytest.importorskip("httpx", reason=missing("httpx"))
pytest.importorskip("openai", reason=missing("openai"))

import asyncio
import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import torch

from reference.engine import ReferenceEngine
from spec.engine_config import EngineConfig
from spec.errors import ConfigError
from spec.sampling_params import SamplingParams
from tests.server.test_server import MODEL_NAME, chat_checkpoint, codec, direct  # noqa: F401 (module fixtures)
from twinfer.server.detokenize import TokenizerCodec
from twinfer.server.launch import ServerThread, app_for_engine
from twinfer.server.settings import API_KEY_ENV, ServerSettings, api_key_from

API_KEY = "test-key-0123"
MAX_MODEL_LEN = 48
MAX_BODY_BYTES = 64 * 1024
MAX_REQUEST_TOKENS = 160
ENGINE_CONFIG = EngineConfig(
    block_size=4, num_blocks=256, max_num_seqs=32, max_num_batched_tokens=256, max_model_len=MAX_MODEL_LEN
)
MESSAGES = [{"role": "user", "content": "Hello there"}]


@pytest.fixture(scope="module")
def server(tiny_weights, chat_checkpoint: Path) -> Iterator[ServerThread]:
    config, state_dict = tiny_weights
    engine = ReferenceEngine(config, state_dict, ENGINE_CONFIG, torch.float32, "cpu")
    settings = ServerSettings(api_key=API_KEY, max_body_bytes=MAX_BODY_BYTES, max_request_tokens=MAX_REQUEST_TOKENS)
    with ServerThread(app_for_engine(engine, chat_checkpoint, MODEL_NAME, settings)) as running:
        yield running


@pytest.fixture(scope="module")
def client(server: ServerThread) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=API_KEY, max_retries=0, timeout=60) as made:
        yield made


def greedy(max_tokens: int, **settings: object) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, **settings)


def chat_prompt_ids(client: openai.OpenAI, messages: list[dict[str, str]]) -> list[int]:
    """The token ids the server renders `messages` to (its chat template), as it reports them."""
    response = client.chat.completions.create(
        model=MODEL_NAME, messages=messages, max_tokens=1, extra_body={"return_token_ids": True}
    )
    return response.choices[0].model_extra["prompt_token_ids"]


# -- streaming as users iterate it -------------------------------------------------------------------


def test_the_usual_streaming_loops_over_choices_0_work(
    client: openai.OpenAI,
    direct,
    codec: TokenizerCodec,
) -> None:
    """`for chunk in stream: chunk.choices[0]...` raised IndexError while every stream ended with a usage chunk."""
    prompt = [5, 6, 7, 8]
    (want,) = direct([prompt], [greedy(6)])
    stream = client.completions.create(
        model=MODEL_NAME, prompt=prompt, max_tokens=6, temperature=0, stream=True, extra_body={"ignore_eos": True}
    )
    text, usages = "", []
    for chunk in stream:
        text += chunk.choices[0].text
        usages.append(chunk.usage)
    assert text == codec.decode(want.token_ids)
    assert usages and all(usage is None for usage in usages)

    chat_ids = chat_prompt_ids(client, MESSAGES)
    (chat_want,) = direct([chat_ids], [greedy(5)])
    chat_stream = client.chat.completions.create(
        model=MODEL_NAME, messages=MESSAGES, max_tokens=5, temperature=0, stream=True, extra_body={"ignore_eos": True}
    )
    content = ""
    for chunk in chat_stream:
        content += chunk.choices[0].delta.content or ""
    assert content == codec.decode(chat_want.token_ids)


def test_include_usage_ends_the_stream_with_a_usage_chunk_without_choices(client: openai.OpenAI) -> None:
    for create, request in (
        (client.completions.create, {"prompt": [9, 8, 7]}),
        (client.chat.completions.create, {"messages": MESSAGES}),
    ):
        chunks = list(
            create(
                model=MODEL_NAME,
                max_tokens=4,
                temperature=0,
                stream=True,
                stream_options={"include_usage": True},
                extra_body={"ignore_eos": True},
                **request,
            )
        )
        *body, last = chunks
        assert last.choices == [] and last.usage is not None
        assert last.usage.completion_tokens == 4
        assert last.usage.total_tokens == last.usage.prompt_tokens + 4
        assert body and all(chunk.choices and chunk.usage is None for chunk in body)


def test_with_include_usage_every_other_chunk_carries_usage_null(server: ServerThread) -> None:
    body = {"prompt": [1, 2, 3], "max_tokens": 3, "ignore_eos": True, "stream": True}
    body["stream_options"] = {"include_usage": True}
    with httpx.stream(
        "POST", f"{server.base_url}/v1/completions", json=body, headers={"Authorization": f"Bearer {API_KEY}"}
    ) as events:
        data = [line.removeprefix("data: ") for line in events.iter_lines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    chunks = [json.loads(item) for item in data[:-1]]
    assert all("usage" in chunk and chunk["usage"] is None for chunk in chunks[:-1])
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 3


def test_stream_options_without_stream_is_refused(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as error:
        client.completions.create(model=MODEL_NAME, prompt=[1, 2], max_tokens=2, stream_options={"include_usage": True})
    assert error.value.body["param"] == "stream_options" and "stream" in error.value.body["message"]


# -- responses as a whole -----------------------------------------------------------------------------


def test_with_raw_response_gives_the_headers_and_parses(client: openai.OpenAI, direct) -> None:
    prompt = [11, 12, 13]
    raw = client.completions.with_raw_response.create(
        model=MODEL_NAME, prompt=prompt, max_tokens=5, temperature=0, extra_body={"ignore_eos": True}
    )
    completion = raw.parse()
    (want,) = direct([prompt], [greedy(5)])
    assert raw.http_response.status_code == 200
    assert raw.headers["content-type"] == "application/json"
    assert raw.request_id == completion.id and completion.id.startswith("cmpl-")
    assert completion.object == "text_completion" and completion.model == MODEL_NAME
    assert completion.usage.completion_tokens == len(want.token_ids) == 5
    chat = client.chat.completions.with_raw_response.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=2)
    assert chat.request_id == chat.parse().id and chat.parse().object == "chat.completion"


def test_n_choices_each_sampled_with_its_own_seed(client: openai.OpenAI, direct) -> None:
    prompts = [[21, 22, 23], [24, 25]]
    response = client.completions.create(
        model=MODEL_NAME,
        prompt=prompts,
        n=2,
        max_tokens=6,
        temperature=1.0,
        seed=7,
        extra_body={"ignore_eos": True, "return_token_ids": True},
    )
    expected = direct(
        [prompt for prompt in prompts for _ in range(2)],
        [SamplingParams(max_tokens=6, ignore_eos=True, seed=7 + sample) for _ in prompts for sample in range(2)],
    )
    assert [choice.index for choice in response.choices] == [0, 1, 2, 3]  # prompt p's choice j at p * n + j
    assert [c.model_extra["token_ids"] for c in response.choices] == [list(w.token_ids) for w in expected]
    assert response.choices[0].text != response.choices[1].text  # different seeds, different samples
    assert response.usage.prompt_tokens == 5  # each prompt once, however many choices
    assert response.usage.completion_tokens == 4 * 6

    streamed: dict[int, str] = {0: "", 1: "", 2: ""}
    for chunk in client.chat.completions.create(
        model=MODEL_NAME, messages=MESSAGES, n=3, max_tokens=4, seed=3, stream=True, extra_body={"ignore_eos": True}
    ):
        for choice in chunk.choices:
            streamed[choice.index] += choice.delta.content or ""
    whole = client.chat.completions.create(
        model=MODEL_NAME, messages=MESSAGES, n=3, max_tokens=4, seed=3, extra_body={"ignore_eos": True}
    )
    assert [choice.message.content for choice in whole.choices] == list(streamed.values())


def test_stop_as_a_string_and_as_a_list(client: openai.OpenAI, direct, codec: TokenizerCodec) -> None:
    prompt = [31, 32, 33]
    (free,) = direct([prompt], [greedy(20)])
    full = codec.decode(free.token_ids)
    # Two-character windows of the text that first occur where they stand, with no replacement character
    # (half a UTF-8 sequence) and not only space: the earliest after the start and the last.
    windows = [(i, full[i : i + 2]) for i in range(2, len(full) - 1)]
    usable = [w for i, w in windows if "\ufffd" not in w and w.strip() and full.index(w) == i]
    if len(usable) < 2:
        pytest.fail(f"no two usable stop strings in {full!r}")
    first, later = usable[0], usable[-1]
    request = {"model": MODEL_NAME, "prompt": prompt, "max_tokens": 20, "temperature": 0}
    extra = {"ignore_eos": True}
    by_list = client.completions.create(**request, stop=[later, first], extra_body=extra).choices[0]
    assert by_list.text == full[: min(full.index(first), full.index(later))] and by_list.finish_reason == "stop"
    by_string = client.completions.create(**request, stop=later, extra_body=extra).choices[0]
    assert by_string.text == full[: full.index(later)] and by_string.finish_reason == "stop"


def test_max_tokens_absent(client: openai.OpenAI) -> None:
    """Completions: OpenAI's default of 16. Chat: up to the end of the context, finishing by length there."""
    completion = client.completions.create(model=MODEL_NAME, prompt=[1, 2, 3], extra_body={"ignore_eos": True})
    assert completion.usage.completion_tokens == 16 and completion.choices[0].finish_reason == "length"
    chat = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, extra_body={"ignore_eos": True})
    assert chat.choices[0].finish_reason == "length"
    assert chat.usage.prompt_tokens + chat.usage.completion_tokens == MAX_MODEL_LEN


def test_logprobs_in_openai_shapes(client: openai.OpenAI, direct) -> None:
    prompt = [41, 42, 43]
    (want,) = direct([prompt], [greedy(4, logprobs=3)])
    logprobs = (
        client.completions.create(
            model=MODEL_NAME, prompt=prompt, max_tokens=4, temperature=0, logprobs=2, extra_body={"ignore_eos": True}
        )
        .choices[0]
        .logprobs
    )
    assert logprobs.token_logprobs == pytest.approx([entry.logprob for entry in want.logprobs], abs=1e-5)
    assert len(logprobs.tokens) == len(logprobs.top_logprobs) == len(logprobs.text_offset) == 4
    for token, chosen, top in zip(logprobs.tokens, logprobs.token_logprobs, logprobs.top_logprobs, strict=True):
        assert 2 <= len(top) <= 3 and top[token] == pytest.approx(chosen)  # the top 2 and the token itself
    only_chosen = client.completions.create(
        model=MODEL_NAME, prompt=prompt, max_tokens=2, temperature=0, logprobs=0, extra_body={"ignore_eos": True}
    )
    zero = only_chosen.choices[0].logprobs
    assert [list(top) for top in zero.top_logprobs] == [[token] for token in zero.tokens]

    chat = client.chat.completions.create(
        model=MODEL_NAME, messages=MESSAGES, max_tokens=3, temperature=0, logprobs=True, top_logprobs=3
    )
    content = chat.choices[0].logprobs.content
    assert len(content) == chat.usage.completion_tokens == 3
    for entry in content:
        assert [alternative.logprob for alternative in entry.top_logprobs] == sorted(
            (alternative.logprob for alternative in entry.top_logprobs), reverse=True
        )
        assert len(entry.top_logprobs) == 3 and entry.bytes == list(entry.token.encode())
    bare = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=2, logprobs=True)
    assert all(entry.top_logprobs == [] for entry in bare.choices[0].logprobs.content)
    none = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=2)
    assert none.choices[0].logprobs is None


def test_a_seed_reproduces_a_sample(client: openai.OpenAI) -> None:
    def sample(seed: int) -> str:
        request = {"model": MODEL_NAME, "prompt": [51, 52], "max_tokens": 8, "temperature": 1.0, "seed": seed}
        return client.completions.create(**request, extra_body={"ignore_eos": True}).choices[0].text

    assert sample(123) == sample(123)
    assert sample(123) != sample(124)


def test_echo_puts_the_prompt_first(client: openai.OpenAI, codec: TokenizerCodec) -> None:
    prompt = "Once upon"
    echoed = client.completions.create(
        model=MODEL_NAME, prompt=prompt, max_tokens=3, temperature=0, echo=True, logprobs=1
    ).choices[0]
    plain = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=3, temperature=0).choices[0]
    assert echoed.text == prompt + plain.text
    prompt_len = len(codec.encode(prompt))
    assert len(echoed.logprobs.tokens) == prompt_len + 3
    assert echoed.logprobs.token_logprobs[0] is None and None not in echoed.logprobs.token_logprobs[1:]
    streamed = client.completions.create(
        model=MODEL_NAME, prompt=prompt, max_tokens=3, temperature=0, echo=True, stream=True
    )
    assert "".join(chunk.choices[0].text for chunk in streamed) == echoed.text


def test_null_means_not_given(server: ServerThread) -> None:
    body = {"prompt": [1, 2], "max_tokens": 2, "temperature": None, "stop": None, "n": None, "stream_options": None}
    response = httpx.post(
        f"{server.base_url}/v1/completions", json=body, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=30
    )
    assert response.status_code == 200, response.text
    assert len(response.json()["choices"]) == 1


# -- several clients at once ------------------------------------------------------------------------


def test_threads_of_clients_each_get_their_own_generate(client: openai.OpenAI, direct) -> None:
    prompts = [[60 + index, 61, 62 + index] for index in range(6)]
    params = [SamplingParams(temperature=0.9, seed=index, max_tokens=5, ignore_eos=True) for index in range(6)]

    def one(index: int) -> list[int]:
        response = client.completions.create(
            model=MODEL_NAME,
            prompt=prompts[index],
            max_tokens=5,
            temperature=0.9,
            seed=index,
            extra_body={"ignore_eos": True, "return_token_ids": True},
        )
        return response.choices[0].model_extra["token_ids"]

    with ThreadPoolExecutor(max_workers=6) as pool:
        results = list(pool.map(one, range(6)))
    assert results == [list(want.token_ids) for want in direct(prompts, params)]


def test_async_clients_gathered_each_get_their_own_generate(
    server: ServerThread,
    client: openai.OpenAI,
    direct,
    codec: TokenizerCodec,
) -> None:
    conversations = [[{"role": "user", "content": f"Tell me about {topic}"}] for topic in ("cats", "rain", "tea")]
    prompt_ids = [chat_prompt_ids(client, messages) for messages in conversations]

    async def one(async_client: openai.AsyncOpenAI, index: int) -> str:
        stream = await async_client.chat.completions.create(
            model=MODEL_NAME,
            messages=conversations[index],
            max_tokens=6,
            temperature=0.8,
            seed=100 + index,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        return "".join([chunk.choices[0].delta.content or "" async for chunk in stream])

    async def gathered() -> list[str]:
        async with openai.AsyncOpenAI(
            base_url=f"{server.base_url}/v1", api_key=API_KEY, max_retries=0, timeout=60
        ) as async_client:
            return await asyncio.gather(*(one(async_client, index) for index in range(3)))

    texts = asyncio.run(gathered())
    params = [SamplingParams(temperature=0.8, seed=100 + index, max_tokens=6, ignore_eos=True) for index in range(3)]
    assert texts == [codec.decode(want.token_ids) for want in direct(prompt_ids, params)]


# -- errors -----------------------------------------------------------------------------------------

BAD_REQUESTS = [
    ("completions", {"prompt": [1], "extra_body": {"best_guess": 1}}, "best_guess"),
    ("completions", {"prompt": [1], "n": 0}, "n"),
    ("completions", {"prompt": [1], "logprobs": 6}, "logprobs"),
    ("completions", {"prompt": [1], "stop": 5}, "stop"),
    ("completions", {"prompt": [1], "stream": True, "stream_options": {"include_obfuscation": True}}, "stream_options"),
    ("chat", {"messages": MESSAGES, "top_logprobs": 21, "logprobs": True}, "top_logprobs"),
    ("chat", {"messages": MESSAGES, "top_logprobs": 2}, "top_logprobs"),
    ("chat", {"messages": MESSAGES, "temperature": "warm"}, "temperature"),
    ("chat", {"messages": MESSAGES, "tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
]


@pytest.mark.parametrize(
    ("endpoint", "request_fields", "param"), BAD_REQUESTS, ids=[f"{e}-{p}" for e, _, p in BAD_REQUESTS]
)
def test_bad_requests_raise_bad_request_error_naming_the_field(
    client: openai.OpenAI, endpoint: str, request_fields: dict, param: str
) -> None:
    create = client.completions.create if endpoint == "completions" else client.chat.completions.create
    with pytest.raises(openai.BadRequestError) as error:
        create(model=MODEL_NAME, max_tokens=2, **request_fields)
    assert error.value.status_code == 400
    assert error.value.body["param"] == param and param in error.value.body["message"], error.value.body
    assert error.value.body["type"] == "invalid_request_error"


def test_n_times_max_tokens_is_bounded(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as error:
        client.completions.create(model=MODEL_NAME, prompt=[1, 2], n=8, max_tokens=30)
    message = error.value.body["message"]
    assert error.value.body["param"] == "n" and "n x max_tokens = 8 x 30" in message
    assert str(MAX_REQUEST_TOKENS) in message and "--max-request-tokens" in message
    with pytest.raises(openai.BadRequestError) as chat_error:
        client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, n=8)  # max_tokens: the rest, 23 each
    assert "max_tokens (not given: the rest of the context)" in chat_error.value.body["message"]
    fits = client.completions.create(model=MODEL_NAME, prompt=[1, 2], n=8, max_tokens=20)
    assert len(fits.choices) == 8


def test_errors_of_the_http_layer_are_openai_shaped(server: ServerThread) -> None:
    headers = {"Authorization": f"Bearer {API_KEY}"}
    missing_route = httpx.get(f"{server.base_url}/v1/engines", headers=headers, timeout=10)
    assert missing_route.status_code == 404 and set(missing_route.json()["error"]) == {
        "message",
        "type",
        "param",
        "code",
    }
    wrong_method = httpx.get(f"{server.base_url}/v1/completions", headers=headers, timeout=10)
    assert wrong_method.status_code == 405 and "error" in wrong_method.json()


# -- security -----------------------------------------------------------------------------------------


def test_requests_without_the_api_key_get_401(server: ServerThread) -> None:
    for key in ("wrong-key", API_KEY + "0"):
        with openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=key, max_retries=0) as stranger:
            with pytest.raises(openai.AuthenticationError) as error:
                stranger.completions.create(model=MODEL_NAME, prompt=[1, 2], max_tokens=2)
        assert error.value.status_code == 401 and error.value.body["code"] == "invalid_api_key"
    for path in ("/v1/models", "/v1/completions", "/docs"):
        bare = httpx.request("GET" if path != "/v1/completions" else "POST", f"{server.base_url}{path}", timeout=10)
        assert bare.status_code == 401, path
        assert set(bare.json()["error"]) == {"message", "type", "param", "code"}
        assert bare.headers["www-authenticate"] == "Bearer"
    for path in ("/health", "/metrics"):  # probes and scrapers need no secret
        assert httpx.get(f"{server.base_url}{path}", timeout=10).status_code == 200, path


def test_a_body_over_the_limit_gets_413(server: ServerThread, client: openai.OpenAI) -> None:
    url = f"{server.base_url}/v1/completions"
    headers = {"Authorization": f"Bearer {API_KEY}", "content-type": "application/json"}
    too_big = json.dumps({"prompt": [1] * (MAX_BODY_BYTES // 2), "max_tokens": 1}).encode()
    assert len(too_big) > MAX_BODY_BYTES
    declared = httpx.post(url, content=too_big, headers=headers, timeout=30)
    assert declared.status_code == 413 and declared.json()["error"]["code"] == "request_too_large"
    assert str(MAX_BODY_BYTES) in declared.json()["error"]["message"]

    def chunked():  # no Content-Length: the server counts the bytes as they come
        yield b'{"prompt": [' + b"1, " * (MAX_BODY_BYTES // 3)
        yield b"1]}"

    streamed = httpx.post(url, content=chunked(), headers=headers, timeout=30)
    assert streamed.status_code == 413
    small = httpx.post(url, content=iter([b'{"prompt": [1, 2], ', b'"max_tokens": 1}']), headers=headers, timeout=30)
    assert small.status_code == 200, small.text
    assert client.completions.create(model=MODEL_NAME, prompt=[1, 2], max_tokens=1).choices  # the server still serves


def test_the_api_key_comes_from_the_option_else_the_environment() -> None:
    assert api_key_from("given", {API_KEY_ENV: "from-env"}) == "given"
    assert api_key_from(None, {API_KEY_ENV: "from-env"}) == "from-env"
    assert api_key_from(None, {API_KEY_ENV: ""}) is None and api_key_from(None, {}) is None
    with pytest.raises(ConfigError, match="API key"):
        ServerSettings(api_key=" ")
    with pytest.raises(ConfigError, match="max_body_bytes"):
        ServerSettings(max_body_bytes=0)


def test_the_default_bind_is_loopback() -> None:
    from fastapi import FastAPI

    from twinfer.cli import build_parser
    from twinfer.server.cli import is_loopback

    args = build_parser().parse_args(["serve"])
    assert args.host == "127.0.0.1" and args.api_key is None
    thread = ServerThread(FastAPI())
    try:
        assert thread.host == "127.0.0.1" and thread._socket.getsockname()[0] == "127.0.0.1"
    finally:
        thread._socket.close()
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("example.org")
