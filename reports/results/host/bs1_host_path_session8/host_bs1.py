import statistics, sys, torch
from reports.serving.host_overhead import HostSettings, measure_once
from reports.bench.workloads import build_workload
torch.set_num_threads(1)
(phase,) = build_workload("decode-bs1", 1.0).phases
settings = HostSettings(scale=1.0, repeats=1, profile=False, sampler_vocab=64, torch_threads=1, async_scheduling=True)
per = []
for _ in range(5):
    run, engine = measure_once(phase, settings)
    steps = sorted(run.step_wall_s)
    per.append(statistics.median(steps) * 1e3)
print(sys.argv[1], "median host ms/step over 5 runs:", [round(x, 4) for x in per], "->", round(statistics.median(per), 4), "steps", len(run.step_wall_s))
