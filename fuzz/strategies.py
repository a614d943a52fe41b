"""Shared pieces of the state machines: token sequences with frequent common prefixes, and a
step wrapper that counts steps and checks state after each one."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Concatenate, ParamSpec, Protocol, TypeVar

import hypothesis.strategies as st
from hypothesis.stateful import RuleBasedStateMachine

from fuzz import stats
from fuzz.workload import PROMPT_ALPHABET

BLOCK_SIZES = (1, 2, 4, 8, 16)
MAX_STEMS = 3


def prefix_stems(max_length: int) -> st.SearchStrategy[list[list[int]]]:
    """A small pool of token sequences; prompts start with a piece of one, so cache hits are common."""
    stem = st.lists(st.sampled_from(PROMPT_ALPHABET), min_size=1, max_size=max_length)
    return st.lists(stem, min_size=1, max_size=MAX_STEMS)


def draw_tokens(data: st.DataObject, stems: Sequence[Sequence[int]], max_length: int) -> list[int]:
    """1 to `max_length` tokens: a leading piece of a stem, then fresh tokens."""
    stem = data.draw(st.sampled_from(stems), label="stem")
    longest = min(len(stem), max_length)
    # Often the whole stem: shared whole blocks are what the prefix cache serves.
    keep = data.draw(st.one_of(st.just(longest), st.integers(0, longest)), label="stem tokens kept")
    suffix = data.draw(
        st.lists(st.sampled_from(PROMPT_ALPHABET), min_size=0 if keep else 1, max_size=max_length - keep),
        label="fresh tokens",
    )
    return [*stem[:keep], *suffix]


class SteppedMachine(Protocol):
    steps_run: int
    healthy: bool

    def after_step(self) -> None: ...


P = ParamSpec("P")
M = TypeVar("M", bound=SteppedMachine)


def checked_step(method: Callable[Concatenate[M, P], None]) -> Callable[Concatenate[M, P], None]:
    """Run a rule, then the machine's checks. `healthy` stays False if either raised, so
    teardown does not pile a second failure on the first."""

    @functools.wraps(method)
    def run_rule_then_check(self: M, *args: P.args, **kwargs: P.kwargs) -> None:
        self.healthy = False
        self.steps_run += 1
        method(self, *args, **kwargs)
        self.after_step()
        self.healthy = True

    return run_rule_then_check


class CountedMachine(RuleBasedStateMachine):
    """Bookkeeping both state machines share: examples and steps counted under `stats_label`,
    the step count of the latest run kept for the planted-bug tests, and the `healthy` flag
    that `checked_step` maintains. Subclasses put their per-step checks in `check_after_step`."""

    stats_label: ClassVar[str]
    last_run_steps: ClassVar[int] = 0  # steps of the latest run: after a failure, the shrunk one's

    def __init__(self) -> None:
        super().__init__()
        self.steps_run = 0
        self.healthy = True
        stats.bump(self.stats_label, "examples")

    def after_step(self) -> None:
        type(self).last_run_steps = self.steps_run
        stats.bump(self.stats_label, "steps")
        self.check_after_step()

    def check_after_step(self) -> None:
        """Checks to run after every rule (none by default)."""

    def teardown(self) -> None:
        type(self).last_run_steps = self.steps_run


def ignore(*_: Any) -> None:
    """A hypothesis reporter that drops what it is given (tests do not print)."""
