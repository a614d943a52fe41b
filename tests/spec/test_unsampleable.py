"""Unsampleable rows (spec.sampling) end a request with FinishReason.ERROR (spec.request), on both engines.

The rule itself: `unsampleable_rows` and the codes. End to end: a request whose logits are made non-finite at
one output position (tests.engines.plant_non_finite: the model is untouched, the row is planted just before
sampling) keeps the tokens before it, finishes with ERROR and a message naming the cause and the position,
and reports no logprobs for it; every other request of the same run gets exactly the tokens, logprobs and
finish of a clean run. On the fast engine also with async scheduling (steps planned and launched ahead of
the failing token) and with speculative decoding (the planted position inside a verify chunk).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from spec.agreement import token_logprobs_agree
from spec.engine_config import EngineConfig
from spec.request import (
    PENDING_TOKEN,
    FinishReason,
    LifecycleError,
    Request,
    RequestOutput,
    TokenLogprobs,
    unsampleable_error,
)
from spec.sampling import (
    UNSAMPLEABLE_CAUSES,
    UNSAMPLEABLE_NAN,
    UNSAMPLEABLE_NO_FINITE,
    UNSAMPLEABLE_POSITIVE_INF,
    unsampleable_rows,
)
from spec.sampling_params import SamplingParams
from spec.speculative import SpeculativeConfig
from tests.engines import ENGINE_NAMES, build_engine, plant_non_finite, plant_rows
from tests.spec.speculation import PlantedDrafts, always_right

INF, NAN = float("inf"), float("nan")


def test_unsampleable_rows_are_nan_or_positive_inf_or_no_finite_value() -> None:
    logits = torch.tensor(
        [
            [1.0, INF, 0.5, 2.0],
            [NAN, 0.0, 0.0, 0.0],
            [-INF, -INF, -INF, -INF],
            [-INF, -INF, 3.0e38, -INF],  # -inf is masking: one finite value is enough
            [NAN, INF, -INF, 1.0],
            [-3.0e38, -1.0, 0.0, 1.0],
        ]
    )
    assert unsampleable_rows(logits).tolist() == [True, True, True, False, True, False]


def test_the_codes_are_never_token_ids_nor_the_pending_placeholder() -> None:
    codes = {UNSAMPLEABLE_NAN, UNSAMPLEABLE_POSITIVE_INF, UNSAMPLEABLE_NO_FINITE}
    assert codes == set(UNSAMPLEABLE_CAUSES) and len(codes) == 3
    assert all(code < 0 and code != PENDING_TOKEN for code in codes)
    assert unsampleable_error(UNSAMPLEABLE_NAN, 7) == "the model produced non-finite logits (NaN) at output position 7"
    assert "(+inf)" in unsampleable_error(UNSAMPLEABLE_POSITIVE_INF, 0)
    assert "(all -inf)" in unsampleable_error(UNSAMPLEABLE_NO_FINITE, 3)
    with pytest.raises(ValueError, match="not an unsampleable"):
        unsampleable_error(PENDING_TOKEN, 0)


def test_a_request_fails_only_on_its_pending_placeholder_once_finished() -> None:
    request = Request("r", (1, 2), SamplingParams(), seed=0, arrival_index=0)
    request.admit(0)
    request.append_token(5)
    request.append_token(PENDING_TOKEN)
    with pytest.raises(LifecycleError, match="running"):  # the scheduler finishes it first
        request.fail_pending_token(UNSAMPLEABLE_NAN)
    request.finish(FinishReason.LENGTH)  # the placeholder was its last allowed token
    request.fail_pending_token(UNSAMPLEABLE_NAN)
    output = request.output()
    assert (output.token_ids, output.finish_reason) == ((5,), FinishReason.ERROR)
    assert output.error == "the model produced non-finite logits (NaN) at output position 1"
    with pytest.raises(LifecycleError, match="no pending token"):
        request.fail_pending_token(UNSAMPLEABLE_NAN)


# -- end to end -------------------------------------------------------------------------------

PROMPTS = [[1, 2, 3, 4, 5], [7, 8, 9, 7, 8, 9, 7], [11, 12, 13]]
FAILING = 7  # the request whose prompt starts with 7 gets the non-finite row
MAX_TOKENS = 6


def run_params(logprobs: int) -> list[SamplingParams]:
    """Greedy, seeded and seeded with filters; logprobs asked for (or not: then async steps launch ahead)."""
    return [
        SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=logprobs),
        SamplingParams(seed=5, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=logprobs),
        SamplingParams(seed=6, top_k=20, top_p=0.9, min_p=0.01, max_tokens=MAX_TOKENS, ignore_eos=True),
    ]


def make(name: str, tiny_weights, **settings: object):
    config, state_dict = tiny_weights
    return build_engine(
        name, config, state_dict, EngineConfig(block_size=4, num_blocks=64, check_invariants=True, **settings)
    )


def fails(request: Request) -> bool:
    return request.prompt_token_ids[0] == FAILING


def check_outputs(clean: list[RequestOutput], outputs: list[RequestOutput], position: int, cause: str) -> None:
    for index, (expected, got) in enumerate(zip(clean, outputs, strict=True)):
        if PROMPTS[index][0] != FAILING:  # untouched: the clean run's output, its logprobs within fp32's 1e-4
            assert replace(got, logprobs=None) == replace(expected, logprobs=None), index
            assert logprobs_close(got.logprobs, expected.logprobs), index
            continue
        assert got.finish_reason is FinishReason.ERROR
        assert got.token_ids == expected.token_ids[:position]
        assert got.error == f"the model produced non-finite logits ({cause}) at output position {position}"
        if expected.logprobs is not None:
            assert logprobs_close(got.logprobs, expected.logprobs[:position])


def logprobs_close(got: tuple[TokenLogprobs, ...] | None, expected: tuple[TokenLogprobs, ...] | None) -> bool:
    """fp32's rule position by position: a batch that loses a request changes shape, and the CPU's matmuls may
    round otherwise at another shape (the H200 host's 16-core BLAS did: run_34d1239)."""
    if got is None or expected is None:
        return got is expected
    return len(got) == len(expected) and all(map(token_logprobs_agree, got, expected))


CONFIGS = {
    "reference": [{}],
    "fast": [{"async_scheduling": False}, {"async_scheduling": True}],
}
CASES = [(name, settings) for name in ENGINE_NAMES for settings in CONFIGS[name]]


@pytest.mark.parametrize(("name", "settings"), CASES, ids=[f"{n}-{s}" for n, s in CASES])
@pytest.mark.parametrize(
    ("kind", "cause", "position", "logprobs"),
    [
        ("nan", "NaN", 3, 2),
        ("+inf", "+inf", 0, 0),  # the prefill's row: no token at all
        ("-inf", "all -inf", MAX_TOKENS - 1, 0),  # the last token: the placeholder had finished it by length
        ("nan", "NaN", 2, 0),
    ],
)
def test_a_non_finite_row_fails_its_request_and_no_other(
    tiny_weights, name: str, settings: dict, kind: str, cause: str, position: int, logprobs: int
) -> None:
    params = run_params(logprobs)
    clean = make(name, tiny_weights, **settings).generate(PROMPTS, params)
    engine = make(name, tiny_weights, **settings)
    plant_non_finite(engine, kind, position, fails)
    outputs = engine.generate(PROMPTS, params)
    check_outputs(clean, outputs, position, cause)
    assert not engine.has_unfinished
    allocator = engine.scheduler.allocator  # type: ignore[attr-defined]
    assert allocator.num_free_blocks == engine.config.num_blocks  # the failed request's blocks were freed
    if settings.get("async_scheduling") and not logprobs:
        assert engine.step_timings.launched_ahead_steps > 0  # type: ignore[attr-defined]


def spy_failing_verifies(engine) -> list[tuple[int, ...]]:
    """The tokens the scheduler applies for each verify chunk of the failing request."""
    applied: list[tuple[int, ...]] = []
    update = engine.scheduler.update

    def recording_update(plan, sampled):
        for chunk in plan.chunks:
            request = engine.request(chunk.request_id)
            if chunk.draft_token_ids and fails(request):
                tokens = sampled[chunk.request_id]
                applied.append((tokens,) if isinstance(tokens, int) else tuple(tokens))
        return update(plan, sampled)

    engine.scheduler.update = recording_update
    return applied


@pytest.mark.parametrize(("name", "settings"), CASES, ids=[f"{n}-{s}" for n, s in CASES])
@pytest.mark.parametrize("position", [2, 4])
def test_a_non_finite_draft_position_stops_acceptance_and_fails_the_request(
    tiny_weights, name: str, settings: dict, position: int
) -> None:
    """Drafts always right: the planted position falls inside a verify chunk (checked), past agreeing drafts."""
    params = run_params(1)
    speculative = SpeculativeConfig("ngram", 3, large_batch_rows=None)
    plain = make(name, tiny_weights, **settings).generate(PROMPTS, params)

    def speculating_engine():
        engine = make(name, tiny_weights, speculative=speculative, **settings)
        engine.scheduler.proposer = PlantedDrafts(plain, engine.model_config.vocab_size, always_right)
        return engine

    clean = speculating_engine().generate(PROMPTS, params)  # a verify row's logprobs round as verify rows do
    engine = speculating_engine()
    applied = spy_failing_verifies(engine)
    plant_non_finite(engine, "nan", position, fails)
    outputs = engine.generate(PROMPTS, params)
    check_outputs(clean, outputs, position, "NaN")
    # The failing position was a verify chunk's row after agreeing drafts: applied as kept tokens, then pending.
    assert applied and applied[-1][-1] == PENDING_TOKEN and len(applied[-1]) > 1, applied
    assert engine.scheduler.allocator.num_free_blocks == engine.config.num_blocks  # type: ignore[attr-defined]


def test_a_request_added_while_another_fails_runs_as_it_would_alone(tiny_weights) -> None:
    """The failed request's room goes to the next one (async scheduling drops it from the plan made ahead)."""
    params = run_params(0)
    clean = make("fast", tiny_weights, async_scheduling=True, max_num_seqs=1).generate(PROMPTS, params)
    engine = make("fast", tiny_weights, async_scheduling=True, max_num_seqs=1)
    plant_non_finite(engine, "+inf", 1, fails)
    outputs = engine.generate(PROMPTS, params)
    check_outputs(clean, outputs, 1, "+inf")


def choose_token_zero(row: torch.Tensor) -> None:
    """Token 0 far ahead of every other: greedy and seeded rows alike sample it (the Gumbel noise spans < 20)."""
    row.fill_(-30.0)
    row[0] = 30.0


@pytest.mark.parametrize(("name", "settings"), CASES, ids=[f"{n}-{s}" for n, s in CASES])
def test_token_zero_ending_a_verify_chunk_is_a_token_not_a_code(tiny_weights, name: str, settings: dict) -> None:
    """Codes are negative: token 0 (a real token; ignore_eos) as the model's own token after agreeing drafts
    ends its verify chunk and the request goes on, with the tokens of a plain run given the same logits."""
    params, position = run_params(0), 2
    plain = make(name, tiny_weights, **settings).generate(PROMPTS, params)
    expected_engine = make(name, tiny_weights, **settings)
    plant_rows(expected_engine, choose_token_zero, position, fails)
    expected = expected_engine.generate(PROMPTS, params)
    engine = make(name, tiny_weights, speculative=SpeculativeConfig("ngram", 3, large_batch_rows=None), **settings)
    engine.scheduler.proposer = PlantedDrafts(plain, engine.model_config.vocab_size, always_right)
    applied = spy_failing_verifies(engine)
    plant_rows(engine, choose_token_zero, position, fails)
    outputs = engine.generate(PROMPTS, params)
    assert [(o.token_ids, o.finish_reason) for o in outputs] == [(o.token_ids, o.finish_reason) for o in expected]
    failing = next(o for o, prompt in zip(outputs, PROMPTS, strict=True) if prompt[0] == FAILING)
    assert failing.token_ids[position] == 0 and failing.finish_reason is FinishReason.LENGTH
    # Token 0 closed a verify chunk after kept drafts (the plain run's token there was not 0, so its draft failed).
    assert any(len(tokens) > 1 and tokens[-1] == 0 for tokens in applied), applied
