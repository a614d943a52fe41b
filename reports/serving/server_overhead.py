"""`python -m reports.serving.server_overhead`: the server's own cost per streamed token, measured without a GPU.

The server (real uvicorn on loopback, the real app, the engine on a thread or in a child process)
drives a `StubEngine`: an engine that keeps the protocol (add_request / step / abort / has_unfinished,
validation through spec.request.check_request, continuous batching with chunked prefill under
max_num_seqs and max_num_batched_tokens) but computes nothing. Each step takes the time an H200 takes
on Qwen3-0.6B in bf16 (decode about 13 ms at 256 running requests, see `StubTiming`), part of it spent
in Python holding the interpreter lock, as an engine's host work does, the rest sleeping, as an engine
waiting on its GPU does. Each step gives every running request one token.

For each client count N and engine mode, the same N requests as `reports.serving.server_load` (the load
generator is the same code, in several processes) run against the server and offline
(`StubEngine.generate`); the record gives both throughputs, their ratio, the clients' latencies, and
the CPU time of each part while the clients ran: the server's event loop thread, its engine thread
(thread mode) or reader and writer threads plus the engine process (process mode), and the client
processes, each also per streamed token. With `--py-spy DIR` (py-spy installed) it also samples every
thread of the server and its children while the clients run and writes the heaviest functions of each.

    python -m reports.serving.server_overhead --clients 1,16,64,256 --json /tmp/overhead.json
    python -m reports.serving.server_overhead --clients 256 --modes process --py-spy /tmp/spy --json /tmp/o.json
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import cProfile
import functools
import gc
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from reports.serving.server_load import (
    DEFAULT_CLIENT,
    DEFAULT_CLIENTS_PER_PROCESS,
    TEMPERATURE,
    LoadRequest,
    against_offline,
    build_requests,
    client_summary,
    clients_in_subprocesses,
    distribution,
    http_stack,
    warm_up_server,
)
from spec.engine_config import EngineConfig
from spec.errors import InvalidRequestError
from spec.request import FinishReason, RequestOutput, check_request
from spec.sampling_params import SamplingParams

logger = logging.getLogger(__name__)

STUB_VOCAB_SIZE = 151_936  # Qwen3's


# -- the stub engine --------------------------------------------------------------------------------


@dataclass(frozen=True)
class StubTiming:
    """How long a step takes: base + per decoding request + per prompt token computed; of that, the host
    part (base + per running request) is spent in Python holding the interpreter lock, the rest asleep.
    The defaults approximate the fast engine on an H200 with Qwen3-0.6B in bf16 (decode 2.3 ms at batch 1,
    about 13 ms at 256; prefill about 400k tokens/s; a few ms of host work per full-batch step)."""

    step_base_s: float = 0.002
    step_per_decode_s: float = 0.011 / 256
    step_per_prompt_token_s: float = 2.4e-6
    host_base_s: float = 0.0005
    host_per_request_s: float = 0.0025 / 256
    # The host work lets the interpreter lock go this many times a step (a torch call releases it while it
    # dispatches); on a thread, each time the server's event loop may take it and delay the engine.
    host_lock_releases: int = 40

    def scaled(self, factor: float) -> StubTiming:
        times = {name: value * factor for name, value in asdict(self).items() if name.endswith("_s")}
        return replace(self, **times)


@dataclass(eq=False)
class _StubRequest:
    request_id: str
    prompt: tuple[int, ...]
    params: SamplingParams
    seed: int
    computed: int = 0  # prompt tokens computed so far
    output: list[int] = field(default_factory=list)
    finish_reason: FinishReason | None = None

    def result(self) -> RequestOutput:
        return RequestOutput(self.request_id, self.prompt, tuple(self.output), self.finish_reason, 0)


class StubEngine:
    """The engine protocol over no model: see the module docstring. Token i of a request is a function of
    its seed and i, so the server and `generate` produce the same tokens."""

    def __init__(self, config: EngineConfig, timing: StubTiming = StubTiming()) -> None:
        if config.max_model_len is None or config.num_blocks is None:
            config = replace(config, max_model_len=config.max_model_len or 2048, num_blocks=config.num_blocks or 65536)
        self.config = config
        self.timing = timing
        self.vocab_size = STUB_VOCAB_SIZE
        self.waiting: collections.deque[_StubRequest] = collections.deque()
        self.running: list[_StubRequest] = []
        self._requests: dict[str, _StubRequest] = {}
        self._ids = 0
        self.host_s = 0.0  # time spent holding the interpreter lock on purpose (the "host work")
        self.steps = 0
        self.step_s = 0.0  # wall time of all steps
        self.planned_s = 0.0  # what they would have taken with the interpreter lock always at hand

    @property
    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def add_request(
        self, prompt_token_ids: Sequence[int], params: SamplingParams | None = None, request_id: str | None = None
    ) -> str:
        params = params if params is not None else SamplingParams()
        if request_id is None:
            request_id, self._ids = f"request-{self._ids}", self._ids + 1
        if request_id in self._requests:
            raise InvalidRequestError(f"request id {request_id!r} is already in use")
        prompt = check_request(request_id, prompt_token_ids, params, self.vocab_size, self.config)
        seed = params.seed if params.seed is not None else hash(request_id) & 0x7FFFFFFF
        request = _StubRequest(request_id, prompt, params, seed)
        self._requests[request_id] = request
        self.waiting.append(request)
        return request_id

    def abort(self, request_id: str) -> RequestOutput:
        request = self._requests.pop(request_id, None)
        if request is None:
            raise KeyError(f"no unfinished request {request_id!r}")
        if request in self.running:
            self.running.remove(request)
        else:
            self.waiting.remove(request)
        request.finish_reason = FinishReason.ABORT
        return request.result()

    def step(self) -> list[RequestOutput]:
        began = time.perf_counter()
        try:
            return self._step()
        finally:
            self.step_s += time.perf_counter() - began
            self.steps += 1

    def _step(self) -> list[RequestOutput]:
        budget = self.config.max_num_batched_tokens
        sampling: list[_StubRequest] = []
        prompt_tokens = 0
        for request in self.running:  # decodes first, then unfinished prompts, as the engines schedule
            if request.computed == len(request.prompt) and budget > 0:
                sampling.append(request)
                budget -= 1
        for request in self.running:
            if request.computed < len(request.prompt) and budget > 0:
                budget, prompt_tokens = self._prefill(request, budget, prompt_tokens, sampling)
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            request = self.waiting.popleft()
            self.running.append(request)
            budget, prompt_tokens = self._prefill(request, budget, prompt_tokens, sampling)
        self._spend(len(sampling), prompt_tokens)
        outputs = []
        for request in sampling:
            request.output.append(_token(request.seed, len(request.output)))
            request.finish_reason = self._finish_reason(request)
            if request.finish_reason is not None:
                self.running.remove(request)
                del self._requests[request.request_id]
            outputs.append(request.result())
        return outputs

    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams | Sequence[SamplingParams] | None = None
    ) -> list[RequestOutput]:
        params_list = [params] * len(prompts) if not isinstance(params, Sequence) else list(params)
        ids = [self.add_request(prompt, p) for prompt, p in zip(prompts, params_list, strict=True)]
        finished: dict[str, RequestOutput] = {}
        while self.has_unfinished:
            finished.update((output.request_id, output) for output in self.step() if output.finished)
        return [finished[request_id] for request_id in ids]

    def _prefill(
        self, request: _StubRequest, budget: int, prompt_tokens: int, sampling: list[_StubRequest]
    ) -> tuple[int, int]:
        chunk = min(budget, len(request.prompt) - request.computed)
        request.computed += chunk
        if request.computed == len(request.prompt):
            sampling.append(request)
        return budget - chunk, prompt_tokens + chunk

    def _spend(self, decodes: int, prompt_tokens: int) -> None:
        timing = self.timing
        total = timing.step_base_s + timing.step_per_decode_s * decodes + timing.step_per_prompt_token_s * prompt_tokens
        host = min(total, timing.host_base_s + timing.host_per_request_s * len(self.running))
        self.planned_s += total
        slices = max(1, timing.host_lock_releases)
        start = time.perf_counter()
        for index in range(slices):  # host work: holds the interpreter lock, but for a moment each slice
            end = start + host * (index + 1) / slices
            while time.perf_counter() < end:
                pass
            os.sched_yield()  # lets the lock go, as a torch call does (time.sleep(0) is far slower)
        self.host_s += time.perf_counter() - start
        time.sleep(max(0.0, total - (time.perf_counter() - start)))  # the device: the lock is free

    def _finish_reason(self, request: _StubRequest) -> FinishReason | None:
        if request.output[-1] in request.params.stop_token_ids:
            return FinishReason.STOP
        if len(request.output) >= request.params.max_tokens:
            return FinishReason.LENGTH
        if len(request.prompt) + len(request.output) >= self.config.model_len:
            return FinishReason.LENGTH
        return None


def _token(seed: int, position: int) -> int:
    return (seed * 2_654_435_761 + position * 40_503 + (seed >> 7)) % STUB_VOCAB_SIZE


# -- CPU time of threads and processes ----------------------------------------------------------------


def _task_cpu_s(path: Path) -> float:
    """CPU seconds of one task (thread) from /proc: schedstat's nanoseconds, else stat's clock ticks."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        return int((path / "schedstat").read_text().split()[0]) / 1e9
    with contextlib.suppress(OSError, ValueError, IndexError):
        fields = (path / "stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return 0.0


def thread_cpu_s() -> dict[int, float]:
    """CPU seconds of every thread of this process, by native thread id."""
    tasks = Path("/proc/self/task")
    if not tasks.is_dir():
        return {}
    return {int(task.name): _task_cpu_s(task) for task in tasks.iterdir()}


def process_cpu_s(pid: int) -> float:
    """CPU seconds of all threads of process `pid` (0.0 where /proc is missing)."""
    tasks = Path(f"/proc/{pid}/task")
    if not tasks.is_dir():
        return 0.0
    return sum(_task_cpu_s(task) for task in tasks.iterdir())


class GcMeter:
    """Garbage-collection pauses in this process (every thread) between `start()` and `stop()`, by generation."""

    def __init__(self) -> None:
        self.pauses = [0.0, 0.0, 0.0]
        self.counts = [0, 0, 0]
        self._began = 0.0

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._began = time.perf_counter()
        else:
            self.pauses[info["generation"]] += time.perf_counter() - self._began
            self.counts[info["generation"]] += 1

    def start(self) -> None:
        gc.callbacks.append(self._callback)

    def stop(self) -> dict[str, object]:
        gc.callbacks.remove(self._callback)
        return {"collections": self.counts, "pause_s": self.pauses}


class CpuMeter:
    """CPU seconds of the server's parts between `start()` and `stop()`, by role."""

    def __init__(self, roles: dict[int, str], engine_pid: int | None) -> None:
        self.roles = roles  # native thread id -> role
        self.engine_pid = engine_pid

    def start(self) -> None:
        self._threads = thread_cpu_s()
        self._engine = process_cpu_s(self.engine_pid) if self.engine_pid else 0.0

    def stop(self) -> dict[str, float]:
        after = thread_cpu_s()
        spent: dict[str, float] = collections.defaultdict(float)
        for tid, seconds in after.items():
            spent[self.roles.get(tid, "other server threads")] += seconds - self._threads.get(tid, 0.0)
        if self.engine_pid:
            spent["engine process"] = process_cpu_s(self.engine_pid) - self._engine
        return dict(spent)


# -- phases ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class OverheadSettings:
    clients: tuple[int, ...]
    modes: tuple[str, ...]
    prompt_len: tuple[int, int]
    output_len: tuple[int, int]
    seed: int
    timing: StubTiming
    engine_config: EngineConfig
    clients_per_process: int = DEFAULT_CLIENTS_PER_PROCESS
    client: str = DEFAULT_CLIENT
    py_spy_dir: Path | None = None
    cprofile_dir: Path | None = None


def stub_engine(config: EngineConfig, timing: StubTiming) -> StubEngine:
    """Module-level, so that a child process can build it (EngineProcess pickles a partial of it)."""
    return StubEngine(config, timing)


def run_offline(settings: OverheadSettings, requests: Sequence[LoadRequest]) -> dict[str, object]:
    engine = StubEngine(settings.engine_config, settings.timing)
    params = [
        SamplingParams(temperature=TEMPERATURE, max_tokens=r.max_tokens, ignore_eos=True, seed=r.seed) for r in requests
    ]
    cpu, start = time.process_time(), time.perf_counter()
    ids = [engine.add_request(list(r.prompt_token_ids), p) for r, p in zip(requests, params, strict=True)]
    first: dict[str, float] = {}
    finished: dict[str, RequestOutput] = {}
    while engine.has_unfinished:
        for output in engine.step():
            first.setdefault(output.request_id, time.perf_counter() - start)
            if output.finished:
                finished[output.request_id] = output
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    outputs = [finished[request_id] for request_id in ids]
    tokens = sum(len(o.token_ids) for o in outputs)
    return {
        "wall_s": wall,
        "output_tokens": tokens,
        "output_tokens_per_s": tokens / wall,
        "time_to_first_token_s": distribution(list(first.values())),
        "steps": engine.steps,
        "engine_step_s_mean": engine.step_s / max(engine.steps, 1),
        "engine_step_slowdown": engine.step_s / max(engine.planned_s, 1e-9),
        "engine_cpu_s": cpu,
        "engine_host_work_s": engine.host_s,
        "token_ids": [tuple(o.token_ids) for o in outputs],
    }


def run_server(
    settings: OverheadSettings, requests: list[LoadRequest], mode: str, label: str
) -> tuple[dict[str, object], list[tuple[int, ...]]]:
    from twinfer.server.app import create_app
    from twinfer.server.detokenize import IdOnlyCodec
    from twinfer.server.engine_loop import EngineLoop
    from twinfer.server.engine_process import EngineProcess
    from twinfer.server.launch import ServerThread

    factory = functools.partial(stub_engine, settings.engine_config, settings.timing)
    driver = EngineProcess(factory) if mode == "process" else EngineLoop(factory())
    app = create_app(driver, IdOnlyCodec(), None, "stub")
    server = ServerThread(app)
    profiles = _profile_threads(server, driver, settings.cprofile_dir, label)
    with server:
        warm_up_server(server.base_url, "stub")
        meter = CpuMeter(_thread_roles(server, driver), getattr(getattr(driver, "_process", None), "pid", None))
        stub = getattr(driver, "engine", None)
        steps_before, step_s_before, planned_before = (
            (stub.steps, stub.step_s, stub.planned_s) if stub is not None else (0, 0.0, 0.0)
        )
        gc_meter = GcMeter()
        with _py_spy(settings.py_spy_dir, label):
            meter.start()
            gc_meter.start()
            run = clients_in_subprocesses(
                server.base_url, "stub", requests, settings.clients_per_process, settings.client
            )
            gc_pauses = gc_meter.stop()
            cpu = meter.stop()
    for name, profile in profiles.items():
        profile.dump_stats(str(settings.cprofile_dir / f"{label}-{name}.prof"))
    summary = client_summary(run)
    tokens = summary["output_tokens"] or 1
    summary["server_cpu_s"] = cpu
    summary["server_gc"] = gc_pauses
    if mode == "thread":  # how much the server slowed the engine's steps (the process mode's engine is out of reach)
        engine = stub
        summary["engine_steps"] = engine.steps - steps_before
        summary["engine_step_slowdown"] = (engine.step_s - step_s_before) / max(engine.planned_s - planned_before, 1e-9)
    summary["cpu_us_per_token"] = {role: seconds / tokens * 1e6 for role, seconds in cpu.items()}
    summary["cpu_us_per_token"]["clients"] = summary["client_cpu_s"] / tokens * 1e6
    summary["busy_fraction"] = {role: seconds / run.wall_s for role, seconds in cpu.items()}
    return summary, [r.token_ids for r in run.records]


def _thread_roles(server, driver) -> dict[int, str]:
    roles = {server._thread.native_id: "event loop"}
    engine_thread = getattr(driver, "_thread", None)
    if engine_thread is not None:
        roles[engine_thread.native_id] = "engine thread"
    for thread in getattr(driver, "_threads", ()):
        roles[thread.native_id] = thread.name.removeprefix("twinfer-").replace("-", " ") + " thread"
    return roles


def _profile_threads(server, driver, directory: Path | None, label: str) -> dict[str, cProfile.Profile]:
    """cProfile the event loop thread and, in thread mode, the engine thread, from their start to the server's
    stop (wraps their targets before they start)."""
    if directory is None:
        return {}
    directory.mkdir(parents=True, exist_ok=True)
    profiles = {"loop": cProfile.Profile()}
    thread = server._thread
    run_server = thread._target
    thread._target = lambda *args, **kwargs: profiles["loop"].runcall(run_server, *args, **kwargs)
    if hasattr(driver, "_run"):
        run_engine = driver._run
        profiles["engine"] = cProfile.Profile()
        driver._run = lambda: profiles["engine"].runcall(run_engine)
    return profiles


@contextlib.contextmanager
def _py_spy(directory: Path | None, label: str) -> Iterator[None]:
    """Sample this process and its children (raw collapsed stacks, per thread) while the block runs."""
    if directory is None:
        yield
        return
    executable = shutil.which("py-spy")
    if executable is None:
        raise SystemExit("--py-spy needs py-spy (pip install py-spy)")
    directory.mkdir(parents=True, exist_ok=True)
    raw = directory / f"{label}.txt"
    command = [executable, "record", "--pid", str(os.getpid()), "--subprocesses", "--threads", "--nonblocking"]
    command += ["--rate", "250", "--format", "raw", "--output", str(raw)]
    spy = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)  # let it attach
    try:
        yield
    finally:
        spy.send_signal(signal.SIGINT)
        try:
            spy.wait(timeout=60)
        except subprocess.TimeoutExpired:
            spy.kill()
    if raw.exists():
        (directory / f"{label}.summary.txt").write_text("\n".join(summarize_stacks(raw.read_text())) + "\n")


def summarize_stacks(raw: str, top: int = 25) -> list[str]:
    """Per process and thread of py-spy's raw output: samples, then the functions with most samples of their
    own (self) and in total (inclusive)."""
    groups: dict[str, tuple[collections.Counter, collections.Counter, list[int]]] = {}
    for line in raw.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        frames = stack.split(";")
        key_parts = [frame for frame in frames[:2] if frame.startswith(("process ", "thread "))]
        body = frames[len(key_parts) :]
        key = " / ".join(part[:80] for part in key_parts) or "all"
        own, inclusive, total = groups.setdefault(key, (collections.Counter(), collections.Counter(), [0]))
        count = int(count_text)
        total[0] += count
        if body:
            own[body[-1]] += count
            for frame in set(body):
                inclusive[frame] += count
    lines = []
    for key, (own, inclusive, total) in sorted(groups.items(), key=lambda item: -item[1][2][0]):
        lines.append(f"== {key}: {total[0]} samples")
        lines.append("  self:")
        lines += [f"    {count / total[0]:6.1%}  {frame}" for frame, count in own.most_common(top)]
        lines.append("  inclusive:")
        lines += [f"    {count / total[0]:6.1%}  {frame}" for frame, count in inclusive.most_common(top)]
    return lines


def run_overhead(settings: OverheadSettings) -> dict[str, object]:
    results = []
    for num_clients in settings.clients:
        requests = build_requests(num_clients, settings.prompt_len, settings.output_len, settings.seed)
        logger.info("%d clients: offline", num_clients)
        offline = run_offline(settings, requests)
        offline_tokens = offline.pop("token_ids")
        servers = {}
        for mode in settings.modes:
            logger.info("%d clients: server, engine on a %s", num_clients, mode)
            server, tokens = run_server(settings, requests, mode, f"{mode}-{num_clients}")
            servers[mode] = against_offline(server, tokens, offline, offline_tokens)
        results.append({"clients": num_clients, "offline": offline, "server": servers})
    return {
        "what": "the server over a stub engine (no model, H200-like step times): see "
        "reports/serving/server_overhead.py",
        "cpu_count": os.cpu_count(),
        "python": sys.version.split()[0],
        "timing": asdict(settings.timing),
        "engine_config": asdict(settings.engine_config),
        "workload": {
            "prompt_len": list(settings.prompt_len),
            "output_len": list(settings.output_len),
            "seed": settings.seed,
        },
        "load_generator": {"client": settings.client, "clients_per_process": settings.clients_per_process},
        "server_http_stack": http_stack(),
        "results": results,
    }


def summary_lines(record: dict[str, object]) -> list[str]:
    lines = [
        f"{'clients':>7} {'engine':>7} {'server':>8} {'offline':>8} {'ratio':>6} {'TTFT50':>7} {'(off)':>7} "
        f"{'TPOT50':>7} {'tok/ev':>6} {'same':>5}  CPU us/token (busy fraction)"
    ]
    for result in record["results"]:  # type: ignore[union-attr]
        offline = result["offline"]
        for mode, server in result["server"].items():
            ttft, tpot = server["time_to_first_token_s"] or {}, server["time_per_output_token_s"] or {}
            offline_ttft = offline["time_to_first_token_s"] or {}
            busy = {**server["busy_fraction"], "clients": server["client_busiest_process_cpu_fraction"]}
            parts = ", ".join(
                f"{role} {us:.0f} ({busy[role]:.0%})"
                for role, us in sorted(server["cpu_us_per_token"].items(), key=lambda item: -item[1])
                if us >= 0.5
            )
            per_event = server["tokens_per_event"] or float("nan")
            lines.append(
                f"{result['clients']:>7} {mode:>7} {server['output_tokens_per_s']:>8.0f} "
                f"{offline['output_tokens_per_s']:>8.0f} {server['throughput_over_offline']:>6.3f} "
                f"{ttft.get('p50', float('nan')) * 1e3:>5.0f}ms {offline_ttft.get('p50', float('nan')) * 1e3:>5.0f}ms "
                f"{tpot.get('p50', float('nan')) * 1e3:>5.1f}ms "
                f"{per_event:>6.2f} {server['outputs_identical_to_offline']:>5}  {parts}"
            )
    return lines


# -- command line -----------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    from reports.serving.server_load import _ints, _modes, _range, add_client_arguments

    parser = argparse.ArgumentParser(
        prog="python -m reports.serving.server_overhead", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--clients", default="1,16,64,256", help="comma-separated client counts (default 1,16,64,256)")
    parser.add_argument("--modes", default="thread,process", help="thread and/or process (default both)")
    parser.add_argument("--prompt-len", default="100,1024", help="prompt length range LO,HI (default 100,1024)")
    parser.add_argument("--output-len", default="128,128", help="output length range LO,HI (default 128,128)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--time-scale", type=float, default=1.0, help="multiply every step time (above 1 on a machine with few cores)"
    )
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--max-num-batched-tokens", type=int, default=8192)
    add_client_arguments(parser)
    parser.add_argument("--py-spy", type=Path, default=None, help="sample the server with py-spy; write here")
    parser.add_argument(
        "--cprofile", type=Path, default=None, help="cProfile the event loop and engine-side threads; write here"
    )
    parser.add_argument("--json", type=Path, required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    settings = OverheadSettings(
        clients=tuple(_ints(args.clients, "--clients")),
        modes=_modes(args.modes),
        prompt_len=_range(args.prompt_len, "--prompt-len"),
        output_len=_range(args.output_len, "--output-len"),
        seed=args.seed,
        timing=StubTiming().scaled(args.time_scale),
        engine_config=EngineConfig(
            max_num_seqs=args.max_num_seqs,
            max_num_batched_tokens=args.max_num_batched_tokens,
            max_model_len=2048,
            num_blocks=65536,
        ),
        clients_per_process=args.clients_per_process,
        client=args.client,
        py_spy_dir=args.py_spy,
        cprofile_dir=args.cprofile,
    )
    record = run_overhead(settings)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(record, indent=2))
    print("\n".join(summary_lines(record)))
    failed = sum(server["failed_clients"] for r in record["results"] for server in r["server"].values())
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
