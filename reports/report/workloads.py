"""What the correctness matrix runs: the prompt sets (sized for the device and mode), the engine
pairs, and the features each cell forces through EngineConfig.

An OpenAI endpoint (`openai:URL`) is compared with transformers and the reference engine
(`endpoint_pairs`) under the one feature `AS_SERVED`: its server's settings cannot be changed from
here, so no EngineConfig feature applies to it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

from spec.engine_config import EngineConfig

PAIRS = (("reference", "hf"), ("fast", "hf"), ("fast", "reference"))
ENDPOINT_BASELINES = ("hf", "reference")
MODES = ("free-running", "teacher-forced")
TOP_K = 5

# Text prompts, user-visible in the page; one holds HTML metacharacters on purpose.
TEXT_PROMPTS = (
    "The quick brown fox",
    "Once upon a time there was a small model with random weights.",
    'Escaping check: <b>bold</b> & "quotes" stay text.',
    "A verified inference engine computes the same tokens as its reference, token by token. "
    "Attention reads keys and values from a paged cache; blocks that hold a shared prefix are reused.",
    "Hello world!",
)


@dataclass(frozen=True)
class Workload:
    """A prompt set: `num_text_prompts` of TEXT_PROMPTS (when the model has a tokenizer) and token-id
    prompts of the given lengths (ids drawn with a fixed seed), each run for `max_new_tokens`."""

    name: str
    num_text_prompts: int
    token_prompt_lengths: tuple[int, ...]
    max_new_tokens: int


def choose_workload(device_type: str, quick: bool, involves_fast: bool) -> Workload:
    """Sized so that a CPU run finishes in minutes: the fast engine on the CPU goes through Triton's
    interpreter (about a second per decode step of the tiny model), so its cells stay tiny."""
    if device_type == "cuda":
        if quick:
            return Workload("cuda-quick", 2, (1, 16, 17, 64, 64, 64, 128, 128), 32)
        return Workload("cuda-full", 4, (1, 16, 17) + (128,) * 32, 128)
    if involves_fast:
        return Workload("cpu-fast-quick" if quick else "cpu-fast", 1, (17,) if quick else (1, 17), 4 if quick else 8)
    if quick:
        return Workload("cpu-quick", 2, (17, 33), 8)
    return Workload("cpu-full", 4, (1, 16, 17, 40), 24)


def endpoint_pairs(endpoint: str) -> tuple[tuple[str, str], ...]:
    """The pairs an `openai:URL` endpoint joins the matrix with: it is the candidate of each."""
    return tuple((endpoint, baseline) for baseline in ENDPOINT_BASELINES)


def token_prompts(workload: Workload, vocab_size: int) -> list[list[int]]:
    """Deterministic token-id prompts; consecutive prompts of equal length share their first half,
    so prefix hits also happen between different prompts."""
    generator = random.Random(0)
    prompts: list[list[int]] = []
    for length in workload.token_prompt_lengths:
        ids = [generator.randrange(vocab_size) for _ in range(length)]
        if prompts and len(prompts[-1]) == length and length > 1:
            ids[: length // 2] = prompts[-1][: length // 2]
        prompts.append(ids)
    return prompts


@dataclass(frozen=True)
class Feature:
    """An engine behaviour a cell forces. `engines` are the twins it changes (a pair where neither
    engine is changed has no cell for it); `warm_passes` runs the prompts that many times first, so
    the compared pass is served from the prefix cache. A feature `for_endpoints` belongs to pairs
    with an endpoint, which have no other."""

    name: str
    description: str
    engines: frozenset[str] = frozenset({"reference", "fast"})
    cuda_only: bool = False
    warm_passes: int = 0
    for_endpoints: bool = False


FEATURES = (
    Feature(
        "prefix-cache-on",
        "prefix caching on; the prompts run twice and the second pass (served from the cache) is compared",
        warm_passes=1,
    ),
    Feature("prefix-cache-off", "prefix caching off"),
    Feature("chunked-prefill", "a token budget smaller than the longest prompt, so prompts are prefilled in chunks"),
    Feature("preemption", "a KV pool too small for the whole batch, so requests are preempted and recomputed"),
    Feature("cuda-graphs-on", "decode steps replayed from CUDA graphs", frozenset({"fast"}), cuda_only=True),
    Feature("cuda-graphs-off", "every step run eagerly", frozenset({"fast"}), cuda_only=True),
)
# Not in FEATURES: a report without endpoints has no such column.
AS_SERVED = Feature(
    "as-served",
    "the endpoint as its server is configured; the local baseline runs with default settings",
    frozenset(),
    for_endpoints=True,
)
FEATURES_BY_NAME = {feature.name: feature for feature in (*FEATURES, AS_SERVED)}


@dataclass(frozen=True)
class ForcedConfig:
    config: EngineConfig
    evidence: str  # how the configuration forces the feature, shown in the page


def feature_config(feature: Feature, prompts: list[list[int]], max_new_tokens: int, base: EngineConfig) -> ForcedConfig:
    """The EngineConfig that forces `feature` for these prompts, and a sentence saying how."""
    longest = max(len(p) for p in prompts)
    if feature.name == "prefix-cache-on":
        return ForcedConfig(replace(base, enable_prefix_caching=True), "prefix caching on")
    if feature.name == "prefix-cache-off":
        return ForcedConfig(replace(base, enable_prefix_caching=False), "prefix caching off")
    if feature.name == "chunked-prefill":
        budget = max(2, min(longest // 2, 64))
        return ForcedConfig(
            replace(base, max_num_batched_tokens=budget),
            f"token budget {budget} per step, longest prompt {longest} tokens",
        )
    if feature.name == "preemption":
        blocks = [base.blocks_for_tokens(len(p) + max_new_tokens - 1) for p in prompts]
        pool = max(blocks) + 1
        return ForcedConfig(
            replace(base, num_blocks=pool),
            f"KV pool of {pool} blocks; the batch needs {sum(blocks)} blocks at full length",
        )
    if feature.name in ("cuda-graphs-on", "cuda-graphs-off"):
        return ForcedConfig(replace(base, enable_cuda_graphs=feature.name == "cuda-graphs-on"), feature.description)
    raise ValueError(f"unknown feature {feature.name!r}")
