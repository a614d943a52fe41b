"""Server metrics in Prometheus' text exposition format (version 0.0.4).

Counters and histograms are updated from two threads (the engine thread counts tokens and prefix
hits; request handlers time first tokens and per-token latency), so every update takes one lock.
Gauges of the engine's state (running, waiting, KV blocks) come from the engine thread's latest
`EngineStats` snapshot: nothing here reads the engine while it steps.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

PREFIX = "twinfer"
THROUGHPUT_WINDOW_S = 10.0
LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


@dataclass(frozen=True)
class EngineStats:
    """The engine's state after its latest step, published by the engine thread. None: not exposed."""

    num_running: int | None = None
    num_waiting: int | None = None
    kv_blocks_total: int | None = None
    kv_blocks_free: int | None = None
    alive: bool = True

    @property
    def kv_blocks_used(self) -> int | None:
        if self.kv_blocks_total is None or self.kv_blocks_free is None:
            return None
        return self.kv_blocks_total - self.kv_blocks_free


class Histogram:
    def __init__(self, buckets: Sequence[float]) -> None:
        self.buckets = tuple(buckets)
        self.counts = [0] * len(self.buckets)
        self.total = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        for index, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[index] += 1
                break
        self.total += value
        self.count += 1

    def render(self, name: str, help_text: str) -> list[str]:
        lines = [f"# HELP {name} {help_text}", f"# TYPE {name} histogram"]
        cumulative = 0
        for bound, count in zip(self.buckets, self.counts, strict=True):
            cumulative += count
            lines.append(f'{name}_bucket{{le="{_number(bound)}"}} {cumulative}')
        lines += [
            f'{name}_bucket{{le="+Inf"}} {self.count}',
            f"{name}_sum {_number(self.total)}",
            f"{name}_count {self.count}",
        ]
        return lines


class ServerMetrics:
    def __init__(self, clock=time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._started = clock()
        self.generation_tokens = 0
        self.prompt_tokens = 0
        self.cached_prompt_tokens = 0
        self.finished: dict[str, int] = {}
        self.aborted = 0
        self.rejected = 0
        self.time_to_first_token = Histogram(LATENCY_BUCKETS_S)
        self.time_per_output_token = Histogram(LATENCY_BUCKETS_S)
        self._recent_tokens: deque[tuple[float, int]] = deque()

    # -- engine thread -----------------------------------------------------------------------

    def record_step(self, num_tokens: int) -> None:
        now = self._clock()
        with self._lock:
            self.generation_tokens += num_tokens
            self._recent_tokens.append((now, num_tokens))
            self._trim(now)

    def record_prefill(self, num_prompt_tokens: int, num_cached_tokens: int) -> None:
        with self._lock:
            self.prompt_tokens += num_prompt_tokens
            self.cached_prompt_tokens += num_cached_tokens

    def record_aborted(self, count: int) -> None:
        with self._lock:
            self.aborted += count

    # -- request handlers --------------------------------------------------------------------

    def record_rejected(self) -> None:
        with self._lock:
            self.rejected += 1

    def record_request(
        self, finish_reason: str, time_to_first_token: float | None, time_per_token: float | None
    ) -> None:
        with self._lock:
            self.finished[finish_reason] = self.finished.get(finish_reason, 0) + 1
            if time_to_first_token is not None:
                self.time_to_first_token.observe(time_to_first_token)
            if time_per_token is not None:
                self.time_per_output_token.observe(time_per_token)

    # -- exposition --------------------------------------------------------------------------

    def tokens_per_second(self) -> float:
        now = self._clock()
        with self._lock:
            self._trim(now)
            tokens = sum(count for _, count in self._recent_tokens)
        window = min(THROUGHPUT_WINDOW_S, max(now - self._started, 1e-9))
        return tokens / window

    def prefix_cache_hit_rate(self) -> float:
        with self._lock:
            return self.cached_prompt_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def render(self, stats: EngineStats) -> str:
        lines: list[str] = []
        gauges = {
            "requests_running": ("requests the engine is running", stats.num_running),
            "requests_waiting": ("requests waiting for admission", stats.num_waiting),
            "kv_blocks_total": ("KV blocks in the pool", stats.kv_blocks_total),
            "kv_blocks_used": (
                "KV blocks held by requests (free and merely cached blocks excluded)",
                stats.kv_blocks_used,
            ),
            "prefix_cache_hit_rate": (
                "prompt tokens served from the prefix cache / prompt tokens",
                self.prefix_cache_hit_rate(),
            ),
            "generation_tokens_per_second": (
                f"tokens generated per second over the last {THROUGHPUT_WINDOW_S:g} s",
                self.tokens_per_second(),
            ),
            "engine_alive": ("1 while the engine thread runs", int(stats.alive)),
        }
        for name, (help_text, value) in gauges.items():
            if value is not None:
                lines += _single(f"{PREFIX}_{name}", "gauge", help_text, value)
        with self._lock:
            lines += _single(f"{PREFIX}_generation_tokens_total", "counter", "tokens generated", self.generation_tokens)
            lines += _single(f"{PREFIX}_prompt_tokens_total", "counter", "prompt tokens admitted", self.prompt_tokens)
            lines += _single(
                f"{PREFIX}_prompt_tokens_cached_total",
                "counter",
                "prompt tokens served from the prefix cache",
                self.cached_prompt_tokens,
            )
            lines += _single(
                f"{PREFIX}_requests_aborted_total", "counter", "requests aborted (client gone)", self.aborted
            )
            lines += _single(
                f"{PREFIX}_requests_rejected_total", "counter", "requests refused with an error", self.rejected
            )
            name = f"{PREFIX}_requests_finished_total"
            lines += [f"# HELP {name} requests finished, by finish reason", f"# TYPE {name} counter"]
            lines += [f'{name}{{finish_reason="{reason}"}} {count}' for reason, count in sorted(self.finished.items())]
            lines += self.time_to_first_token.render(
                f"{PREFIX}_time_to_first_token_seconds", "from request arrival to its first token reaching the handler"
            )
            lines += self.time_per_output_token.render(
                f"{PREFIX}_time_per_output_token_seconds",
                "mean time between output tokens after the first, per request",
            )
        return "\n".join(lines) + "\n"

    def _trim(self, now: float) -> None:
        while self._recent_tokens and self._recent_tokens[0][0] < now - THROUGHPUT_WINDOW_S:
            self._recent_tokens.popleft()


def _single(name: str, kind: str, help_text: str, value: float) -> list[str]:
    return [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", f"{name} {_number(value)}"]


def _number(value: float) -> str:
    if isinstance(value, int):
        return str(value)
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))
