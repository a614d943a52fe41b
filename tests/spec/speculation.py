"""Helpers of the speculative-decoding tests: a proposer with planted wrong tokens, and a spy on the
verify chunks an engine's scheduler applies."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from spec.request import RequestOutput
from spec.scheduling import StepPlan


def periodically_wrong(request: int, index: int) -> bool:
    """PlantedDrafts' default: output index i of every request is wrong when i % 7 in (2, 3)."""
    return index % 7 in (2, 3)


def always_right(request: int, index: int) -> bool:
    return False


@dataclass
class PlantedDrafts:
    """Proposes what a plain run produced next, with the tokens at some output indices made wrong.

    So a test gets drafts accepted whole, cut after a few agreeing tokens and rejected at once, on a
    random model whose outputs prompt lookup would rarely guess. wrong(request, i): whether output
    index i of the request (its index in `plain`) is guessed wrong; beyond the plain output (a request
    that stopped), every guess is wrong; a request in `silent` gets empty drafts. `asked` records (request,
    its output count) per draft asked for.
    """

    plain: Sequence[RequestOutput]
    vocab_size: int
    wrong: Callable[[int, int], bool] = periodically_wrong
    silent: frozenset[int] = frozenset()  # requests the proposer finds nothing for: their drafts are empty
    calls: int = 0
    asked: list[tuple[int, int]] = field(default_factory=list)

    def propose(self, token_ids: Sequence[Sequence[int]], max_tokens: Sequence[int]) -> list[tuple[int, ...]]:
        self.calls += 1
        return [self._draft(list(tokens), limit) for tokens, limit in zip(token_ids, max_tokens, strict=True)]

    def asked_at(self, request: int) -> list[int]:
        """The output counts at which a draft was asked for `request`, in order."""
        return [done for asked, done in self.asked if asked == request]

    def _draft(self, tokens: list[int], limit: int) -> tuple[int, ...]:
        request, output = max(
            ((i, o) for i, o in enumerate(self.plain) if tokens[: len(o.prompt_token_ids)] == list(o.prompt_token_ids)),
            key=lambda pair: len(pair[1].prompt_token_ids),
        )
        done = len(tokens) - len(output.prompt_token_ids)
        self.asked.append((request, done))
        if request in self.silent:
            return ()
        draft = []
        for index in range(done, done + limit):
            truth = output.token_ids[index] if index < len(output.token_ids) else 0
            wrong = self.wrong(request, index) or index >= len(output.token_ids)
            draft.append((truth + 1) % self.vocab_size if wrong else truth)
        return tuple(draft)


@dataclass
class VerifyLog:
    """Per verify chunk applied: (draft length, tokens appended)."""

    verifies: list[tuple[int, int]] = field(default_factory=list)

    @property
    def accepted_whole(self) -> int:
        return sum(1 for drafted, appended in self.verifies if appended == drafted + 1)

    @property
    def rejected_at_once(self) -> int:
        return sum(1 for drafted, appended in self.verifies if appended == 1)

    @property
    def cut_midway(self) -> int:
        return sum(1 for drafted, appended in self.verifies if 1 < appended <= drafted)


def spy_verifies(engine) -> VerifyLog:
    """Record every verify chunk the engine's scheduler applies, without changing what it does."""
    log = VerifyLog()
    update = engine.scheduler.update

    def recording_update(plan: StepPlan, sampled):
        for chunk in plan.chunks:
            if chunk.draft_token_ids:
                tokens = sampled[chunk.request_id]
                log.verifies.append((len(chunk.draft_token_ids), 1 if isinstance(tokens, int) else len(tokens)))
        return update(plan, sampled)

    engine.scheduler.update = recording_update
    return log


def assert_same_outputs(speculative: Sequence[RequestOutput], plain: Sequence[RequestOutput], tolerance: float) -> None:
    """Token for token and finish for finish; logprobs (the token's and its top alternatives) within
    `tolerance` (0: bitwise)."""
    for spec_output, plain_output in zip(speculative, plain, strict=True):
        assert spec_output.token_ids == plain_output.token_ids, spec_output.request_id
        assert spec_output.finish_reason == plain_output.finish_reason, spec_output.request_id
        if plain_output.logprobs is None:
            assert spec_output.logprobs is None
            continue
        assert len(spec_output.logprobs) == len(plain_output.logprobs) == len(plain_output.token_ids)
        for ours, theirs in zip(spec_output.logprobs, plain_output.logprobs, strict=True):
            assert ours.token_id == theirs.token_id
            assert abs(ours.logprob - theirs.logprob) <= tolerance
            assert [token for token, _ in ours.top] == [token for token, _ in theirs.top]
            assert all(abs(a - b) <= tolerance for (_, a), (_, b) in zip(ours.top, theirs.top, strict=True))
