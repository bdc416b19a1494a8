"""Code the program-level form leaves unread.

Helpers whose calls were read through their summaries and rewritten (`_replicate(tree, n)`,
`_unreplicate(tree)`): a private def of the module that is such a helper, read before the
rewrite and nowhere after it, goes (`drop_dead_helpers`). Module-level code whose every read the
rewrite deletes (flax imagenet's `sync_batch_stats` and the `cross_replica_mean` pmap it calls:
their calls on the step's equal copies go), public or not, when the code base shows no other
use of it (`left_unread`). Locals a deleted split read (`drop_dead_locals`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from itertools import dropwhile
from typing import Any, TypeVar, cast

import libcst as cst

from ._forms import single_name
from ._layout import Qualname
from ._reach import Flow, assigned_name, nodes_in, read_names
from ._summary import SCOPED, summarize

NodeT = TypeVar("NodeT", bound=cst.CSTNode)


@dataclass(frozen=True)
class Unread:
    """A module-level statement the rewrite of one program group leaves unread."""

    group: str  # the group whose edits delete its reads
    statement: cst.FunctionDef | cst.SimpleStatementLine
    readers: tuple[str, ...]  # the other such statements that read it ("" for a deleted call)


def bound_name(statement: cst.CSTNode) -> str | None:
    """The name a module-level def or one-target assignment (`name = ...`) binds, else None."""
    if isinstance(statement, cst.FunctionDef):
        return statement.name.value
    if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1:
        return assigned_name(statement.body[0])
    return None


def left_unread(
    module: cst.Module,
    flow: Flow,
    gone: Mapping[int, str],
    may_go: Callable[[str, cst.CSTNode], bool],
) -> dict[str, Unread]:
    """The module-level statements (those `may_go`) whose every read is one the rewrite deletes
    (`gone`: the group deleting it, by id of the name read) or is in another such statement
    or in itself, all for one group; by the name each binds. A name never read stays."""
    candidates = {}
    for statement in module.body:
        name = bound_name(statement)
        if name is not None and may_go(name, statement):
            assert isinstance(statement, (cst.FunctionDef, cst.SimpleStatementLine))
            candidates[name] = statement
    found: dict[str, Unread] = {}
    while True:  # until a pass over those not found finds no more
        count = len(found)
        for name, statement in [(n, s) for n, s in candidates.items() if n not in found]:
            groups, readers = set(), []
            for use in flow.loads.get(name, []):
                around = [a for a in flow.ancestors(use) if not isinstance(a, cst.Module)]
                reader = bound_name(around[-1]) if around else None
                if id(use) in gone:
                    groups.add(gone[id(use)])
                    readers.append("")
                elif around and around[-1] is statement:
                    continue  # a recursive def
                elif reader in found:
                    groups.add(found[reader].group)
                    readers.append(reader)
                else:
                    break
            else:
                if len(groups) == 1:
                    found[name] = Unread(groups.pop(), statement, tuple(readers))
        if len(found) == count:
            return found


def drop_dead_helpers(original: cst.Module, updated: cst.Module, qualname: Qualname) -> cst.Module:
    """Return `updated` without the private helpers the rewrite left unread."""
    defs = [d for d in original.body if isinstance(d, cst.FunctionDef)]
    private = [d for d in defs if d.name.value.startswith("_") and d.name.value[:2] != "__"]
    helpers = {d.name.value for d in private if summarize(d, qualname) is not None}
    if not helpers:
        return updated
    before, after = read_names(original), read_names(updated)
    dead = {name for name in helpers if before[name] and not after[name]}
    kept = [
        s for s in updated.body if not (isinstance(s, cst.FunctionDef) and s.name.value in dead)
    ]
    return updated.with_changes(body=kept)


# What a dead local's value may not hold: a call, or code that runs another's (`await`, a
# comprehension, `:=`, a lambda: `_summary.SCOPED`). Names, literals, arithmetic, attributes and items (`shape_prefix =
# (n, rows)`, `rows = x.shape[0] // n`) may go.
EFFECTS: tuple[type[cst.BaseExpression], ...] = (cst.Call, cst.Await, cst.Yield, *SCOPED)


BLOCKS = (cst.Else, cst.ExceptHandler, cst.ExceptStarHandler, cst.Finally, cst.MatchCase)


def _defs(module: cst.Module) -> dict[tuple[str, ...], cst.FunctionDef]:
    """Every def of `module` by the names of the defs around it and its own; a path two defs
    share is left out."""
    found: dict[tuple[str, ...], list[cst.FunctionDef]] = {}

    def walk(node: cst.CSTNode, path: tuple[str, ...]) -> None:
        # statements only: a def is a statement, and expressions are most of a module's nodes
        for child in node.children:
            if not isinstance(child, (cst.BaseCompoundStatement, cst.BaseSuite, BLOCKS)):
                continue
            inner = path
            if isinstance(child, cst.FunctionDef):
                inner = (*path, child.name.value)
                found.setdefault(inner, []).append(child)
            walk(child, inner)

    walk(module, ())
    return {path: defs[0] for path, defs in found.items() if len(defs) == 1}


def drop_dead_locals(original: cst.Module, updated: cst.Module) -> cst.Module:
    """Return `updated` without the local assignments its rewrite left unread.

    A split deleted (`images = images.reshape(shape_prefix + images.shape[1:])`) leaves the
    value it read unread: `shape_prefix = (num_devices, batch_size_per_device)`. Such a
    statement of a def goes, with its comments, when its one target is a plain name bound once
    in the def (nested defs included), not declared `global` or `nonlocal`, read in the
    original def and nowhere in the rewritten one, and its value holds none of `EFFECTS`
    (`without`: a block left empty holds `pass`). A `del` of such names alone goes with them
    (`del shape_prefix` after the split: kept, it would raise `UnboundLocalError`); a name a
    `del` deletes with a live one keeps its assignment. Names at module level stay: another
    module may import them.
    """
    before, dead = _defs(original), set()
    for path, new in _defs(updated).items():
        old = before.get(path)
        if old is None or old.deep_equals(new):
            continue
        read_before, read_after = read_names(old), read_names(new)
        bound = [t.target for a in nodes_in(new, cst.Assign) for t in a.targets]
        declared = {n.name.value for d in nodes_in(new, cst.Global) for n in d.names}
        declared |= {n.name.value for d in nodes_in(new, cst.Nonlocal) for n in d.names}
        unread: dict[str, int] = {}
        for line in nodes_in(new, cst.SimpleStatementLine):
            name = bound_name(line)  # `name = value`: its one target a plain name
            if (
                name
                and read_before[name]
                and not read_after[name]
                and sum(single_name(t) == name for t in bound) == 1
                and name not in declared
                and not any(next(nodes_in(line, kind), None) for kind in EFFECTS)  # in `value`
            ):
                unread[name] = id(line)
        for line in nodes_in(new, cst.SimpleStatementLine):
            deleted = [  # the names a `del` unbinds (not `del x.a`, `del x[i]`: reads of `x`)
                n.value
                for d in nodes_in(line, cst.Del)
                for n in nodes_in(d.target, cst.Name, skip=(cst.Attribute, cst.Subscript))
            ]
            if deleted and len(line.body) == 1 and set(deleted) <= unread.keys():
                dead.add(id(line))
            else:
                for name in deleted:
                    unread.pop(name, None)
        dead |= set(unread.values())
    return without(updated, dead)


def without(tree: NodeT, dead: set[int]) -> NodeT:
    """`tree` without the statements `dead` (by id), each with the comments above it. The blank
    lines above one go to the next statement of its block that has none of its own; a block
    whose first statements went begins at its next comment or statement."""
    if not dead:
        return tree

    class Drop(cst.CSTTransformer):
        def leave_IndentedBlock(
            self, original_node: cst.IndentedBlock, updated_node: cst.IndentedBlock
        ) -> cst.IndentedBlock:
            kept: list[Any] = []
            blank: list[cst.EmptyLine] = []  # above the statements gone since the last kept one
            gone = False
            for old, new in zip(original_node.body, updated_node.body, strict=True):
                lines = new.leading_lines  # type: ignore[attr-defined]
                if id(old) in dead:
                    blank, gone = blank or [line for line in lines if _blank(line)], True
                    continue
                if gone and not kept:
                    new = new.with_changes(leading_lines=list(dropwhile(_blank, lines)))
                elif blank and not any(map(_blank, lines)):
                    new = new.with_changes(leading_lines=[*blank, *lines])
                kept.append(new)
                blank = []
            return updated_node.with_changes(body=kept)

    return cast(NodeT, tree.visit(Drop()))


def _blank(line: cst.EmptyLine) -> bool:
    return line.comment is None
