"""`python -m reports.serving.server_load`: `twinfer serve` under N concurrent streaming clients, against
offline generate.

For each client count N, on the same N requests (random prompt ids in [0, 10000), lengths drawn from
`--prompt-len`, `--output-len` tokens each, temperature 0.6 with a per-request seed, ignore_eos):

* server: a fresh engine behind the OpenAI server in this process (uvicorn in a thread), the engine
  on a thread of this process and/or in a child process (`--modes`), two warm-up requests (a plain
  one and a stream), then N streaming clients started together from separate processes
  (`--clients-per-process` each, so that parsing the streams bounds nothing and none of it shares
  the server's interpreter lock). The clients (`--client`) speak HTTP/1.1 over bare asyncio
  connections by default, several times cheaper per event than httpx (also available). Each client
  records its time to first token and mean time per output token after the first; throughput is
  output tokens over the wall time from the first request sent to the last token received. The
  record also says how many tokens each stream event carried (the server groups the tokens of steps
  a stream has fallen behind on), how busy the client processes were, and whether the server ran on
  uvloop and httptools (uvicorn takes them when installed) or on asyncio and h11.
* offline: a fresh engine, one warm-up request, then `engine.generate` on the same requests.

The record gives both throughputs and their ratio, latency distributions, and how many server
outputs were token-for-token identical to the offline ones (seeded sampling makes them equal up to
floating-point near-ties between different batch compositions).

    python -m reports.serving.server_load --model qwen3-0.6b --clients 1,16,64,256 --json server_load.json
    python -m reports.serving.server_load --model tiny --device cpu --dtype float32 --clients 1,4 \\
        --prompt-len 4,16 --output-len 8,8 --json /tmp/load.json        # a CPU check of the harness
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import logging
import multiprocessing
import queue
import random
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx

logger = logging.getLogger(__name__)

TEMPERATURE = 0.6
TOKEN_ID_RANGE = (0, 10_000)
CLIENT_TIMEOUT_S = 900.0
CLIENT_START_TIMEOUT_S = 120.0
DEFAULT_CLIENTS_PER_PROCESS = 32
DEFAULT_CLIENT = "raw"
CLIENTS = ("raw", "httpx")


@dataclass(frozen=True)
class LoadRequest:
    prompt_token_ids: tuple[int, ...]
    max_tokens: int
    seed: int


@dataclass(frozen=True)
class ClientRecord:
    token_ids: tuple[int, ...]
    time_to_first_token_s: float | None
    time_per_output_token_s: float | None
    error: str | None = None
    events: int = 0  # stream events that carried tokens (a server may group several steps' tokens in one)


def build_requests(
    num_clients: int, prompt_len: tuple[int, int], output_len: tuple[int, int], seed: int
) -> list[LoadRequest]:
    rng = random.Random(seed)
    requests = []
    for index in range(num_clients):
        length = rng.randint(*prompt_len)
        prompt = tuple(rng.randint(*TOKEN_ID_RANGE) for _ in range(length))
        requests.append(LoadRequest(prompt, rng.randint(*output_len), seed * 100_003 + index))
    return requests


# -- clients (run in child processes) ---------------------------------------------------------------


@dataclass(frozen=True)
class ClientBatch:
    """One client process's share: its records, when its clients started and ended (time.monotonic, which
    every process of the machine shares), and the CPU time the process spent on them."""

    records: list[ClientRecord]
    started: float
    ended: float
    cpu_s: float


@dataclass(frozen=True)
class ClientRun:
    """All client processes together: records in request order, wall time from the first client started
    to the last token received, the processes' CPU seconds (one entry each)."""

    records: list[ClientRecord]
    wall_s: float
    cpu_s: list[float]

    @property
    def num_processes(self) -> int:
        return len(self.cpu_s)


def run_clients(
    base_url: str, model: str, requests: Sequence[LoadRequest], go=None, client: str = DEFAULT_CLIENT
) -> ClientBatch:
    """Concurrent streaming clients started together (after `go`, a threading/multiprocessing Event, is set)."""
    return asyncio.run(_all_clients(base_url, model, requests, go, client))


async def _all_clients(base_url: str, model: str, requests: Sequence[LoadRequest], go, client: str) -> ClientBatch:
    async with contextlib.AsyncExitStack() as stack:
        if client == "httpx":
            limits = httpx.Limits(max_connections=len(requests) + 8, max_keepalive_connections=len(requests) + 8)
            pool = await stack.enter_async_context(
                httpx.AsyncClient(base_url=base_url, limits=limits, timeout=CLIENT_TIMEOUT_S)
            )
            # Warm this process's HTTP stack (imports, first connection) before the clock starts.
            (await pool.get("/health")).raise_for_status()
            one = functools.partial(_one_httpx_client, pool, model)
        elif client == "raw":
            url = httpx.URL(base_url)
            one = functools.partial(_one_raw_client, url.host, url.port, model)
        else:
            raise ValueError(f"unknown client {client!r}: raw or httpx")
        if go is not None:
            await asyncio.get_running_loop().run_in_executor(None, go.wait)
        cpu = time.process_time()
        started = time.monotonic()
        records = await asyncio.gather(*(one(request) for request in requests))
        ended = time.monotonic()
        cpu = time.process_time() - cpu
    return ClientBatch(list(records), started, ended, cpu)


def _body(model: str, request: LoadRequest) -> dict[str, object]:
    return {
        "model": model,
        "prompt": list(request.prompt_token_ids),
        "max_tokens": request.max_tokens,
        "temperature": TEMPERATURE,
        "seed": request.seed,
        "stream": True,
        "ignore_eos": True,
        "return_token_ids": True,
    }


class _Stream:
    """A client's view of one stream: tokens, events that carried them, first and last arrival."""

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.events = 0
        self.sent = time.monotonic()
        self.first: float | None = None
        self.last: float | None = None
        self.error: str | None = None

    def event(self, data: bytes | str) -> None:
        """One `data: ...` payload."""
        if data[:1] not in ("{", b"{"):
            return  # [DONE]
        payload = json.loads(data)
        if "error" in payload:  # the server failed mid-stream
            self.error = f"stream error: {payload['error']}"
        for choice in payload.get("choices", []):
            new = choice.get("token_ids") or []
            if new:
                self.last = time.monotonic()
                self.first = self.first if self.first is not None else self.last
                self.tokens += new
                self.events += 1

    def record(self, error: str | None = None) -> ClientRecord:
        error = error or self.error
        if error is not None:
            return ClientRecord(tuple(self.tokens), None, None, error, self.events)
        first, last, count = self.first, self.last, len(self.tokens)
        ttft = None if first is None else first - self.sent
        tpot = (last - first) / (count - 1) if first is not None and last is not None and count > 1 else None
        return ClientRecord(tuple(self.tokens), ttft, tpot, None, self.events)


async def _one_httpx_client(client: httpx.AsyncClient, model: str, request: LoadRequest) -> ClientRecord:
    stream = _Stream()
    try:
        async with client.stream("POST", "/v1/completions", json=_body(model, request)) as response:
            if response.status_code != 200:
                return stream.record(f"HTTP {response.status_code}: {(await response.aread())[:300]!r}")
            async for line in response.aiter_lines():
                if line.startswith("data: "):
                    stream.event(line[6:])
    except httpx.HTTPError as error:
        return stream.record(f"{type(error).__name__}: {error}")
    return stream.record()


async def _one_raw_client(host: str, port: int, model: str, request: LoadRequest) -> ClientRecord:
    """The same request as `_one_httpx_client`, over a bare asyncio connection: HTTP/1.1 with a chunked
    response body, server-sent events split on blank lines. Several times cheaper per event than httpx,
    so a client process follows many more streams."""
    body = json.dumps(_body(model, request)).encode()
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
        f"Accept: text/event-stream\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    stream = _Stream()
    writer = None
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), CLIENT_TIMEOUT_S)
        writer.write(head + body)
        status, headers = await _response_head(reader)
        if status != 200:
            length = int(headers.get("content-length", "0"))
            return stream.record(f"HTTP {status}: {(await reader.readexactly(length))[:300]!r}")
        if headers.get("transfer-encoding", "").lower() != "chunked":
            return stream.record(f"expected a chunked event stream, got headers {headers}")
        await _read_events(reader, stream)
    except (TimeoutError, OSError, asyncio.IncompleteReadError, ValueError) as error:
        return stream.record(f"{type(error).__name__}: {error}")
    finally:
        if writer is not None:
            writer.close()
    return stream.record()


async def _response_head(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    status_line = await reader.readline()
    parts = status_line.split()
    if len(parts) < 2 or not parts[1].isdigit():
        raise ValueError(f"not an HTTP response: {status_line[:100]!r}")
    headers = {}
    while (line := await reader.readline()) not in (b"\r\n", b"\n", b""):
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(parts[1]), headers


async def _read_events(reader: asyncio.StreamReader, stream: _Stream) -> None:
    """Decode the chunked body as it arrives and hand each event's data to `stream`, until the last chunk."""
    buffer = b""  # undecoded chunked bytes
    text = b""  # decoded body not yet split into events
    while True:
        data = await reader.read(1 << 16)
        if not data:
            raise asyncio.IncompleteReadError(buffer, None)
        buffer += data
        position = 0
        while True:
            line_end = buffer.find(b"\r\n", position)
            if line_end < 0:
                break
            size = int(buffer[position:line_end].split(b";")[0], 16)
            if size == 0:
                _split_events(text, stream)
                return
            if len(buffer) < line_end + 2 + size + 2:
                break
            text += buffer[line_end + 2 : line_end + 2 + size]
            position = line_end + 2 + size + 2
        buffer = buffer[position:]
        text = _split_events(text, stream)


def _split_events(text: bytes, stream: _Stream) -> bytes:
    """Hand on every complete event (ended by a blank line); the incomplete rest."""
    *events, rest = text.split(b"\n\n")
    for event in events:
        for line in event.split(b"\n"):
            if line.startswith(b"data: "):
                stream.event(line[6:])
    return rest


def _client_process(
    share: int, base_url: str, model: str, requests: list[LoadRequest], client: str, ready, go, results
) -> None:
    """ready, results: multiprocessing Queues; go: a multiprocessing Event. Puts (share, ClientBatch or error)."""

    class _ReadyThenGo:
        def wait(self) -> None:
            ready.put(True)
            go.wait()

    try:
        results.put((share, run_clients(base_url, model, requests, _ReadyThenGo(), client)))
    except BaseException as error:  # report instead of leaving the parent waiting
        ready.put(False)
        results.put((share, error))


def _wait_until_ready(processes: list, ready) -> None:
    """Every client process ready (or failed, then it reports) before any client starts."""
    deadline = time.monotonic() + CLIENT_START_TIMEOUT_S
    waiting = len(processes)
    while waiting:
        try:
            ready.get(timeout=1.0)
            waiting -= 1
        except queue.Empty:
            dead = [process.exitcode for process in processes if process.exitcode is not None]
            if dead:
                raise RuntimeError(f"a client process exited (code {dead[0]}) before its clients started") from None
            if time.monotonic() > deadline:
                raise TimeoutError(f"client processes not ready within {CLIENT_START_TIMEOUT_S:.0f} s") from None


def clients_in_subprocesses(
    base_url: str,
    model: str,
    requests: list[LoadRequest],
    clients_per_process: int = DEFAULT_CLIENTS_PER_PROCESS,
    client: str = DEFAULT_CLIENT,
) -> ClientRun:
    """The clients split over ceil(N / clients_per_process) processes, so that parsing the streams does not
    bound what is measured (and none of it shares the server's interpreter lock), all started together."""
    context = multiprocessing.get_context("spawn")
    shares = [requests[i : i + clients_per_process] for i in range(0, len(requests), clients_per_process)]
    ready, go, results = context.Queue(), context.Event(), context.Queue()
    processes = [
        context.Process(
            target=_client_process, args=(index, base_url, model, share, client, ready, go, results), daemon=True
        )
        for index, share in enumerate(shares)
    ]
    for process in processes:
        process.start()
    outcomes: dict[int, ClientBatch | BaseException] = {}
    try:
        _wait_until_ready(processes, ready)
        go.set()
        for _ in processes:
            share, outcome = results.get(timeout=CLIENT_TIMEOUT_S + 60)
            outcomes[share] = outcome
    finally:
        go.set()
        for process in processes:
            process.join(timeout=30)
            if process.is_alive():
                process.kill()
    failures = [outcome for outcome in outcomes.values() if isinstance(outcome, BaseException)]
    if failures:
        raise RuntimeError(f"a client process failed: {failures[0]!r}") from failures[0]
    batches = [outcomes[index] for index in range(len(shares))]
    return ClientRun(
        records=[record for batch in batches for record in batch.records],
        wall_s=max(batch.ended for batch in batches) - min(batch.started for batch in batches),
        cpu_s=[batch.cpu_s for batch in batches],
    )


# -- server and offline phases ----------------------------------------------------------------------


@dataclass(frozen=True)
class LoadSettings:
    model: str  # a shape name from reports.bench.shapes.SHAPES, or a checkpoint
    engine: str
    dtype: object  # torch.dtype
    device: object  # torch.device
    clients: tuple[int, ...]
    prompt_len: tuple[int, int]
    output_len: tuple[int, int]
    seed: int
    weight_seed: int
    engine_settings: dict[str, object]
    modes: tuple[str, ...] = ("thread", "process")
    clients_per_process: int = DEFAULT_CLIENTS_PER_PROCESS
    client: str = DEFAULT_CLIENT


def build_engine(settings: LoadSettings, engine_config):
    """A fresh engine: random weights of a named shape, or a checkpoint."""
    from reports.bench.shapes import SHAPES, random_state_dict
    from twinfer.registry import build_engine as build_from_checkpoint
    from twinfer.registry import engine_class

    if settings.model in SHAPES:
        model_config = SHAPES[settings.model].model_config()
        state_dict = random_state_dict(model_config, settings.dtype, settings.device, settings.weight_seed)
        return engine_class(settings.engine, settings.device)(
            model_config, state_dict, engine_config, settings.dtype, settings.device
        )
    return build_from_checkpoint(settings.engine, settings.model, engine_config, settings.dtype, settings.device)


def build_warm_engine(settings: LoadSettings, engine_config):
    """A fresh engine after one warm-up request; module-level so that a child process can run it."""
    from reports.bench.runners import warm_up_engine

    engine = build_engine(settings, engine_config)
    warm_up_engine(engine)
    return engine


def serving_app(settings: LoadSettings, engine_config, mode: str):
    """The server, its engine on a thread of this process or (mode "process") in a child process."""
    from reports.bench.shapes import SHAPES
    from twinfer.server.app import create_app
    from twinfer.server.detokenize import IdOnlyCodec
    from twinfer.server.engine_loop import EngineLoop
    from twinfer.server.engine_process import EngineProcess
    from twinfer.server.launch import load_text_support

    factory = functools.partial(build_warm_engine, settings, engine_config)
    driver = EngineProcess(factory) if mode == "process" else EngineLoop(factory())
    codec, tokenizer = (IdOnlyCodec(), None) if settings.model in SHAPES else load_text_support(Path(settings.model))
    return create_app(driver, codec, tokenizer, settings.model)


def engine_config_for(settings: LoadSettings, requests: Sequence[LoadRequest]):
    """The settings given, and nothing else where the engine sizes itself (the fast engine on CUDA);
    elsewhere what was not given is sized so that all clients run at once (batch limit and pool)."""
    from reports.bench.workloads import WARMUP_MAX_TOKENS, WARMUP_PROMPT
    from spec.engine_config import DEFAULT_NUM_BLOCKS, SMALL_BATCHES, EngineConfig
    from twinfer.registry import engine_entry

    sized: dict[str, object] = {}
    if not (engine_entry(settings.engine).sizes_kv_pool_from_gpu_memory and settings.device.type == "cuda"):
        sized["max_num_seqs"] = max(SMALL_BATCHES.max_num_seqs, len(requests))
        block_size = int(settings.engine_settings.get("block_size", EngineConfig().block_size))
        lengths = [len(r.prompt_token_ids) + r.max_tokens for r in requests] + [len(WARMUP_PROMPT) + WARMUP_MAX_TOKENS]
        sized["num_blocks"] = max(DEFAULT_NUM_BLOCKS, sum(-(-n // block_size) for n in lengths))
    return EngineConfig(**(sized | settings.engine_settings))


def run_server_phase(
    settings: LoadSettings, requests: list[LoadRequest], mode: str
) -> tuple[dict[str, object], list[ClientRecord]]:
    from twinfer.server.launch import ServerThread

    app = serving_app(settings, engine_config_for(settings, requests), mode)
    with ServerThread(app) as server:
        warm_up_server(server.base_url, settings.model)
        run = clients_in_subprocesses(
            server.base_url, settings.model, requests, settings.clients_per_process, settings.client
        )
        metrics_text = httpx.get(f"{server.base_url}/metrics", timeout=30).text
        engine_config = asdict(app.state.context.driver.config)
    # Both names reach the engine (the server holds the app, the app its driver): drop both before
    # releasing, or the next phase's engine sizes its pool with this one's still allocated.
    del app, server
    _release(settings.device)
    summary = {
        "engine_mode": mode,
        "engine_config": engine_config,
        **client_summary(run),
        "server_prefix_cache_hit_rate": _metric(metrics_text, "twinfer_prefix_cache_hit_rate"),
    }
    return summary, run.records


def client_summary(run: ClientRun) -> dict[str, object]:
    """What the clients saw: throughput, latencies, how many tokens each stream event carried, and how busy
    the client processes were (a busy fraction near 1 would mean the load generator bounds the figures)."""
    records = run.records
    output_tokens = sum(len(r.token_ids) for r in records)
    events = sum(r.events for r in records)
    errors = [r.error for r in records if r.error]
    return {
        "wall_s": run.wall_s,
        "output_tokens": output_tokens,
        "output_tokens_per_s": output_tokens / run.wall_s,
        "failed_clients": len(errors),
        "first_errors": errors[:3],
        "time_to_first_token_s": distribution([r.time_to_first_token_s for r in records]),
        "time_per_output_token_s": distribution([r.time_per_output_token_s for r in records]),
        "stream_events": events,
        "tokens_per_event": output_tokens / events if events else None,
        "client_processes": run.num_processes,
        "client_cpu_s": sum(run.cpu_s),
        "client_busiest_process_cpu_fraction": max(run.cpu_s) / run.wall_s,
    }


def warm_up_server(base_url: str, model: str) -> None:
    """One request of each kind the clients send (a plain one, a stream), so first-use costs (lazy imports on
    the server's first stream, for one) fall outside the measurement."""
    body = {"model": model, "prompt": [10_001, 10_002, 10_003], "max_tokens": 4, "temperature": 0, "ignore_eos": True}
    httpx.post(f"{base_url}/v1/completions", json=body, timeout=600).raise_for_status()
    with httpx.stream("POST", f"{base_url}/v1/completions", json={**body, "stream": True}, timeout=600) as events:
        events.raise_for_status()
        for _ in events.iter_lines():
            pass


def run_offline_phase(
    settings: LoadSettings, requests: list[LoadRequest]
) -> tuple[dict[str, object], list[tuple[int, ...]]]:
    import torch

    from spec.sampling_params import SamplingParams

    engine = build_warm_engine(settings, engine_config_for(settings, requests))
    params = [
        SamplingParams(temperature=TEMPERATURE, max_tokens=r.max_tokens, ignore_eos=True, seed=r.seed) for r in requests
    ]
    if settings.device.type == "cuda":
        torch.cuda.synchronize(settings.device)
    start = time.perf_counter()
    outputs = engine.generate([list(r.prompt_token_ids) for r in requests], params)
    if settings.device.type == "cuda":
        torch.cuda.synchronize(settings.device)
    wall = time.perf_counter() - start
    output_tokens = sum(len(o.token_ids) for o in outputs)
    del engine
    _release(settings.device)
    summary = {"wall_s": wall, "output_tokens": output_tokens, "output_tokens_per_s": output_tokens / wall}
    return summary, [tuple(o.token_ids) for o in outputs]


def _release(device) -> None:
    import gc

    import torch

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def distribution(values: Sequence[float | None]) -> dict[str, float | int] | None:
    present = sorted(v for v in values if v is not None)
    if not present:
        return None

    def quantile(q: float) -> float:
        return present[min(len(present) - 1, round(q * (len(present) - 1)))]

    return {
        "count": len(present),
        "mean": statistics.fmean(present),
        "p50": quantile(0.5),
        "p90": quantile(0.9),
        "p99": quantile(0.99),
        "max": present[-1],
    }


def _metric(text: str, name: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


def against_offline(
    server: dict[str, object],
    server_tokens: Sequence[Sequence[int]],
    offline: dict[str, object],
    offline_tokens: Sequence[Sequence[int]],
) -> dict[str, object]:
    """A server phase's record, with how many of its outputs equal offline generate's and its throughput over
    offline's (the same requests, in the same order)."""
    identical = sum(list(a) == list(b) for a, b in zip(server_tokens, offline_tokens, strict=True))
    return server | {
        "outputs_identical_to_offline": identical,
        "throughput_over_offline": server["output_tokens_per_s"] / offline["output_tokens_per_s"],
    }


def run_load(settings: LoadSettings) -> dict[str, object]:
    from reports.bench.device import environment

    results = []
    for num_clients in settings.clients:
        requests = build_requests(num_clients, settings.prompt_len, settings.output_len, settings.seed)
        logger.info("%d clients: offline generate", num_clients)
        offline, offline_tokens = run_offline_phase(settings, requests)
        servers = {}
        for mode in settings.modes:
            logger.info("%d clients: server, engine on a %s", num_clients, mode)
            server, records = run_server_phase(settings, requests, mode)
            servers[mode] = against_offline(server, [r.token_ids for r in records], offline, offline_tokens)
        results.append(
            {
                "clients": num_clients,
                "prompt_tokens": sum(len(r.prompt_token_ids) for r in requests),
                "requested_output_tokens": sum(r.max_tokens for r in requests),
                "offline": offline,
                "server": servers,
            }
        )
    return {
        "environment": environment(settings.device, None),
        "model": settings.model,
        "engine": settings.engine,
        "dtype": str(settings.dtype).removeprefix("torch."),
        "engine_settings_given": settings.engine_settings,
        "load_generator": {"client": settings.client, "clients_per_process": settings.clients_per_process},
        "server_http_stack": http_stack(),
        "workload": {
            "prompt_len": list(settings.prompt_len),
            "output_len": list(settings.output_len),
            "seed": settings.seed,
            "token_ids": list(TOKEN_ID_RANGE),
            "temperature": TEMPERATURE,
            "ignore_eos": True,
            "definition": "per client count N: random.Random(seed); each request a prompt of randint(*prompt_len) ids "
            "randint(0, 10000), then randint(*output_len) output tokens; one request per streaming client",
        },
        "results": results,
    }


# -- command line -----------------------------------------------------------------------------------


def configure_parser(parser: argparse.ArgumentParser) -> None:
    from twinfer.engine_options import add_engine_arguments
    from twinfer.registry import ENGINE_NAMES

    parser.add_argument(
        "--model", default="qwen3-0.6b", help="a shape of reports.bench.shapes (random weights) or a checkpoint"
    )
    parser.add_argument(
        "--engine", default=None, choices=ENGINE_NAMES, help="default: fast on CUDA, reference elsewhere"
    )
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "float16", "bfloat16"])
    parser.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    parser.add_argument("--clients", default="1,16,64,256", help="comma-separated client counts (default 1,16,64,256)")
    parser.add_argument("--prompt-len", default="100,1024", help="prompt length range LO,HI (default 100,1024)")
    parser.add_argument("--output-len", default="128,128", help="output length range LO,HI (default 128,128)")
    parser.add_argument("--seed", type=int, default=0, help="workload seed (default 0)")
    parser.add_argument("--weight-seed", type=int, default=0, help="seed of the random weights (default 0)")
    parser.add_argument(
        "--modes",
        default="thread,process",
        help="where the server runs its engine, comma-separated: thread, process (default both, one after the other)",
    )
    add_client_arguments(parser)
    parser.add_argument("--json", type=Path, required=True, help="where to write the record")
    add_engine_arguments(parser)


def add_client_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--clients-per-process",
        type=int,
        default=DEFAULT_CLIENTS_PER_PROCESS,
        help=f"streaming clients per load-generator process (default {DEFAULT_CLIENTS_PER_PROCESS})",
    )
    parser.add_argument(
        "--client",
        default=DEFAULT_CLIENT,
        choices=CLIENTS,
        help="raw: HTTP/1.1 over bare asyncio connections (cheap per event); httpx: httpx.AsyncClient "
        f"(default {DEFAULT_CLIENT})",
    )


def settings_from_args(args: argparse.Namespace) -> LoadSettings:
    import torch

    from twinfer.engine_options import given_engine_settings
    from twinfer.registry import default_engine_name, resolve_device

    device = resolve_device(args.device)
    return LoadSettings(
        model=args.model,
        engine=args.engine or default_engine_name(device),
        dtype=getattr(torch, args.dtype),
        device=device,
        clients=tuple(_ints(args.clients, "--clients")),
        prompt_len=_range(args.prompt_len, "--prompt-len"),
        output_len=_range(args.output_len, "--output-len"),
        seed=args.seed,
        weight_seed=args.weight_seed,
        engine_settings=given_engine_settings(args),
        modes=_modes(args.modes),
        clients_per_process=_positive(args.clients_per_process, "--clients-per-process"),
        client=args.client,
    )


def http_stack() -> dict[str, str]:
    """The event loop and HTTP parser uvicorn picks ("auto": uvloop and httptools when installed)."""
    import importlib.util

    return {
        "loop": "uvloop" if importlib.util.find_spec("uvloop") else "asyncio",
        "http": "httptools" if importlib.util.find_spec("httptools") else "h11",
    }


def _positive(value: int, flag: str) -> int:
    if value < 1:
        raise SystemExit(f"{flag} takes a positive integer, got {value}")
    return value


def _modes(text: str) -> tuple[str, ...]:
    modes = tuple(part.strip() for part in text.split(",") if part.strip())
    if not modes or any(mode not in ("thread", "process") for mode in modes):
        raise SystemExit(f"--modes takes thread and/or process, got {text!r}")
    return modes


def _ints(text: str, flag: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError as error:
        raise SystemExit(f"{flag} takes comma-separated integers, got {text!r}") from error
    if not values or any(v < 1 for v in values):
        raise SystemExit(f"{flag} takes positive integers, got {text!r}")
    return values


def _range(text: str, flag: str) -> tuple[int, int]:
    values = _ints(text, flag)
    if len(values) != 2 or values[0] > values[1]:
        raise SystemExit(f"{flag} takes LO,HI with LO <= HI, got {text!r}")
    return values[0], values[1]


def summary_lines(record: dict[str, object]) -> list[str]:
    columns = (("clients", 7), ("engine", 7), ("server tok/s", 12), ("offline tok/s", 13), ("ratio", 6))
    columns += (("TTFT p50", 9), ("TPOT p50", 9), ("same", 5), ("tok/event", 9), ("procs", 5))
    lines = [" ".join(f"{name:>{width}}" for name, width in columns)]
    for result in record["results"]:  # type: ignore[union-attr]
        offline = result["offline"]
        for mode, server in result["server"].items():
            ttft, tpot = server["time_to_first_token_s"] or {}, server["time_per_output_token_s"] or {}
            lines.append(
                f"{result['clients']:>7} {mode:>7} {server['output_tokens_per_s']:>12.1f} "
                f"{offline['output_tokens_per_s']:>13.1f} {server['throughput_over_offline']:>6.3f} "
                f"{ttft.get('p50', float('nan')) * 1e3:>7.1f}ms {tpot.get('p50', float('nan')) * 1e3:>7.2f}ms "
                f"{server['outputs_identical_to_offline']:>5} {server.get('tokens_per_event') or float('nan'):>9.2f} "
                f"{server.get('client_processes', 1):>5}"
            )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reports.serving.server_load", description=__doc__.split("\n")[0])
    configure_parser(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    record = run_load(settings_from_args(args))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(record, indent=2))
    print("\n".join(summary_lines(record)))
    failed = sum(server["failed_clients"] for r in record["results"] for server in r["server"].values())
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
