"""The package's layers, kept honest: which package may import which, and no import circle.

    cli, __main__, the package facade            7  the command line (typer)
    report                                       6  json / sarif / markdown / text reports
    ui                                           5  everything rich renders
    verify, review                               4  verification by execution, interactive review
    pipeline                                     3  discovery, prefilter, engine, notebooks, cache, runner
    codemods, registry                           2  the rules, in one ordered registry
    toolkit                                      1  what passes are built from: scope model, emitter
    model, textio, config, _version              0  records and text every layer shares

A module may import from its own layer and the layers below it, never above; every import counts
(at module level, under TYPE_CHECKING, or inside a function). `verify.child` runs inside the
user's interpreter next to JAX, so it imports nothing of jaxmigrate outside itself. rich is
imported only by `ui` and `cli`, JAX only by `verify.child`.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SOURCES = {"jaxmigrate": ROOT / "src" / "jaxmigrate", "jaxmigrate.codemods": ROOT / "codemods"}

LAYERS: list[tuple[str, ...]] = [
    ("jaxmigrate.model", "jaxmigrate.textio", "jaxmigrate.config", "jaxmigrate._version"),
    ("jaxmigrate.toolkit",),
    ("jaxmigrate.codemods", "jaxmigrate.registry"),
    ("jaxmigrate.pipeline",),
    ("jaxmigrate.verify", "jaxmigrate.review"),
    ("jaxmigrate.ui",),
    ("jaxmigrate.report",),
    ("jaxmigrate.cli", "jaxmigrate.__main__", "jaxmigrate"),
]


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package, root in SOURCES.items():
        for path in root.rglob("*.py"):
            parts = path.relative_to(root).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join((package, *parts))] = path
    return found


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """Return the jaxmigrate modules `name` imports, wherever in the file the import is."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            for alias in node.names:
                full = f"{base}.{alias.name}"
                found.add(full if full in MODULES else base)
    return {m for m in found if m in MODULES and m != name}


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def layer_of(module: str) -> int:
    best, best_len = -1, -1
    for index, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best_len:
                best, best_len = index, len(prefix)
    assert best >= 0, f"{module} is in no layer: add it to LAYERS"
    return best


def test_every_import_of_jaxmigrate_names_a_module_that_exists() -> None:
    """A module moved into a package leaves no import of its old place behind."""
    missing = []
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and not node.level and node.module:
                if node.module.startswith("jaxmigrate") and node.module not in MODULES:
                    missing.append(f"{name}: from {node.module} import ...")
            elif isinstance(node, ast.Import):
                wanted = [a.name for a in node.names if a.name.startswith("jaxmigrate")]
                missing += [f"{name}: import {w}" for w in wanted if w not in MODULES]
    assert not missing, missing


def test_every_module_is_in_a_layer() -> None:
    for module in MODULES:
        layer_of(module)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_module_imports_from_a_layer_above_its_own(module: str) -> None:
    upward = [m for m in GRAPH[module] if layer_of(m) > layer_of(module)]
    assert not upward, f"{module} (layer {layer_of(module)}) imports {upward} from above"


def test_there_is_no_import_circle() -> None:
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(module: str) -> None:
        state[module] = 1
        path.append(module)
        for target in sorted(GRAPH[module]):
            if state.get(target) == 1:
                circle = path[path.index(target) :] + [target]
                raise AssertionError("import circle: " + " -> ".join(circle))
            if target not in state:
                visit(target)
        path.pop()
        state[module] = 2

    for module in sorted(GRAPH):
        if module not in state:
            visit(module)


def test_the_verification_child_imports_nothing_of_jaxmigrate_outside_itself() -> None:
    child = "jaxmigrate.verify.child"
    for module, targets in GRAPH.items():
        if module.startswith(child):
            outside = [t for t in targets if not t.startswith(child)]
            assert not outside, f"{module} imports {outside}"


def _third_party(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module.split(".")[0])
    return found


@pytest.mark.parametrize(
    ("library", "allowed"),
    [("rich", ("jaxmigrate.ui", "jaxmigrate.cli")), ("jax", ("jaxmigrate.verify.child",))],
)
def test_rich_and_jax_stay_in_their_layer(library: str, allowed: tuple[str, ...]) -> None:
    users = [m for m, p in MODULES.items() if library in _third_party(p)]
    outside = [m for m in users if not any(m == a or m.startswith(a + ".") for a in allowed)]
    assert not outside, f"{library} imported by {outside}"


def test_the_layer_picture_in_the_docs_is_this_one() -> None:
    doc = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    for prefixes in LAYERS:
        for prefix in prefixes:
            if prefix != "jaxmigrate":
                assert prefix.removeprefix("jaxmigrate.") in doc, prefix
