"""Mutants saved to a JSON file and loaded back without cosmic-ray: make them where the optional
extra is installed (`python -m fuzz.mutation --save-mutants FILE`), run them on a machine that cannot
install it (`--mutants FILE`, e.g. a device host with no network).

Each mutant is kept as line edits against its module (not the whole mutated source: a few hundred
bytes, not a module's size), with the module's SHA-256: a tree whose module differs from the one the
mutants were made from is refused, since the edits would not mean the same mutation there.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
from pathlib import Path
from typing import Any

from fuzz.mutation.mutants import Mutant

FILE_KIND = "twinfer-mutants"


def save_mutants(path: Path, root: Path, mutants: list[Mutant]) -> None:
    sources = {module: (root / module).read_text(encoding="utf-8") for module in {m.module for m in mutants}}
    entries = []
    for mutant in mutants:
        fields = {f.name: getattr(mutant, f.name) for f in dataclasses.fields(mutant) if f.name != "source"}
        entries.append({**fields, "edits": line_edits(sources[mutant.module], mutant.source)})
    modules = {module: _sha256(text) for module, text in sorted(sources.items())}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"kind": FILE_KIND, "modules": modules, "mutants": entries}) + "\n", encoding="utf-8")


def load_mutants(path: Path, root: Path) -> dict[str, list[Mutant]]:
    """Module -> its mutants, rebuilt against the tree at `root` (which must hold the same modules)."""
    document = json.loads(path.read_text(encoding="utf-8"))
    if document.get("kind") != FILE_KIND:
        raise ValueError(f"{path} is not a mutants file (kind {document.get('kind')!r})")
    sources = {}
    for module, digest in document["modules"].items():
        text = (root / module).read_text(encoding="utf-8")
        if _sha256(text) != digest:
            raise ValueError(f"{module} differs from the one {path.name}'s mutants were made from: make them again")
        sources[module] = text
    by_module: dict[str, list[Mutant]] = {module: [] for module in sources}
    for entry in document["mutants"]:
        fields: dict[str, Any] = {key: value for key, value in entry.items() if key != "edits"}
        source = apply_edits(sources[entry["module"]], entry["edits"])
        by_module[entry["module"]].append(Mutant(**fields, source=source))
    return by_module


def line_edits(source: str, mutated: str) -> list[list[Any]]:
    """[start, end, replacement lines] per changed run of lines, last first (so each applies as listed)."""
    before, after = source.splitlines(keepends=True), mutated.splitlines(keepends=True)
    matcher = difflib.SequenceMatcher(a=before, b=after, autojunk=False)
    edits = [[i1, i2, after[j1:j2]] for tag, i1, i2, j1, j2 in matcher.get_opcodes() if tag != "equal"]
    return edits[::-1]


def apply_edits(source: str, edits: list[list[Any]]) -> str:
    lines = source.splitlines(keepends=True)
    for start, end, replacement in edits:
        lines[start:end] = replacement
    return "".join(lines)


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
