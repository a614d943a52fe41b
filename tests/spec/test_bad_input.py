"""Bad input is a clear error naming the problem, and nothing else is lost: other requests in the
same engine still finish, with the same tokens they get when run alone."""

from __future__ import annotations

import pytest

from spec.engine_config import EngineConfig
from spec.errors import InvalidRequestError, SamplingParamsError
from spec.model_config import ModelConfig
from spec.request import FinishReason, check_request
from spec.sampling_params import SamplingParams

GOOD_PROMPTS = [[11, 22, 33, 44, 55], [7, 8, 9]]
GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"temperature": -0.5}, "temperature must be >= 0"),
        ({"temperature": float("nan")}, "temperature must be a finite number"),
        ({"temperature": float("inf")}, "temperature must be a finite number"),
        ({"top_k": -2}, "top_k must be -1 or 0"),
        ({"top_k": 2.5}, "top_k must be an integer"),
        ({"top_p": 0.0}, r"top_p must be in \(0, 1\]"),
        ({"top_p": 1.5}, r"top_p must be in \(0, 1\]"),
        ({"min_p": -0.1}, r"min_p must be in \[0, 1\]"),
        ({"min_p": 1.1}, r"min_p must be in \[0, 1\]"),
        ({"max_tokens": 0}, "max_tokens must be >= 1"),
        ({"max_tokens": True}, "max_tokens must be an integer"),
        ({"ignore_eos": "yes"}, "ignore_eos must be a bool"),
        ({"stop_token_ids": "12"}, "stop_token_ids must be a sequence of ints"),
        ({"stop_token_ids": (3, -1)}, "stop_token_ids entries must be >= 0"),
        ({"seed": -1}, r"seed must be in \[0, 2\*\*63 - 1\]"),
        ({"seed": 2**63}, r"seed must be in \[0, 2\*\*63 - 1\]"),
        ({"logprobs": 21}, r"logprobs must be in \[0, 20\]"),
        ({"logprobs": -1}, r"logprobs must be in \[0, 20\]"),
    ],
)
def test_invalid_sampling_params_are_named(settings: dict[str, object], message: str) -> None:
    with pytest.raises(SamplingParamsError, match=message):
        SamplingParams(**settings)  # type: ignore[arg-type]


def run_alone(make_engine, prompt: list[int]) -> tuple[int, ...]:
    return make_engine(block_size=4, num_blocks=64, max_model_len=64).generate([prompt], GREEDY)[0].token_ids


@pytest.mark.parametrize(
    ("prompt", "params", "message"),
    [
        ([], GREEDY, "the prompt is empty"),
        ([1, 2, 384], GREEDY, r"token ids outside the vocabulary \[0, 384\): \[384\]"),
        ([1, -3], GREEDY, r"outside the vocabulary \[0, 384\): \[-3\]"),
        ([5] * 64, GREEDY, "prompt of 64 tokens leaves no room to generate within max_model_len 64"),
        ([5] * 40, SamplingParams(max_tokens=30), r"needs 16 KV blocks \(63 tokens\) but the pool has only 12"),
        ("some text", GREEDY, "the engine takes token ids"),
    ],
)
def test_bad_request_is_rejected_and_others_finish(make_engine, prompt, params: SamplingParams, message: str) -> None:
    engine = make_engine(block_size=4, num_blocks=12, max_model_len=64)
    good_ids = [engine.add_request(p, GREEDY) for p in GOOD_PROMPTS]
    engine.step()  # the good requests are already running when the bad one arrives
    with pytest.raises(InvalidRequestError, match=message):
        engine.add_request(prompt, params)
    outputs = {}
    while engine.has_unfinished:
        outputs.update({o.request_id: o for o in engine.step() if o.finished})
    for request_id, prompt_ids in zip(good_ids, GOOD_PROMPTS, strict=True):
        assert outputs[request_id].finish_reason is FinishReason.LENGTH
        assert outputs[request_id].token_ids == run_alone(make_engine, prompt_ids)


def test_duplicate_request_id_is_rejected(make_engine) -> None:
    engine = make_engine()
    engine.add_request([1, 2], GREEDY, request_id="a")
    with pytest.raises(InvalidRequestError, match="request id 'a' is already in use"):
        engine.add_request([3], GREEDY, request_id="a")
    assert engine.generate([[4]], GREEDY)[0].finish_reason is FinishReason.LENGTH


def test_abort_finishes_once_and_frees_blocks(make_engine) -> None:
    engine = make_engine(block_size=4, num_blocks=32)
    keep = engine.add_request(GOOD_PROMPTS[0], GREEDY)
    drop = engine.add_request(GOOD_PROMPTS[1], GREEDY)
    engine.step()
    aborted = engine.abort(drop)
    assert aborted.finish_reason is FinishReason.ABORT and len(aborted.token_ids) == 1
    with pytest.raises(KeyError, match="no unfinished request"):
        engine.abort(drop)
    finished = {}
    while engine.has_unfinished:
        finished.update({o.request_id: o for o in engine.step() if o.finished})
    assert set(finished) == {keep}
    assert finished[keep].token_ids == run_alone(make_engine, GOOD_PROMPTS[0])
    assert all(block.ref_count == 0 for block in engine.scheduler.allocator.snapshot().blocks)


def test_waiting_request_can_be_aborted(make_engine) -> None:
    engine = make_engine(block_size=4, num_blocks=32, max_num_seqs=1)
    first = engine.add_request(GOOD_PROMPTS[0], GREEDY)
    second = engine.add_request(GOOD_PROMPTS[1], GREEDY)
    engine.step()
    assert engine.abort(second).finish_reason is FinishReason.ABORT
    outputs = engine.generate([GOOD_PROMPTS[1]], GREEDY)
    assert outputs[0].token_ids == run_alone(make_engine, GOOD_PROMPTS[1])
    assert first not in {o.request_id for o in outputs}


def test_reference_engine_refuses_tensor_parallelism(tiny_weights) -> None:
    from reference.engine import ReferenceEngine
    from spec.engine_config import EngineConfig
    from spec.errors import ConfigError

    config, state_dict = tiny_weights
    with pytest.raises(ConfigError, match="tensor_parallel_size 2 is for the fast engine"):
        ReferenceEngine(config, state_dict, EngineConfig(tensor_parallel_size=2), device="cpu")


def test_a_request_that_needs_exactly_the_whole_pool_is_accepted() -> None:
    """The pool's bound is inclusive: 12 blocks of 4 hold 48 cached tokens (a 40-token prompt and 9 outputs),
    one more output needs a 13th block."""
    model = ModelConfig("Qwen3ForCausalLM", 384, 64, 128, 2, 4, 2, 16, 1e-6, 1e4, 1024, True)
    config = EngineConfig(block_size=4, num_blocks=12, max_model_len=64).resolved(model)
    assert check_request("a", [5] * 40, SamplingParams(max_tokens=9), 384, config) == (5,) * 40
    with pytest.raises(InvalidRequestError, match=r"needs 13 KV blocks \(49 tokens\) but the pool has only 12"):
        check_request("b", [5] * 40, SamplingParams(max_tokens=10), 384, config)
