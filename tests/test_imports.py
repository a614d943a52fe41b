"""The layers point one way, and the twins stay independent.

spec <- reference, fast <- twinfer <- reports, with tests/ and fuzz/ above them all: each top-level
package imports only itself and the packages below it (and third-party ones); `fast` never imports
`reference`, nor `reference` `fast`; both build on `spec`. The one exception is documented in
twinfer/cli.py: the `twinfer` command reaches the harness (reports) only inside a function, when a
harness command runs. Read from the source (every import statement, at module level or inside a
function), so a lazy import cannot slip through; and checked in a fresh interpreter, so that
`import twinfer` loads nothing of reports.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Each top-level package, and the first-party packages it may import (itself included).
LAYERS = {
    "spec": {"spec"},
    "reference": {"spec", "reference"},
    "fast": {"spec", "fast"},
    "twinfer": {"spec", "reference", "fast", "twinfer"},
    "reports": {"spec", "reference", "fast", "twinfer", "reports"},
    "tests": {"spec", "reference", "fast", "twinfer", "reports", "tests", "fuzz", "conftest"},
    "fuzz": {"spec", "reference", "fast", "twinfer", "reports", "tests", "fuzz", "conftest"},
}
FIRST_PARTY = set().union(*LAYERS.values())
# The documented exception (twinfer/cli.py's docstring): twinfer's command line reaches reports lazily.
CLI_MODULE = "twinfer.cli"


def import_statements(source: str, module: str) -> list[tuple[str, bool]]:
    """(absolute name, inside a function) of every module that `source` (the text of module `module`)
    imports; `from a import b` names both `a` and `a.b`."""
    package_parts = module.split(".")[:-1]
    found: list[tuple[str, bool]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        if isinstance(node, ast.Import):
            found.extend((alias.name, in_function) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the importing module's package
                base = package_parts[: len(package_parts) - node.level + 1]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            found.append((prefix, in_function))
            found.extend((f"{prefix}.{alias.name}", in_function) for alias in node.names)
        nested = in_function or isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
        for child in ast.iter_child_nodes(node):
            visit(child, nested)

    visit(ast.parse(source), False)
    return found


def imported_modules(source: str, module: str) -> set[str]:
    """Absolute names of the modules that `source` (the text of module `module`) imports."""
    return {name for name, _ in import_statements(source, module)}


def module_sources(package: str) -> dict[str, tuple[str, str]]:
    """module name -> (the name relative imports resolve against, its source), for every module of `package`."""
    result = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        resolver = module + ".__init__" if parts[-1] == "__init__" else module  # relative imports stay inside
        result[module] = (resolver, path.read_text())
    return result


def package_imports(package: str) -> dict[str, set[str]]:
    """module name -> the modules it imports, for every module of `package`."""
    return {
        module: imported_modules(source, resolver) for module, (resolver, source) in module_sources(package).items()
    }


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


@pytest.mark.parametrize("package", sorted(LAYERS))
def test_each_layer_imports_only_itself_and_the_layers_below(package: str) -> None:
    modules = module_sources(package)
    assert len(modules) > 3, f"found only {sorted(modules)} under {package}/"
    offending = {}
    for module, (resolver, source) in modules.items():
        for name, in_function in import_statements(source, resolver):
            top = name.split(".")[0]
            if top not in FIRST_PARTY or top in LAYERS[package]:
                continue
            if module == CLI_MODULE and top == "reports" and in_function:
                continue  # the documented exception, and only lazily
            offending.setdefault(module, set()).add(name)
    assert not offending, f"{package} imports layers above it or beside it: {offending}"


def test_the_command_line_reaches_the_harness_only_lazily() -> None:
    """twinfer/cli.py reaches reports only through its harness commands' modules, imported inside a function
    (importlib.import_module); never at module level."""
    from twinfer import cli

    tree = ast.parse((ROOT / "twinfer" / "cli.py").read_text())
    dynamic_imports_at_module_level = [
        node.lineno
        for node in _nodes_outside_functions(tree)
        if isinstance(node, ast.Call) and "import_module" in ast.unparse(node.func)
    ]
    assert not dynamic_imports_at_module_level
    reaching_reports = [command for command in cli.MODULE_COMMANDS if command.module.split(".")[0] == "reports"]
    assert {command.name for command in reaching_reports} == {"diff", "bench", "report", "memory-check"}
    assert all(command.harness for command in reaching_reports)


@pytest.mark.parametrize("name", ["diff", "bench", "report", "memory-check"])
def test_each_harness_command_names_a_module_that_offers_it(name: str) -> None:
    import importlib

    from twinfer import cli

    (command,) = [command for command in cli.MODULE_COMMANDS if command.name == name]
    module = importlib.import_module(command.module)
    assert callable(module.configure_parser) and callable(module.run)


def test_importing_twinfer_loads_nothing_of_reports() -> None:
    """In a fresh interpreter: `import twinfer, twinfer.cli`, the parser built and `twinfer --help` printed."""
    script = (
        "import contextlib, io, sys\n"
        "import twinfer, twinfer.cli\n"
        "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
        "    twinfer.cli.main(['--help'])\n"
        "print(sorted(m for m in sys.modules if m == 'reports' or m.startswith('reports.')))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300, check=True
    )
    assert result.stdout.strip().splitlines()[-1] == "[]"


def _nodes_outside_functions(tree: ast.AST):
    for child in ast.iter_child_nodes(tree):
        if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            continue
        yield child
        yield from _nodes_outside_functions(child)
