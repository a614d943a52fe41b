"""`twinfer bench` records as the speed section reads them: what was measured, on which shape,
commit and GPU, and with which engine settings, labelled as the `twinfer bench` flags that gave them.

A record holds the settings given to the twinfer engine (`engine_settings_given`: the flags on the
command line; every other setting at its default), so two records of one workload that differ in
their flags are told apart by those flags, and a record with none is "no flags (defaults)".
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

BENCH_RECORD = "twinfer bench"
HF = "hf"  # the transformers baseline's engine name in a record (reports.bench.harness.HF)
DEFAULTS_LABEL = "no flags (defaults)"
NO_TWINFER_LABEL = "transformers only"  # a record of `twinfer bench --engine hf`
REQUIRED_KEYS = ("workload", "shape", "dtype", "environment", "ceilings", "results")


class BenchRecordError(ValueError):
    """A file is not a `twinfer bench` record this report can read; the message says why."""


@dataclass(frozen=True)
class BenchRecord:
    """One bench record (the JSON as written) and the file it came from ("" for one made by this run)."""

    data: dict[str, Any]
    source: str = ""

    def __post_init__(self) -> None:
        if self.data.get("record") != BENCH_RECORD:
            raise BenchRecordError("not a `twinfer bench` record")
        missing = [key for key in REQUIRED_KEYS if key not in self.data]
        if missing:
            raise BenchRecordError(f"a `twinfer bench` record without {', '.join(missing)}")
        if not self.data["results"]:
            raise BenchRecordError("a `twinfer bench` record with no result")

    @property
    def workload(self) -> str:
        return self.data["workload"]["name"]

    @property
    def shape(self) -> str:
        return self.data["shape"]["name"]

    @property
    def commit(self) -> str | None:
        return self.data["environment"].get("commit")

    @property
    def gpu(self) -> str | None:
        environment = self.data["environment"]
        return environment.get("gpu") or environment.get("device")

    @property
    def twinfer_result(self) -> dict[str, Any] | None:
        """The twinfer engine's result (a record has at most one; None for a transformers-only record)."""
        return next((result for result in self.data["results"] if result["engine"] != HF), None)

    @property
    def settings_given(self) -> dict[str, Any]:
        result = self.twinfer_result
        return dict(result.get("engine_settings_given") or {}) if result else {}

    @property
    def settings_label(self) -> str:
        if self.twinfer_result is None:
            return NO_TWINFER_LABEL
        return settings_flags(self.settings_given)

    def setting_in_effect(self, name: str) -> Any:
        """An engine setting as the twinfer engine ran with it (the record's resolved config)."""
        result = self.twinfer_result
        phases = result["phases"] if result else []
        return phases[0].get("engine_config", {}).get(name) if phases else None


def load_records(paths: Sequence[Path]) -> tuple[list[BenchRecord], list[str]]:
    """The readable records among `paths`, and for each one that is not, why."""
    records, problems = [], []
    for path in paths:
        try:
            records.append(BenchRecord(json.loads(Path(path).read_text()), str(path)))
        except (OSError, json.JSONDecodeError) as error:
            problems.append(f"{path}: unreadable bench record: {error}")
        except BenchRecordError as error:
            problems.append(f"{path}: {error}")
    return records, problems


def settings_flags(given: Mapping[str, Any]) -> str:
    """Engine settings as the `twinfer bench` flags that give them, in the record's order."""
    flags = _engine_flags()
    words = []
    for name, value in given.items():
        if name == "speculative" and isinstance(value, Mapping):  # SpeculativeConfig's fields: their own flags
            words.append(speculative_flags(value))
            continue
        flag = flags.get(name, "--" + name.replace("_", "-"))  # a setting this version no longer has
        if isinstance(value, bool):
            words.append(flag if value else "--no-" + flag.removeprefix("--"))
        else:
            words.append(f"{flag} {value}")
    return " ".join(words) or DEFAULTS_LABEL


def speculative_flags(fields: Mapping[str, Any]) -> str:
    """A recorded SpeculativeConfig as the flags that give it (twinfer.engine_options)."""
    words = [f"--speculative-method {fields['method']}", f"--num-speculative-tokens {fields['num_speculative_tokens']}"]
    if fields.get("draft_model"):
        words.append(f"--speculative-draft-model {fields['draft_model']}")
    return " ".join(words)


@cache
def _engine_flags() -> dict[str, str]:
    from twinfer.engine_options import engine_options

    return {option.field: option.flag for option in engine_options()}


def record_labels(records: Sequence[BenchRecord]) -> list[str]:
    """A label per record that tells apart the records shown together: its settings, then, among
    records that share their settings, what else differs (the shape, the commit, else the file)."""
    labels = [record.settings_label for record in records]
    for describe in (_shape_word, _commit_word, _file_word):
        groups: dict[str, list[int]] = {}
        for index, label in enumerate(labels):
            groups.setdefault(label, []).append(index)
        for members in groups.values():
            if len(members) > 1 and len({describe(records[i]) for i in members}) > 1:
                for i in members:
                    labels[i] += f" · {describe(records[i])}"
    return labels


def _shape_word(record: BenchRecord) -> str:
    return record.shape


def _commit_word(record: BenchRecord) -> str:
    return f"commit {short_commit(record.commit)}"


def _file_word(record: BenchRecord) -> str:
    return Path(record.source).name or "this run"


def defaults_first(records: Sequence[BenchRecord]) -> list[BenchRecord]:
    """Records with no flags before the others; otherwise in the order given."""
    return sorted(records, key=lambda record: record.settings_label != DEFAULTS_LABEL)


def short_commit(commit: str | None) -> str:
    return (commit or "unknown")[:7]
