"""`twinfer bench`: one subcommand per standard workload (reports.bench.harness) and `kernels`
(reports.bench.kernels.kernel_bench).

`configure_parser(parser)` and `run(args) -> int` are what the `twinfer` command wires in; it imports
this module only when `twinfer bench` runs.
"""

from __future__ import annotations

import argparse

from reports.bench import harness
from reports.bench.kernels import kernel_bench

KERNELS = "kernels"


def configure_parser(parser: argparse.ArgumentParser) -> None:
    workloads = parser.add_subparsers(dest="bench_command", required=True)
    kernels = workloads.add_parser(KERNELS, help="time each Triton kernel beside torch's implementation (GPU)")
    kernel_bench.configure_parser(kernels)
    for name, summary in harness.WORKLOAD_SUMMARIES.items():
        workload = workloads.add_parser(name, help=summary, description=summary)
        harness.configure_parser(workload)
        workload.set_defaults(workload=name)


def run(args: argparse.Namespace) -> int:
    if args.bench_command == KERNELS:
        return kernel_bench.run(args)
    return harness.run(args)
