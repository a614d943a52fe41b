"""Command-line options for every `EngineConfig` field, derived from the dataclass itself.

Deriving them keeps the CLI in step with `spec.engine_config`: a setting added there is offered
by `twinfer generate`, `twinfer bench` and the server without touching this module. Every option
defaults to None, meaning "EngineConfig's own default", so only the settings a user gave are
passed on. The one nested setting, `speculative` (spec.speculative.SpeculativeConfig), has options
of its own: `--speculative-method`, `--num-speculative-tokens`, `--speculative-draft-model` and
`--speculative-ngram-min/-max` and `--speculative-min-acceptance-rate`.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import types
import typing
from typing import Any

from spec.engine_config import EngineConfig
from spec.errors import ConfigError
from spec.speculative import METHODS, SpeculativeConfig

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
    speculative = parser.add_argument_group("speculative decoding (spec.speculative.SpeculativeConfig)")
    speculative.add_argument(
        "--speculative-method",
        choices=METHODS,
        default=None,
        help="draft tokens by prompt lookup (ngram) or a smaller model of the same family (draft-model); "
        "the output is the output without speculation (default: off)",
    )
    speculative.add_argument(
        "--num-speculative-tokens", type=int, default=None, help="K: the most draft tokens a step verifies"
    )
    speculative.add_argument(
        "--speculative-draft-model", default=None, help="the draft checkpoint, for --speculative-method draft-model"
    )
    for end in ("min", "max"):
        speculative.add_argument(
            f"--speculative-ngram-{end}", type=int, default=None, help=f"prompt lookup's {end}imum n-gram length"
        )
    speculative.add_argument(
        "--speculative-min-acceptance-rate",
        type=float,
        default=None,
        help="a request whose recent drafts were accepted below this rate stops proposing for a while, then "
        "probes again (default: 0.25; 0: never stops)",
    )


_SPECULATIVE_ARGUMENTS = {
    "num_speculative_tokens": "num_speculative_tokens",
    "speculative_draft_model": "draft_model",
    "speculative_ngram_min": "ngram_min",
    "speculative_ngram_max": "ngram_max",
    "speculative_min_acceptance_rate": "min_acceptance_rate",
}


def given_engine_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The engine settings named on the command line (the others keep EngineConfig's defaults)."""
    settings = {
        option.field: getattr(args, option.field)
        for option in engine_options()
        if getattr(args, option.field, None) is not None
    }
    speculative = _speculative_config(args)
    if speculative is not None:
        settings["speculative"] = speculative
    return settings


def _speculative_config(args: argparse.Namespace) -> SpeculativeConfig | None:
    """SpeculativeConfig from --speculative-method and its companions (a ConfigError naming what is missing)."""
    given = {
        field: getattr(args, argument)
        for argument, field in _SPECULATIVE_ARGUMENTS.items()
        if getattr(args, argument, None) is not None
    }
    method = getattr(args, "speculative_method", None)
    if method is None:
        if given:
            flags = ", ".join(
                "--" + argument.replace("_", "-")
                for argument in _SPECULATIVE_ARGUMENTS
                if getattr(args, argument, None) is not None
            )
            raise ConfigError(f"{flags} need --speculative-method ({' or '.join(METHODS)})")
        return None
    if "num_speculative_tokens" not in given:
        raise ConfigError(
            "--speculative-method needs --num-speculative-tokens K (the most draft tokens a step verifies)"
        )
    return SpeculativeConfig(method, **given)


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
