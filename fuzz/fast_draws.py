"""A stand-in for hypothesis's ConjectureData that answers strategies' draws straight from a seeded
`random.Random`: the soak driver's draws (fuzz/random_driver.py).

A draw through ConjectureData records the choice, opens spans, validates the strategy at top level
and checks the buffer; profiled on the allocator machine, two thirds of a soak step went there. The
strategies themselves only call `draw`, `draw_integer`, `draw_boolean`, `draw_bytes` and the span
methods, so an object answering those runs the same strategies (composites, integers, booleans,
binary, lists, sampled_from, one_of, map, runner) with none of that bookkeeping. Hypothesis's own
runs of the same machines (tests, planted bugs) keep the real thing: validation, shrinking and
the coverage-guided search.

Draws are uniform (a boolean's `p` is honoured): the engine's choice of small values and its
mutations of earlier examples do not carry over. `fuzz/test_soak.py` shows the soak still reaches
the situations the pytest runs must reach.
"""

from __future__ import annotations

import random
from typing import Any

from hypothesis.strategies._internal.lazy import unwrap_strategies
from hypothesis.strategies._internal.strategies import SearchStrategy

# Where a strategy leaves a bound open, what a draw stays within (the machines bound every draw).
UNBOUNDED_SPAN = 2**16
# Strategies unwrapped once, for every example (holding them keeps ids from being reused); cleared past
# this size, in case a strategy is built anew at every draw.
_UNWRAPPED: dict[SearchStrategy, SearchStrategy] = {}
MAX_UNWRAPPED = 4096


class FastDraws:
    """Answers strategies' draws from `rng`. Not a ConjectureData: only what strategies call."""

    def __init__(self, rng: random.Random, runner: Any) -> None:
        self._rng = rng
        self.hypothesis_runner = runner  # what st.runner() draws
        self.depth = 0

    def draw(self, strategy: SearchStrategy, label: Any = None, observe_as: str | None = None) -> Any:
        unwrapped = _UNWRAPPED.get(strategy)
        if unwrapped is None:
            if len(_UNWRAPPED) >= MAX_UNWRAPPED:
                _UNWRAPPED.clear()
            unwrapped = _UNWRAPPED[strategy] = unwrap_strategies(strategy)
        return unwrapped.do_draw(self)

    def draw_integer(
        self,
        min_value: int | None = None,
        max_value: int | None = None,
        *,
        weights: dict[int, float] | None = None,
        shrink_towards: int = 0,
        forced: int | None = None,
        observe: bool = True,
    ) -> int:
        if forced is not None:
            return forced
        if weights is not None:
            values, chances = zip(*weights.items(), strict=True)
            if self._rng.random() < sum(chances):
                return self._rng.choices(values, chances)[0]
        low = min_value if min_value is not None else (max_value or 0) - UNBOUNDED_SPAN
        high = max_value if max_value is not None else low + 2 * UNBOUNDED_SPAN
        return self._rng.randint(low, high)

    def draw_boolean(self, p: float = 0.5, *, forced: bool | None = None, observe: bool = True) -> bool:
        if forced is not None:
            return forced
        return self._rng.random() < p

    def draw_bytes(
        self, min_size: int = 0, max_size: int = UNBOUNDED_SPAN, *, forced: bytes | None = None, observe: bool = True
    ) -> bytes:
        if forced is not None:
            return forced
        return self._rng.randbytes(self._rng.randint(min_size, min(max_size, min_size + UNBOUNDED_SPAN)))

    def start_span(self, label: int) -> None:
        self.depth += 1

    def stop_span(self, *, discard: bool = False) -> None:
        self.depth -= 1

    def mark_invalid(self, why: str | None = None) -> None:
        raise RuntimeError(f"a strategy rejected every draw it made ({why}): the soak's draws cannot serve it")
