"""The mutated modules and their test selections, read from targets.toml and checked once."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

TARGETS_FILE = Path(__file__).with_name("targets.toml")


@dataclass(frozen=True)
class Target:
    module: str  # repository-relative path of the module mutated
    tests: tuple[str, ...]  # test paths or node ids, run in this order with -x

    def __post_init__(self) -> None:
        if not self.module.endswith(".py"):
            raise ValueError(f"a target module is a .py path: {self.module!r}")
        if not self.tests:
            raise ValueError(f"{self.module}: a target needs at least one test")


def load_targets(root: Path, path: Path = TARGETS_FILE) -> tuple[Target, ...]:
    """Every target of `path`; each module and each test file must exist under `root`."""
    entries = tomllib.loads(path.read_text(encoding="utf-8")).get("target", [])
    targets = tuple(Target(entry["module"], tuple(entry["tests"])) for entry in entries)
    missing = [
        name
        for target in targets
        for name in (target.module, *(test.split("::")[0] for test in target.tests))
        if not (root / name).is_file()
    ]
    if missing:
        raise ValueError(f"{path.name} names files that do not exist: {sorted(set(missing))}")
    modules = [target.module for target in targets]
    if len(set(modules)) != len(modules):
        raise ValueError(f"{path.name} lists a module twice: {modules}")
    return targets


def select(targets: tuple[Target, ...], modules: list[str] | None) -> tuple[Target, ...]:
    """The targets of `modules` (all where None), in the file's order."""
    if modules is None:
        return targets
    known = {target.module for target in targets}
    unknown = sorted(set(modules) - known)
    if unknown:
        raise ValueError(f"not a target of {TARGETS_FILE.name}: {unknown}; targets: {sorted(known)}")
    return tuple(target for target in targets if target.module in modules)
