"""Mutants judged equivalent (no test can tell them from the original), each with its reason, read
from equivalent.toml. An equivalent survivor leaves the module's score; a listed mutant that a test
kills is reported as a stale entry."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

EQUIVALENT_FILE = Path(__file__).with_name("equivalent.toml")


@dataclass(frozen=True)
class Equivalent:
    key: str  # Mutant.key
    module: str
    mutated: str  # the mutated line, for the reader (the key is what matches)
    reason: str

    def __post_init__(self) -> None:
        if not self.reason.strip():
            raise ValueError(f"equivalent mutant {self.key} of {self.module} needs a reason")


def load_equivalents(path: Path = EQUIVALENT_FILE) -> dict[str, Equivalent]:
    """Mutant key -> its entry."""
    if not path.is_file():
        return {}
    entries = tomllib.loads(path.read_text(encoding="utf-8")).get("equivalent", [])
    equivalents = [Equivalent(e["key"], e["module"], e.get("mutated", ""), e["reason"]) for e in entries]
    by_key = {entry.key: entry for entry in equivalents}
    if len(by_key) != len(equivalents):
        raise ValueError(f"{path.name} lists a mutant twice")
    return by_key
