"""The fast engine's host time per decode-bs1 step, device stubbed (see RUN.txt beside this file).

python host_bs1.py LABEL   (run from the root of the tree to measure)
"""

import statistics
import sys

import torch

from reports.bench.workloads import build_workload
from reports.serving.host_overhead import HostSettings, measure_once

torch.set_num_threads(1)
(phase,) = build_workload("decode-bs1", 1.0).phases
settings = HostSettings(scale=1.0, repeats=1, profile=False, sampler_vocab=64, torch_threads=1, async_scheduling=True)
medians_ms = []
for _ in range(5):
    run, _engine = measure_once(phase, settings)
    medians_ms.append(statistics.median(run.step_wall_s) * 1e3)
print(
    sys.argv[1],
    "median host ms/step over 5 runs:",
    [round(value, 4) for value in medians_ms],
    "->",
    round(statistics.median(medians_ms), 4),
    "steps",
    len(run.step_wall_s),
)
