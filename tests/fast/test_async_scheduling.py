"""EngineConfig.async_scheduling: the fast engine schedules step n+1 while step n runs, and does
exactly what it does step by step: the same plans, the same runner inputs, the same outputs. Where
no logprobs are asked for, step n+1 is also launched before step n's tokens are read; then a
request added in between joins step n+2, the one departure from the step-by-step plans.

On the CPU nothing runs beside the host, so these tests check the decisions, not the overlap (the
time saved is a GPU measurement). The scheduled-ahead path must actually run (StepTimings.ahead_steps),
and fall back to stepping where a token's value can finish a request (stop ids, end of sequence).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from fast.engine import FastEngine
from reports.bench.workloads import build_workload
from reports.serving import host_overhead
from spec.engine_config import EngineConfig
from spec.request import PENDING_TOKEN, FinishLimits, LifecycleError, Request, RequestOutput
from spec.sampling_params import SamplingParams
from tests.engines import build_engine, logits_in_one_buffer, record_executed_plans

MAX_TOKENS = 5


def test_the_host_path_makes_the_same_plans_inputs_and_outputs_ahead() -> None:
    """offline-256 at 5% (13 requests) on the host-only engine: plan, input and output digests agree."""
    phase = build_workload("offline-256", 0.05).phases[0]
    step_by_step = host_overhead.digest_run(phase, host_overhead.HostSettings(scale=0.05))
    ahead = host_overhead.digest_run(phase, host_overhead.HostSettings(scale=0.05, async_scheduling=True))
    assert ahead == step_by_step and step_by_step["num_plans"] > 10


def fast_engine(tiny_weights, async_scheduling: bool, **settings: object) -> FastEngine:
    config, state_dict = tiny_weights
    engine_config = EngineConfig(block_size=4, check_invariants=True, async_scheduling=async_scheduling, **settings)
    return build_engine("fast", config, state_dict, engine_config)  # type: ignore[return-value]


def greedy(**changes: object) -> SamplingParams:
    return replace(SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=2), **changes)


def streaming_script(engine: FastEngine) -> list[RequestOutput]:
    """Arrivals and aborts between steps while a plan made ahead waits (a waiting request, a running
    one with a chunk in that plan), and a request a stop id can end (its steps cannot go ahead).
    The engine runs at most two requests at once."""
    outputs: list[RequestOutput] = []
    engine.add_request([5, 6, 7, 8, 9, 10], greedy(max_tokens=9), "a")
    engine.add_request([11, 12, 13], greedy(max_tokens=4), "b")
    outputs += engine.step()
    engine.add_request([30, 31], greedy(), "d")  # waits: two are running
    outputs.append(engine.abort("d"))
    outputs.append(engine.abort("b"))  # its chunk leaves the plan, and its seat is free
    engine.add_request([5, 6, 7, 8, 20], greedy(stop_token_ids=(3,), max_tokens=3), "c")  # admitted into it
    steps_since_c_finished = None
    while engine.has_unfinished:
        outputs += engine.step()
        if steps_since_c_finished is None and any(o.request_id == "c" and o.finished for o in outputs):
            steps_since_c_finished = 0
        elif steps_since_c_finished is not None:
            steps_since_c_finished += 1
        if steps_since_c_finished == 1:  # a step without "c" went ahead: its plan waits
            engine.add_request([40, 41, 42, 43, 44, 45, 46, 47, 48], greedy(), "e")
    return outputs


def test_streaming_arrivals_and_aborts_give_the_same_plans_and_outputs(tiny_weights) -> None:
    runs = {}
    for ahead in (False, True):
        engine = fast_engine(tiny_weights, ahead, max_num_seqs=2)
        plans = record_executed_plans(engine)
        runs[ahead] = (plans, streaming_script(engine), engine)
    (plans, outputs, _), (ahead_plans, ahead_outputs, engine) = runs[False], runs[True]
    assert ahead_plans == plans
    assert ahead_outputs == outputs
    # Some steps went ahead, and those where "c" (a stop id can end it) sampled did not.
    steps_sampling_c = sum(any(c.request_id == "c" and c.samples for c in plan.chunks) for plan in plans)
    assert 0 < engine.step_timings.ahead_steps <= len(plans) - steps_sampling_c
    assert 0 < engine.step_timings.prepared_ahead_steps < engine.step_timings.ahead_steps
    assert engine.scheduler.allocator.num_free_blocks == engine.config.pool_blocks


def test_chunked_prefill_and_preemption_give_the_same_plans_and_outputs(tiny_weights) -> None:
    """A pool too small for the batch and a budget smaller than the prompts, every request ignore_eos:
    every step is scheduled ahead, through preemptions and recomputation."""
    prompts = [[(7 * i + j) % 300 + 1 for j in range(n)] for i, n in enumerate((9, 3, 14, 6))]
    runs = {}
    for ahead in (False, True):
        engine = fast_engine(tiny_weights, ahead, num_blocks=9, max_num_batched_tokens=8)
        plans = record_executed_plans(engine)
        outputs = engine.generate(prompts, greedy())
        runs[ahead] = (plans, outputs, engine)
    (plans, outputs, _), (ahead_plans, ahead_outputs, engine) = runs[False], runs[True]
    assert any(plan.preempted for plan in plans), "the pool must force a preemption"
    assert ahead_plans == plans and ahead_outputs == outputs
    assert engine.step_timings.ahead_steps == len(plans)
    # Every step but the first ran from inputs loaded ahead, decode rows filled in from the sampled tokens.
    assert engine.step_timings.prepared_ahead_steps == len(plans) - 1


def test_prompt_scoring_steps_planned_ahead_beside_pending_decode_rows(tiny_weights) -> None:
    """Async scheduling beside prompt scoring: two requests run at once, and each waiting request asking
    prompt_logprobs is admitted in a plan made ahead, when a running one finishes by length, into a step
    whose other rows decode with tokens still pending on the host. Such a step has more logit rows than
    sequences; it is not loaded ahead (fast.engine._prepare_ahead), and the step after it is. Tokens,
    logprobs, prompt logprobs and plans equal the step-by-step engine's."""
    prompts = [[5, 6, 7, 8, 9, 10], [11, 12, 13], [20, 21, 22, 23, 24, 25, 26], [30, 31, 32]]
    params = [
        greedy(max_tokens=7),
        greedy(max_tokens=2, logprobs=0),
        greedy(max_tokens=3, prompt_logprobs=2),
        greedy(max_tokens=2, prompt_logprobs=1, logprobs=0),
    ]
    runs = {}
    for ahead in (False, True):
        engine = fast_engine(tiny_weights, ahead, max_num_seqs=2)
        plans = record_executed_plans(engine)
        runs[ahead] = (plans, engine.generate(prompts, params), engine)
    (plans, outputs, _), (ahead_plans, ahead_outputs, engine) = runs[False], runs[True]
    assert [o.prompt_logprobs is not None for o in outputs] == [False, False, True, True]
    assert ahead_plans == plans
    assert ahead_outputs == outputs
    late = {outputs[2].request_id, outputs[3].request_id}
    scoring = [i for i, plan in enumerate(plans) if any(c.request_id in late and c.start == 0 for c in plan.chunks)]
    assert len(scoring) == 2 and all(len(plans[i].chunks) == 2 for i in scoring), "each beside a decode row"
    assert engine.step_timings.ahead_steps == len(plans)  # every plan was made ahead, the scoring ones too
    assert 0 < engine.step_timings.prepared_ahead_steps <= len(plans) - 1 - len(scoring)


def test_a_pending_token_is_resolved_once() -> None:
    request = Request("r", (1, 2), SamplingParams(max_tokens=3), seed=0, arrival_index=0)
    request.admit(0)
    with pytest.raises(LifecycleError, match="no pending token"):
        request.resolve_pending_token(7)
    request.append_token(PENDING_TOKEN)
    request.resolve_pending_token(7)
    assert request.output_token_ids == [7]
    with pytest.raises(LifecycleError, match="no pending token"):
        request.resolve_pending_token(8)


@pytest.mark.parametrize(
    ("params", "eos", "by_length"),
    [
        (SamplingParams(ignore_eos=True), frozenset({2}), True),
        (SamplingParams(), frozenset(), True),
        (SamplingParams(), frozenset({2}), False),
        (SamplingParams(ignore_eos=True, stop_token_ids=(5,)), frozenset({2}), False),
    ],
)
def test_which_requests_can_be_scheduled_ahead(params: SamplingParams, eos: frozenset[int], by_length: bool) -> None:
    assert FinishLimits.of(params, 3, eos, 100).by_length_only is by_length


# ----------------------------------------------------------------------------- steps launched ahead


def tokens_only(**changes: object) -> SamplingParams:
    """No logprobs: a step's logits are not read after sampling, so the next step may be launched first."""
    return greedy(logprobs=0, **changes)


def test_steps_launched_ahead_give_the_same_plans_and_outputs(tiny_weights) -> None:
    """Chunked prefill and preemption as above, without logprobs: the steps after the first are
    launched before the last one's tokens are read, and plans and outputs stay the step-by-step ones."""
    prompts = [[(7 * i + j) % 300 + 1 for j in range(n)] for i, n in enumerate((9, 3, 14, 6))]
    runs = {}
    for ahead in (False, True):
        engine = fast_engine(tiny_weights, ahead, num_blocks=9, max_num_batched_tokens=8)
        plans = record_executed_plans(engine)
        runs[ahead] = (plans, engine.generate(prompts, tokens_only()), engine)
    (plans, outputs, _), (ahead_plans, ahead_outputs, engine) = runs[False], runs[True]
    assert any(plan.preempted for plan in plans), "the pool must force a preemption"
    assert ahead_plans == plans and ahead_outputs == outputs
    assert engine.step_timings.launched_ahead_steps == len(plans) - 1
    assert engine.scheduler.allocator.num_free_blocks == engine.config.pool_blocks


def test_arrivals_and_aborts_while_a_step_is_launched_ahead(tiny_weights) -> None:
    """A request added while a step is launched joins the step after it; a request aborted while its
    chunk runs in a launched step gets no token from it and frees its blocks. Each request's tokens
    equal the step-by-step engine's (the tiny model's greedy tokens do not depend on the batch)."""
    runs = {}
    for ahead in (False, True):
        engine = fast_engine(tiny_weights, ahead, max_num_seqs=3)
        plans = record_executed_plans(engine)
        engine.add_request([5, 6, 7, 8, 9, 10], tokens_only(max_tokens=9), "a")
        engine.add_request([11, 12, 13], tokens_only(max_tokens=6), "b")
        engine.step()
        launched = engine._in_flight
        engine.add_request([30, 31], tokens_only(), "d")
        aborted = engine.abort("b")
        finished = {}
        while engine.has_unfinished:
            finished.update((o.request_id, o) for o in engine.step() if o.finished)
        runs[ahead] = (plans, finished, aborted, launched, engine)
    (plans, finished, aborted, _, _), (ahead_plans, ahead_finished, ahead_aborted, launched, engine) = (
        runs[False],
        runs[True],
    )
    assert launched is not None and {c.request_id for c in launched.plan.chunks} == {"a", "b"}
    # Step by step, "d" joins the second step; ahead it joins the third, and "b" ran in the second.
    assert {c.request_id for c in plans[1].chunks} == {"a", "d"}
    assert {c.request_id for c in ahead_plans[1].chunks} == {"a"}
    assert {c.request_id for c in ahead_plans[2].chunks} == {"a", "d"}
    assert ahead_aborted.token_ids == aborted.token_ids and len(aborted.token_ids) == 1
    assert {k: v.token_ids for k, v in ahead_finished.items()} == {k: v.token_ids for k, v in finished.items()}
    assert engine.step_timings.launched_ahead_steps > 0
    assert engine.scheduler.allocator.num_free_blocks == engine.config.pool_blocks


def test_aborting_every_request_of_a_launched_step(tiny_weights) -> None:
    """The launched step's plan is empty: the next step drops it and schedules afresh."""
    engine = fast_engine(tiny_weights, True)
    engine.add_request([5, 6, 7], tokens_only(), "a")
    engine.step()
    assert engine._in_flight is not None
    engine.abort("a")
    assert not engine.has_unfinished
    engine.add_request([8, 9], tokens_only(max_tokens=2), "b")
    outputs = engine.generate([[8, 9]], tokens_only(max_tokens=2))
    expected = fast_engine(tiny_weights, False).generate([[8, 9]], tokens_only(max_tokens=2))
    assert [o.token_ids for o in outputs] == [o.token_ids for o in expected]
    assert engine.scheduler.allocator.num_free_blocks == engine.config.pool_blocks


def test_logits_read_after_a_step_are_read_before_the_next_launch(tiny_weights) -> None:
    """A budget of one token: the last prompt position is scored in a step of its own, with no sampling
    row, and the step after it (the first output, by length only) could be launched before the scored
    logits are read. Found by the whole-engine fuzzer on an H200 (reports/results/fuzz/engine_soak_h200/):
    the next step's graph replay rewrote the logits, and the prompt's last logprob was the next position's.
    Launching ahead must wait for every logit row the host reads: prompt logprobs as logprobs."""
    prompts = [[35, 37, 3, 37, 18, 22, 18, 17, 24], [5, 6, 7]]
    params = [tokens_only(max_tokens=3, prompt_logprobs=0), tokens_only(max_tokens=2, prompt_logprobs=1)]
    outputs = {}
    for ahead in (False, True):
        engine = fast_engine(tiny_weights, ahead, max_num_batched_tokens=1)
        logits_in_one_buffer(engine)  # on the CPU as graph replays on a GPU
        outputs[ahead] = engine.generate(prompts, params)
    scored = [len(output.prompt_logprobs) for output in outputs[True]]
    assert scored == [len(prompt) for prompt in prompts]
    assert outputs[True] == outputs[False]
    assert engine.step_timings.launched_ahead_steps > 0  # the output steps still go ahead of each other
