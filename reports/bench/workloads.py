"""The standard benchmark workloads of ../shared/benchmarks.md, exactly as written there.

A workload is one or more phases; a phase is a set of requests submitted together and run to
completion (decode-sweep has a phase per batch size, prefix-shared one with prefix caching on
and one with it off). `scale` < 1 shrinks every count and length, for tests of the harness on
the CPU; such a workload is not the standard one and every record says so.

Prompts are drawn from `random.Random(0)`, which yields the same numbers as `random.seed(0)`
followed by the module-level functions that benchmarks.md writes, without touching global state.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from spec.errors import ConfigError

GENERATE = "generate"  # transformers' model.generate
CONTINUOUS_BATCHING = "continuous_batching"  # transformers' continuous batching manager

# A short request run before each measured phase (excluded from every figure). Its ids lie
# above the workloads' (0 to 10000), so its blocks never serve a workload prompt from the cache.
WARMUP_PROMPT = tuple(range(10_001, 10_017))
WARMUP_MAX_TOKENS = 8


def warmup_prompt(vocab_size: int) -> tuple[int, ...]:
    """WARMUP_PROMPT, or for a vocabulary too small to hold it (the shipped model's 4,096) its last 16 ids."""
    if vocab_size > WARMUP_PROMPT[-1]:
        return WARMUP_PROMPT
    return tuple(range(vocab_size - len(WARMUP_PROMPT), vocab_size))


@dataclass(frozen=True)
class BenchRequest:
    prompt_token_ids: tuple[int, ...]
    max_tokens: int


@dataclass(frozen=True)
class Phase:
    """Requests submitted together, all with ignore_eos and the same temperature (0: greedy)."""

    label: str
    requests: tuple[BenchRequest, ...]
    temperature: float
    hf_method: str  # GENERATE or CONTINUOUS_BATCHING
    prefix_caching: bool | None = None  # None: the engine setting as given; else forced for this phase
    run_on_hf: bool = True  # False where transformers has nothing to compare (prefix caching off)

    @property
    def num_prompt_tokens(self) -> int:
        return sum(len(request.prompt_token_ids) for request in self.requests)

    @property
    def num_output_tokens(self) -> int:
        return sum(request.max_tokens for request in self.requests)

    def record(self) -> dict[str, object]:
        return {
            "label": self.label,
            "num_requests": len(self.requests),
            "num_prompt_tokens": self.num_prompt_tokens,
            "num_output_tokens": self.num_output_tokens,
            "temperature": self.temperature,
            "ignore_eos": True,
            "prefix_caching": self.prefix_caching,
            "transformers_method": self.hf_method if self.run_on_hf else None,
        }


@dataclass(frozen=True)
class Workload:
    name: str
    definition: str  # as benchmarks.md states it
    metric: str  # what the record's headline figures are
    phases: tuple[Phase, ...]
    scale: float
    # True where the headline figure is a latency: each phase then runs several times on one
    # engine and the median is kept. Throughput workloads run once (a second run would find
    # its prompts in the prefix cache).
    latency: bool

    @property
    def standard(self) -> bool:
        return self.scale == 1.0

    def record(self) -> dict[str, object]:
        return {
            "name": self.name,
            "definition": self.definition,
            "metric": self.metric,
            "standard_workload": self.standard,
            "scale": self.scale,
            "scale_note": None
            if self.standard
            else f"NOT the standard workload: counts and lengths scaled by {self.scale} (harness test)",
            "phases": [phase.record() for phase in self.phases],
        }


def scaled(count: int, scale: float, minimum: int = 1) -> int:
    return max(minimum, round(count * scale))


def random_ids(rng: random.Random, length: int) -> tuple[int, ...]:
    """`length` ids in [0, 10000)."""
    return tuple(rng.randrange(10000) for _ in range(length))


def offline_256(scale: float) -> Workload:
    rng = random.Random(0)
    prompts = [[rng.randint(0, 10000) for _ in range(rng.randint(100, 1024))] for _ in range(256)]
    max_tokens = [rng.randint(100, 1024) for _ in range(256)]
    count = scaled(256, scale)
    requests = tuple(
        BenchRequest(tuple(prompt[: scaled(len(prompt), scale)]), scaled(tokens, scale))
        for prompt, tokens in zip(prompts[:count], max_tokens[:count], strict=True)
    )
    return Workload(
        name="offline-256",
        definition="random.seed(0); prompts = [[random.randint(0, 10000) for _ in range(random.randint(100, 1024))] "
        "for _ in range(256)]; max_tokens = [random.randint(100, 1024) for _ in range(256)]; ignore_eos, "
        "temperature 0.6 (nano-vllm's bench.py)",
        metric="output tokens / wall seconds from submitting all requests to the last completion "
        "(engine start-up and one short warm-up request excluded)",
        phases=(Phase("offline", requests, temperature=0.6, hf_method=CONTINUOUS_BATCHING),),
        scale=scale,
        latency=False,
    )


def decode_bs1(scale: float) -> Workload:
    rng = random.Random(0)
    request = BenchRequest(random_ids(rng, scaled(128, scale)), scaled(256, scale, minimum=2))
    return Workload(
        name="decode-bs1",
        definition="one request, prompt of 128 ids (random.seed(0), ids in [0, 10000)), 256 output tokens, "
        "greedy, ignore_eos",
        metric="time per output token after the first (TPOT), and its inverse; median of the runs",
        phases=(Phase("batch-1", (request,), temperature=0.0, hf_method=GENERATE),),
        scale=scale,
        latency=True,
    )


def decode_sweep(scale: float) -> Workload:
    phases = []
    for batch_size in sorted({scaled(size, scale) for size in (1, 8, 32, 128, 256)}):
        rng = random.Random(0)  # each batch's prompts are the first of one sequence
        requests = tuple(
            BenchRequest(random_ids(rng, scaled(1024, scale)), scaled(128, scale, minimum=2)) for _ in range(batch_size)
        )
        phases.append(Phase(f"batch-{batch_size}", requests, temperature=0.0, hf_method=GENERATE))
    return Workload(
        name="decode-sweep",
        definition="batch sizes 1, 8, 32, 128, 256; each request a 1024-token prompt (random.seed(0), ids in "
        "[0, 10000), distinct per request) and 128 output tokens, greedy, ignore_eos",
        metric="TPOT at each batch size (median of the runs) and output tokens/s",
        phases=tuple(phases),
        scale=scale,
        latency=True,
    )


def prefix_shared(scale: float) -> Workload:
    rng = random.Random(0)
    prefix = random_ids(rng, scaled(2048, scale))
    suffix_length, output_tokens = scaled(128, scale), scaled(128, scale, minimum=2)
    requests = tuple(
        BenchRequest(prefix + random_ids(rng, suffix_length), output_tokens)
        for _ in range(scaled(64, scale, minimum=2))
    )
    return Workload(
        name="prefix-shared",
        definition="64 requests sharing one 2048-token prefix (random.seed(0), ids in [0, 10000)), each with its "
        "own 128-token suffix, 128 output tokens, greedy, ignore_eos; run with prefix caching on and off",
        metric="throughput, prompt tokens computed vs served from cache, and whether outputs are identical "
        "between the two runs",
        phases=(
            Phase("prefix-caching-on", requests, 0.0, CONTINUOUS_BATCHING, prefix_caching=True),
            Phase("prefix-caching-off", requests, 0.0, CONTINUOUS_BATCHING, prefix_caching=False, run_on_hf=False),
        ),
        scale=scale,
        latency=False,
    )


def long_context(scale: float) -> Workload:
    rng = random.Random(0)
    requests = tuple(
        BenchRequest(random_ids(rng, scaled(16384, scale)), scaled(256, scale, minimum=2))
        for _ in range(scaled(8, scale))
    )
    return Workload(
        name="long-context",
        definition="8 requests with 16,384-token prompts (random.seed(0), ids in [0, 10000)), 256 output tokens; "
        "greedy and ignore_eos (benchmarks.md does not say; chosen so every run generates the same tokens)",
        metric="prefill tokens/s (prompt tokens / time from submission to the last first token) and TPOT "
        "(median of the runs)",
        phases=(Phase("long-context", requests, temperature=0.0, hf_method=CONTINUOUS_BATCHING),),
        scale=scale,
        latency=True,
    )


# The file decode-bs1-edit's prompt holds, then begins again and cuts off after EDIT_CUT characters (mid-line,
# where an editor's cursor might be): a model that continues the file repeats what it has read.
EDIT_SOURCE = Path(__file__).resolve().parent / "data" / "edit_source.py.txt"
EDIT_CUT = 400


def edit_prompt_ids() -> tuple[int, ...]:
    """decode-bs1-edit's prompt: EDIT_SOURCE, a newline and its first EDIT_CUT characters again, in the shipped
    model's tokens (twinfer.default_model; the ids are the workload whatever model runs it)."""
    from twinfer.default_model import default_model
    from twinfer.llm import load_tokenizer

    source = EDIT_SOURCE.read_text()
    text = source + "\n" + source[:EDIT_CUT]
    return tuple(load_tokenizer(default_model()).encode(text, add_special_tokens=False))


def decode_bs1_edit(scale: float) -> Workload:
    ids = edit_prompt_ids()
    request = BenchRequest(ids[-scaled(len(ids), scale) :], scaled(256, scale, minimum=2))
    return Workload(
        name="decode-bs1-edit",
        definition="not in benchmarks.md (speculative decoding's workload): one request whose output can repeat "
        "its prompt: the shipped model's tokens of reports/bench/data/edit_source.py.txt (a 63-line Python "
        "module), a newline and the module's first 400 characters again (707 ids); 256 output tokens, greedy, "
        "ignore_eos",
        metric="time per output token after the first (TPOT), and its inverse; median of the runs",
        phases=(Phase("batch-1", (request,), temperature=0.0, hf_method=GENERATE),),
        scale=scale,
        latency=True,
    )


WORKLOADS: Mapping[str, Callable[[float], Workload]] = MappingProxyType(
    {
        "offline-256": offline_256,
        "decode-bs1": decode_bs1,
        "decode-bs1-edit": decode_bs1_edit,
        "decode-sweep": decode_sweep,
        "prefix-shared": prefix_shared,
        "long-context": long_context,
    }
)


def build_workload(name: str, scale: float = 1.0) -> Workload:
    if name not in WORKLOADS:
        raise ConfigError(f"unknown workload {name!r}; available: {', '.join(WORKLOADS)}")
    if not 0 < scale <= 1:
        raise ConfigError(f"--scale must be in (0, 1], got {scale}")
    return WORKLOADS[name](scale)
