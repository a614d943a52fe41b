"""SamplingParams at the edges of every range: the bound itself is accepted, one past it refused (the
refusals are in tests/spec/test_bad_input.py). The mutation run (fuzz/mutation) showed each `<=` here could
become `<` unseen."""

from __future__ import annotations

import dataclasses

import pytest

from spec.errors import SamplingParamsError
from spec.sampling_params import MAX_LOGPROBS, SamplingParams


@pytest.mark.parametrize(
    "settings",
    [
        {"top_k": -1},
        {"top_k": 0},
        {"min_p": 0.0},
        {"min_p": 1.0},
        {"top_p": 1.0},
        {"max_tokens": 1},
        {"stop_token_ids": (0,)},
        {"seed": 0},
        {"seed": 2**63 - 1},
        {"logprobs": 0},
        {"logprobs": 20},
        {"prompt_logprobs": 0},
        {"prompt_logprobs": 20},
    ],
    ids=repr,
)
def test_the_bound_itself_is_accepted(settings: dict[str, object]) -> None:
    params = SamplingParams(**settings)  # type: ignore[arg-type]
    assert all(getattr(params, name) == value for name, value in settings.items())


@pytest.mark.parametrize("count", [-1, 21])
def test_prompt_logprob_counts_are_zero_to_twenty(count: int) -> None:
    assert MAX_LOGPROBS == 20
    with pytest.raises(SamplingParamsError, match=r"prompt_logprobs must be None or in \[0, 20\]"):
        SamplingParams(prompt_logprobs=count)


def test_a_bool_is_not_a_number() -> None:
    with pytest.raises(SamplingParamsError, match="temperature must be a finite number"):
        SamplingParams(temperature=True)  # type: ignore[arg-type]


def test_params_are_immutable_and_hashable() -> None:
    """Requests share them, and caches key on them (the engine fuzzer's solo runs)."""
    params = SamplingParams(temperature=0.0, stop_token_ids=[3, 4])  # type: ignore[arg-type]
    assert params.stop_token_ids == (3, 4) and hash(params) == hash(SamplingParams(0.0, stop_token_ids=(3, 4)))
    with pytest.raises(dataclasses.FrozenInstanceError):
        params.max_tokens = 99  # type: ignore[misc]


def test_the_defaults() -> None:
    """What `SamplingParams()` means to a caller: plain sampling at temperature 1, no filter, 16 tokens
    (OpenAI's completions default), a drawn seed, no logprobs."""
    assert SamplingParams() == SamplingParams(
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        min_p=0.0,
        max_tokens=16,
        ignore_eos=False,
        stop_token_ids=(),
        seed=None,
        logprobs=0,
        prompt_logprobs=None,
    )
