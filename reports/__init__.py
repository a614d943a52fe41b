"""The harness: everything that measures, compares and reports on the engines; the top layer but for tests/
and fuzz/ (it may import spec, reference, fast and twinfer; nothing below imports it, but for the lazy
`twinfer` subcommands of twinfer/cli.py).

- `bench/`: `twinfer bench` (the standard workloads, beside transformers), the kernel micro-benchmarks
  (`bench/kernels/`), and the plan runner for device calls (`bench/plan.py`).
- `diff/`: `twinfer diff`: engines and OpenAI-compatible servers compared token by token.
- `serving/`: the server under load, its own overhead, the engine's host path, the memory check
  (`twinfer memory-check`).
- `report/`: `twinfer report`, the HTML report of the differential matrix, fuzzing, kernels and speed.
- `results/`: committed measurements, each with its command (or plan) and commit; records only, no code.
- `published/`: the published report's files; records only.

The tooling that makes the built-in model lives beside it, in twinfer/models/.
"""
