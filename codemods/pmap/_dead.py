"""Helpers the program-level form leaves uncalled (`_replicate(tree, n)`, `_unreplicate(tree)`:
their calls were read through their summaries and rewritten). A private def of the module that
is such a helper, read before the rewrite and nowhere after it, goes; a public one stays (another
module may import it)."""

from __future__ import annotations

import libcst as cst

from ._layout import Qualname
from ._reach import read_names
from ._summary import summarize


def drop_dead_helpers(original: cst.Module, updated: cst.Module, qualname: Qualname) -> cst.Module:
    """Return `updated` without the private helpers the rewrite left unread."""
    helpers = {
        d.name.value
        for d in original.body
        if isinstance(d, cst.FunctionDef)
        and d.name.value.startswith("_")
        and not d.name.value.startswith("__")
        and summarize(d, qualname) is not None
    }
    if not helpers:
        return updated
    before, after = read_names(original), read_names(updated)
    dead = {name for name in helpers if before[name] and not after[name]}
    if not dead:
        return updated
    kept = [
        s for s in updated.body if not (isinstance(s, cst.FunctionDef) and s.name.value in dead)
    ]
    return updated.with_changes(body=kept)


# What a dead local's value may be: names, literals and arithmetic on them, their attributes
# and items (`shape_prefix = (n, rows)`, `rows = x.shape[0] // n`); never a call.
PURE = (
    cst.Name,
    cst.Integer,
    cst.Float,
    cst.Imaginary,
    cst.SimpleString,
    cst.ConcatenatedString,
    cst.Tuple,
    cst.List,
    cst.Element,
    cst.StarredElement,
    cst.BinaryOperation,
    cst.UnaryOperation,
    cst.Attribute,
    cst.Subscript,
    cst.SubscriptElement,
    cst.Index,
    cst.Slice,
    cst.Ellipsis,
    cst.LeftParen,
    cst.RightParen,
    cst.LeftSquareBracket,
    cst.RightSquareBracket,
    cst.Comma,
    cst.Colon,
    cst.Dot,
    cst.BaseBinaryOp,
    cst.BaseUnaryOp,
    cst.MaybeSentinel,
    cst.SimpleWhitespace,
    cst.ParenthesizedWhitespace,
    cst.TrailingWhitespace,
    cst.EmptyLine,
    cst.Newline,
    cst.Comment,
)


def _pure(node: cst.CSTNode) -> bool:
    return isinstance(node, PURE) and all(_pure(child) for child in node.children)


def _defs(node: cst.CSTNode, path: tuple[str, ...] = ()) -> dict[tuple[str, ...], cst.FunctionDef]:
    """Every def under `node` by the names of the defs around it and its own; a path two defs
    share maps to neither (`None` is left out)."""
    found: dict[tuple[str, ...], cst.FunctionDef] = {}
    twice: set[tuple[str, ...]] = set()

    class Defs(cst.CSTVisitor):
        def __init__(self) -> None:
            self.path = list(path)

        def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
            self.path.append(node.name.value)
            key = tuple(self.path)
            if key in found:
                twice.add(key)
            found[key] = node

        def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
            self.path.pop()

    node.visit(Defs())
    return {k: v for k, v in found.items() if k not in twice}


def drop_dead_locals(original: cst.Module, updated: cst.Module) -> cst.Module:
    """Return `updated` without the local assignments its rewrite left unread.

    A split deleted (`images = images.reshape(shape_prefix + images.shape[1:])`) leaves the
    value it read unread: `shape_prefix = (num_devices, batch_size_per_device)`. Such a
    statement of a def goes when its one target is a plain name bound nowhere else in the def,
    read in the original def and nowhere in the rewritten one (nested defs and lambdas
    included), its value has no call (`_pure`), and it is not alone in its block. Names at
    module level stay: another module may import them.
    """
    before, after = _defs(original), _defs(updated)
    dead: set[int] = set()
    for path, new in after.items():
        old = before.get(path)
        if old is None or old is new or old.deep_equals(new):
            continue
        read_before, read_after = read_names(old), read_names(new)
        bound = [
            target.target.value
            for assign in _walk(new, cst.Assign)
            for target in assign.targets
            if isinstance(target.target, cst.Name)
        ]
        declared = {n.value for d in _walk(new, (cst.Global, cst.Nonlocal)) for n in _names_of(d)}
        for line in _walk(new, cst.SimpleStatementLine):
            if len(line.body) != 1 or not isinstance(line.body[0], cst.Assign):
                continue
            assign = line.body[0]
            if len(assign.targets) != 1 or not isinstance(assign.targets[0].target, cst.Name):
                continue
            name = assign.targets[0].target.value
            if (
                read_before[name]
                and not read_after[name]
                and bound.count(name) == 1
                and name not in declared
                and _pure(assign.value)
            ):
                dead.add(id(line))
    if not dead:
        return updated

    class Drop(cst.CSTTransformer):
        def leave_IndentedBlock(
            self, original_node: cst.IndentedBlock, updated_node: cst.IndentedBlock
        ) -> cst.IndentedBlock:
            pairs = zip(original_node.body, updated_node.body, strict=True)
            kept = [new for old, new in pairs if id(old) not in dead]
            return updated_node.with_changes(body=kept) if kept else updated_node

    return updated.visit(Drop())


def _walk(node: cst.CSTNode, kind: type | tuple[type, ...]) -> list:
    """The nodes of `kind` in `node`'s own body, not in the defs and classes nested in it."""
    found = []

    class Walk(cst.CSTVisitor):
        def on_visit(self, child: cst.CSTNode) -> bool:
            if child is not node and isinstance(child, (cst.FunctionDef, cst.ClassDef)):
                return False
            if isinstance(child, kind):
                found.append(child)
            return True

    node.visit(Walk())
    return found


def _names_of(declaration: cst.Global | cst.Nonlocal) -> list[cst.Name]:
    return [item.name for item in declaration.names]
