"""The import contract (.importlinter, docs/architecture.md): packages point one way, TVM has one
door, every module sits on a floor, and every import left inside a function says why.

Nothing here imports TVM: the graph is read from the source (import-linter's grimp, and ast).
"""

from __future__ import annotations

import ast
import configparser
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("qcompile", "schedules", "tuning_db", "targets")
CONFIG = REPO / ".importlinter"

#: Directories whose imports inside functions are not checked yet (none: every one is).
PENDING: tuple[str, ...] = ()


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            if "migrations" in path.parts:
                continue
            parts = path.relative_to(REPO).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def _floors() -> list[list[str]]:
    parser = configparser.ConfigParser()
    parser.read(CONFIG)
    lines = [line.strip() for line in parser["importlinter:contract:floors"]["layers"].splitlines()]
    floors = []
    for line in filter(None, lines):
        separator = "|" if "|" in line else ":"
        floors.append([name.strip().strip("()") for name in line.split(separator)])
    return floors


def test_the_contract_holds():
    from importlinter.cli import lint_imports

    assert lint_imports(config_filename=str(CONFIG), no_cache=True) == 0, \
        "lint-imports: a module imports from a floor above its own, or TVM past qcompile._tvm"


def test_every_module_sits_on_a_floor():
    floors = [name for floor in _floors() for name in floor]
    roots = {"qcompile"}  # the package itself: its __init__ holds the version and load()
    homeless = [module for module in _modules() if module not in roots
                and not any(module == f or module.startswith(f + ".") for f in floors)]
    assert not homeless, f"modules on no floor of .importlinter: {homeless}"


def _top_level_imports(tree: ast.Module, module: str) -> set[str]:
    """Modules ``tree`` imports when it is imported (not those of functions, nor of
    ``if TYPE_CHECKING:`` blocks)."""
    found: set[str] = set()

    def visit(nodes):
        for node in nodes:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                visit(node.orelse)
            elif isinstance(node, ast.If | ast.Try | ast.With):
                for field in ("body", "orelse", "finalbody", "handlers"):
                    visit(getattr(node, field, []) or [])
            elif isinstance(node, ast.ExceptHandler):
                visit(node.body)
            elif isinstance(node, ast.Import | ast.ImportFrom):
                found.update(_imported(node, module))

    visit(tree.body)
    return found


def _imported(node: ast.Import | ast.ImportFrom, module: str) -> set[str]:
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names}
    base = node.module or ""
    if node.level:
        package = module.split(".")[: -node.level] if node.level else []
        base = ".".join([*package, base]) if base else ".".join(package)
    return {base} | {f"{base}.{alias.name}" for alias in node.names}


def _loads_tvm(modules: dict[str, Path]) -> set[str]:
    """The modules whose import loads TVM (through qcompile._tvm, at module level)."""
    edges = {}
    for module, path in modules.items():
        imported = _top_level_imports(ast.parse(path.read_text()), module)
        parents = {".".join(module.split(".")[:i]) for i in range(1, module.count(".") + 1)}
        edges[module] = {m for m in imported | parents if m in modules or m.split(".")[0] == "tvm"}
    heavy = {"qcompile._tvm"}
    changed = True
    while changed:
        changed = False
        for module, targets_ in edges.items():
            if module not in heavy and any(t in heavy or t.split(".")[0] == "tvm"
                                           for t in targets_):
                heavy.add(module)
                changed = True
    return heavy


def _light_reasons(tree: ast.Module) -> str:
    """The module docstring's "Light: ..." paragraph: which imports it defers, and why."""
    doc = ast.get_docstring(tree) or ""
    return " ".join(p for p in doc.split("\n\n") if p.startswith("Light:"))


def test_imports_inside_functions_say_why():
    """An import of ours inside a function stays there only for start-up cost: a module that
    loads no TVM imports one that does (TVM takes seconds), or the line says its reason in a
    comment, or the module docstring's "Light:" paragraph names the module it defers and why.
    Everything else belongs at the top of the module."""
    modules = _modules()
    heavy = _loads_tvm(modules)
    lines_of = {}
    unexplained = []
    for module, path in modules.items():
        relative = path.relative_to(REPO).as_posix()
        if relative.startswith(PENDING):
            continue
        source = path.read_text()
        lines_of[module] = source.splitlines()
        tree = ast.parse(source)
        light = _light_reasons(tree)
        for function in ast.walk(tree):
            if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(function):
                if not isinstance(node, ast.Import | ast.ImportFrom):
                    continue
                ours = {m for m in _imported(node, module)
                        if m.split(".")[0] in (*PACKAGES, "tvm", "tvm_ffi")}
                if not ours:
                    continue
                line = lines_of[module][node.lineno - 1]
                costly = module not in heavy and any(
                    m in heavy or m.split(".")[0] in ("tvm", "tvm_ffi") for m in ours)
                named = bool(light) and all(
                    any(f"``{p}``" in light for p in _prefixes(m)) for m in ours)
                if not (costly or named or "#" in line):
                    unexplained.append(f"{relative}:{node.lineno}: {line.strip()}")
    assert not unexplained, ("imports inside functions with no reason (hoist them, or say why "
                             "in a comment):\n" + "\n".join(unexplained))


def _prefixes(module: str) -> list[str]:
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts) + 1)]


@pytest.mark.parametrize("module", ["qcompile.cli", "qcompile.cli_args", "qcompile.cli_db",
                                    "tuning_db", "targets", "qcompile.kernel_cache",
                                    "qcompile.measure", "qcompile.progress"])
def test_light_modules_load_no_tvm(module):
    assert module not in _loads_tvm(_modules())
