"""Counters the state machines keep, written out as JSON by fuzz/conftest.py at session end.

Every number comes from a counter bumped where the thing happens (a machine built, a rule
run, a snapshot checked); nothing is estimated.
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter, defaultdict
from pathlib import Path

# machine label (e.g. "allocator[reference]") -> counter name -> count
_COUNTERS: defaultdict[str, Counter[str]] = defaultdict(Counter)
# Where a long run writes its counters as it goes (every LIVE_EVERY_S at most), so that a run killed at
# its time limit still reports: the session-end file (fuzz/conftest.py) is written only if it ends.
LIVE_PATH_VARIABLE = "TWINFER_FUZZ_STATS_LIVE"
LIVE_EVERY_S = 10.0
_last_live_write = 0.0


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


def write_live() -> None:
    """Write the counters to $TWINFER_FUZZ_STATS_LIVE if it is set and the last write is LIVE_EVERY_S old.
    The machines call it as each example starts."""
    global _last_live_write
    path = os.environ.get(LIVE_PATH_VARIABLE)
    now = time.monotonic()
    if not path or now - _last_live_write < LIVE_EVERY_S:
        return
    _last_live_write = now
    destination = Path(path)
    destination.parent.mkdir(parents=True, exist_ok=True)
    partial = destination.with_name(destination.name + ".partial")
    partial.write_text(json.dumps({"written_at": time.time(), "machines": all_counters()}, indent=1) + "\n")
    os.replace(partial, destination)
