"""Hypothesis profiles for the fuzzers, and the statistics each run writes.

Profiles: `ci` (default) is derandomised and sized to run the whole fuzz directory in a few
minutes on a 2-core machine; `deep` (`pytest fuzz --hypothesis-profile=deep`) runs thousands of
examples of up to 200 steps. The planted-bug tests and the engine fuzzer carry their own sizes.

At session end the counters in fuzz/stats.py are written as JSON to the path in the
environment variable TWINFER_FUZZ_STATS, by default `.fuzz-stats/<profile>.json` under the
repository root; under pytest-xdist the workers' counters are summed first (fuzz/stats_report.py).
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings

# Every failure must replay the same way on every machine: no randomness, no example database.
_REPRODUCIBLE = dict(
    derandomize=True,
    database=None,
    deadline=None,
    print_blob=False,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)
settings.register_profile("ci", max_examples=200, stateful_step_count=50, **_REPRODUCIBLE)
settings.register_profile("deep", max_examples=1200, stateful_step_count=200, **_REPRODUCIBLE)

# The fuzzers default to `ci`; a profile chosen on the command line (loaded by hypothesis's
# pytest plugin) is left alone.
if settings.get_current_profile_name() == "default":
    settings.load_profile("ci")

# The statistics' session hooks (xdist included), found here by name.
from fuzz.stats_report import pytest_sessionfinish, pytest_sessionstart, pytest_testnodedown  # noqa: E402, F401
