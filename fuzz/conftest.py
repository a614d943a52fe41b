"""Hypothesis profiles for the fuzzers, and the statistics each run writes.

Profiles: `ci` (default) is derandomised and sized for the CI time budget (the whole fuzz
directory in about a minute of CPU); `deep` (`pytest fuzz --hypothesis-profile=deep`) runs thousands of
examples of up to 200 steps. The planted-bug tests and the engine fuzzer carry their own sizes.

At session end the counters in fuzz/stats.py are written as JSON to the path in the
environment variable TWINFER_FUZZ_STATS, by default `.fuzz-stats/<profile>.json` under the
repository root; under pytest-xdist the workers' counters are summed first (fuzz/stats_report.py).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.internal.conjecture import providers

# Every failure must replay the same way on every machine: no randomness, no example database.
_REPRODUCIBLE = dict(
    derandomize=True,
    database=None,
    deadline=None,
    print_blob=False,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)
settings.register_profile("ci", max_examples=100, stateful_step_count=50, **_REPRODUCIBLE)
settings.register_profile("deep", max_examples=1200, stateful_step_count=200, **_REPRODUCIBLE)
# Long runs bounded by a time limit, not an example count: random (seeded with --hypothesis-seed, so that
# runs side by side draw different examples), counters written as they go ($TWINFER_FUZZ_STATS_LIVE).
# The engine fuzzer takes its example count from $TWINFER_FUZZ_MAX_EXAMPLES (fuzz/test_engine_fuzz.py).
settings.register_profile(
    "soak",
    max_examples=1_000_000,
    stateful_step_count=50,
    **{**_REPRODUCIBLE, "derandomize": False},
)

# The fuzzers default to `ci`; a profile chosen on the command line (loaded by hypothesis's
# pytest plugin) is left alone.
if settings.get_current_profile_name() == "default":
    settings.load_profile("ci")

# The statistics' session hooks (xdist included), found here by name.
from fuzz.stats_report import pytest_sessionfinish, pytest_sessionstart, pytest_testnodedown  # noqa: E402, F401


@pytest.fixture(autouse=True)
def _no_local_constants(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Hypothesis mixes literal constants of the local modules imported so far into what it draws,
    so a derandomised run's examples would depend on which tests ran before it in the process
    (another module, or another xdist worker's share of the suite: the async-scheduling fuzzer once
    took 150 examples to find a planted bug after a tests/ module, 14 alone). The fuzzers draw with
    none, so a fuzz test draws the same examples wherever it runs. (Internals of hypothesis: where
    they are gone, there is nothing to pin.)"""
    if not (hasattr(providers, "_get_local_constants") and hasattr(providers, "CONSTANTS_CACHE")):
        yield
        return
    monkeypatch.setattr(providers, "_get_local_constants", providers.Constants)
    providers.CONSTANTS_CACHE.cache.clear()  # entries computed with the constants
    yield
    providers.CONSTANTS_CACHE.cache.clear()  # entries computed without them, for the tests after
