"""`twinfer report`: run the checks and benchmarks, write report.json and report.html; or compare two
report.json files; or render a kept report.json again.

Heavy imports (torch, transformers, the engines) happen inside `run`, so building the `twinfer`
parser stays fast.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shlex
import sys
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

SECTIONS = ("correctness", "fuzz", "mutation", "kernels", "speed")
DEFAULT_OUT = Path("twinfer-report")
DEFAULT_DTYPES = "float32,bfloat16"


def default_model() -> Path:
    """The checkpoint a report uses when --model is not given: the built-in trained stdlib-tiny model."""
    from twinfer.default_model import default_model as built_in

    return built_in()


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Run the differential matrix, the fuzz suite, the kernel checks and (on CUDA) the standard workloads, "
        "and write one self-contained report.html with the report.json it was rendered from."
    )
    parser.add_argument("--model", help="checkpoint directory or hub id (default: the built-in tiny model)")
    parser.add_argument("--device", help="cpu or cuda (default: cuda if available)")
    parser.add_argument(
        "--dtype", default=DEFAULT_DTYPES, help=f"comma-separated dtypes of the matrix (default {DEFAULT_DTYPES})"
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"output directory (default ./{DEFAULT_OUT})")
    parser.add_argument("--quick", action="store_true", help="small prompt sets and one speed workload")
    parser.add_argument(
        "--compare", nargs=2, type=Path, metavar=("OLD.json", "NEW.json"), help="compare two report.json files"
    )
    parser.add_argument("--render", type=Path, metavar="REPORT.json", help="render a kept report.json again")
    parser.add_argument(
        "--commit",
        help="the commit under test (default: `git rev-parse HEAD`; give it where the tree is a copy whose git "
        "metadata may be stale, as on a device machine)",
    )
    parser.add_argument(
        "--sections", default=",".join(SECTIONS), help=f"comma-separated sections to run (default {','.join(SECTIONS)})"
    )
    parser.add_argument(
        "--endpoint",
        action="append",
        default=[],
        metavar="openai:URL",
        help=(
            "an OpenAI-compatible server to add to the differential matrix, as openai:http://HOST:PORT/v1 "
            "(repeatable): compared with hf and reference under the feature as-served, free-running and "
            "teacher-forced (echo with prompt logprobs, where the server gives them); its server's dtype "
            "is its own, so it is queried once and compared with the local engine in every --dtype"
        ),
    )
    parser.add_argument(
        "--endpoint-model",
        metavar="NAME",
        help="the model to ask each --endpoint for (default: the first its /v1/models lists)",
    )
    parser.add_argument(
        "--fuzz",
        choices=("ci", "committed"),
        default="committed",
        help="show the committed deep-run records (default), or run the fuzz suite with its ci profile",
    )
    speed = parser.add_argument_group("speed (CUDA)")
    speed.add_argument("--workloads", help="comma-separated standard workloads (default: all; decode-bs1 with --quick)")
    speed.add_argument(
        "--bench-json",
        type=Path,
        nargs="+",
        action="extend",
        metavar="FILE",
        help="show these `twinfer bench` records instead of running (repeatable); records of one workload and "
        "shape share a table, labelled by their engine flags, the defaults first",
    )
    speed.add_argument("--speed-shape", default="qwen3-0.6b", help="model shape of the workloads (default qwen3-0.6b)")
    speed.add_argument("--speed-repeats", type=int, default=3, help="runs per latency phase (default 3)")


def run(args: argparse.Namespace) -> int:
    if args.compare:
        return _run_compare(args.compare[0], args.compare[1], args.out)
    if args.render:
        _write_html(_load_report(args.render), args.out)
        print(args.out / "report.html")
        return 0
    return _run_report(args)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reports.report")
    configure_parser(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from spec.errors import TwinferError

    try:
        return run(args)
    except TwinferError as error:
        print(f"twinfer report: error: {error}", file=sys.stderr)
        return 2


# -- a run ---------------------------------------------------------------------------------


def _run_report(args: argparse.Namespace) -> int:
    import torch

    from reports.report.assemble import assemble_report
    from reports.report.correctness import parse_dtypes
    from reports.report.records import RunSettings
    from twinfer.registry import resolve_device

    sections = _parse_sections(args.sections)
    endpoints = parse_endpoints(args.endpoint, args.endpoint_model)
    if endpoints and "correctness" not in sections:
        from spec.errors import ConfigError

        raise ConfigError("--endpoint adds rows to the correctness section, which --sections leaves out")
    device = resolve_device(args.device)
    dtypes = parse_dtypes(args.dtype)
    if device.type == "cpu":
        # The fast engine's Triton kernels run on the CPU only through the interpreter, which Triton
        # reads when a kernel module is first imported: set it before any engine is built.
        os.environ.setdefault("TRITON_INTERPRET", "1")
    if args.model is not None:
        from spec.checkpoint import resolve_checkpoint

        checkpoint = resolve_checkpoint(args.model)
    else:
        checkpoint = default_model()
        if device.type == "cpu":
            torch.set_num_threads(1)  # the tiny model: extra threads only add contention
    settings = RunSettings(
        model=args.model or f"built-in tiny model ({checkpoint})",
        device=str(device),
        dtypes=tuple(str(d).removeprefix("torch.") for d in dtypes),
        quick=args.quick,
        command=_command_line(),
    )
    correctness = _correctness(sections, checkpoint, device, dtypes, args.quick, endpoints, args.endpoint_model)
    fuzz = _fuzz(sections, args.fuzz)
    kernels = _kernels(sections, device)
    speed = _speed(sections, device, args)
    report = assemble_report(settings, correctness, fuzz, kernels, speed, device, _mutation(sections), args.commit)
    document = report.to_json()
    from reports.report.schema import validate_report

    validate_report(document, "the report just made")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "report.json").write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
    _write_html(document, args.out)
    summary = document["summary"]
    counts = f"{summary['passed']} passed, {summary['failed']} failed, {summary['not_run']} not run"
    print(f"{counts}: {args.out / 'report.html'}")
    return 1 if summary["failed"] else 0


def _parse_sections(text: str) -> frozenset[str]:
    from spec.errors import ConfigError

    chosen = {name.strip() for name in text.split(",") if name.strip()}
    unknown = chosen - set(SECTIONS)
    if unknown:
        raise ConfigError(f"--sections takes names from {', '.join(SECTIONS)}; unknown: {', '.join(sorted(unknown))}")
    return frozenset(chosen)


def parse_endpoints(values: list[str], model_name: str | None) -> tuple[str, ...]:
    """--endpoint values as engine names `openai:URL` (the URL normalised), each checked now."""
    from reports.diff.endpoint import ENDPOINT_PREFIX, endpoint_url
    from spec.errors import ConfigError

    endpoints = []
    for value in values:
        try:
            endpoints.append(ENDPOINT_PREFIX + endpoint_url(value))
        except ConfigError as error:
            raise ConfigError(f"--endpoint: {error}") from error
    if model_name is not None and not endpoints:
        raise ConfigError("--endpoint-model names the model of an --endpoint; give --endpoint too")
    return tuple(dict.fromkeys(endpoints))


_LEFT_OUT = "not run: left out by --sections"


def _correctness(
    sections: frozenset[str],
    checkpoint: Path,
    device,
    dtypes,
    quick: bool,
    endpoints: tuple[str, ...],
    endpoint_model: str | None,
):
    from reports.report import workloads
    from reports.report.correctness import CorrectnessOptions, run_correctness
    from reports.report.records import CorrectnessSection, Status

    if "correctness" not in sections:
        return CorrectnessSection(Status.NOT_RUN, _LEFT_OUT, str(checkpoint), (), (), (), (), (), ())
    pairs = workloads.PAIRS + tuple(pair for name in endpoints for pair in workloads.endpoint_pairs(name))
    return run_correctness(CorrectnessOptions(checkpoint, device, dtypes, quick, pairs, endpoint_model=endpoint_model))


def _fuzz(sections: frozenset[str], source: str):
    from reports.report.fuzz_section import ci_fuzz_section, committed_fuzz_section
    from reports.report.records import FuzzSection, Status

    if "fuzz" not in sections:
        return FuzzSection(Status.NOT_RUN, _LEFT_OUT, ())
    return ci_fuzz_section() if source == "ci" else committed_fuzz_section()


def _mutation(sections: frozenset[str]):
    from reports.report.mutation_section import committed_mutation_section
    from reports.report.records import MutationSection, Status

    if "mutation" not in sections:
        return MutationSection(Status.NOT_RUN, _LEFT_OUT)
    return committed_mutation_section()


def _kernels(sections: frozenset[str], device):
    from reports.report.kernel_section import kernel_section
    from reports.report.records import KernelSection, Status

    if "kernels" not in sections:
        return KernelSection(Status.NOT_RUN, _LEFT_OUT)
    return kernel_section(device.type)


def _speed(sections: frozenset[str], device, args: argparse.Namespace):
    from reports.report.records import SpeedSection, Status
    from reports.report.speed_section import QUICK_WORKLOADS, STANDARD_WORKLOADS, SpeedOptions, speed_section

    if "speed" not in sections:
        return SpeedSection(Status.NOT_RUN, _LEFT_OUT)
    if args.workloads:
        workloads = tuple(name.strip() for name in args.workloads.split(",") if name.strip())
    else:
        workloads = QUICK_WORKLOADS if args.quick else STANDARD_WORKLOADS
    options = SpeedOptions(
        device=device,
        workloads=workloads,
        shape=args.speed_shape,
        repeats=args.speed_repeats,
        bench_json=tuple(args.bench_json or ()),
    )
    return speed_section(options)


def _command_line() -> str:
    """This process's command line as the user typed it (as far as argv tells)."""
    program = Path(sys.argv[0])
    if program.name == "__main__.py" and program.parent.name == "report":
        words = ["python", "-m", "reports.report"]
    else:
        words = [program.name]
    return shlex.join([*words, *sys.argv[1:]])


# -- compare and render --------------------------------------------------------------------


def _run_compare(old_path: Path, new_path: Path, out: Path) -> int:
    from reports.report.comparison import compare_reports
    from reports.report.render import render_comparison

    old, new = _load_report(old_path), _load_report(new_path)
    comparison = compare_reports(old, new, str(old_path), str(new_path))
    out.mkdir(parents=True, exist_ok=True)
    destination = out / "compare.html"
    destination.write_text(render_comparison(comparison), encoding="utf-8")
    counts = comparison["counts"]
    print(
        f"{counts['regressions']} regressions, {counts['checks_changed']} checks changed, "
        f"{counts['figures_moved']} figures moved: {destination}"
    )
    return 1 if counts["regressions"] else 0


def _load_report(path: Path) -> dict[str, Any]:
    from reports.report.schema import ReportFormatError, validate_report

    try:
        document = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as error:
        raise ReportFormatError(f"cannot read report {path}: {error}") from error
    validate_report(document, str(path))
    return document


def _write_html(document: dict[str, Any], out: Path) -> None:
    from reports.report.render import render_report

    out.mkdir(parents=True, exist_ok=True)
    (out / "report.html").write_text(render_report(document), encoding="utf-8")
