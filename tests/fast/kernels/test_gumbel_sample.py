"""fast.kernels.gumbel_sample against spec.sampling's Gumbel-max step.

On the CPU (Triton's interpreter) the tokens must be equal; on a GPU the kernel's per-chunk best
values must equal the spec's, bit for bit (which the token alone would rarely show: a one-ulp
difference in the noise changes the argmax only near a tie).
"""

from __future__ import annotations

import pytest
import torch

from fast.kernels.gumbel_sample import BLOCK_V, chunk_count, gumbel_sample
from spec.sampling import gumbel_max, gumbel_noise, row_keys, scale_logits
from tests.fast.kernels.reference import DEVICE


def _rows(count: int, device: torch.device = DEVICE) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    temperature = torch.tensor([0.6, 1.0, 0.3, 2.0, 0.9, 1.7, 0.05, 1.1][:count], device=device)
    seeds = torch.tensor([0, 1, 2**40 + 7, 123_456_789, 5, 2**63 - 1, 42, 9][:count], device=device)
    positions = torch.tensor([0, 3, 100, 2**33, 7, 1, 4095, 65_536][:count], device=device)
    return temperature, seeds, positions


def _spec_tokens(logits, temperature, seeds, positions, keep=None) -> torch.Tensor:
    scaled = scale_logits(logits, temperature)
    keep = torch.ones_like(scaled, dtype=torch.bool) if keep is None else keep
    return gumbel_max(scaled, keep, seeds, positions)


@pytest.mark.parametrize("vocab_size", [1, 37, BLOCK_V, 2 * BLOCK_V + 5])
def test_tokens_equal_the_spec(vocab_size: int) -> None:
    generator = torch.Generator().manual_seed(vocab_size)
    temperature, seeds, positions = _rows(8)
    logits = (3 * torch.randn(8, vocab_size, generator=generator)).to(DEVICE)
    tokens = gumbel_sample(logits, temperature, row_keys(seeds, positions))
    assert torch.equal(tokens, _spec_tokens(logits, temperature, seeds, positions))


def test_keep_mask_and_strided_inputs() -> None:
    generator = torch.Generator().manual_seed(1)
    vocab_size = 2 * BLOCK_V + 5
    temperature, seeds, positions = _rows(4)
    wide = (3 * torch.randn(4, vocab_size + 3, generator=generator)).to(DEVICE)
    logits = wide[:, :vocab_size]  # rows strided, vocabulary contiguous
    keep = (torch.rand(4, vocab_size, generator=generator) > 0.5).to(DEVICE)
    keep[2] = False
    keep[2, vocab_size - 1] = True  # the only token row 2 may take, in the last, partial chunk
    strided_temperature = torch.stack([temperature, temperature], dim=1)[:, 0]
    assert strided_temperature.stride(0) == 2
    tokens = gumbel_sample(logits, strided_temperature, row_keys(seeds, positions), keep)
    assert torch.equal(tokens, _spec_tokens(logits, temperature, seeds, positions, keep))
    assert int(tokens[2]) == vocab_size - 1


def test_caller_workspace_is_used_and_checked() -> None:
    temperature, seeds, positions = _rows(3)
    logits = torch.randn(3, 100).to(DEVICE)
    values = torch.full((3 * chunk_count(100) + 4,), 7.0, device=DEVICE)
    tokens = torch.zeros(values.shape, dtype=torch.int64, device=DEVICE)
    result = gumbel_sample(logits, temperature, row_keys(seeds, positions), workspace=(values, tokens))
    assert torch.equal(result, _spec_tokens(logits, temperature, seeds, positions))
    assert not torch.equal(values[:3], torch.full((3,), 7.0, device=DEVICE))  # written in place
    with pytest.raises(ValueError, match="workspace"):
        gumbel_sample(logits, temperature, row_keys(seeds, positions), workspace=(values[:2], tokens[:2]))


def test_bad_inputs_are_refused() -> None:
    temperature, seeds, positions = _rows(2)
    keys = row_keys(seeds, positions)
    with pytest.raises(TypeError, match="dtype"):
        gumbel_sample(torch.randn(2, 10, dtype=torch.float16, device=DEVICE), temperature, keys)
    with pytest.raises(ValueError, match="shape"):
        gumbel_sample(torch.randn(3, 10, device=DEVICE), temperature, keys)
    with pytest.raises(ValueError, match="contiguous"):
        gumbel_sample(torch.randn(10, 2, device=DEVICE).t(), temperature, keys)
    with pytest.raises(ValueError, match="shape"):
        gumbel_sample(
            torch.randn(2, 10, device=DEVICE), temperature, keys, torch.ones(2, 9, dtype=torch.bool, device=DEVICE)
        )


@pytest.mark.gpu
@pytest.mark.parametrize("with_keep", [False, True])
def test_chunk_values_are_bit_identical_to_the_spec_on_a_gpu(with_keep: bool) -> None:
    device, vocab_size, num_rows = torch.device("cuda"), 151_936, 256
    generator = torch.Generator(device=device).manual_seed(3)
    logits = 4 * torch.randn(num_rows, vocab_size, generator=generator, device=device)
    temperature = 0.1 + 2 * torch.rand(num_rows, generator=generator, device=device)
    seeds = torch.arange(num_rows, device=device) * 7_919 + 2**35
    positions = torch.arange(num_rows, device=device) * 31
    keep = torch.rand(num_rows, vocab_size, generator=generator, device=device) > 0.2 if with_keep else None
    num_chunks = chunk_count(vocab_size)
    values = torch.empty(num_rows * num_chunks, device=device)
    chunk_tokens = torch.empty(num_rows * num_chunks, dtype=torch.int64, device=device)
    tokens = gumbel_sample(logits, temperature, row_keys(seeds, positions), keep, workspace=(values, chunk_tokens))

    scaled = scale_logits(logits, temperature)
    candidates = scaled + gumbel_noise(seeds, positions, vocab_size)
    if keep is not None:
        candidates = torch.where(keep, candidates, float("-inf"))
    padded = torch.full((num_rows, num_chunks * BLOCK_V), float("-inf"), device=device)
    padded[:, :vocab_size] = candidates
    assert torch.equal(values.view(num_rows, num_chunks), padded.view(num_rows, num_chunks, BLOCK_V).amax(dim=2))
    full_keep = keep if keep is not None else torch.ones_like(scaled, dtype=torch.bool)
    assert torch.equal(tokens, gumbel_max(scaled, full_keep, seeds, positions))
