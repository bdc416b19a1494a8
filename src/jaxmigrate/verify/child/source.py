"""Read-only questions about Python source, answered with `ast` (no JAX, imported by both sides).

Which `with` statements that can set a mesh enclose a line, and where the target of a site is
called. The recorder asks them about the frames of a running program; the planner about files.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass

MESH_CALLS = frozenset({"set_mesh", "use_mesh", "use_abstract_mesh", "Mesh", "make_mesh"})


_BLOCKS = (ast.stmt, ast.excepthandler, ast.match_case)


@dataclass(frozen=True)
class MeshWith:
    """A `with` statement at `line` whose items may set a mesh, as source text."""

    line: int
    exprs: tuple[str, ...]


def _callee_name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return None


def is_mesh_expr(node: ast.expr) -> bool:
    """Return True if a with-item may set a mesh: a name, an attribute, or a call of a callee
    named like a mesh (`Mesh(...)`, `jax.set_mesh(...)`, `use_mesh`, an alias `LegacyMesh`)."""
    if isinstance(node, (ast.Name, ast.Attribute)):
        return True
    if not isinstance(node, ast.Call):
        return False
    name = _callee_name(node.func) or ""
    return name in MESH_CALLS or "mesh" in name.lower()


def mesh_with(node: ast.With | ast.AsyncWith, text: str) -> MeshWith | None:
    """Return the mesh-like items of one `with` statement, or None if it has none."""
    exprs = tuple(
        ast.get_source_segment(text, item.context_expr) or ""
        for item in node.items
        if is_mesh_expr(item.context_expr)
    )
    return MeshWith(node.lineno, exprs) if exprs else None


def _contains(node: ast.AST, line: int) -> bool:
    start = getattr(node, "lineno", None)
    end = getattr(node, "end_lineno", None)
    return start is not None and end is not None and start <= line <= end


def enclosing_withs(tree: ast.Module, text: str, line: int) -> tuple[MeshWith, ...]:
    """Return the mesh-like `with` statements around `line` whose body holds it, outermost first."""
    found: list[MeshWith] = []
    node: ast.AST = tree
    while True:
        child = next(
            (
                c
                for c in ast.iter_child_nodes(node)
                if isinstance(c, _BLOCKS) and _contains(c, line)
            ),
            None,
        )
        if child is None:
            return tuple(found)
        if isinstance(child, (ast.With, ast.AsyncWith)) and child.body[0].lineno <= line:
            item = mesh_with(child, text)
            if item is not None:
                found.append(item)
        node = child


def local_bindings(tree: ast.Module, text: str, with_line: int) -> list[list[str]]:
    """Return [name, expression] of the locals the `with` at `with_line` reads that its function
    assigns once, by a plain `name = ...` before it (and of the locals those read), in the
    order they run: `mesh = jax.make_mesh(...)` before `with jax.set_mesh(mesh):`."""
    funcs = [
        n
        for n in ast.walk(tree)
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and _contains(n, with_line)
    ]
    node = next(
        (
            n
            for n in ast.walk(tree)
            if isinstance(n, ast.With | ast.AsyncWith) and n.lineno == with_line
        ),
        None,
    )
    if not funcs or node is None:
        return []
    func = max(funcs, key=lambda f: f.lineno)  # the innermost
    binds: dict[str, int] = {}  # every way a name is bound: `=`, `+=`, `for`, `as`, `import`
    plain: dict[str, ast.Assign] = {}  # `name = value`, one target
    for child in _own_nodes(func):
        names = _bound_names(child)
        for name in names:
            binds[name] = binds.get(name, 0) + 1
        if isinstance(child, ast.Assign) and len(child.targets) == 1:
            target = child.targets[0]
            if isinstance(target, ast.Name):
                plain[target.id] = child
    params = {a.arg for a in ast.walk(func.args) if isinstance(a, ast.arg)}
    found: dict[str, ast.Assign] = {}
    todo = [
        n.id for item in node.items for n in ast.walk(item.context_expr) if isinstance(n, ast.Name)
    ]
    while todo:
        name = todo.pop()
        stmt = plain.get(name)
        if name in found or name in params or binds.get(name) != 1 or stmt is None:
            continue  # a parameter, bound more than once or otherwise: the recorded mesh
        if stmt.lineno >= with_line:
            continue
        found[name] = stmt
        todo += [n.id for n in ast.walk(stmt.value) if isinstance(n, ast.Name)]
    ordered = sorted(found.items(), key=lambda kv: kv[1].lineno)
    return [[name, ast.get_source_segment(text, stmt.value) or ""] for name, stmt in ordered]


def _bound_names(node: ast.AST) -> list[str]:
    """The names one node of a function binds (or declares another scope's: `global`)."""
    if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
        return [node.id]
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return [(a.asname or a.name).split(".")[0] for a in node.names]
    if isinstance(node, (ast.Global, ast.Nonlocal)):
        return list(node.names) * 2  # never one binding of this function's own
    if isinstance(node, ast.ExceptHandler) and node.name:
        return [node.name]
    if isinstance(node, (ast.MatchAs, ast.MatchStar)) and node.name:
        return [node.name]
    return []


def _own_nodes(func: ast.AST) -> Iterator[ast.AST]:
    """Every node of a function's body but those of the functions and classes nested in it."""
    todo = list(ast.iter_child_nodes(func))
    while todo:
        node = todo.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            todo.extend(ast.iter_child_nodes(node))


def calls_of(tree: ast.Module, name: str) -> Iterator[ast.Call]:
    """Yield every call of the plain name `name` in the module, in source order."""
    calls = [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == name
    ]
    yield from sorted(calls, key=lambda c: (c.lineno, c.col_offset))


def call_site_withs(tree: ast.Module, text: str, name: str) -> tuple[MeshWith, ...]:
    """Return the mesh contexts of the first call of `name` that runs under one, else ()."""
    for call in calls_of(tree, name):
        withs = enclosing_withs(tree, text, call.lineno)
        if withs:
            return withs
    return ()


def with_at(tree: ast.Module, text: str, line: int) -> MeshWith | None:
    """Return the mesh-like `with` statement starting at `line`, or None."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.With, ast.AsyncWith)) and node.lineno == line:
            return mesh_with(node, text)
    return None
