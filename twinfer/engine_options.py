"""Command-line options for every `EngineConfig` field, derived from the dataclass itself.

Deriving them keeps the CLI in step with `spec.engine_config`: a setting added there is offered
by `twinfer generate`, `twinfer bench` and the server without touching this module. Every option
defaults to None, meaning "EngineConfig's own default", so only the settings a user gave are
passed on.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import types
import typing
from typing import Any

from spec.engine_config import EngineConfig

_OPTION_TYPES: tuple[type, ...] = (bool, int, float, str)


@dataclasses.dataclass(frozen=True)
class EngineOption:
    field: str
    flag: str
    value_type: type
    help: str


def engine_options() -> tuple[EngineOption, ...]:
    """One option per EngineConfig field whose type a command line can express."""
    hints = typing.get_type_hints(EngineConfig)
    documented = _field_docs(EngineConfig.__doc__ or "")
    options = []
    for field in dataclasses.fields(EngineConfig):
        value_type = _plain_type(hints[field.name])
        if value_type is None:
            continue
        default = field.default if field.default is not dataclasses.MISSING else None
        summary = documented.get(field.name, f"engine setting {field.name}")
        help_text = f"{summary} (default {default})".replace("%", "%%")  # argparse %-formats help
        options.append(EngineOption(field.name, _flag(field.name, value_type), value_type, help_text))
    return tuple(options)


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("engine settings (spec.engine_config.EngineConfig)")
    for option in engine_options():
        if option.value_type is bool:
            group.add_argument(
                option.flag, dest=option.field, action=argparse.BooleanOptionalAction, default=None, help=option.help
            )
        else:
            group.add_argument(option.flag, dest=option.field, type=option.value_type, default=None, help=option.help)


def given_engine_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The engine settings named on the command line (the others keep EngineConfig's defaults)."""
    return {
        option.field: getattr(args, option.field)
        for option in engine_options()
        if getattr(args, option.field, None) is not None
    }


def engine_config_from_args(args: argparse.Namespace, **defaults: Any) -> EngineConfig:
    """EngineConfig from the command line; `defaults` fill settings the user did not give."""
    return EngineConfig(**(defaults | given_engine_settings(args)))


def _plain_type(hint: Any) -> type | None:
    """int for `int` and `int | None`; None for types a command line cannot express."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        members = [member for member in typing.get_args(hint) if member is not type(None)]
        hint = members[0] if len(members) == 1 else None
    return hint if hint in _OPTION_TYPES else None


def _flag(name: str, value_type: type) -> str:
    # enable_prefix_caching -> --prefix-caching / --no-prefix-caching
    if value_type is bool and name.startswith("enable_"):
        name = name.removeprefix("enable_")
    return "--" + name.replace("_", "-")


def _field_docs(docstring: str) -> dict[str, str]:
    """The first line of each `name: text` entry of a dataclass docstring."""
    return {match[1]: match[2].strip() for match in re.finditer(r"^\s+(\w+): (.+)$", docstring, re.MULTILINE)}
