"""`python -m reports.server_load`: `twinfer serve` under N concurrent streaming clients, against offline generate.

For each client count N, on the same N requests (random prompt ids in [0, 10000), lengths drawn from
`--prompt-len`, `--output-len` tokens each, temperature 0.6 with a per-request seed, ignore_eos):

* server: a fresh engine behind the OpenAI server in this process (uvicorn in a thread), the engine
  on a thread of this process and/or in a child process (`--modes`), one warm-up request, then N
  streaming clients started together from a separate process (so the clients' own Python work does
  not share the server's interpreter lock). Each client records its time to first token and mean
  time per output token after the first; throughput is output tokens over the wall time from the
  first request sent to the last token received.
* offline: a fresh engine, one warm-up request, then `engine.generate` on the same requests.

The record gives both throughputs and their ratio, latency distributions, and how many server
outputs were token-for-token identical to the offline ones (seeded sampling makes them equal up to
floating-point near-ties between different batch compositions).

    python -m reports.server_load --model qwen3-0.6b --clients 1,16,64,256 --json server_load.json
    python -m reports.server_load --model tiny --device cpu --dtype float32 --clients 1,4 \\
        --prompt-len 4,16 --output-len 8,8 --json /tmp/load.json        # a CPU check of the harness
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import logging
import multiprocessing
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


# -- clients (run in a child process) ---------------------------------------------------------------


def run_clients(base_url: str, model: str, requests: Sequence[LoadRequest]) -> tuple[list[ClientRecord], float]:
    """N concurrent streaming clients started together; their records and the wall time of the whole batch."""
    return asyncio.run(_all_clients(base_url, model, requests))


async def _all_clients(base_url: str, model: str, requests: Sequence[LoadRequest]) -> tuple[list[ClientRecord], float]:
    limits = httpx.Limits(max_connections=len(requests) + 8, max_keepalive_connections=len(requests) + 8)
    async with httpx.AsyncClient(base_url=base_url, limits=limits, timeout=CLIENT_TIMEOUT_S) as client:
        start = time.perf_counter()
        records = await asyncio.gather(*(_one_client(client, model, request) for request in requests))
        wall = time.perf_counter() - start
    return list(records), wall


async def _one_client(client: httpx.AsyncClient, model: str, request: LoadRequest) -> ClientRecord:
    body = {
        "model": model,
        "prompt": list(request.prompt_token_ids),
        "max_tokens": request.max_tokens,
        "temperature": TEMPERATURE,
        "seed": request.seed,
        "stream": True,
        "ignore_eos": True,
        "return_token_ids": True,
    }
    tokens: list[int] = []
    sent = time.perf_counter()
    first = last = None
    try:
        async with client.stream("POST", "/v1/completions", json=body) as response:
            if response.status_code != 200:
                return ClientRecord((), None, None, f"HTTP {response.status_code}: {(await response.aread())[:300]!r}")
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                for choice in json.loads(line.removeprefix("data: ")).get("choices", []):
                    new = choice.get("token_ids") or []
                    if new:
                        last = time.perf_counter()
                        first = first if first is not None else last
                        tokens += new
    except httpx.HTTPError as error:
        return ClientRecord(tuple(tokens), None, None, f"{type(error).__name__}: {error}")
    ttft = None if first is None else first - sent
    tpot = (last - first) / (len(tokens) - 1) if first is not None and last is not None and len(tokens) > 1 else None
    return ClientRecord(tuple(tokens), ttft, tpot)


def _client_process(base_url: str, model: str, requests: list[LoadRequest], results) -> None:  # results: Queue
    try:
        results.put(run_clients(base_url, model, requests))
    except BaseException as error:  # report instead of leaving the parent waiting
        results.put(error)


def clients_in_subprocess(base_url: str, model: str, requests: list[LoadRequest]) -> tuple[list[ClientRecord], float]:
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    process = context.Process(target=_client_process, args=(base_url, model, requests, results), daemon=True)
    process.start()
    try:
        outcome = results.get(timeout=CLIENT_TIMEOUT_S + 60)
    finally:
        process.join(timeout=30)
    if isinstance(outcome, BaseException):
        raise RuntimeError(f"the client process failed: {outcome!r}") from outcome
    return outcome


# -- server and offline phases ----------------------------------------------------------------------


@dataclass(frozen=True)
class LoadSettings:
    model: str  # a shape name from reports.model_shapes.SHAPES, or a checkpoint
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


def build_engine(settings: LoadSettings, engine_config):
    """A fresh engine: random weights of a named shape, or a checkpoint."""
    from reports.model_shapes import SHAPES, random_state_dict
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
    from reports.bench_runners import warm_up_engine

    engine = build_engine(settings, engine_config)
    warm_up_engine(engine)
    return engine


def serving_app(settings: LoadSettings, engine_config, mode: str):
    """The server, its engine on a thread of this process or (mode "process") in a child process."""
    from reports.model_shapes import SHAPES
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
    """The settings given; what was not given is sized so that all clients run at once (the pool too,
    unless the engine sizes its own pool from GPU memory)."""
    from reports.bench_runners import WARMUP_MAX_TOKENS, WARMUP_PROMPT
    from spec.engine_config import DEFAULT_NUM_BLOCKS, EngineConfig
    from twinfer.registry import engine_entry

    sized: dict[str, object] = {"max_num_seqs": max(EngineConfig().max_num_seqs, len(requests))}
    if not (engine_entry(settings.engine).sizes_kv_pool_from_gpu_memory and settings.device.type == "cuda"):
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
        _warm_up_server(server.base_url, settings.model)
        records, wall = clients_in_subprocess(server.base_url, settings.model, requests)
        metrics_text = httpx.get(f"{server.base_url}/metrics", timeout=30).text
        engine_config = asdict(app.state.context.driver.config)
    # Both names reach the engine (the server holds the app, the app its driver): drop both before
    # releasing, or the next phase's engine sizes its pool with this one's still allocated.
    del app, server
    _release(settings.device)
    output_tokens = sum(len(r.token_ids) for r in records)
    errors = [r.error for r in records if r.error]
    summary = {
        "engine_mode": mode,
        "engine_config": engine_config,
        "wall_s": wall,
        "output_tokens": output_tokens,
        "output_tokens_per_s": output_tokens / wall,
        "failed_clients": len(errors),
        "first_errors": errors[:3],
        "time_to_first_token_s": distribution([r.time_to_first_token_s for r in records]),
        "time_per_output_token_s": distribution([r.time_per_output_token_s for r in records]),
        "server_prefix_cache_hit_rate": _metric(metrics_text, "twinfer_prefix_cache_hit_rate"),
    }
    return summary, records


def _warm_up_server(base_url: str, model: str) -> None:
    body = {"model": model, "prompt": [10_001, 10_002, 10_003], "max_tokens": 4, "temperature": 0, "ignore_eos": True}
    response = httpx.post(f"{base_url}/v1/completions", json=body, timeout=600)
    response.raise_for_status()


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


def run_load(settings: LoadSettings) -> dict[str, object]:
    from reports.bench_device import environment

    results = []
    for num_clients in settings.clients:
        requests = build_requests(num_clients, settings.prompt_len, settings.output_len, settings.seed)
        logger.info("%d clients: offline generate", num_clients)
        offline, offline_tokens = run_offline_phase(settings, requests)
        servers = {}
        for mode in settings.modes:
            logger.info("%d clients: server, engine on a %s", num_clients, mode)
            server, records = run_server_phase(settings, requests, mode)
            server["outputs_identical_to_offline"] = sum(
                r.token_ids == t for r, t in zip(records, offline_tokens, strict=True)
            )
            server["throughput_over_offline"] = server["output_tokens_per_s"] / offline["output_tokens_per_s"]
            servers[mode] = server
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
        "--model", default="qwen3-0.6b", help="a shape of reports.model_shapes (random weights) or a checkpoint"
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
    parser.add_argument("--json", type=Path, required=True, help="where to write the record")
    add_engine_arguments(parser)


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
    )


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
    columns += (("TTFT p50", 9), ("TPOT p50", 9), ("same", 5))
    lines = [" ".join(f"{name:>{width}}" for name, width in columns)]
    for result in record["results"]:  # type: ignore[union-attr]
        offline = result["offline"]
        for mode, server in result["server"].items():
            ttft, tpot = server["time_to_first_token_s"] or {}, server["time_per_output_token_s"] or {}
            lines.append(
                f"{result['clients']:>7} {mode:>7} {server['output_tokens_per_s']:>12.1f} "
                f"{offline['output_tokens_per_s']:>13.1f} {server['throughput_over_offline']:>6.3f} "
                f"{ttft.get('p50', float('nan')) * 1e3:>7.1f}ms {tpot.get('p50', float('nan')) * 1e3:>7.2f}ms "
                f"{server['outputs_identical_to_offline']:>5}"
            )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reports.server_load", description=__doc__.split("\n")[0])
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
