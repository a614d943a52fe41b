"""Benchmarks: the standard workloads behind `twinfer bench`, and the kernel micro-benchmarks (`kernels/`).

- `command.py`: the `twinfer bench` command line (a subcommand per workload, and `kernels`).
- `harness.py`: `twinfer bench WORKLOAD`, one workload on one engine, optionally beside transformers.
- `workloads.py`: the workloads of shared/benchmarks.md, exactly as written there.
- `runners.py`: one phase run and timed on a twinfer engine or on transformers.
- `device.py`: where a record ran (versions, commit, GPU) and the device's own ceilings.
- `profile.py`: where a run's time goes, from torch.profiler.
- `shapes.py`: the benchmark model shapes, with random weights drawn on the device.
- `graph_timing.py`: device work timed by replaying a CUDA graph (every micro-benchmark's timer).
- `tensor_parallel.py`: the engine on 1 and 2 ranks, and its all-reduce paths (two GPUs).
- `kernels/`: one Triton kernel (or a few) timed beside torch or cuBLAS.
- `plan.py`: one device call's steps (a plan file: commands and time limits, as data) run under one budget.
- `ab.py`: an A/B of engine code trees in one call, one `twinfer bench` process a run, the trees alternating.

Every benchmark writes a JSON record; the committed ones live in reports/results/.
"""
