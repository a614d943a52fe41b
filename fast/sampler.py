"""spec.sampling on the device, bit for bit, with the per-row parameters in persistent buffers.

    sampler = Sampler(max_num_seqs, vocab_size, device)
    sampler.set_rows(rows)               # one non-blocking host-to-device copy
    tokens = sampler.sample(logits)      # int64 [B], no host sync
    tokens = sampler.sample(step.logits, step.head_max)   # the LM head's row max and argmax, if it made them
    chosen, top_ids, top_values = sampler.logprobs(logits, tokens, count)

Every step is one of spec.sampling's batch-wide tensor functions, or a kernel that computes the
same numbers, so the tokens equal `spec.sampling.sample_tokens` on the same device:
* the Gumbel-max step (scale, noise, mask, argmax) is one pass of fast.kernels.gumbel_sample
  instead of the spec's ~20 elementwise passes over int64 hashes of every (row, token);
The other departures are shortcuts that give identical results, decided on the host from the rows
(no device sync):
* every row greedy: the argmax alone; no row greedy: no argmax;
* unsampleable rows (spec.sampling) are told by each row's max, folded into the tokens as their codes by a
  few elementwise ops over [B]: where a row is greedy the max comes with the argmax (torch.max, one pass),
  otherwise it is one reduction over [B, V] (torch.amax); no host sync, whatever the rows hold;
* where the LM head computed each row's max and argmax (fast.logits.RowMax, fast.kernels.lm_head_argmax:
  torch.max of the same logits, bit for bit), those are taken instead of that pass;
* a filter no row uses is skipped (top-k off keeps every token since all are >= the smallest, no scaled logit of a
  sampleable row being NaN; top_p == 1 and min_p == 0 keep every token by the spec's rules);
* top-k reads the k-th largest value from `torch.topk` over the largest k any row asks for, not
  from a full sort: the k-th largest value is the same number either way.

The host side is built for a call every step: a request's columns that never change (temperature,
filters, the seed's half of the row key) are a `SamplerRow`, made once per request by `row`, and
the row keys (spec.sampling.row_keys, the same bits) are computed on the host with numpy and
uploaded with the parameters instead of as ~60 tiny device ops.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import torch

from fast.kernels.gumbel_sample import chunk_count, gumbel_sample
from fast.logits import RowMax
from spec.sampling import (
    FMIX32_MULTIPLIER_1,
    FMIX32_MULTIPLIER_2,
    HASH_MASK,
    SEED_SALT,
    SamplingRow,
    SamplingTensors,
    greedy_one_hot,
    min_p_mask,
    row_max,
    row_temperature,
    row_top_k,
    scale_logits,
    top_logprobs,
    top_p_mask,
    with_unsampleable_codes,
)
from spec.sampling_params import SamplingParams


class _Field(enum.IntEnum):
    """Columns of the parameter buffer [max_num_seqs, len(_Field)] int64; fp32 fields are stored in the
    low-address half of their int64 slot (the buffer viewed as fp32 has them at column 2 * field)."""

    TEMPERATURE = 0
    TOP_P = 1
    MIN_P = 2
    TOP_K = 3
    SEED = 4
    POSITION = 5
    GREEDY = 6
    KEY = 7  # spec.sampling.row_keys(seed, position), computed on the host


class SamplerRow(NamedTuple):
    """A request's sampling columns that no step changes (Sampler.row builds them once per request)."""

    temperature: float  # spec.sampling.row_temperature: 1 for a greedy row
    top_p: float
    min_p: float
    top_k: int  # spec.sampling.row_top_k: in [1, vocab_size]
    is_greedy: bool
    seed: int
    seed_key: int  # the seed's half of the row key: fmix32(seed_low ^ fmix32(seed_high ^ SEED_SALT))


def _fmix32(h: int) -> int:
    """spec.sampling's fmix32 on one Python int in [0, 2**32)."""
    h ^= h >> 16
    h = (h * FMIX32_MULTIPLIER_1) & HASH_MASK
    h ^= h >> 13
    h = (h * FMIX32_MULTIPLIER_2) & HASH_MASK
    return h ^ (h >> 16)


def seed_key(seed: int) -> int:
    """The part of spec.sampling.row_keys that depends on the seed alone (0 <= seed < 2**63)."""
    return _fmix32((seed & HASH_MASK) ^ _fmix32(((seed >> 32) & HASH_MASK) ^ SEED_SALT))


_MULTIPLIER_1, _MULTIPLIER_2 = np.uint32(FMIX32_MULTIPLIER_1), np.uint32(FMIX32_MULTIPLIER_2)


def host_row_keys(seed_keys: Sequence[int], positions: Sequence[int]) -> np.ndarray:
    """uint32 [B]: spec.sampling.row_keys = fmix32(seed_key ^ (position mod 2**32)), bit for bit, in numpy
    (uint32 products wrap mod 2**32 as the spec's masked ones do). On the device the spec's version is
    ~60 elementwise launches a step; this is ~20 us of host time at 256 rows."""
    h = np.array(seed_keys, dtype=np.uint32)
    h ^= np.array(positions, dtype=np.int64).astype(np.uint32)  # the C cast keeps the low 32 bits
    h ^= h >> 16
    h *= _MULTIPLIER_1
    h ^= h >> 13
    h *= _MULTIPLIER_2
    h ^= h >> 16
    return h


class Sampler:
    """Samples one token per row of fp32 logits [B, V] by spec.sampling's rules, for B <= max_num_seqs."""

    def __init__(self, max_num_seqs: int, vocab_size: int, device: torch.device | str) -> None:
        if max_num_seqs < 1 or vocab_size < 1:
            raise ValueError(f"max_num_seqs and vocab_size must be >= 1, got {max_num_seqs} and {vocab_size}")
        self.max_num_seqs = max_num_seqs
        self.vocab_size = vocab_size
        self.device = torch.device(device)
        pin = self.device.type == "cuda"
        shape = (max_num_seqs, len(_Field))
        # Two host buffers, used in turn: a buffer must not be rewritten while a copy from it may still be
        # queued, and with async scheduling the rows of step n+1 are set while step n (whose rows' copy
        # was queued after its forward pass) still runs: the other buffer's copy is long done.
        self._hosts = [torch.zeros(shape, dtype=torch.int64, pin_memory=pin) for _ in range(2)]
        # Each buffer's numpy views, int64 and float32 ([max_num_seqs, 2 * len(_Field)]), made once.
        self._host_views = [(host.numpy(), host.view(torch.float32).numpy()) for host in self._hosts]
        self._copies_done = [torch.cuda.Event() if self.device.type == "cuda" else None for _ in range(2)]
        self._turn = 0
        self._device_buffer = torch.zeros(shape, dtype=torch.int64, device=self.device)
        self._num_rows = 0
        self._all_greedy = True
        self._any_greedy = True
        chunks = max_num_seqs * chunk_count(vocab_size)
        self._gumbel_workspace = (
            torch.empty(chunks, dtype=torch.float32, device=self.device),
            torch.empty(chunks, dtype=torch.int64, device=self.device),
        )
        self._max_top_k = vocab_size
        self._uses_top_k = False
        self._uses_top_p = False
        self._uses_min_p = False
        self._tensors: SamplingTensors | None = None
        self._keys = torch.zeros(0, dtype=torch.int64, device=self.device)  # row keys of the rows set last

    @property
    def num_rows(self) -> int:
        return self._num_rows

    @property
    def all_greedy(self) -> bool:
        return self._all_greedy

    def row(self, params: SamplingParams, seed: int) -> SamplerRow:
        """A request's constant columns (its params and resolved seed), for `set_sampler_rows`."""
        return SamplerRow(
            row_temperature(params),
            params.top_p,
            params.min_p,
            row_top_k(params, self.vocab_size),
            params.is_greedy,
            seed,
            seed_key(seed),
        )

    def set_rows(self, rows: list[SamplingRow]) -> None:
        """Load the parameters of the next batch (row i samples logits row i)."""
        self.set_batch([row.params for row in rows], [row.seed for row in rows], [row.output_position for row in rows])

    def set_batch(self, params: list[SamplingParams], seeds: list[int], positions: list[int]) -> None:
        """`set_rows` given by columns: row i's params, resolved seed and output position."""
        self.set_sampler_rows([self.row(p, seed) for p, seed in zip(params, seeds, strict=True)], positions)

    def set_sampler_rows(self, rows: Sequence[SamplerRow], positions: Sequence[int]) -> None:
        """`set_rows` from each row's constant columns (`row`, kept by the caller from step to step)
        and its output position: the engine's call each step."""
        count = len(rows)
        if not 1 <= count <= self.max_num_seqs:
            raise ValueError(f"a batch of {count} rows does not fit a sampler of max_num_seqs {self.max_num_seqs}")
        if len(positions) != count:
            raise ValueError(f"{len(positions)} positions for {count} rows")
        self._num_rows = count
        temperatures, top_ps, min_ps, top_ks, greedy, seeds, seed_keys = zip(*rows, strict=True)
        self._all_greedy = all(greedy)
        self._any_greedy = any(greedy)
        self._tensors = None
        if self._all_greedy:
            return
        # The filters are decided by the rows that sample; a greedy row's result is the argmax whatever they are.
        sampled = [not is_greedy for is_greedy in greedy] if self._any_greedy else None
        sampled_top_ks = _sampled(top_ks, sampled)
        self._max_top_k = max(sampled_top_ks)
        self._uses_top_k = min(sampled_top_ks) < self.vocab_size
        self._uses_top_p = min(_sampled(top_ps, sampled)) < 1.0
        self._uses_min_p = max(_sampled(min_ps, sampled)) > 0.0
        self._turn ^= 1
        host, copy_done = self._hosts[self._turn], self._copies_done[self._turn]
        if copy_done is not None:
            copy_done.synchronize()  # the copy of two calls ago: long done
        ints, floats = self._host_views[self._turn]
        floats[:count, 2 * _Field.TEMPERATURE] = temperatures
        floats[:count, 2 * _Field.TOP_P] = top_ps
        floats[:count, 2 * _Field.MIN_P] = min_ps
        ints[:count, _Field.TOP_K] = top_ks
        ints[:count, _Field.SEED] = seeds
        ints[:count, _Field.POSITION] = positions
        ints[:count, _Field.GREEDY] = greedy
        ints[:count, _Field.KEY] = host_row_keys(seed_keys, positions)
        device_rows = self._device_buffer[:count]
        device_rows.copy_(host[:count], non_blocking=True)
        if copy_done is not None:
            copy_done.record()
        floats_view = device_rows.view(torch.float32)
        self._tensors = SamplingTensors(
            temperature=floats_view[:, 2 * _Field.TEMPERATURE],
            top_k=device_rows[:, _Field.TOP_K],
            top_p=floats_view[:, 2 * _Field.TOP_P],
            min_p=floats_view[:, 2 * _Field.MIN_P],
            seeds=device_rows[:, _Field.SEED],
            positions=device_rows[:, _Field.POSITION],
            is_greedy=device_rows[:, _Field.GREEDY].bool(),
        )
        self._keys = device_rows[:, _Field.KEY].contiguous()  # the kernel reads the keys contiguous

    def _check_logits(self, logits: torch.Tensor) -> torch.Tensor:
        if logits.dim() != 2 or logits.shape != (self._num_rows, self.vocab_size):
            raise ValueError(
                f"logits must be [{self._num_rows}, {self.vocab_size}] (the rows set last), got {tuple(logits.shape)}"
            )
        return logits.to(torch.float32)

    def kept_mask(self, logits: torch.Tensor) -> torch.Tensor:
        """bool [B, V]: the tokens each row may sample (spec.sampling.kept_mask)."""
        logits = self._check_logits(logits)
        if self._tensors is None:
            return greedy_one_hot(logits)
        keep = self._filter_mask(scale_logits(logits, self._tensors.temperature))
        return torch.where(self._tensors.is_greedy[:, None], greedy_one_hot(logits), keep)

    def sample(self, logits: torch.Tensor, head_max: RowMax | None = None) -> torch.Tensor:
        """int64 [B]: one token per row of fp32 logits [B, V]; an unsampleable row's code
        (spec.sampling.UNSAMPLEABLE_*) in place of its token, as spec.sampling.sample_tokens.

        head_max: torch.max(logits, dim=-1) of these very logits, where the LM head computed it
        (fast.logits.StepLogits.head_max); taken instead of the sampler's own pass over [B, V]. Whoever
        edits the logits after the head must not pass it."""
        logits = self._check_logits(logits)
        if head_max is not None:
            self._check_head_max(head_max)
        if self._tensors is None:
            maxima, argmax = _max_and_argmax(logits) if head_max is None else head_max
            return with_unsampleable_codes(argmax, maxima)
        tensors = self._tensors
        keep = self._filter_mask(scale_logits(logits, tensors.temperature)) if self._uses_filters else None
        sampled = self._gumbel_max(logits, tensors.temperature, self._keys, keep)
        if not self._any_greedy:  # the one extra pass over [B, V], if the head gave no max: no greedy row, no argmax
            maxima = row_max(logits) if head_max is None else head_max.values
            return with_unsampleable_codes(sampled, maxima)
        maxima, argmax = _max_and_argmax(logits) if head_max is None else head_max
        return with_unsampleable_codes(torch.where(tensors.is_greedy, argmax, sampled), maxima)

    def _check_head_max(self, head_max: RowMax) -> None:
        """Metadata only (no host sync): one fp32 max and one int64 index per row set last."""
        values, indices = head_max
        if values.shape != (self._num_rows,) or indices.shape != (self._num_rows,):
            raise ValueError(
                f"head_max must hold [{self._num_rows}] values and indices (the rows set last), got "
                f"{tuple(values.shape)} and {tuple(indices.shape)}"
            )
        if values.dtype != torch.float32 or indices.dtype != torch.int64:
            raise TypeError(f"head_max must be fp32 values and int64 indices, got {values.dtype} and {indices.dtype}")

    def _gumbel_max(
        self, logits: torch.Tensor, temperature: torch.Tensor, keys: torch.Tensor, keep: torch.Tensor | None
    ) -> torch.Tensor:
        """int64 [B]: the Gumbel-max step, one kernel (a method so that reports.serving.host_overhead can time the
        host path without it: on the CPU the kernel runs in Triton's interpreter, ~1 s a step)."""
        return gumbel_sample(logits, temperature, keys, keep, workspace=self._gumbel_workspace)

    @property
    def _uses_filters(self) -> bool:
        return self._uses_top_k or self._uses_top_p or self._uses_min_p

    def logprobs(
        self, logits: torch.Tensor, tokens: torch.Tensor, count: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(logprob of each row's token [B], top ids [B, count], top logprobs [B, count]) from raw fp32 logits."""
        return top_logprobs(logits, tokens, count)

    def _filter_mask(self, scaled: torch.Tensor) -> torch.Tensor:
        assert self._tensors is not None
        tensors = self._tensors
        keep = self._top_k_mask(scaled, tensors.top_k)
        if self._uses_top_p:
            keep &= top_p_mask(scaled, keep, tensors.top_p)
        if self._uses_min_p:
            keep &= min_p_mask(scaled, tensors.min_p)
        return keep

    def _top_k_mask(self, scaled: torch.Tensor, top_k: torch.Tensor) -> torch.Tensor:
        if not self._uses_top_k:
            return torch.ones_like(scaled, dtype=torch.bool)
        largest = torch.topk(scaled, self._max_top_k, dim=-1, sorted=True).values  # [B, max_k], descending
        # Greedy rows may ask for more than max_top_k (taken over sampled rows); their result is the argmax.
        kth_value = largest.gather(1, (top_k.clamp(max=self._max_top_k) - 1)[:, None])
        return scaled >= kth_value


def _max_and_argmax(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(row max [B], spec.sampling.greedy_tokens [B]) in one pass: torch.max's index is argmax's (both take
    the first maximum, a NaN first of all), and its value propagates a NaN as spec.sampling.row_max does."""
    maxima, argmax = torch.max(logits, dim=-1)
    return maxima, argmax


def _sampled(values: tuple, sampled: list[bool] | None) -> tuple | list:
    """The values of the rows that sample (`sampled` None: every row)."""
    return values if sampled is None else [value for value, keep in zip(values, sampled, strict=True) if keep]
