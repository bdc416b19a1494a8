"""Deciding cheaply which passes a file needs, so most files are never parsed by libcst.

Two stages. The text stage asks each pass's `TRIGGER` regex. A pass may also look at the `ast` itself
(`Pass.may_apply_to`). The name stage runs only for passes that declare `QUALNAMES` (the legacy objects they rewrite): Python's own `ast` parser, an order of
magnitude faster than libcst's, lists what the file's imports make reachable, and a pass stays
only if one of its qualified names is referenced. The name stage over-approximates (it ignores
shadowing), so it never drops a file a pass would rewrite; a file `ast` cannot parse (newer syntax
than the running Python) keeps every pass.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Sequence

from jaxmigrate.passes import Pass


def _chain(node: ast.expr) -> tuple[str, list[str]] | None:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return node.id, parts[::-1]
    return None


def parse(source: str) -> ast.Module | None:
    """Return the `ast` of `source`, or None when the running Python cannot parse it."""
    try:
        return ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def referenced_names(tree: ast.Module) -> set[str]:
    """Return the dotted names of imported objects the module mentions."""
    aliases: dict[str, set[str]] = {}
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                local = a.asname or a.name.split(".")[0]
                aliases.setdefault(local, set()).add(a.name if a.asname else local)
                found.add(a.name)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:
                qualified = f"{node.module}.{a.name}"
                aliases.setdefault(a.asname or a.name, set()).add(qualified)
                found.add(qualified)
    for node in ast.walk(tree):
        if isinstance(node, (ast.Attribute, ast.Name)) and isinstance(node.ctx, ast.Load):
            chain = _chain(node)
            if chain is not None and chain[0] in aliases:
                for base in aliases[chain[0]]:
                    found.add(".".join([base, *chain[1]]))
    return found


def _mentions(names: Iterable[str], wanted: Sequence[str]) -> bool:
    return any(n == w or n.startswith(w + ".") for n in names for w in wanted)


def passes_for(source: str, passes: Sequence[type[Pass]]) -> list[type[Pass]]:
    """Return the passes that may find a site in `source`, in their order."""
    chosen = [p for p in passes if p.applies_to(source)]
    if not chosen:
        return chosen
    tree = parse(source)
    if tree is None:
        return chosen
    names = referenced_names(tree) if any(p.QUALNAMES for p in chosen) else set()
    return [
        p
        for p in chosen
        if (not p.QUALNAMES or _mentions(names, p.QUALNAMES)) and p.may_apply_to(tree)
    ]
