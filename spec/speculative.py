"""Speculative decoding: the rule both engines obey, written so that speculation cannot change a bit.

A decoding request's step normally computes its one uncomputed token (the newest output) and
samples the next. With speculation a proposer first guesses up to K tokens that follow (the
draft); the step then computes the newest token and the draft together, as one chunk of the
request (a verify chunk), and reads logits at all 1 + len(draft) positions. Position j's token is
drawn by spec.sampling's rule exactly as a plain step would draw it there: the same logits (the
position's own), the same parameters and the noise of output position len(outputs) + j. So:

* the model's token at position j is the token a plain run samples at that output position,
  provided the tokens before it are the plain run's: true while every earlier draft token agreed;
* `accepted_tokens` keeps the model's tokens up to and including the first one that differs from
  the draft (all 1 + len(draft) of them when every draft token agrees), cut after a stop token.

Every kept token is therefore the plain run's token, whatever the draft was: a bad draft costs
time, never a changed output. Bit for bit this needs a position's logits to be the same whether
its token was computed alone or in a chunk, which batch-invariant mode guarantees on the fast
engine; elsewhere the logits agree to rounding (exact tokens in fp32 up to near-ties, the near-tie
rule in bf16), as for chunked prefill.

The K/V of the draft positions was written to the request's blocks during the verify chunk; only
the positions whose tokens were kept count as computed, blocks past them are freed (roll back),
and the prefix cache only ever registers blocks of kept tokens (spec.scheduling has the policy).

When to propose is the scheduler's choice (spec.scheduling step 2b): since no draft can change an
output, any rule of when to ask for one keeps outputs identical. The rule (`AcceptanceGate`) turns
speculation off where it does not pay: per request, by the acceptance of its recent verify chunks
(paused with exponential back-off, then probed again), and per step, in a large batch, where a verify
chunk's extra tokens cost real compute (only requests with a proven high acceptance propose there).

Proposers (`DraftProposer`): "ngram" (prompt lookup, `propose_ngram`: the request's own tokens,
no second model) and "draft-model" (a smaller checkpoint that shares the tokenizer, run greedily
by an engine of the same kind; each engine builds it).
"""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from spec.errors import ConfigError
from spec.sampling_params import SamplingParams

NGRAM = "ngram"
DRAFT_MODEL = "draft-model"
METHODS = (NGRAM, DRAFT_MODEL)


@dataclass(frozen=True)
class SpeculativeConfig:
    """How drafts are proposed, validated at construction.

    method: "ngram" (prompt lookup over the request's own prompt and output) or "draft-model".
    num_speculative_tokens: K, the most draft tokens a verify chunk carries (>= 1).
    ngram_min, ngram_max: the n-gram lengths prompt lookup tries, longest first.
    draft_model: the draft checkpoint (a directory or hub id) for "draft-model"; it must share the
        target's vocabulary.

    When speculation is turned off (`AcceptanceGate`; none of these can change an output):
    acceptance_window: W, the newest verify chunks of a request whose acceptance decides (>= 1).
    min_acceptance_rate: a request whose last W verify chunks accepted fewer than this fraction of their
        draft tokens pauses (in [0, 1]; 0: never pauses).
    backoff_outputs: a pause lasts this many of the request's output tokens; each pause that follows a
        failed probe doubles it, up to max_backoff_outputs; a passing decision resets it (>= 1).
    large_batch_rows: a step with at least this many decoding chunks is large: only requests whose last W
        verify chunks accepted at least large_batch_acceptance_rate of their draft tokens propose in it
        (None: no step is large).
    """

    method: str
    num_speculative_tokens: int
    ngram_min: int = 1
    ngram_max: int = 3
    draft_model: str | None = None
    acceptance_window: int = 4
    min_acceptance_rate: float = 0.25
    backoff_outputs: int = 16
    max_backoff_outputs: int = 256
    large_batch_rows: int | None = 32
    large_batch_acceptance_rate: float = 0.5

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ConfigError(f"speculative method must be one of {', '.join(METHODS)}; got {self.method!r}")
        positive = ["num_speculative_tokens", "ngram_min", "ngram_max", "acceptance_window", "backoff_outputs"]
        positive += ["max_backoff_outputs"] + ([] if self.large_batch_rows is None else ["large_batch_rows"])
        for name in positive:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"speculative setting {name!r} must be a positive integer, got {value!r}")
        for name in ("min_acceptance_rate", "large_batch_acceptance_rate"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 <= value <= 1.0:
                raise ConfigError(f"speculative setting {name!r} must be a fraction in [0, 1], got {value!r}")
        if self.ngram_min > self.ngram_max:
            raise ConfigError(f"speculative ngram_min {self.ngram_min} exceeds ngram_max {self.ngram_max}")
        if self.backoff_outputs > self.max_backoff_outputs:
            raise ConfigError(
                f"speculative backoff_outputs {self.backoff_outputs} exceeds max_backoff_outputs "
                f"{self.max_backoff_outputs}"
            )
        if self.method == DRAFT_MODEL and not self.draft_model:
            raise ConfigError("speculative method 'draft-model' needs draft_model (a checkpoint sharing the tokenizer)")
        if self.method == NGRAM and self.draft_model is not None:
            raise ConfigError("draft_model is for speculative method 'draft-model', not 'ngram'")


class DraftProposer(Protocol):
    """Proposes drafts for a batch of decoding requests (one call per step)."""

    def propose(self, token_ids: Sequence[Sequence[int]], max_tokens: Sequence[int]) -> list[tuple[int, ...]]:
        """Per request: at most max_tokens[i] tokens guessed to follow token_ids[i] (prompt then outputs).

        A proposal must be prefix-consistent (asked for fewer tokens, it is the first of them), so a
        scheduler may cut it."""
        ...


@dataclass(frozen=True)
class NgramProposer:
    """Prompt lookup (`propose_ngram`) with the configured n-gram lengths."""

    min_n: int
    max_n: int

    def propose(self, token_ids: Sequence[Sequence[int]], max_tokens: Sequence[int]) -> list[tuple[int, ...]]:
        pairs = zip(token_ids, max_tokens, strict=True)
        return [propose_ngram(tokens, limit, self.min_n, self.max_n) for tokens, limit in pairs]


_WORD = array("q").itemsize  # token ids packed as int64 words so bytes.find searches them in C


def propose_ngram(token_ids: Sequence[int], max_tokens: int, min_n: int, max_n: int) -> tuple[int, ...]:
    """Prompt lookup: for n from max_n down to min_n, the earliest earlier occurrence of the last n tokens;
    the (at most max_tokens) tokens that followed it. Empty when no n-gram recurs.

    The earliest occurrence, not the latest: in a repeating sequence it has the longest continuation."""
    count = len(token_ids)
    if max_tokens < 1 or count < 2:
        return ()
    packed = array("q", token_ids).tobytes()
    for n in range(min(max_n, count - 1), min_n - 1, -1):
        pattern = packed[(count - n) * _WORD :]
        # An occurrence starting before count - n: the suffix itself is not an earlier occurrence.
        limit = (count - 1) * _WORD
        start = packed.find(pattern, 0, limit)
        while start != -1 and start % _WORD:  # a match across word boundaries is not a token match
            start = packed.find(pattern, start + 1, limit)
        if start != -1:
            follow = start // _WORD + n
            return tuple(token_ids[follow : follow + max_tokens])
    return ()


def draft_limit(num_speculative_tokens: int, num_outputs: int, max_outputs: int) -> int:
    """The most draft tokens a decoding request with num_outputs of max_outputs outputs may carry: a
    verify chunk appends up to 1 + len(draft) tokens, which must not pass max_tokens or max_model_len."""
    return max(0, min(num_speculative_tokens, max_outputs - num_outputs - 1))


def accepted_tokens(
    draft: Sequence[int], sampled: Sequence[int], stop_token_ids: frozenset[int] | set[int] = frozenset()
) -> tuple[int, ...]:
    """The tokens a verify chunk appends. sampled[j] is the model's token at the chunk's position j
    (1 + len(draft) of them). Kept: sampled[0..a], where a is the number of leading draft tokens equal
    to the model's token at their position; cut after the first stop token (the request ends there)."""
    if len(sampled) != len(draft) + 1:
        raise ValueError(f"a verify chunk of {len(draft)} draft tokens samples {len(draft) + 1}, got {len(sampled)}")
    kept = 0
    while kept < len(draft) and draft[kept] == sampled[kept]:
        kept += 1
    tokens = tuple(sampled[: kept + 1])
    for index, token in enumerate(tokens):
        if token in stop_token_ids:
            return tokens[: index + 1]
    return tokens


def is_large_batch(config: SpeculativeConfig, num_decoding_chunks: int) -> bool:
    """Whether a step with this many decoding chunks (single-token sampling chunks) is large: there a verify
    chunk's extra tokens cost compute the step would not otherwise spend."""
    return config.large_batch_rows is not None and num_decoding_chunks >= config.large_batch_rows


@dataclass(slots=True)
class AcceptanceGate:
    """Whether a request asks for drafts (spec.scheduling step 2b), from its own recent verify chunks.

    Kept by the scheduler per request from the counts it applies anyway (draft length, tokens appended),
    from the request's addition to its finish (a preemption keeps it: the outputs stay). Deterministic:
    two schedulers that apply the same steps make the same choices.

    * window: (drafted, accepted) of the request's newest verify chunks since it last paused, at most W.
    * An empty proposal counts as a verify chunk of one drafted token and none accepted
      (`record_empty_proposal`).
    * After a verify chunk the request is judged when its window holds W chunks, or on the one chunk
      of a probe (the first verify after a pause): it fails when accepted < min_acceptance_rate * drafted
      over the window. Failing pauses it for `backoff` output tokens (resume_at), clears the window, makes
      its next verify a probe and doubles backoff (at most max_backoff_outputs); passing resets backoff.
    * It may propose when it has at least resume_at outputs and, in a large step, its window holds W
      chunks that accepted at least large_batch_acceptance_rate * drafted (so a request with no such
      record, a probe included, waits for a smaller step).
    """

    config: SpeculativeConfig
    window: deque[tuple[int, int]] = field(init=False)
    resume_at: int = 0
    backoff: int = field(init=False)
    probing: bool = False

    def __post_init__(self) -> None:
        self.window = deque(maxlen=self.config.acceptance_window)
        self.backoff = self.config.backoff_outputs

    def may_propose(self, num_outputs: int, large_batch: bool) -> bool:
        if num_outputs < self.resume_at:
            return False
        return not large_batch or self._window_rate_at_least(self.config.large_batch_acceptance_rate)

    def record(self, num_drafted: int, num_accepted: int, num_outputs: int) -> bool:
        """A verify chunk of num_drafted draft tokens accepted num_accepted; num_outputs: the request's output
        tokens after it. Whether the request paused."""
        self.window.append((num_drafted, num_accepted))
        if not (self.probing or len(self.window) == self.config.acceptance_window):
            return False
        drafted, accepted = _window_totals(self.window)
        self.probing = accepted < self.config.min_acceptance_rate * drafted
        if not self.probing:
            self.backoff = self.config.backoff_outputs
            return False
        self.resume_at = num_outputs + self.backoff
        self.backoff = min(2 * self.backoff, self.config.max_backoff_outputs)
        self.window.clear()
        return True

    def record_empty_proposal(self, num_outputs: int) -> bool:
        """The proposer had no draft for the request when it asked (num_outputs: its output tokens): recorded
        as a verify chunk of one drafted token and none accepted. Whether the request paused.

        Why: a request whose tokens never repeat (a prompt of random ids) would otherwise ask in every step
        and never pause, and a step in which anyone may ask is planned only once the previous step's tokens
        are read (no step ahead under async scheduling): on an H200 that cost offline-256's tail about 110
        steps planned after the fact (reports/results/bench/speculative_session6/)."""
        return self.record(1, 0, num_outputs)

    def state(self) -> tuple[int, int, bool, tuple[tuple[int, int], ...]]:
        """(resume_at, backoff, probing, window): all that decides its future choices."""
        return self.resume_at, self.backoff, self.probing, tuple(self.window)

    def _window_rate_at_least(self, rate: float) -> bool:
        if len(self.window) < self.config.acceptance_window:  # no full record: nothing proven
            return False
        drafted, accepted = _window_totals(self.window)
        return accepted >= rate * drafted


def _window_totals(window: deque[tuple[int, int]]) -> tuple[int, int]:
    return sum(drafted for drafted, _ in window), sum(accepted for _, accepted in window)


class GreedyGenerator(Protocol):
    """What a draft model's engine must do for `DraftModelProposer` (spec.engine.Engine has it)."""

    def generate(self, prompts: Sequence[Sequence[int]], params: Sequence[SamplingParams]) -> list: ...


@dataclass(frozen=True)
class DraftModelProposer:
    """The draft model's greedy continuation, from an engine of the target's kind over the draft checkpoint
    (with its own KV pool and prefix cache: each step's proposal recomputes only the request's new tokens).

    Greedy decoding is prefix-consistent: asked for fewer tokens, it proposes the first of them."""

    engine: GreedyGenerator

    def propose(self, token_ids: Sequence[Sequence[int]], max_tokens: Sequence[int]) -> list[tuple[int, ...]]:
        params = [SamplingParams(temperature=0.0, max_tokens=limit, ignore_eos=True) for limit in max_tokens]
        return [tuple(output.token_ids) for output in self.engine.generate([list(t) for t in token_ids], params)]


def check_draft_vocabulary(draft_vocab_size: int, target_vocab_size: int, draft_model: str) -> None:
    """A draft model must share the target's tokenizer: at least the same vocabulary size."""
    if draft_vocab_size != target_vocab_size:
        raise ConfigError(
            f"draft model {draft_model!r} has a vocabulary of {draft_vocab_size} tokens, the target "
            f"{target_vocab_size}: a draft model must share the target's tokenizer"
        )


def make_ngram_proposer(config: SpeculativeConfig) -> NgramProposer:
    if config.method != NGRAM:
        raise ConfigError(f"speculative method {config.method!r} needs a proposer built by the engine")
    return NgramProposer(config.ngram_min, config.ngram_max)
