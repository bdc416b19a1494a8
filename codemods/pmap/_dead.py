"""Helpers the program-level form leaves uncalled (`_replicate(tree, n)`, `_unreplicate(tree)`:
their calls were read through their summaries and rewritten). A private def of the module that
is such a helper, read before the rewrite and nowhere after it, goes; a public one stays (another
module may import it)."""

from __future__ import annotations

from collections import Counter

import libcst as cst

from ._layout import Qualname
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
    before, after = _reads(original, helpers), _reads(updated, helpers)
    dead = {name for name in helpers if before[name] and not after[name]}
    if not dead:
        return updated
    kept = [
        s for s in updated.body if not (isinstance(s, cst.FunctionDef) and s.name.value in dead)
    ]
    return updated.with_changes(body=kept)


def _reads(module: cst.Module, names: set[str]) -> Counter[str]:
    """How often each of `names` is read in `module` (not as a def's name or an attribute)."""
    found: Counter[str] = Counter()
    defined: set[int] = set()

    class Reads(cst.CSTVisitor):
        def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
            defined.add(id(node.name))  # the def's own name is no read

        def visit_Attribute(self, node: cst.Attribute) -> bool:
            node.value.visit(self)
            return False  # `x._name`: an attribute, not the helper

        def visit_Name(self, node: cst.Name) -> None:
            if node.value in names and id(node) not in defined:
                found[node.value] += 1

    if names:
        module.visit(Reads())
    return found
