"""Removing imports a rewrite left unused, without a full scope analysis.

libcst's `RemoveImportsVisitor` needs `ScopeProvider`, the expensive part of name resolution. A
pass knows which local names it stopped using, so it asks for exactly those to be dropped; an
import goes only when its name is no longer read anywhere in the module (any scope, any spelling
as a `Name`), which is conservative: a name still used in a nested scope keeps its import.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import libcst as cst

from jaxmigrate.names import dotted


class _NameUses(cst.CSTVisitor):
    def __init__(self) -> None:
        self.used: set[str] = set()
        self.dotted_used: set[str] = set()
        self.imported: list[str] = []  # what each import alias binds: `a.b.c`, `np`, ...

    def visit_Import(self, node: cst.Import) -> bool:
        self.imported.extend(filter(None, map(_bound_name, node.names)))
        return False

    def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
        if not isinstance(node.names, cst.ImportStar):
            self.imported.extend(filter(None, map(_bound_name, node.names)))
        return False

    def visit_Name(self, node: cst.Name) -> None:
        self.used.add(node.value)

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        name = dotted(node)
        if name is not None:
            self.dotted_used.add(name)
        # `obj.name` reads `obj`, not a variable called `name`.
        node.value.visit(self)
        return False


def _bound_name(alias: cst.ImportAlias) -> str | None:
    if alias.asname is not None:
        target = alias.asname.name
        return target.value if isinstance(target, cst.Name) else None
    name = dotted(alias.name)
    return None if name is None else name


def _fix_commas(aliases: list[cst.ImportAlias]) -> list[cst.ImportAlias]:
    if aliases and not isinstance(aliases[-1].comma, cst.MaybeSentinel):
        last = aliases[-1]
        aliases[-1] = last.with_changes(comma=cst.MaybeSentinel.DEFAULT)
    return aliases


class _Remover(cst.CSTTransformer):
    def __init__(self, candidates: Collection[str], uses: _NameUses) -> None:
        self.candidates = candidates
        self.uses = uses
        self.emptied: set[int] = set()

    def leave_SimpleStatementLine(
        self, original_node: cst.SimpleStatementLine, updated_node: cst.SimpleStatementLine
    ) -> cst.SimpleStatementLine | cst.RemovalSentinel:
        if original_node.body and not updated_node.body:
            self.emptied.add(id(original_node))
            return cst.RemoveFromParent()
        return updated_node

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        body = self._tidy(original_node.body, updated_node.body)
        return updated_node if body is updated_node.body else updated_node.with_changes(body=body)

    def leave_IndentedBlock(
        self, original_node: cst.IndentedBlock, updated_node: cst.IndentedBlock
    ) -> cst.IndentedBlock:
        body = self._tidy(original_node.body, updated_node.body)
        return updated_node if body is updated_node.body else updated_node.with_changes(body=body)

    def _tidy(
        self, original: Sequence[cst.BaseStatement], updated: Sequence[cst.BaseStatement]
    ) -> Sequence[cst.BaseStatement]:
        """Drop the blank lines a removed first import leaves at the top of its block."""
        if not original or id(original[0]) not in self.emptied or not updated:
            return updated
        first = updated[0]
        if not isinstance(first, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
            return updated
        lines = list(first.leading_lines)
        while lines and lines[0].comment is None:
            lines.pop(0)
        return [first.with_changes(leading_lines=lines), *updated[1:]]

    def _unused(self, alias: cst.ImportAlias, plain_import: bool) -> bool:
        bound = _bound_name(alias)
        if bound is None or bound not in self.candidates:
            return False
        if plain_import and alias.asname is None and "." in bound:
            # `import a.b.c` binds `a`; it is unused when no `a.b.c...` chain remains.
            prefix = bound + "."
            if any(d == bound or d.startswith(prefix) for d in self.uses.dotted_used):
                return False
            # ... and when `a` itself is still read, another import must keep binding it.
            top = bound.split(".")[0]
            return top not in self.uses.used or any(
                b.split(".")[0] == top and b not in self.candidates for b in self.uses.imported
            )
        return bound not in self.uses.used

    def leave_Import(
        self, original_node: cst.Import, updated_node: cst.Import
    ) -> cst.Import | cst.RemovalSentinel:
        kept = [a for a in updated_node.names if not self._unused(a, plain_import=True)]
        if not kept:
            return cst.RemoveFromParent()
        if len(kept) == len(updated_node.names):
            return updated_node
        return updated_node.with_changes(names=_fix_commas(kept))

    def leave_ImportFrom(
        self, original_node: cst.ImportFrom, updated_node: cst.ImportFrom
    ) -> cst.ImportFrom | cst.RemovalSentinel:
        if isinstance(updated_node.names, cst.ImportStar):
            return updated_node
        kept = [a for a in updated_node.names if not self._unused(a, plain_import=False)]
        if not kept:
            return cst.RemoveFromParent()
        if len(kept) == len(updated_node.names):
            return updated_node
        changes: dict[str, object] = {"names": _fix_commas(kept)}
        if len(kept) == 1 and updated_node.lpar is not None:
            changes.update(lpar=None, rpar=None)
        return updated_node.with_changes(**changes)


def remove_unused_imports(module: cst.Module, candidates: Collection[str]) -> cst.Module:
    """Return `module` without the imports binding `candidates` that nothing reads any more.

    `candidates` are local names (`pjit`, `shmap`) or, for a plain `import a.b.c`, the dotted
    module path.
    """
    if not candidates:
        return module
    uses = _NameUses()
    module.visit(uses)
    return module.visit(_Remover(candidates, uses))
