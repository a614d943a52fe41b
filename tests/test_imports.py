"""The twins stay independent: `fast` never imports `reference`, and `reference` never imports
`fast`; both build on `spec`. Read from the source (every import statement, at module level or
inside a function), so a lazy import cannot slip through."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def imported_modules(source: str, module: str) -> set[str]:
    """Absolute names of the modules that `source` (the text of module `module`) imports."""
    package_parts = module.split(".")[:-1]
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the importing module's package
                base = package_parts[: len(package_parts) - node.level + 1]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            names.add(prefix)
            names.update(f"{prefix}.{alias.name}" for alias in node.names)
    return names


def package_imports(package: str) -> dict[str, set[str]]:
    """module name -> the modules it imports, for every module of `package`."""
    result = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        if parts[-1] == "__init__":
            module += ".__init__"  # so relative imports resolve inside the package itself
        result[module.removesuffix(".__init__")] = imported_modules(path.read_text(), module)
    return result


def imports_of_package(imports: set[str], package: str) -> set[str]:
    return {name for name in imports if name == package or name.startswith(package + ".")}


@pytest.mark.parametrize(("package", "forbidden"), [("fast", "reference"), ("reference", "fast")])
def test_twin_never_imports_the_other(package: str, forbidden: str) -> None:
    modules = package_imports(package)
    assert len(modules) > 3, f"found only {sorted(modules)} under {package}/"
    offending = {module: sorted(imports_of_package(names, forbidden)) for module, names in modules.items()}
    assert not {module: names for module, names in offending.items() if names}


@pytest.mark.parametrize("package", ["fast", "reference"])
def test_both_twins_build_on_spec(package: str) -> None:
    modules = package_imports(package)
    assert any(imports_of_package(names, "spec") for names in modules.values())


def test_the_reader_sees_every_form_of_import() -> None:
    source = """
import reference
import os, reference.engine as engine
from reference.model import CausalLM
from reference import scheduler

def lazily():
    from reference.kv_cache import PagedKVCache
"""
    names = imported_modules(source, "fast.model")
    assert imports_of_package(names, "reference") == {
        "reference",
        "reference.engine",
        "reference.model",
        "reference.model.CausalLM",
        "reference.scheduler",
        "reference.kv_cache",
        "reference.kv_cache.PagedKVCache",
    }
    assert "os" in names


def test_relative_imports_resolve_to_their_package() -> None:
    assert "fast.kernels.decode_attention" in imported_modules("from .kernels import decode_attention", "fast.engine")
    assert "fast.model.CausalLM" in imported_modules("from ..model import CausalLM", "fast.kernels.x")
    assert "fast.kernels.x.y" not in imported_modules("from . import y", "fast.kernels.x")
    assert "fast.kernels.y" in imported_modules("from . import y", "fast.kernels.x")
    assert "fast.model" in imported_modules("from . import model", "fast.__init__")
