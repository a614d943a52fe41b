"""Sampling semantics (spec.sampling): greedy ties, filters in order, Gumbel-max from a counter-based
hash, and seeded requests that sample the same tokens whatever batch they run in."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from spec.sampling import (
    SamplingRow,
    SamplingTensors,
    gumbel_noise,
    hash_uniform,
    kept_mask,
    row_temperature,
    sample_tokens,
    top_logprobs,
)
from spec.sampling_params import SamplingParams


def py_fmix32(h: int) -> int:
    """MurmurHash3 fmix32 on Python ints: an independent implementation to check the torch one."""
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & 0xFFFFFFFF
    return h ^ (h >> 16)


def py_gumbel(seed: int, position: int, token_id: int) -> float:
    row_key = py_fmix32((seed & 0xFFFFFFFF) ^ py_fmix32(((seed >> 32) & 0xFFFFFFFF) ^ 0x9E3779B9))
    row_key = py_fmix32(row_key ^ position)
    uniform = ((py_fmix32(row_key ^ token_id) >> 9) + 0.5) / 2**23
    return -math.log(-math.log(uniform))


def rows(params: SamplingParams, count: int = 1, seed: int = 0, position: int = 0) -> list[SamplingRow]:
    return [SamplingRow(params, seed, position)] * count


def test_gumbel_noise_matches_the_spec_hash() -> None:
    seeds = [0, 1, 12345, 2**40 + 7, 2**63 - 1]
    positions = [0, 3, 99, 1000, 70000]
    noise = gumbel_noise(torch.tensor(seeds), torch.tensor(positions), vocab_size=50)
    for row, (seed, position) in enumerate(zip(seeds, positions, strict=True)):
        for token_id in (0, 1, 17, 49):
            assert noise[row, token_id].item() == pytest.approx(py_gumbel(seed, position, token_id), abs=1e-5)


def test_extreme_hash_values_give_finite_noise_inside_the_unit_interval() -> None:
    # With 24 bits, the largest hash rounded u to 1.0 in fp32 and its noise to +inf: that token won
    # every draw it was kept in.
    extremes = torch.tensor([0, 1, 2**31, 2**32 - 2**10, 2**32 - 1], dtype=torch.int64)
    uniform = hash_uniform(extremes)
    assert bool(((uniform > 0) & (uniform < 1)).all()), uniform.tolist()
    assert uniform.tolist() == [0.5 / 2**23, 0.5 / 2**23, 0.5 + 0.5 / 2**23, 1 - 1.5 / 2**23, 1 - 0.5 / 2**23]
    noise = -torch.log(-torch.log(uniform))
    assert bool(torch.isfinite(noise).all()), noise.tolist()


def test_gumbel_noise_is_gumbel_distributed() -> None:
    noise = gumbel_noise(torch.tensor([42]), torch.tensor([0]), vocab_size=200_000)[0]
    assert noise.mean().item() == pytest.approx(0.5772, abs=0.01)  # Euler-Mascheroni constant
    assert noise.std().item() == pytest.approx(math.pi / math.sqrt(6), abs=0.01)


def test_greedy_breaks_ties_towards_the_lowest_id() -> None:
    logits = torch.tensor([[0.0, 1.0, 3.0, 2.0, 3.0, 3.0]])
    assert sample_tokens(logits, rows(SamplingParams(temperature=0.0))).tolist() == [2]


def draws(logits: torch.Tensor, params: SamplingParams, count: int) -> torch.Tensor:
    """Tokens sampled at `count` output positions of one seeded request."""
    batch = logits.expand(count, -1)
    return sample_tokens(batch, [SamplingRow(params, seed=7, output_position=p) for p in range(count)])


PROBS = torch.tensor([0.4, 0.25, 0.15, 0.1, 0.06, 0.04])
LOGITS = PROBS.log()[None, :]


def test_sampling_frequencies_follow_softmax() -> None:
    counts = torch.bincount(draws(LOGITS, SamplingParams(temperature=1.0), 20_000), minlength=6).float()
    assert torch.allclose(counts / counts.sum(), PROBS, atol=0.015)


def test_temperature_sharpens() -> None:
    counts = torch.bincount(draws(LOGITS, SamplingParams(temperature=0.5), 20_000), minlength=6).float()
    sharpened = PROBS**2 / (PROBS**2).sum()
    assert torch.allclose(counts / counts.sum(), sharpened, atol=0.015)


def test_top_k_keeps_the_k_most_likely() -> None:
    tokens = draws(LOGITS, SamplingParams(top_k=2), 2_000)
    assert set(tokens.tolist()) == {0, 1}
    assert set(draws(LOGITS, SamplingParams(top_k=1), 200).tolist()) == {0}


def test_top_p_keeps_the_head_whose_mass_reaches_p() -> None:
    # mass before token 1 is 0.4 < 0.5 (kept); before token 2 it is 0.65 (dropped)
    assert set(draws(LOGITS, SamplingParams(top_p=0.5), 2_000).tolist()) == {0, 1}
    assert set(draws(LOGITS, SamplingParams(top_p=0.35), 500).tolist()) == {0}
    assert set(draws(LOGITS, SamplingParams(top_p=0.66), 3_000).tolist()) == {0, 1, 2}


def test_min_p_keeps_tokens_relative_to_the_most_likely() -> None:
    # 0.15 / 0.4 = 0.375 >= 0.3 kept; 0.1 / 0.4 = 0.25 < 0.3 dropped
    assert set(draws(LOGITS, SamplingParams(min_p=0.3), 3_000).tolist()) == {0, 1, 2}


def test_filters_apply_in_order_top_k_then_top_p() -> None:
    # top_k=3 leaves probs 0.4/0.8, 0.25/0.8, 0.15/0.8 = 0.5, 0.3125, 0.1875; top_p=0.6 keeps two.
    assert set(draws(LOGITS, SamplingParams(top_k=3, top_p=0.6), 2_000).tolist()) == {0, 1}


def test_same_seed_same_tokens_different_seed_different_tokens() -> None:
    logits = torch.randn(1, 1000, generator=torch.Generator().manual_seed(0))
    params = SamplingParams(temperature=1.0)
    first = sample_tokens(logits.expand(64, -1), [SamplingRow(params, 5, p) for p in range(64)])
    again = sample_tokens(logits.expand(64, -1), [SamplingRow(params, 5, p) for p in range(64)])
    other = sample_tokens(logits.expand(64, -1), [SamplingRow(params, 6, p) for p in range(64)])
    assert torch.equal(first, again)
    assert not torch.equal(first, other)


def test_mixed_greedy_and_sampled_rows() -> None:
    logits = torch.tensor([[0.0, 5.0, 0.0], [0.0, 0.0, 1.0]])
    greedy, sampled = SamplingParams(temperature=0.0), SamplingParams(temperature=1.0, top_k=1)
    assert sample_tokens(logits, [SamplingRow(greedy, 0, 0), SamplingRow(sampled, 0, 0)]).tolist() == [1, 2]


def test_top_p_of_one_keeps_every_token_even_when_the_rounded_mass_reaches_one() -> None:
    # One dominant token: its fp32 probability rounds to 1, so every later token has mass before it of 1.
    logits = torch.tensor([[30.0, 0.0, -1.0, -2.0]])
    assert kept_mask(logits, rows(SamplingParams(top_p=1.0))).tolist() == [[True] * 4]
    assert kept_mask(logits, rows(SamplingParams(top_p=0.999))).tolist() == [[True, False, False, False]]


def test_kept_mask_of_a_greedy_row_is_its_argmax() -> None:
    logits = torch.tensor([[0.0, 3.0, 1.0, 3.0]])
    assert kept_mask(logits, rows(SamplingParams(temperature=0.0, top_k=3))).tolist() == [[False, True, False, False]]


def test_top_logprobs_are_log_softmax_of_raw_logits() -> None:
    logits = torch.tensor([[1.0, 2.0, 3.0, 0.5]])
    chosen, ids, values = top_logprobs(logits, torch.tensor([0]), 2)
    expected = torch.log_softmax(logits, -1)
    assert chosen.item() == pytest.approx(expected[0, 0].item())
    assert ids.tolist() == [[2, 1]]
    assert values[0].tolist() == pytest.approx(expected[0, [2, 1]].tolist())


def test_seeded_request_samples_the_same_alone_or_in_a_batch(make_engine) -> None:
    params = SamplingParams(
        temperature=0.9, top_k=50, top_p=0.95, min_p=0.01, max_tokens=40, ignore_eos=True, seed=1234
    )
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    alone = make_engine(block_size=4, num_blocks=256).generate([prompt], params)[0].token_ids
    others = [[(7 * i + j) % 384 for j in range(3 + 2 * i)] for i in range(8)]
    other_params = [SamplingParams(temperature=1.0, max_tokens=30 + i, seed=i) for i in range(8)]
    batch = make_engine(block_size=4, num_blocks=256, max_num_batched_tokens=24).generate(
        [*others[:4], prompt, *others[4:]], [*other_params[:4], params, *other_params[4:]]
    )
    assert batch[4].token_ids == alone
    assert len(set(alone)) > 5, "sampling collapsed to a few tokens: the test would not notice a wrong seed"
    unseeded = make_engine(block_size=4, num_blocks=256).generate(
        [prompt] * 2, SamplingParams(temperature=1.0, max_tokens=20, ignore_eos=True)
    )
    assert unseeded[0].token_ids != unseeded[1].token_ids, "unseeded requests must draw their own seeds"


def test_top_logprobs_count_by_count() -> None:
    """0 asks for none (an empty [B, 0] of each dtype, one row per logits row), 1 for the single most likely."""
    logits = torch.tensor([[1.0, 2.0, 3.0, 0.5], [0.0, -1.0, 4.0, 2.0], [5.0, 1.0, 0.0, 0.0]])
    chosen = torch.tensor([0, 1, 2])
    expected = torch.log_softmax(logits, -1)
    logprob, ids, values = top_logprobs(logits, chosen, 0)
    assert logprob.tolist() == pytest.approx(expected[[0, 1, 2], [0, 1, 2]].tolist())
    assert ids.shape == (3, 0) and ids.dtype == torch.int64
    assert values.shape == (3, 0) and values.dtype == torch.float32
    _, ids, values = top_logprobs(logits, chosen, 1)
    assert ids.tolist() == [[2], [2], [0]]
    assert values[:, 0].tolist() == pytest.approx(expected[[0, 1, 2], [2, 2, 0]].tolist())


def test_a_greedy_row_divides_by_one() -> None:
    """SamplingTensors' documented temperature of a greedy row: 1, so its scaled logits stay its logits."""
    assert row_temperature(SamplingParams(temperature=0.0)) == 1.0
    assert row_temperature(SamplingParams(temperature=0.7)) == pytest.approx(0.7)
    tensors = SamplingTensors.from_rows(
        [SamplingRow(SamplingParams(temperature=0.0), 1, 0), SamplingRow(SamplingParams(temperature=2.0), 1, 0)],
        8,
        "cpu",
    )
    assert tensors.temperature.tolist() == [1.0, 2.0]


def test_a_batch_whose_rows_do_not_match_is_refused() -> None:
    params = SamplingParams(temperature=1.0, seed=1)
    for logits in (torch.zeros((3, 8)), torch.zeros((1, 8)), torch.zeros(8), torch.zeros((2, 8, 1))):
        with pytest.raises(ValueError, match=r"logits must be \[len\(rows\)=2, vocab\]"):
            sample_tokens(logits, rows(params, 2))
        with pytest.raises(ValueError, match=r"logits must be \[len\(rows\)=2, vocab\]"):
            kept_mask(logits, rows(params, 2))


def test_sampling_rows_and_tensors_are_frozen() -> None:
    row = SamplingRow(SamplingParams(), 1, 0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        row.seed = 2  # type: ignore[misc]
    tensors = SamplingTensors.from_rows([row], 8, "cpu")
    with pytest.raises(dataclasses.FrozenInstanceError):
        tensors.top_k = torch.ones(1)  # type: ignore[misc]


def test_top_p_among_equal_probabilities_keeps_the_lowest_ids() -> None:
    """The stable sort of top-p: among tokens of equal probability the lower ids come first, so a head cut
    midway through a tie keeps the lowest ids (here 5 of 2,000 tied tokens for top_p 0.0025)."""
    logits = torch.zeros((1, 2000))
    kept = kept_mask(logits, rows(SamplingParams(temperature=1.0, top_p=0.0025, seed=3)))
    assert kept[0].nonzero().flatten().tolist() == [0, 1, 2, 3, 4]
