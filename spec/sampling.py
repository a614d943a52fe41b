"""Sampling semantics, defined once so both engines choose exactly the same tokens.

Given fp32 logits for one request's next token:

* unsampleable: a row whose logits hold a NaN or +inf, or no finite value at all (every value -inf),
  yields no token, whatever its parameters (greedy or not, any filters): the request ends there with
  FinishReason.ERROR (spec.request, the lifecycle). -inf alone is legitimate masking: a row with at
  least one finite value and the rest -inf samples as below. The check reads the raw logits, before
  the steps below (`unsampleable_rows`); `sample_tokens` returns the row's cause as a negative code
  (UNSAMPLEABLE_NAN, UNSAMPLEABLE_POSITIVE_INF, UNSAMPLEABLE_NO_FINITE, by that precedence: a NaN
  wins over +inf) where a token id would be. Every other row of the batch is sampled exactly as if
  the row were not there (each step below works row by row).
* temperature == 0 (greedy): the argmax, ties broken towards the lowest token id.
* otherwise, in this order:
  1. scale: s = logits / temperature (fp32);
  2. top-k: keep tokens whose s is >= the k-th largest s (ties at the boundary are kept);
  3. top-p: p = softmax(s over kept tokens); sort kept tokens by p descending, ties by lower
     token id first; keep a token if the mass of the tokens ranked before it is < top_p
     (so the most likely token is always kept); top_p == 1 keeps every token;
  4. min-p: keep a token if exp(s - max s) >= min_p; min_p == 0 keeps every token (the filter switched
     off: where s overflows to +inf, from finite logits over a small temperature, exp(inf - inf) is NaN);
  5. Gumbel-max: choose argmax over kept tokens of s + g, ties to the lowest id, where
     g = -log(-log(u)) and u in (0, 1) comes from a counter-based hash of
     (seed, output position, token id) -- see `gumbel_noise`.

temperature, top_p and min_p take part as fp32 numbers (a min_p of 1e-50 is 0, a top_p of
1 - 1e-10 is 1). The set of tokens steps 2-4 keep is `kept_mask`; for a greedy row it is the argmax alone.

Because the noise depends only on (seed, position, token id), a seeded request samples the
same tokens whatever batch it runs in and on either engine (up to floating-point near-ties).
Log-probabilities reported to the user are log_softmax of the raw fp32 logits, independent of
temperature and filtering. An unsampleable row reports none (it yields no token). A prompt position
(SamplingParams.prompt_logprobs) is scored whatever its logits: where they are unsampleable,
log_softmax is NaN throughout, and its entry holds those NaNs; the request goes on (no token is drawn
there, so nothing is lost but that position's scores).

The tensor functions below (`SamplingTensors`, `scale_logits`, the masks, `gumbel_max`) are pure
and batch-wide, so an engine that keeps its per-row parameters on the device (fast/sampler.py)
reuses them and stays bit-identical to `sample_tokens`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from spec.sampling_params import SamplingParams

# -- the noise hash -------------------------------------------------------------------------
# Noise for (seed, position, token) is built from MurmurHash3's 32-bit finaliser fmix32:
#   row_key = fmix32(seed_low ^ fmix32(seed_high ^ SEED_SALT))
#   row_key = fmix32(row_key ^ (position mod 2**32))
#   hashed  = fmix32(row_key ^ token_id)
#   u       = ((hashed >> (32 - UNIFORM_BITS)) + 0.5) / 2**UNIFORM_BITS
#   g       = -log(-log(u))
# where seed_low / seed_high are the low and high 32 bits of the seed and
# fmix32(h) = h ^= h >> 16; h *= FMIX32_MULTIPLIER_1; h ^= h >> 13; h *= FMIX32_MULTIPLIER_2; h ^= h >> 16
# (multiplications mod 2**32). Anyone can recompute the noise from these constants alone.

HASH_MASK = 0xFFFFFFFF  # the hash works on 32-bit words
SEED_SALT = 0x9E3779B9  # mixed into the seed's high word so seeds 0 and 2**32 differ
FMIX32_MULTIPLIER_1 = 0x85EBCA6B
FMIX32_MULTIPLIER_2 = 0xC2B2AE35
# 23 bits, not 24: (k + 0.5) needs UNIFORM_BITS + 1 significant bits, and fp32 has 24, so u is
# exact and strictly inside (0, 1). With 24 bits the largest k rounded u to 1.0 and its noise to +inf.
UNIFORM_BITS = 23

# -- unsampleable rows ----------------------------------------------------------------------
# What `sample_tokens` returns for an unsampleable row instead of a token id, by cause: negative, so
# never a vocabulary id (no stop id matches one), and distinct from spec.request.PENDING_TOKEN (-1).
UNSAMPLEABLE_NAN = -2  # the row holds a NaN
UNSAMPLEABLE_POSITIVE_INF = -3  # the row holds +inf (and no NaN)
UNSAMPLEABLE_NO_FINITE = -4  # every value is -inf
UNSAMPLEABLE_CAUSES = {UNSAMPLEABLE_NAN: "NaN", UNSAMPLEABLE_POSITIVE_INF: "+inf", UNSAMPLEABLE_NO_FINITE: "all -inf"}


@dataclass(frozen=True)
class SamplingRow:
    """What sampling needs to know about one row of a logits batch."""

    params: SamplingParams
    seed: int  # the request's resolved seed (drawn when the request was added if params.seed is None)
    output_position: int  # index of the token being sampled within the request's output


@dataclass(frozen=True)
class SamplingTensors:
    """The per-row parameters of a batch as tensors [B] on the logits' device.

    Greedy rows carry temperature 1 only to keep the arithmetic finite; their tokens are the argmax.
    Disabled filters carry their neutral value: top_k = vocab_size, top_p = 1, min_p = 0.
    """

    temperature: torch.Tensor  # fp32
    top_k: torch.Tensor  # int64, in [1, vocab_size]
    top_p: torch.Tensor  # fp32
    min_p: torch.Tensor  # fp32
    seeds: torch.Tensor  # int64
    positions: torch.Tensor  # int64
    is_greedy: torch.Tensor  # bool

    @classmethod
    def from_rows(cls, rows: list[SamplingRow], vocab_size: int, device: torch.device | str) -> SamplingTensors:
        def column(values: list, dtype: torch.dtype) -> torch.Tensor:
            return torch.tensor(values, dtype=dtype, device=device)

        return cls(
            temperature=column([row_temperature(row.params) for row in rows], torch.float32),
            top_k=column([row_top_k(row.params, vocab_size) for row in rows], torch.int64),
            top_p=column([row.params.top_p for row in rows], torch.float32),
            min_p=column([row.params.min_p for row in rows], torch.float32),
            seeds=column([row.seed for row in rows], torch.int64),
            positions=column([row.output_position for row in rows], torch.int64),
            is_greedy=column([row.params.is_greedy for row in rows], torch.bool),
        )


def row_temperature(params: SamplingParams) -> float:
    """The divisor of a row's logits: its temperature, or 1 for a greedy row (whose result is the argmax)."""
    return 1.0 if params.is_greedy else params.temperature


def row_top_k(params: SamplingParams, vocab_size: int) -> int:
    """A row's top-k as a count in [1, vocab_size]; vocab_size when top-k is off."""
    return min(params.top_k, vocab_size) if params.top_k_enabled else vocab_size


# -- the hash and the noise -----------------------------------------------------------------


def _mul32(x: torch.Tensor, constant: int) -> torch.Tensor:
    """(x * constant) mod 2**32 for 0 <= x < 2**32 without int64 overflow.

    Splitting the constant into 16-bit halves keeps every product below 2**48.
    """
    high, low = constant >> 16, constant & 0xFFFF
    return ((((x * high) & 0xFFFF) << 16) + x * low) & HASH_MASK


def _fmix32(h: torch.Tensor) -> torch.Tensor:
    """MurmurHash3's 32-bit finaliser on int64 tensors holding values in [0, 2**32)."""
    h = h ^ (h >> 16)
    h = _mul32(h, FMIX32_MULTIPLIER_1)
    h = h ^ (h >> 13)
    h = _mul32(h, FMIX32_MULTIPLIER_2)
    return h ^ (h >> 16)


def hash_uniform(hashed: torch.Tensor) -> torch.Tensor:
    """fp32 u in (0, 1) from int64 hash values in [0, 2**32): the top UNIFORM_BITS bits, centred."""
    top_bits = (hashed >> (32 - UNIFORM_BITS)).to(torch.float32)  # exact: < 2**23
    return (top_bits + 0.5) * (1.0 / 2**UNIFORM_BITS)  # exact: 24 significant bits, a power-of-two scale


def row_keys(seeds: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """int64 [B] in [0, 2**32): the hash of (seed, output position) that each token id is mixed into."""
    seeds = seeds.to(torch.int64)
    seed_low = seeds & HASH_MASK
    seed_high = (seeds >> 32) & HASH_MASK
    row_key = _fmix32(seed_low ^ _fmix32(seed_high ^ SEED_SALT))
    return _fmix32(row_key ^ (positions.to(torch.int64) & HASH_MASK))


def gumbel_noise(seeds: torch.Tensor, positions: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Gumbel(0, 1) noise fp32 [B, V] from the hash of (seed, output position, token id); seeds, positions int64 [B]."""
    row_key = row_keys(seeds, positions)  # [B]
    token_ids = torch.arange(vocab_size, device=row_key.device, dtype=torch.int64)  # [V]
    uniform = hash_uniform(_fmix32(row_key[:, None] ^ token_ids[None, :]))  # [B, V]
    return -torch.log(-torch.log(uniform))


# -- the steps, batch-wide ------------------------------------------------------------------


def row_max(logits: torch.Tensor) -> torch.Tensor:
    """fp32 [B]: each row's largest logit; NaN where the row holds a NaN (torch's max propagates it)."""
    return torch.amax(logits.to(torch.float32), dim=-1)


def unsampleable_rows(logits: torch.Tensor) -> torch.Tensor:
    """bool [B]: the rows that yield no token. A row's max is NaN if it holds a NaN, +inf if it holds
    +inf, -inf if every value is -inf, and finite exactly when the row is sampleable."""
    return ~torch.isfinite(row_max(logits))


def with_unsampleable_codes(tokens: torch.Tensor, maxima: torch.Tensor) -> torch.Tensor:
    """int64 [B]: tokens, with each unsampleable row's code (its cause, from the row's max `maxima`) in
    place of its token. Elementwise over [B]: no pass over the vocabulary."""
    codes = maxima.nan_to_num(UNSAMPLEABLE_NAN, UNSAMPLEABLE_POSITIVE_INF, UNSAMPLEABLE_NO_FINITE).to(torch.int64)
    return torch.where(torch.isfinite(maxima), tokens, codes)


def is_unsampleable_code(token: int) -> bool:
    return token in UNSAMPLEABLE_CAUSES


def greedy_tokens(logits: torch.Tensor) -> torch.Tensor:
    """argmax per row; torch returns the first maximum, i.e. the lowest token id."""
    return torch.argmax(logits, dim=-1)


def scale_logits(logits: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    return logits.to(torch.float32) / temperature[:, None]


def top_k_mask(scaled: torch.Tensor, top_k: torch.Tensor) -> torch.Tensor:
    """Tokens whose scaled logit is >= the row's k-th largest (top_k int64 [B] in [1, V])."""
    sorted_values = torch.sort(scaled, dim=-1, descending=True).values
    kth_value = sorted_values.gather(1, (top_k - 1)[:, None])  # [B, 1]
    return scaled >= kth_value


def top_p_mask(scaled: torch.Tensor, keep: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Among the tokens in `keep`, the head of the distribution whose mass before each token is < top_p."""
    probs = torch.softmax(torch.where(keep, scaled, float("-inf")), dim=-1)
    # stable descending sort: equal probabilities keep index order, i.e. lower token id first
    sorted_probs, order = torch.sort(probs, dim=-1, descending=True, stable=True)
    mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
    # top_p == 1 is the filter switched off: the rounded fp32 mass may reach 1 before the tail.
    keep_sorted = (mass_before < top_p[:, None]) | (top_p[:, None] >= 1.0)
    return torch.zeros_like(keep).scatter(1, order, keep_sorted)


def min_p_mask(scaled: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Tokens at least min_p times as likely as the most likely one; every token where min_p is 0."""
    max_scaled = scaled.max(dim=-1, keepdim=True).values
    # min_p == 0 is the filter switched off: a token whose s is +inf has exp(inf - inf) = NaN, never >= 0.
    return (torch.exp(scaled - max_scaled) >= min_p[:, None]) | (min_p[:, None] <= 0.0)


def filter_mask(scaled: torch.Tensor, tensors: SamplingTensors) -> torch.Tensor:
    """Steps 2-4: the tokens top-k, then top-p, then min-p keep."""
    keep = top_k_mask(scaled, tensors.top_k)
    keep &= top_p_mask(scaled, keep, tensors.top_p)
    keep &= min_p_mask(scaled, tensors.min_p)
    return keep


def gumbel_max(scaled: torch.Tensor, keep: torch.Tensor, seeds: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Step 5: argmax over kept tokens of scaled + the hash's Gumbel noise (ties to the lowest id)."""
    noise = gumbel_noise(seeds, positions, scaled.shape[1])
    return torch.argmax(torch.where(keep, scaled + noise, float("-inf")), dim=-1)


def greedy_one_hot(logits: torch.Tensor) -> torch.Tensor:
    """bool [B, V]: True at each row's argmax only."""
    one_hot = torch.zeros(logits.shape, dtype=torch.bool, device=logits.device)
    return one_hot.scatter(1, greedy_tokens(logits)[:, None], True)


# -- the entry points -----------------------------------------------------------------------


def _check_batch(logits: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
    if logits.dim() != 2 or logits.shape[0] != len(rows):
        raise ValueError(f"logits must be [len(rows)={len(rows)}, vocab], got {tuple(logits.shape)}")
    return logits.to(torch.float32)


def kept_mask(logits: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
    """bool [B, V]: the tokens a row may sample, i.e. what top-k, top-p and min-p keep.

    For a greedy row it is the argmax alone (the only token it can produce).
    """
    logits = _check_batch(logits, rows)
    tensors = SamplingTensors.from_rows(rows, logits.shape[1], logits.device)
    keep = filter_mask(scale_logits(logits, tensors.temperature), tensors)
    return torch.where(tensors.is_greedy[:, None], greedy_one_hot(logits), keep)


def sample_tokens(logits: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
    """Choose one token per row of fp32 logits [B, V] by the rules in this module's docstring: int64 [B],
    an unsampleable row's UNSAMPLEABLE_* code where its token would be."""
    logits = _check_batch(logits, rows)
    maxima = row_max(logits)
    argmax = greedy_tokens(logits)
    if all(row.params.is_greedy for row in rows):
        return with_unsampleable_codes(argmax, maxima)
    tensors = SamplingTensors.from_rows(rows, logits.shape[1], logits.device)
    scaled = scale_logits(logits, tensors.temperature)
    sampled = gumbel_max(scaled, filter_mask(scaled, tensors), tensors.seeds, tensors.positions)
    return with_unsampleable_codes(torch.where(tensors.is_greedy, argmax, sampled), maxima)


def top_logprobs(
    logits: torch.Tensor, chosen: torch.Tensor, count: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """log_softmax of fp32 logits [B, V]: (chosen token's logprob [B], top ids [B, count], top logprobs [B, count])."""
    logprobs = torch.log_softmax(logits.to(torch.float32), dim=-1)
    # An unsampleable row's code reads token 0's logprob: a valid index, for a value nobody reports.
    chosen_logprob = logprobs.gather(1, chosen[:, None].to(torch.int64).clamp(min=0))[:, 0]
    if count <= 0:
        empty = logprobs.new_empty((logprobs.shape[0], 0))
        return chosen_logprob, empty.to(torch.int64), empty
    top = torch.topk(logprobs, k=count, dim=-1)
    return chosen_logprob, top.indices, top.values
