"""The fast engine's host time per decode-bs1-edit step, device stubbed (see RUN.txt beside this file).

cd TREE && PYTHONPATH=TREE python host_edit.py LABEL

The tree under test must come first on sys.path: a script's own folder, not the working directory, heads
sys.path, so without PYTHONPATH an editable install's tree is imported whatever the working directory (the
mistake of ../bs1_host_path_session8/). The script checks it.
"""

import statistics
import sys
from pathlib import Path

import torch

import fast
from reports.bench.workloads import build_workload
from reports.serving.host_overhead import HostSettings, measure_once

tree = Path(fast.__file__).resolve().parents[1]
if tree != Path.cwd().resolve():
    sys.exit(f"imported the engine from {tree}, not from the working directory {Path.cwd()}: set PYTHONPATH")
torch.set_num_threads(1)
(phase,) = build_workload("decode-bs1-edit", 1.0).phases
settings = HostSettings(scale=1.0, repeats=1, profile=False, sampler_vocab=64, torch_threads=1, async_scheduling=True)
medians_ms = []
for _ in range(5):
    run, _engine = measure_once(phase, settings)
    medians_ms.append(statistics.median(run.step_wall_s) * 1e3)
print(
    sys.argv[1],
    f"({tree})",
    "median host ms/step over 5 runs:",
    [round(value, 4) for value in medians_ms],
    "->",
    round(statistics.median(medians_ms), 4),
    "steps",
    len(run.step_wall_s),
)
