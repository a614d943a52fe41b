"""The JSON schema of report.json (report.schema.json, shipped beside this module), and validation."""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any

from spec.errors import TwinferError

SCHEMA_FILE = "report.schema.json"


class ReportFormatError(TwinferError, ValueError):
    """A report JSON does not follow the schema of this version of twinfer."""


@cache
def report_schema() -> dict[str, Any]:
    return json.loads(resources.files(__package__).joinpath(SCHEMA_FILE).read_text(encoding="utf-8"))


def validate_report(document: Any, name: str = "report.json") -> None:
    """Raise ReportFormatError naming every place `document` breaks the schema."""
    import jsonschema

    validator = jsonschema.Draft202012Validator(report_schema(), format_checker=jsonschema.FormatChecker())
    errors = sorted(validator.iter_errors(document), key=lambda error: list(error.absolute_path))
    if errors:
        listed = "; ".join(
            f"at /{'/'.join(str(p) for p in error.absolute_path)}: {error.message}" for error in errors[:10]
        )
        more = f" (and {len(errors) - 10} more)" if len(errors) > 10 else ""
        raise ReportFormatError(f"{name} does not follow the twinfer report schema: {listed}{more}")
