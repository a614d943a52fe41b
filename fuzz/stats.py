"""Counters the state machines keep, written out as JSON by fuzz/conftest.py at session end.

Every number comes from a counter bumped where the thing happens (a machine built, a rule
run, a snapshot checked); nothing is estimated.
"""

from __future__ import annotations

from collections import Counter, defaultdict

# machine label (e.g. "allocator[reference]") -> counter name -> count
_COUNTERS: defaultdict[str, Counter[str]] = defaultdict(Counter)


def bump(label: str, counter: str, amount: int = 1) -> None:
    _COUNTERS[label][counter] += amount


def counters(label: str) -> dict[str, int]:
    return dict(_COUNTERS.get(label, {}))


def all_counters() -> dict[str, dict[str, int]]:
    return {label: dict(sorted(values.items())) for label, values in sorted(_COUNTERS.items())}


def merge(machines: dict[str, dict[str, int]]) -> None:
    """Add counters taken elsewhere (an xdist worker's `all_counters()`) to these."""
    for label, values in machines.items():
        _COUNTERS[label].update(values)
