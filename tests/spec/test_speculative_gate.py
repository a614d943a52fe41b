"""Speculation turned off by acceptance (spec.speculative.AcceptanceGate, spec.scheduling step 2b): a request
whose drafts are rejected stops asking for them, backs off and probes again; one whose drafts hold keeps
asking; in a large step only a request with a proven acceptance asks. None of it changes an output.

The output counts at which a request is asked for a draft follow from the rule by hand (each test says
how). The fast engine runs the pause-and-probe count through the interpreter (seconds a case, so only
that one); the scheduler fuzzer (fuzz/test_scheduler_fuzz.py) holds both schedulers' gates, large steps
included, to its oracle twin's at every step."""

from __future__ import annotations

import random

import pytest

from spec.errors import ConfigError
from spec.sampling_params import SamplingParams
from spec.speculative import AcceptanceGate, SpeculativeConfig, is_large_batch
from tests.engines import ENGINE_NAMES
from tests.spec.speculation import PlantedDrafts, always_right, assert_same_outputs, spy_verifies
from tests.spec.test_speculative import FP32_RULE, make_engine

# Small gates, so that a request of a dozen outputs pauses and probes: judged on 2 verify chunks, paused
# for 3 outputs, then 4 (the most).
GATE = {"acceptance_window": 2, "min_acceptance_rate": 0.25, "backoff_outputs": 3, "max_backoff_outputs": 4}


def prompts(seed: int, *lengths: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(384) for _ in range(length)] for length in lengths]


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, logprobs=1)


def planted_engine(engine_name, tiny_weights, plain, wrong, k: int = 2, **gate: object):
    """A speculative engine whose drafts are the plain run's tokens, wrong where `wrong` says."""
    settings = {"batch_invariant": True} if engine_name == "fast" else {}
    engine = make_engine(engine_name, tiny_weights, SpeculativeConfig("ngram", k, **gate), **settings)
    drafts = PlantedDrafts(plain, tiny_weights[0].vocab_size, wrong)
    engine.scheduler.proposer = drafts
    return engine, drafts


def plain_run(engine_name, tiny_weights, prompt_ids, params):
    settings = {"batch_invariant": True} if engine_name == "fast" else {}
    return make_engine(engine_name, tiny_weights, **settings).generate(prompt_ids, params)


def tolerance(engine_name: str) -> float:
    return 0.0 if engine_name == "fast" else FP32_RULE


# -- the gate alone ----------------------------------------------------------------------------------


def test_gate_pauses_backs_off_and_probes() -> None:
    gate = AcceptanceGate(SpeculativeConfig("ngram", 4, **GATE))
    assert gate.may_propose(1, large_batch=False)
    assert not gate.record(4, 0, num_outputs=2)  # one verify chunk: the window of 2 is not full
    assert gate.record(4, 0, num_outputs=3)  # 0 of 8 accepted: paused for 3 outputs
    assert [gate.may_propose(n, large_batch=False) for n in (3, 5, 6)] == [False, False, True]
    assert gate.record(4, 0, num_outputs=7)  # the probe alone fails: paused for 4 (3 doubled, at most 4)
    assert gate.resume_at == 11
    assert not gate.record(4, 4, num_outputs=16)  # a probe that holds: proposing again, back-off reset
    assert gate.backoff == 3 and gate.may_propose(16, large_batch=False)
    assert not gate.may_propose(16, large_batch=True)  # one verify since the pause proves nothing
    assert not gate.record(4, 3, num_outputs=20)
    assert gate.may_propose(20, large_batch=True)  # 7 of 8 accepted over a full window


def test_an_empty_proposal_counts_as_a_rejected_draft_token() -> None:
    gate = AcceptanceGate(SpeculativeConfig("ngram", 4, **GATE))
    assert not gate.record_empty_proposal(num_outputs=1)  # the window of 2 is not full
    assert gate.record_empty_proposal(num_outputs=2)  # 0 of 2: paused for 3 outputs
    assert gate.state() == (5, 4, True, ())
    assert not gate.record(4, 4, num_outputs=9)  # a probe that holds: back-off reset
    assert gate.state() == (5, 3, False, ((4, 4),))
    assert not gate.record_empty_proposal(num_outputs=10)  # 4 of 5 accepted over the window: no pause


def test_large_steps_and_disabled_gates() -> None:
    config = SpeculativeConfig("ngram", 2)
    assert (config.acceptance_window, config.min_acceptance_rate, config.large_batch_rows) == (4, 0.25, 32)
    assert not is_large_batch(config, 31) and is_large_batch(config, 32)
    assert not is_large_batch(SpeculativeConfig("ngram", 2, large_batch_rows=None), 10_000)
    never = AcceptanceGate(SpeculativeConfig("ngram", 2, acceptance_window=1, min_acceptance_rate=0.0))
    assert not any(never.record(2, 0, num_outputs=n) for n in range(2, 40))  # rate 0: never paused


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"acceptance_window": 0}, "'acceptance_window' must be a positive integer"),
        ({"min_acceptance_rate": 1.5}, "'min_acceptance_rate' must be a fraction in \\[0, 1\\]"),
        ({"large_batch_acceptance_rate": -0.1}, "'large_batch_acceptance_rate' must be a fraction"),
        ({"min_acceptance_rate": True}, "'min_acceptance_rate' must be a fraction"),
        ({"large_batch_rows": 0}, "'large_batch_rows' must be a positive integer"),
        ({"backoff_outputs": 8, "max_backoff_outputs": 4}, "backoff_outputs 8 exceeds max_backoff_outputs 4"),
    ],
)
def test_bad_gate_settings_are_named(settings: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        SpeculativeConfig("ngram", 2, **settings)


# -- engines ---------------------------------------------------------------------------------------


@pytest.mark.differential
@pytest.mark.parametrize("engine_name", ENGINE_NAMES)
def test_wrong_drafts_stop_and_are_probed_while_right_drafts_keep_going(engine_name: str, tiny_weights) -> None:
    """K = 2, 14 outputs each, side by side (a step of 2 decoding chunks is not large: each request's gate
    alone decides).

    Request 0, drafts always wrong: asked at 1 and 2 outputs (each verify keeps one token); the window of 2
    then holds 0 of 4 accepted: paused to 3 + 3 = 6. The probe at 6 fails: paused to 7 + 4 = 11 (the
    back-off doubled, held to 4). The probe at 11 fails: paused to 16, past the end. 4 verify chunks in 13
    decode steps.
    Request 1, drafts always right: every verify chunk keeps 3 tokens, so it is asked at 1, 4, 7 and 10; at
    13 a draft would pass max_tokens (draft_limit 0) and its last step is plain."""
    prompt_ids, params = prompts(11, 6, 9), [greedy(14), greedy(14)]
    plain = plain_run(engine_name, tiny_weights, prompt_ids, params)
    engine, drafts = planted_engine(engine_name, tiny_weights, plain, lambda request, _: request == 0, **GATE)
    log = spy_verifies(engine)
    assert_same_outputs(engine.generate(prompt_ids, params), plain, tolerance(engine_name))
    assert drafts.asked_at(0) == [1, 2, 6, 11]
    assert drafts.asked_at(1) == [1, 4, 7, 10]
    assert sorted(log.verifies) == [(2, 1)] * 4 + [(2, 3)] * 4  # rejected at once; accepted whole


@pytest.mark.differential
def test_a_request_the_proposer_finds_nothing_for_pauses_and_probes(tiny_weights) -> None:
    """K = 2, 14 outputs each, side by side, GATE as above: request 0's drafts are always empty (its tokens
    never repeat, say), request 1's always right. Request 0 is asked at 1 and 2 outputs (each empty
    proposal recorded as one rejected draft token); the window then holds 0 of 2: paused to 2 + 3 = 5. The
    probe at 5 finds nothing: paused to 5 + 4 = 9, then 9 + 4 = 13, where draft_limit is 0. Without the
    pauses it would be asked at every one of its 13 decode steps, and none of them could be planned ahead
    of the last step's tokens (fast.scheduler.Scheduler.may_propose_next). Request 1 as in the test above.
    The reference engine only: the rule lives in spec.speculative and the schedulers, and the scheduler
    fuzzer holds the fast scheduler's gates to the oracle's at every step."""
    prompt_ids, params = prompts(11, 6, 9), [greedy(14), greedy(14)]
    plain = plain_run("reference", tiny_weights, prompt_ids, params)
    engine, drafts = planted_engine("reference", tiny_weights, plain, always_right, **GATE)
    drafts.silent = frozenset({0})
    log = spy_verifies(engine)
    assert_same_outputs(engine.generate(prompt_ids, params), plain, tolerance("reference"))
    assert drafts.asked_at(0) == [1, 2, 5, 9]
    assert drafts.asked_at(1) == [1, 4, 7, 10]
    assert sorted(log.verifies) == [(2, 3)] * 4  # request 1's, accepted whole; request 0 never verifies


@pytest.mark.differential
def test_outputs_are_unchanged_while_requests_pause_and_probe(tiny_weights) -> None:
    """Greedy and seeded sampling with logprobs, side by side, 8 outputs each: request 0's drafts are always
    wrong (judged on every verify chunk: asked at 1, paused to 2 + 2 = 4, the probe at 4 fails: paused to
    5 + 4, past the end), request 1's always right (asked at 1 and 4; at 7 draft_limit is 0), request 2's
    wrong at every other output index. The reference engine only: the gate lives in the scheduler, and the
    fast engine runs its gated plans bitwise in the test above (and seeded sampling with drafts in
    test_speculative.py); its interpreter costs seconds a case."""
    engine_name = "reference"
    prompt_ids = prompts(13, 5, 9, 7)
    params = [
        greedy(8),
        SamplingParams(temperature=0.9, top_k=40, seed=5, max_tokens=8, ignore_eos=True, logprobs=2),
        SamplingParams(temperature=0.7, seed=6, max_tokens=8, ignore_eos=True, logprobs=1),
    ]
    plain = plain_run(engine_name, tiny_weights, prompt_ids, params)
    gate = {"acceptance_window": 1, "min_acceptance_rate": 0.5, "backoff_outputs": 2, "max_backoff_outputs": 8}
    engine, drafts = planted_engine(
        engine_name, tiny_weights, plain, lambda request, index: request == 0 or (request == 2 and index % 2), **gate
    )
    assert_same_outputs(engine.generate(prompt_ids, params), plain, tolerance(engine_name))
    assert drafts.asked_at(0) == [1, 4]
    assert drafts.asked_at(1) == [1, 4]
    assert drafts.asked_at(2), "request 2 was never asked"


@pytest.mark.differential
def test_in_a_large_step_only_a_proven_request_proposes(tiny_weights) -> None:
    """large_batch_rows 2, K = 2, drafts always right. A runs alone first: asked at 1 and 4 outputs, a full
    window of 2 accepted whole. B arrives and is admitted beside A's decode chunk (not a large step: A asked
    at 7). From then on both decode: every step is large and only A (proven) asks, at 10, 13 and 16, its
    last (19 of 19 outputs). B, with no window, asks only once it decodes alone: at 4, 7 and 10 of its 12."""
    prompt_ids, params = prompts(14, 6, 8), [greedy(19), greedy(12)]
    plain = plain_run("reference", tiny_weights, prompt_ids, params)
    engine, drafts = planted_engine("reference", tiny_weights, plain, always_right, large_batch_rows=2, **GATE)
    ids = [engine.add_request(prompt_ids[0], params[0])]
    for _ in range(3):  # the prompt, then two verify chunks
        engine.step()
    assert drafts.asked_at(0) == [1, 4]
    ids.append(engine.add_request(prompt_ids[1], params[1]))
    finished = {}
    while engine.has_unfinished:
        finished |= {output.request_id: output for output in engine.step() if output.finished}
    assert drafts.asked_at(0) == [1, 4, 7, 10, 13, 16]
    assert drafts.asked_at(1) == [4, 7, 10]
    assert_same_outputs([finished[request_id] for request_id in ids], plain, FP32_RULE)
