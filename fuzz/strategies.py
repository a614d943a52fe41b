"""Shared pieces of the state machines: token sequences with frequent common prefixes, and a
step wrapper that counts steps and checks state after each one.

Drawing is the larger part of a step's cost, so the draws are cheap ones: rule arguments are
drawn by strategies built once (reading the machine through `st.runner()` where they depend on
its state) rather than through `st.data()`, whose every draw copies the global random state twice
and notes its value; fresh tokens come from one `st.binary` choice (a byte per token, mapped onto
the alphabet) rather than a list of sampled tokens (two choices a token). Fewer choices also mean
fewer shrink passes. Everything still shrinks the same way: to shorter sequences, to token 0, to
the whole stem.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any, ClassVar, Concatenate, ParamSpec, Protocol, TypeVar

import hypothesis.strategies as st
from hypothesis import reject
from hypothesis.control import current_build_context
from hypothesis.errors import InvalidArgument, UnsatisfiedAssumption
from hypothesis.stateful import RuleBasedStateMachine

from fuzz import stats
from fuzz.workload import PROMPT_ALPHABET

BLOCK_SIZES = (1, 2, 4, 8, 16)
MAX_STEMS = 3


@functools.cache
def integers(low: int, high: int) -> st.SearchStrategy[int]:
    """`st.integers(low, high)`, built once per range: hypothesis's own strategy cache builds its key from
    the arguments at every call, which was the largest share of a soak step's drawing (fuzz/soak.py)."""
    return st.integers(low, high)


@functools.cache
def binary(min_size: int, max_size: int) -> st.SearchStrategy[bytes]:
    """`st.binary(...)`, built once per size range (see `integers`)."""
    return st.binary(min_size=min_size, max_size=max_size)


BOOLEANS = st.booleans()
RUNNER = st.runner()  # the machine, to strategies that read its state: one strategy, not one per draw


def tokens_from_bytes(raw: bytes, alphabet: Sequence[int] = PROMPT_ALPHABET) -> list[int]:
    """One token of `alphabet` per byte: byte 0 (where a byte shrinks to) is the alphabet's first token."""
    return [alphabet[byte % len(alphabet)] for byte in raw]


def draw_fresh_tokens(draw: st.DrawFn, min_size: int, max_size: int) -> list[int]:
    """`min_size` to `max_size` tokens of the prompt alphabet, drawn as one choice."""
    return tokens_from_bytes(draw(binary(min_size, max_size)))


@functools.cache  # a strategy built anew is validated anew on its first draw: build each once
def prefix_stems(max_length: int) -> st.SearchStrategy[list[list[int]]]:
    """A small pool of token sequences; prompts start with a piece of one, so cache hits are common."""
    stem = st.binary(min_size=1, max_size=max_length).map(tokens_from_bytes)
    return st.lists(stem, min_size=1, max_size=MAX_STEMS)


def pick(draw: st.DrawFn, options: Sequence[Any]) -> Any:
    """One of `options` (not empty), shrinking to the first: `st.sampled_from` without building a strategy."""
    return options[draw(integers(0, len(options) - 1))]


def draw_tokens(draw: st.DrawFn, stems: Sequence[Sequence[int]], max_length: int) -> list[int]:
    """1 to `max_length` tokens: a leading piece of a stem, then fresh tokens."""
    stem = pick(draw, stems)
    longest = min(len(stem), max_length)
    # Often the whole stem (where this shrinks to): shared whole blocks are what the prefix cache serves.
    keep = draw(integers(0, longest)) if draw(BOOLEANS) else longest
    return [*stem[:keep], *draw_fresh_tokens(draw, 0 if keep else 1, max_length - keep)]


# A long run's time limit in seconds from the process's start ($TWINFER_FUZZ_TIME_LIMIT_S): once it has passed, the
# next example to start ends the session as SIGINT would (`FuzzTimeLimit`). A signal can arrive inside a finalizer,
# where Python prints the KeyboardInterrupt and drops it, and the run goes on until it is killed without a record
# (reports/results/fuzz/engine_fuzz_100k_e/); an example's start is a point in this code, where nothing swallows it.
TIME_LIMIT_VARIABLE = "TWINFER_FUZZ_TIME_LIMIT_S"
_PROCESS_STARTED = time.monotonic()


class FuzzTimeLimit(KeyboardInterrupt):
    """The run's time limit has passed: pytest ends the session as interrupted (exit status 2), the statistics
    record says "interrupted" and its verdict is the failures the machines counted (fuzz/stats_report.py)."""


def stop_at_time_limit() -> None:
    """Raise FuzzTimeLimit once $TWINFER_FUZZ_TIME_LIMIT_S seconds have passed since the process started."""
    value = os.environ.get(TIME_LIMIT_VARIABLE)
    if not value:
        return
    try:
        limit_s = float(value)
    except ValueError:
        raise ValueError(f"{TIME_LIMIT_VARIABLE} must be a number of seconds, got {value!r}") from None
    if time.monotonic() - _PROCESS_STARTED >= limit_s:
        raise FuzzTimeLimit(f"{TIME_LIMIT_VARIABLE}={value}: the run's time limit has passed")


class SteppedMachine(Protocol):
    steps_run: int
    healthy: bool

    def after_step(self) -> None: ...
    def failures_screened(self) -> AbstractContextManager[None]: ...


P = ParamSpec("P")
M = TypeVar("M", bound=SteppedMachine)


def checked_step(method: Callable[Concatenate[M, P], None]) -> Callable[Concatenate[M, P], None]:
    """Run a rule, then the machine's checks. `healthy` stays False if either raised, so
    teardown does not pile a second failure on the first."""

    @functools.wraps(method)
    def run_rule_then_check(self: M, *args: P.args, **kwargs: P.kwargs) -> None:
        self.healthy = False
        self.steps_run += 1
        with self.failures_screened():
            method(self, *args, **kwargs)
            self.after_step()
        self.healthy = True

    return run_rule_then_check


class CountedMachine(RuleBasedStateMachine):
    """Bookkeeping the state machines share: examples and steps counted under `stats_label`,
    the step count of the latest run kept for the planted-bug tests, and the `healthy` flag
    that `checked_step` maintains. Subclasses put their per-step checks in `check_after_step`
    and the checks of a run's end in `check_at_teardown`."""

    stats_label: ClassVar[str]
    last_run_steps: ClassVar[int] = 0  # steps of the latest run: after a failure, the shrunk one's
    # Set by a planted-bug test only: the invariant or property that must catch its bug. An example
    # that fails otherwise first (another check, or the implementation raising) is discarded
    # (hypothesis.reject), so neither the search nor the shrinker settles on another failure: the
    # test shows that this check catches the bug on its own.
    expected_failure: ClassVar[str | None] = None

    def __init__(self) -> None:
        stop_at_time_limit()  # before anything is counted: the example does not run
        super().__init__()
        self.steps_run = 0
        self.healthy = True
        stats.bump(self.stats_label, "examples")
        stats.write_live()

    def after_step(self) -> None:
        type(self).last_run_steps = self.steps_run
        stats.bump(self.stats_label, "steps")
        self.check_after_step()

    def check_after_step(self) -> None:
        """Checks to run after every rule (none by default)."""

    def check_at_teardown(self) -> None:
        """Checks to run once a run's rules are done and none has failed (none by default)."""

    def teardown(self) -> None:
        type(self).last_run_steps = self.steps_run
        # Not after a failed check (report that failure alone), nor when hypothesis cut the run
        # short (it ran out of choices: the run is discarded, and a failure could not be recorded).
        if self.healthy and not _run_cut_short():
            with self.failures_screened():
                self.check_at_teardown()

    @contextmanager
    def failures_screened(self) -> Iterator[None]:
        """Failures pass through, except other failures than `expected_failure`'s where it is set. Each one
        that passes through is counted (`failures`), so that a long run's live counters say whether it has
        failed so far even if it is stopped before hypothesis reports."""
        try:
            yield
        except UnsatisfiedAssumption:
            raise  # an example discarded (reject), not a failure
        except Exception as failure:
            if self.expected_failure is not None and getattr(failure, "invariant", None) != self.expected_failure:
                stats.bump(self.stats_label, "examples_failing_otherwise")
                reject()
            stats.bump(self.stats_label, "failures")
            raise


def _run_cut_short() -> bool:
    """Whether hypothesis has stopped drawing for this run (an overrun) and is unwinding it."""
    try:
        context = current_build_context()
    except InvalidArgument:  # not run by hypothesis
        return False
    return bool(getattr(getattr(context, "data", None), "frozen", False))


def ignore(*_: Any) -> None:
    """A hypothesis reporter that drops what it is given (tests do not print)."""
