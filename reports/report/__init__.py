"""`twinfer report`: one HTML page with the differential matrix, fuzzing, kernel checks and speed.

`configure_parser(parser)` and `run(args) -> int` are what the `twinfer` CLI wires in; `python -m
reports.report` runs the same command on its own.
"""

from reports.report.command import configure_parser, default_model, run

__all__ = ["configure_parser", "default_model", "run"]
