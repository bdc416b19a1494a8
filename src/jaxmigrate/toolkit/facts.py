"""What Python's own `ast` says about a module: parsed cheaply, walked once, shared.

The prefilter (`jaxmigrate.pipeline.prefilter`) parses a file with `ast`, an order of magnitude faster than
libcst, and hands the result to each pass's `may_apply_to` as `AstFacts`; the outline of the same
parse lets `positions.LazyPositions` place a statement without generating the code before it.
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterable, Sequence
from typing import TypeVar

_Node = TypeVar("_Node", bound=ast.AST)
Outline = list[tuple[int, list[int] | None]]


def _chain(node: ast.expr) -> tuple[str, list[str]] | None:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return node.id, parts[::-1]
    return None


def parse(source: str) -> ast.Module | None:
    """Return the `ast` of `source`, or None when the running Python cannot parse it.

    Python 3.11 cannot parse PEP 695 type parameters (`class C[T]:`, `def f[T](x: T)`,
    `type A = ...`), which much new code (JAX's own) uses; such a source is parsed again with
    them rewritten away (`_without_type_params`), which keeps every name it reads.
    """
    return parse_exactly(source)[0]


def parse_exactly(source: str) -> tuple[ast.Module | None, bool]:
    """Return what `parse` returns, and whether Python parsed `source` as it is written (not
    lowered first): then it is neither too deeply nested nor invalid for libcst's purposes."""
    try:
        return ast.parse(source), True
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        pass
    if sys.version_info >= (3, 12):
        return None, False
    lowered = _without_type_params(source)
    if lowered is None:
        return None, False
    try:
        return ast.parse(lowered), False
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None, False


def outline(tree: ast.Module) -> Outline:
    """Where each top-level statement starts, and each statement of a top-level class.

    One entry per `ast` statement: the line of its first token as libcst places a statement
    (`def`/`class`, not the decorators), and for a class the same for its body. This lets
    `positions.LazyPositions` place one statement without generating the code before it.
    """
    return [
        (stmt.lineno, [s.lineno for s in stmt.body] if isinstance(stmt, ast.ClassDef) else None)
        for stmt in tree.body
    ]


_TYPE_PARAMS = re.compile(
    r"\b(?:def|class)[ \t]+\w+[ \t]*\[|^[ \t]*type[ \t]+\w+[ \t]*\[", re.MULTILINE
)
_TYPE_ALIAS = re.compile(r"^([ \t]*)type[ \t]+(?=\w+[ \t]*=)", re.MULTILINE)
_BRACKETS = {"[": "]", "(": ")", "{": "}"}


def _without_type_params(source: str) -> str | None:
    """Return `source` with PEP 695 syntax rewritten into Python 3.11's, or None.

    The `[...]` of type parameters after a `def`, `class` or `type` name is dropped, and the
    bounds and defaults it held are appended as expression statements, so every name they read
    is still seen; then `type A = v` becomes `A = v`.
    """
    pieces: list[str] = []
    reads: list[str] = []
    start = 0
    for match in _TYPE_PARAMS.finditer(source):
        if match.start() < start:
            continue
        opened = match.end() - 1
        closed = _closing(source, opened)
        if closed is None:
            return None
        reads.extend(_bounds(source[opened + 1 : closed]))
        pieces.append(source[start:opened])
        start = closed + 1
    pieces.append(source[start:])
    lowered = _TYPE_ALIAS.sub(r"\1", "".join(pieces))
    return lowered + "".join(f"\n({expr})" for expr in reads) + "\n"


def _closing(source: str, opened: int) -> int | None:
    """Return the index of the bracket closing the one at `opened` (no strings inside)."""
    stack: list[str] = []
    for index in range(opened, len(source)):
        char = source[index]
        if char in _BRACKETS:
            stack.append(_BRACKETS[char])
        elif char in ")]}":
            if not stack or stack.pop() != char:
                return None
            if not stack:
                return index
        elif char in "'\"#":
            return None
    return None


def _bounds(params: str) -> list[str]:
    """Return the bound and default expressions in the text of a type parameter list."""
    found: list[str] = []
    depth = 0
    item: list[str] = []
    for char in params + ",":
        if char == "," and depth == 0:
            # `T`, `T: bound`, `T = default`, `T: bound = default`, `*Ts`, `**P`
            rest = re.sub(r"^\s*\**\s*\w+\s*", "", "".join(item))
            if rest.startswith(":"):
                bound, _, default = rest[1:].partition("=")
            else:
                bound, default = "", rest.removeprefix("=")
            found.extend(e.strip() for e in (bound, default) if e.strip())
            item = []
            continue
        depth += char in "([{"
        depth -= char in ")]}"
        item.append(char)
    return found


class AstFacts:
    """One walk of a module's `ast`, shared by the name stage and every pass's `may_apply_to`.

    `nodes(ast.With)` lists the nodes of a type without walking again; `names` holds the dotted
    names of imported objects the module mentions (see `_referenced`).
    """

    def __init__(self, tree: ast.Module) -> None:
        self.tree = tree
        self._by_type: dict[type[ast.AST], list[ast.AST]] = {}
        stack: list[ast.AST] = [tree]
        by_type = self._by_type
        node_type = ast.AST
        while stack:
            node = stack.pop()
            kind = type(node)
            found = by_type.get(kind)
            if found is None:
                found = by_type[kind] = []
            found.append(node)
            for field in _fields(kind):
                value = getattr(node, field, None)
                if type(value) is list:
                    stack.extend(v for v in value if isinstance(v, node_type))
                elif isinstance(value, node_type):
                    stack.append(value)
        self._names: set[str] | None = None
        self._bindings: dict[str, list[str | tuple[str, list[str]]]] | None = None

    def nodes(self, kind: type[_Node]) -> list[_Node]:
        """Return the module's nodes of type `kind` (exactly: not of its subclasses)."""
        return self._by_type.get(kind, [])  # type: ignore[return-value]

    @property
    def names(self) -> set[str]:
        if self._names is None:
            self._names = _referenced(self)
        return self._names

    def mentions(self, wanted: Sequence[str]) -> bool:
        """Return True if the module mentions one of `wanted` or something inside it."""
        return _mentions(self.names, wanted)

    def meanings(self, node: ast.expr) -> set[str]:
        """Return every dotted name `node` (a name or attribute chain) may refer to: through
        the module's absolute imports and plain aliases (`sm = jax.shard_map`), bound in any
        scope. A superset of what the scope model resolves it to
        (`ScopeModel.qualified_name`), which takes the same two kinds of binding, in scope."""
        chain = _chain(node)
        if chain is None:
            return set()
        if self._bindings is None:
            self._bindings = _bindings(self)
        rest = ".".join(chain[1])
        return {".".join(filter(None, (base, rest))) for base in self._resolve(chain[0], 0)}

    def _resolve(self, name: str, depth: int) -> set[str]:
        assert self._bindings is not None
        found: set[str] = set()
        if depth > 20:  # the scope model gives up there too
            return found
        for bound in self._bindings.get(name, ()):
            if isinstance(bound, str):
                found.add(bound)
                continue
            head, parts = bound
            if head == name:  # `x = x.y`: another binding of `x` is what it reads
                continue
            rest = ".".join(parts)
            found |= {".".join(filter(None, (b, rest))) for b in self._resolve(head, depth + 1)}
        return found


_FIELDS: dict[type[ast.AST], tuple[str, ...]] = {}


def _fields(kind: type[ast.AST]) -> tuple[str, ...]:
    """The fields of an `ast` node type that may hold nodes, without `ctx` (Load/Store: a third
    of all nodes, which no check reads)."""
    found = _FIELDS.get(kind)
    if found is None:
        found = _FIELDS[kind] = tuple(f for f in kind._fields if f != "ctx")
    return found


def _referenced(facts: AstFacts) -> set[str]:
    aliases: dict[str, set[str]] = {}
    found: set[str] = set()
    for imp in facts.nodes(ast.Import):
        for a in imp.names:
            local = a.asname or a.name.split(".")[0]
            aliases.setdefault(local, set()).add(a.name if a.asname else local)
            found.add(a.name)
    for imp_from in facts.nodes(ast.ImportFrom):
        if imp_from.module and not imp_from.level:
            for a in imp_from.names:
                qualified = f"{imp_from.module}.{a.name}"
                aliases.setdefault(a.asname or a.name, set()).add(qualified)
                found.add(qualified)
    load = ast.Load
    reads: list[ast.Attribute | ast.Name] = [*facts.nodes(ast.Attribute), *facts.nodes(ast.Name)]
    for node in reads:
        if isinstance(node.ctx, load):
            chain = _chain(node)
            if chain is not None and chain[0] in aliases:
                for base in aliases[chain[0]]:
                    found.add(".".join([base, *chain[1]]))
    return found


def _bindings(facts: AstFacts) -> dict[str, list[str | tuple[str, list[str]]]]:
    """Each name's bindings that give it a dotted meaning, in any scope: the qualified name an
    absolute import binds, or the chain a plain alias (`x = a.b`, one target) is assigned."""
    found: dict[str, list[str | tuple[str, list[str]]]] = {}
    for imp in facts.nodes(ast.Import):
        for a in imp.names:
            local = a.asname or a.name.split(".")[0]
            found.setdefault(local, []).append(a.name if a.asname else local)
    for imp_from in facts.nodes(ast.ImportFrom):
        if imp_from.module and not imp_from.level:
            for a in imp_from.names:
                found.setdefault(a.asname or a.name, []).append(f"{imp_from.module}.{a.name}")
    for assign in facts.nodes(ast.Assign):
        target = assign.targets[0] if len(assign.targets) == 1 else None
        chain = _chain(assign.value) if isinstance(target, ast.Name) else None
        if isinstance(target, ast.Name) and chain is not None:
            found.setdefault(target.id, []).append(chain)
    return found


def _mentions(names: Iterable[str], wanted: Sequence[str]) -> bool:
    return any(n == w or n.startswith(w + ".") for n in names for w in wanted)
