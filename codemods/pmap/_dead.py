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
