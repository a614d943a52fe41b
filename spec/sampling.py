"""Sampling semantics, defined once so both engines choose exactly the same tokens.

Given fp32 logits for one request's next token:

* temperature == 0 (greedy): the argmax, ties broken towards the lowest token id.
* otherwise, in this order:
  1. scale: s = logits / temperature;
  2. top-k: keep tokens whose s is >= the k-th largest s (ties at the boundary are kept);
  3. top-p: p = softmax(s over kept tokens); sort kept tokens by p descending, ties by lower
     token id first; keep a token if the mass of the tokens ranked before it is < top_p
     (so the most likely token is always kept);
  4. min-p: keep a token if exp(s - max s) >= min_p;
  5. Gumbel-max: choose argmax over kept tokens of s + g, ties to the lowest id, where
     g = -log(-log(u)) and u in (0, 1) comes from a counter-based hash of
     (seed, output position, token id) -- see `gumbel_noise`.

Because the noise depends only on (seed, position, token id), a seeded request samples the
same tokens whatever batch it runs in and on either engine (up to floating-point near-ties).
Log-probabilities reported to the user are log_softmax of the raw fp32 logits, independent of
temperature and filtering.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from spec.sampling_params import SamplingParams

_MASK32 = 0xFFFFFFFF
_SEED_SALT = 0x9E3779B9


@dataclass(frozen=True)
class SamplingRow:
    """What sampling needs to know about one row of a logits batch."""

    params: SamplingParams
    seed: int  # the request's resolved seed (drawn when the request was added if params.seed is None)
    output_position: int  # index of the token being sampled within the request's output


def _mul32(x: torch.Tensor, constant: int) -> torch.Tensor:
    """(x * constant) mod 2**32 for 0 <= x < 2**32 without int64 overflow.

    Splitting the constant into 16-bit halves keeps every product below 2**48.
    """
    high, low = constant >> 16, constant & 0xFFFF
    return ((((x * high) & 0xFFFF) << 16) + x * low) & _MASK32


def _fmix32(h: torch.Tensor) -> torch.Tensor:
    """MurmurHash3's 32-bit finaliser on int64 tensors holding values in [0, 2**32)."""
    h = h ^ (h >> 16)
    h = _mul32(h, 0x85EBCA6B)
    h = h ^ (h >> 13)
    h = _mul32(h, 0xC2B2AE35)
    return h ^ (h >> 16)


def gumbel_noise(seeds: torch.Tensor, positions: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Gumbel(0, 1) noise [B, V] from a hash of (seed, output position, token id).

    seeds, positions: int64 [B]. u = (top 24 bits of the hash + 0.5) / 2**24 is exact in fp32
    and never 0 or 1, so the logs are finite.
    """
    seeds = seeds.to(torch.int64)
    seed_low = seeds & _MASK32
    seed_high = (seeds >> 32) & _MASK32
    row_key = _fmix32(seed_low ^ _fmix32(seed_high ^ _SEED_SALT))
    row_key = _fmix32(row_key ^ (positions.to(torch.int64) & _MASK32))  # [B]
    token_ids = torch.arange(vocab_size, device=seeds.device, dtype=torch.int64)  # [V]
    hashed = _fmix32(row_key[:, None] ^ token_ids[None, :])  # [B, V]
    uniform = ((hashed >> 8).to(torch.float32) + 0.5) * (1.0 / 2**24)
    return -torch.log(-torch.log(uniform))


def sample_tokens(logits: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
    """Choose one token per row of fp32 logits [B, V] by the rules in this module's docstring."""
    if logits.dim() != 2 or logits.shape[0] != len(rows):
        raise ValueError(f"logits must be [len(rows)={len(rows)}, vocab], got {tuple(logits.shape)}")
    logits = logits.to(torch.float32)
    device = logits.device
    greedy_tokens = torch.argmax(logits, dim=-1)  # torch returns the first maximum: lowest id
    if all(row.params.is_greedy for row in rows):
        return greedy_tokens

    def column(values: list[float] | list[int], dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor(values, dtype=dtype, device=device)

    is_greedy = column([row.params.is_greedy for row in rows], torch.bool)
    # Greedy rows get temperature 1 here only to keep the arithmetic finite; their result is
    # replaced by the argmax below.
    temperature = column([row.params.temperature if not row.params.is_greedy else 1.0 for row in rows], torch.float32)
    vocab_size = logits.shape[1]
    top_k = column([row.params.top_k if row.params.top_k_enabled else vocab_size for row in rows], torch.int64)
    top_p = column([row.params.top_p for row in rows], torch.float32)
    min_p = column([row.params.min_p for row in rows], torch.float32)
    seeds = column([row.seed for row in rows], torch.int64)
    positions = column([row.output_position for row in rows], torch.int64)

    scaled = logits / temperature[:, None]
    keep = _top_k_mask(scaled, top_k.clamp(max=vocab_size))
    keep &= _top_p_mask(scaled, keep, top_p)
    keep &= _min_p_mask(scaled, min_p)
    perturbed = torch.where(keep, scaled + gumbel_noise(seeds, positions, vocab_size), float("-inf"))
    sampled_tokens = torch.argmax(perturbed, dim=-1)
    return torch.where(is_greedy, greedy_tokens, sampled_tokens)


def _top_k_mask(scaled: torch.Tensor, top_k: torch.Tensor) -> torch.Tensor:
    sorted_values = torch.sort(scaled, dim=-1, descending=True).values
    kth_value = sorted_values.gather(1, (top_k - 1)[:, None])  # [B, 1]
    return scaled >= kth_value


def _top_p_mask(scaled: torch.Tensor, keep: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    probs = torch.softmax(torch.where(keep, scaled, float("-inf")), dim=-1)
    # stable descending sort: equal probabilities keep index order, i.e. lower token id first
    sorted_probs, order = torch.sort(probs, dim=-1, descending=True, stable=True)
    mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
    keep_sorted = mass_before < top_p[:, None]
    return torch.zeros_like(keep).scatter(1, order, keep_sorted)


def _min_p_mask(scaled: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    max_scaled = scaled.max(dim=-1, keepdim=True).values
    return torch.exp(scaled - max_scaled) >= min_p[:, None]


def top_logprobs(logits: torch.Tensor, chosen: torch.Tensor, count: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """log_softmax of fp32 logits [B, V]: (chosen token's logprob [B], top ids [B, count], top logprobs [B, count])."""
    logprobs = torch.log_softmax(logits.to(torch.float32), dim=-1)
    chosen_logprob = logprobs.gather(1, chosen[:, None].to(torch.int64))[:, 0]
    top = torch.topk(logprobs, k=count, dim=-1) if count > 0 else None
    if top is None:
        empty = logprobs.new_empty((logprobs.shape[0], 0))
        return chosen_logprob, empty.to(torch.int64), empty
    return chosen_logprob, top.indices, top.values
