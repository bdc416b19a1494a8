"""The fast read-only walk every analysis of a module uses, and dotted names.

`walk` visits a module's nodes without rebuilding them (libcst's `visit` does), skipping
punctuation and whitespace. The scope model (`scope.ScopeModel`: scopes, bindings, what each
name means) is built with it.
"""

from __future__ import annotations

import dataclasses

import libcst as cst

# Fields that only ever hold punctuation and whitespace: the walk below never enters them.
_TRIVIA = frozenset(
    {
        "lpar",
        "rpar",
        "leading_lines",
        "lines_after_decorators",
        "comma",
        "semicolon",
        "header",
        "footer",
        "trailing_whitespace",
        "newline",
        "equal",
        "colon",
        "operator",
        "lbracket",
        "rbracket",
        "lbrace",
        "rbrace",
        "dot",
        "relative",
        "asynchronous",
        "star_tok",
    }
)
_FIELDS: dict[type, tuple[str, ...]] = {}


def child_fields(kind: type) -> tuple[str, ...]:
    found = _FIELDS.get(kind)
    if found is None:
        found = tuple(
            f.name
            for f in dataclasses.fields(kind)
            if f.name not in _TRIVIA and not f.name.startswith("whitespace")
        )
        _FIELDS[kind] = found
    return found


_IS_NODE: dict[type, bool] = {}


def is_node(kind: type) -> bool:
    """`issubclass(kind, cst.CSTNode)`, remembered: CSTNode is an ABC, and `isinstance` against
    an ABC costs several times a plain class check, for every field of every node walked."""
    found = _IS_NODE.get(kind)
    if found is None:
        found = _IS_NODE[kind] = issubclass(kind, cst.CSTNode)
    return found


def walk(visitor: cst.CSTVisitor, node: cst.CSTNode) -> None:
    """Visit `node` and its non-trivia children with `visitor`'s on_visit/on_leave.

    About four times faster than `node.visit(visitor)`, which rebuilds every node it passes;
    for read-only visitors that need no attribute hooks and no whitespace or punctuation.
    """
    if visitor.on_visit(node):
        for name in child_fields(type(node)):
            value = getattr(node, name)
            kind = type(value)
            if kind is tuple or kind is list:
                for child in value:
                    if is_node(type(child)):
                        walk(visitor, child)
            elif is_node(kind):
                walk(visitor, value)
    visitor.on_leave(node)


def dotted(node: cst.BaseExpression) -> str | None:
    """Return `a.b.c` for a Name/Attribute chain, else None."""
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        base = dotted(node.value)
        return None if base is None else f"{base}.{node.attr.value}"
    return None
