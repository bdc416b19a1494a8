"""Deciding cheaply which passes a file needs, so most files are never parsed by libcst.

Two stages. The text stage asks each pass's `TRIGGER` regex, once every part of one of its
`QUALNAMES` is seen written in the text (`Pass.may_name`: the name stage needs that). A pass may
also look at the `ast` itself (`Pass.may_apply_to`). The name stage runs only for passes that
declare `QUALNAMES` (the legacy objects they rewrite): Python's own `ast` parser, an order of
magnitude faster than libcst's, lists what the file's imports make reachable, and a pass stays
only if one of its qualified names is referenced (`Pass.mentioned_in`; the pmap rule also keeps a
file naming something `pmap` of another module: a shortcut for `jax.pmap` there). The name stage over-approximates (it ignores
shadowing), so it never drops a file a pass would rewrite; a file `ast` cannot parse (newer
syntax than the running Python) keeps every pass. The parse is returned with the choice
(`Prefiltered`), for the engine to reuse.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from jaxmigrate.toolkit.facts import AstFacts, Outline, outline, parse_exactly
from jaxmigrate.toolkit.passes import Pass


@dataclass(frozen=True)
class Prefiltered:
    """The passes that may find a site in a source, and what Python's parse of it showed."""

    passes: list[type[Pass]]
    # Where the top-level statements start, when Python parsed the source as it is written
    # (so it is not too deeply nested for libcst either); else None.
    outline: Outline | None = None


def prefilter(source: str, passes: Sequence[type[Pass]]) -> Prefiltered:
    """Return the passes that may find a site in `source`, in their order, with the parse."""
    chosen = [p for p in passes if p.may_name(source) and p.applies_to(source)]
    if not chosen:
        return Prefiltered(chosen)
    tree, exact = parse_exactly(source)
    if tree is None:
        return Prefiltered(chosen)
    facts = AstFacts(tree)
    kept = [p for p in chosen if p.mentioned_in(facts) and p.may_apply_to(facts)]
    return Prefiltered(kept, outline(tree) if exact else None)


def passes_for(source: str, passes: Sequence[type[Pass]]) -> list[type[Pass]]:
    """Return the passes that may find a site in `source`, in their order."""
    return prefilter(source, passes).passes
