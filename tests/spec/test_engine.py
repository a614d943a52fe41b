"""Engine behaviour: finishing rules, the step API, logprobs, and the LLM entry point."""

from __future__ import annotations

from pathlib import Path

import pytest

from spec.engine_config import EngineConfig
from spec.errors import ConfigError, InvalidRequestError, SamplingParamsError
from spec.request import FinishReason, RequestStatus
from spec.sampling_params import SamplingParams
from twinfer import LLM

PROMPT = [17, 4, 250, 31, 8, 99]


def greedy_tokens(make_engine, count: int = 20) -> tuple[int, ...]:
    params = SamplingParams(temperature=0.0, max_tokens=count, ignore_eos=True)
    return make_engine().generate([PROMPT], params)[0].token_ids


def test_stop_token_ends_the_request_and_is_kept(make_engine) -> None:
    reference = greedy_tokens(make_engine)
    stop = reference[5]
    first = reference.index(stop)
    output = make_engine().generate([PROMPT], SamplingParams(temperature=0.0, max_tokens=20, stop_token_ids=(stop,)))[0]
    assert output.finish_reason is FinishReason.STOP
    assert output.token_ids == reference[: first + 1]


def test_eos_ends_the_request_unless_ignored(make_engine, tiny_weights) -> None:
    config, _ = tiny_weights
    (eos,) = config.eos_token_ids
    # Find a prompt whose greedy continuation produces EOS within 64 tokens.
    params = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
    engine = make_engine()
    candidates = [[eos], [eos, eos], [1, eos], [eos, 5, eos]]
    outputs = engine.generate(candidates, params)
    with_eos = [(p, o) for p, o in zip(candidates, outputs, strict=True) if eos in o.token_ids]
    assert with_eos, "no candidate prompt generated EOS; pick other candidates"
    prompt, ignoring = with_eos[0]
    stopping = engine.generate([prompt], SamplingParams(temperature=0.0, max_tokens=64))[0]
    assert stopping.finish_reason is FinishReason.STOP
    assert stopping.token_ids == ignoring.token_ids[: ignoring.token_ids.index(eos) + 1]
    assert ignoring.finish_reason is FinishReason.LENGTH and len(ignoring.token_ids) == 64


def test_max_model_len_ends_the_request(make_engine) -> None:
    engine = make_engine(max_model_len=10)
    output = engine.generate([PROMPT], SamplingParams(temperature=0.0, max_tokens=50, ignore_eos=True))[0]
    assert output.finish_reason is FinishReason.LENGTH
    assert len(output.token_ids) == 10 - len(PROMPT)
    assert output.token_ids == greedy_tokens(make_engine)[:4]


def test_step_api_streams_one_token_per_step(make_engine) -> None:
    engine = make_engine()
    request_id = engine.add_request(PROMPT, SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True))
    lengths = []
    while engine.has_unfinished:
        (output,) = engine.step()
        assert output.request_id == request_id
        lengths.append(len(output.token_ids))
    assert lengths == [1, 2, 3]
    assert output.finished and engine.step() == []


def test_logprobs_count_and_chosen_token(make_engine) -> None:
    output = make_engine().generate([PROMPT], SamplingParams(temperature=0.7, max_tokens=8, logprobs=3, seed=1))[0]
    assert output.logprobs is not None and len(output.logprobs) == len(output.token_ids)
    for token_id, entry in zip(output.token_ids, output.logprobs, strict=True):
        assert entry.token_id == token_id and len(entry.top) == 3
        top_values = [value for _, value in entry.top]
        assert top_values == sorted(top_values, reverse=True)
        assert entry.logprob <= top_values[0] + 1e-6
        if token_id in dict(entry.top):
            assert dict(entry.top)[token_id] == pytest.approx(entry.logprob)
    assert make_engine().generate([PROMPT], SamplingParams(max_tokens=2))[0].logprobs is None


def test_lifecycle_is_enforced() -> None:
    from spec.request import LifecycleError, Request

    request = Request("r", (1, 2), SamplingParams(), seed=0, arrival_index=0)
    with pytest.raises(LifecycleError, match="cannot preempt request 'r': it is waiting"):
        request.preempt()
    request.admit(0)
    assert request.status is RequestStatus.RUNNING
    request.finish(FinishReason.LENGTH)
    with pytest.raises(LifecycleError, match="finished twice"):
        request.finish(FinishReason.ABORT)


def test_a_request_refuses_counts_past_its_tokens() -> None:
    """Computing more tokens than the request holds, a second logprobs entry for one output token and prompt
    logprobs at a position past the prompt's last are each a LifecycleError naming the numbers: an engine's
    bookkeeping slip is caught where it happens, not carried into the outputs."""
    from spec.request import LifecycleError, Request, TokenLogprobs

    request = Request("r", (1, 2, 3), SamplingParams(logprobs=1, prompt_logprobs=0), seed=0, arrival_index=0)
    request.admit(0)
    request.advance_computed(2)
    with pytest.raises(LifecycleError, match=r"cannot compute 2 more tokens \(2 of 3 computed\)"):
        request.advance_computed(2)
    request.advance_computed(1)
    request.append_token(7)
    request.append_logprobs(TokenLogprobs(7, -0.5))
    with pytest.raises(LifecycleError, match="more logprobs than output tokens"):
        request.append_logprobs(TokenLogprobs(7, -0.5))
    request.record_prompt_logprobs(2, TokenLogprobs(3, -1.0))  # the last prompt position
    with pytest.raises(LifecycleError, match="no prompt position 3 to score"):
        request.record_prompt_logprobs(3, TokenLogprobs(7, -0.5))
    assert request.output().logprobs == (TokenLogprobs(7, -0.5),)


def test_token_span_reads_exactly_the_tokens_asked_for() -> None:
    """token_span(start, n) is all_token_ids[start:start + n] wherever the span lies: in the prompt, across the
    prompt's end, or in the output (with output tokens left after the span)."""
    from spec.request import Request

    request = Request("r", (1, 2, 3), SamplingParams(), seed=0, arrival_index=0)
    request.output_token_ids.extend([4, 5, 6, 7, 8, 9])  # as append_token would, without the lifecycle
    tokens = request.all_token_ids
    for start in range(len(tokens) + 1):
        for num_tokens in range(len(tokens) - start + 1):
            assert request.token_span(start, num_tokens) == tokens[start : start + num_tokens], (start, num_tokens)


def test_finish_limits_say_when_only_the_length_can_finish_a_request() -> None:
    """by_length_only exactly when no token value can finish the request: eos ignored (or none) and no stop ids;
    the pending-token placeholder is never a token id a prompt, a stop id or an end-of-sequence id can hold."""
    from spec.engine_config import EngineConfig
    from spec.request import PENDING_TOKEN, FinishLimits, check_request

    eos = frozenset({2})
    cases = [
        (SamplingParams(ignore_eos=True), eos, True),
        (SamplingParams(), frozenset(), True),
        (SamplingParams(), eos, False),
        (SamplingParams(ignore_eos=True, stop_token_ids=(5,)), eos, False),
    ]
    for params, eos_ids, expected in cases:
        assert FinishLimits.of(params, 3, eos_ids, 64).by_length_only is expected, (params, eos_ids)
    assert PENDING_TOKEN < 0
    with pytest.raises(InvalidRequestError, match="outside the vocabulary"):
        check_request("r", [1, PENDING_TOKEN], SamplingParams(), 384, EngineConfig(max_model_len=64))
    with pytest.raises(SamplingParamsError, match="stop_token_ids entries must be >= 0"):
        SamplingParams(stop_token_ids=(PENDING_TOKEN,))


def test_a_verify_chunks_rows_are_positioned_and_split_per_request() -> None:
    """sampling_positions: a request's row samples at its output count, the rows of a verify chunk that follow it
    at one more each; step_results gives each request its own rows (a plain chunk one, a verify chunk 1 + draft,
    cut where the draft is rejected) whatever comes before and after them."""
    from spec.engine import SampledToken, sampling_positions, step_results
    from spec.request import Request
    from spec.scheduling import ScheduledChunk, StepPlan

    requests = {name: Request(name, (1, 2), SamplingParams(), 0, n) for n, name in enumerate(("a", "b", "c"))}
    requests["a"].output_token_ids.extend([5, 6])
    requests["b"].output_token_ids.extend([7] * 5)
    rows = [requests[name] for name in ("a", "b", "b", "b", "c")]
    assert sampling_positions(rows) == [2, 5, 6, 7, 0]
    assert sampling_positions(rows[1:]) == [5, 6, 7, 0]  # a verify chunk's rows first
    plan = StepPlan(
        chunks=(
            ScheduledChunk("a", 3, 1, True),
            ScheduledChunk("b", 6, 3, True, (40, 41)),
            ScheduledChunk("c", 0, 2, True),
        ),
        preempted=(),
        admitted=(),
    )
    results = step_results(plan, rows, [10, 40, 9, 8, 30], [None] * 5, lambda request: frozenset())
    assert results == {
        "a": SampledToken(10, None),
        "b": SampledToken(40, None, (SampledToken(9, None),)),
        "c": SampledToken(30, None),
    }


def test_params_are_broadcast_to_the_prompts_or_refused() -> None:
    """No params: the defaults for every prompt; one: shared; a list: one per prompt, of exactly their number."""
    from spec.engine import broadcast_params

    assert broadcast_params(None, 3) == [SamplingParams()] * 3
    greedy = SamplingParams(temperature=0.0)
    assert broadcast_params(greedy, 2) == [greedy, greedy]
    assert broadcast_params([greedy, SamplingParams()], 2) == [greedy, SamplingParams()]
    with pytest.raises(InvalidRequestError, match="2 sampling params for 3 prompts"):
        broadcast_params([greedy, greedy], 3)


def test_generate_returns_once_its_own_requests_finish_and_seeds_from_the_whole_range(
    make_engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """generate steps until its own prompts finish, leaving a request added before it running; an unseeded
    request draws its seed from all of [0, MAX_SEED] (the largest draw is MAX_SEED itself)."""
    import spec.engine
    from spec.sampling_params import MAX_SEED

    monkeypatch.setattr(spec.engine.secrets, "randbelow", lambda bound: bound - 1)
    engine = make_engine(block_size=4, num_blocks=64)
    long = engine.add_request(PROMPT, SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True))
    (output,) = engine.generate([PROMPT[:3]], SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True))
    assert len(output.token_ids) == 2 and engine.has_unfinished
    assert engine.request(long).seed == MAX_SEED


def test_a_speculative_engine_applies_every_accepted_token_with_its_logprobs(make_engine, tiny_weights) -> None:
    """With drafts that are always right (planted from a plain run), each verify step appends its accepted
    tokens, each with its logprobs entry: the same tokens and logprobs as the plain run, in fewer steps."""
    from spec.speculative import SpeculativeConfig
    from tests.spec.speculation import PlantedDrafts

    params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True, logprobs=1)
    plain = make_engine(block_size=4, num_blocks=64).generate([PROMPT], params)
    engine = make_engine(block_size=4, num_blocks=64, speculative=SpeculativeConfig("ngram", 3, large_batch_rows=None))
    engine.scheduler.proposer = PlantedDrafts(plain, tiny_weights[0].vocab_size, lambda request, index: False)
    engine.add_request(PROMPT, params, request_id="r")
    steps, outputs = 0, []
    while engine.has_unfinished:
        steps += 1
        outputs = engine.step() or outputs
    assert outputs[0].token_ids == plain[0].token_ids and steps < len(plain[0].token_ids)
    assert [entry.token_id for entry in outputs[0].logprobs] == list(plain[0].token_ids)


def test_a_request_counts_preemptions_and_keeps_its_first_admissions_prefix_hit() -> None:
    """A new request has no cached prompt tokens and no preemption; each preemption counts one; a readmission's
    prefix hit does not replace the first admission's (what RequestOutput.num_cached_prompt_tokens reports)."""
    from spec.request import Request

    request = Request("r", (1, 2, 3, 4, 5, 6, 7, 8, 9), SamplingParams(), seed=0, arrival_index=0)
    assert (request.num_cached_prompt_tokens, request.num_preemptions, request.was_admitted) == (0, 0, False)
    assert request.output().num_cached_prompt_tokens == 0
    request.admit(4)
    request.preempt()
    request.admit(8)
    request.preempt()
    assert (request.num_preemptions, request.num_cached_prompt_tokens, request.was_admitted) == (2, 4, True)
    request.admit(0)
    assert request.output().num_cached_prompt_tokens == 4 and request.num_computed_tokens == 0


def test_outputs_and_logprobs_are_frozen_and_prompts_hold_only_ints() -> None:
    """What an engine hands out (RequestOutput, TokenLogprobs) cannot be changed afterwards; a prompt token that
    is a bool or a float (even an integral one) is refused like an id outside the vocabulary."""
    from dataclasses import FrozenInstanceError

    from spec.request import Request, TokenLogprobs, check_request

    output = Request("r", (1, 2), SamplingParams(), seed=0, arrival_index=0).output()
    with pytest.raises(FrozenInstanceError):
        output.token_ids = (3,)  # type: ignore[misc]
    with pytest.raises(FrozenInstanceError):
        TokenLogprobs(3, -0.5).logprob = 0.0  # type: ignore[misc]
    config = EngineConfig(max_model_len=64, num_blocks=64)
    for bad in (True, 2.0):
        with pytest.raises(InvalidRequestError, match=r"outside the vocabulary \[0, 384\)"):
            check_request("r", [1, bad], SamplingParams(), 384, config)  # type: ignore[list-item]
    assert check_request("r", [1, 383], SamplingParams(), 384, config) == (1, 383)


def test_invariants_are_checked_exactly_when_asked(make_engine) -> None:
    """check_invariants: the scheduler's state is observed at every step; without it, never (it costs a snapshot)."""
    for check in (True, False):
        engine = make_engine(block_size=4, num_blocks=64, check_invariants=check)
        observed: list[int] = []
        snapshot = engine.scheduler.snapshot

        def counting_snapshot(snapshot=snapshot, observed=observed):
            observed.append(1)
            return snapshot()

        engine.scheduler.snapshot = counting_snapshot
        engine.generate([PROMPT], SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True))
        assert (len(observed) >= 3) if check else not observed, (check, len(observed))


def test_a_finished_request_is_forgotten_and_logprobs_need_a_count_per_token(make_engine) -> None:
    """Once finished, a request is no longer the engine's: looking it up or aborting it is a KeyError. token_logprobs
    takes one count per token (a missing one is an error, not a token dropped). The default device is CUDA exactly
    where it is available."""
    import torch

    from spec.engine import default_device, token_logprobs

    engine = make_engine(block_size=4, num_blocks=64)
    request_id = engine.add_request(PROMPT, SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True))
    assert engine.request(request_id).request_id == request_id
    while engine.has_unfinished:
        engine.step()
    with pytest.raises(KeyError):
        engine.request(request_id)
    with pytest.raises(KeyError, match="no unfinished request"):
        engine.abort(request_id)
    logits = torch.tensor([[0.0, 1.0, 2.0], [2.0, 1.0, 0.0]])
    entries = token_logprobs(logits, [2, 0], [1, 2])
    assert [len(entry.top) for entry in entries] == [1, 2] and [entry.token_id for entry in entries] == [2, 0]
    with pytest.raises(ValueError):
        token_logprobs(logits, [2, 0], [1])
    assert default_device().type == ("cuda" if torch.cuda.is_available() else "cpu")


def test_empty_counts_and_the_first_prompt_position_are_refused() -> None:
    """Advancing by zero tokens and prompt logprobs at position 0 (no token precedes it) are LifecycleErrors; a
    prompt's bad ids are named, the first five of them."""
    from spec.request import LifecycleError, Request, TokenLogprobs, check_request

    request = Request("r", (1, 2, 3), SamplingParams(prompt_logprobs=0), seed=0, arrival_index=0)
    request.admit(0)
    with pytest.raises(LifecycleError, match=r"cannot compute 0 more tokens \(0 of 3 computed\)"):
        request.advance_computed(0)
    with pytest.raises(LifecycleError, match="no prompt position 0 to score"):
        request.record_prompt_logprobs(0, TokenLogprobs(1, -0.5))
    config = EngineConfig(max_model_len=64, num_blocks=64)
    with pytest.raises(InvalidRequestError, match=r"\[0, 384\): \[-1, 384, 385, 386, 387\]$"):
        check_request("r", [5, -1, 384, 385, 386, 387, 388], SamplingParams(), 384, config)


def test_output_carries_each_field() -> None:
    # Request.output builds RequestOutput by position (it runs for every request every step).
    from spec.request import Request, TokenLogprobs

    params = SamplingParams(logprobs=1, prompt_logprobs=0)
    request = Request("r", (1, 2, 3), params, seed=0, arrival_index=0)
    request.admit(0)
    entry, prompt_entry = TokenLogprobs(7, -0.5), TokenLogprobs(2, -1.5)
    request.record_prompt_logprobs(1, prompt_entry)
    request.append_token(7)
    request.append_logprobs(entry)
    request.num_cached_prompt_tokens = 16
    request.finish(FinishReason.STOP)
    output = request.output("seven")
    assert output.request_id == "r" and output.prompt_token_ids == (1, 2, 3) and output.token_ids == (7,)
    assert output.finish_reason is FinishReason.STOP and output.num_cached_prompt_tokens == 16
    assert output.logprobs == (entry,) and output.text == "seven"
    assert output.prompt_logprobs == (None, prompt_entry, None)
    assert Request("q", (1,), SamplingParams(), 0, 0).output().logprobs is None


def test_llm_text_and_token_prompts(tiny_checkpoint: Path) -> None:
    llm = LLM(
        tiny_checkpoint,
        engine="reference",
        dtype="float32",
        device="cpu",
        engine_config=EngineConfig(block_size=8, num_blocks=64),
    )
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    text_output, ids_output = llm.generate(["Hello world!", llm.encode("Hello world!")], params)
    assert text_output.token_ids == ids_output.token_ids
    assert text_output.text == llm.tokenizer.decode(list(text_output.token_ids))
    (single,) = llm.generate(llm.encode("Hello world!"), params)
    assert single.token_ids == ids_output.token_ids


def test_llm_rejects_unknown_engine_and_empty_batch(tiny_checkpoint: Path) -> None:
    with pytest.raises(ConfigError, match="unknown engine 'turbo'"):
        LLM(tiny_checkpoint, engine="turbo", device="cpu")
    llm = LLM(tiny_checkpoint, dtype="float32", device="cpu")
    with pytest.raises(InvalidRequestError, match="no prompts given"):
        llm.generate([])
