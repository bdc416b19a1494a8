"""`jaxmigrate explain CODE|NAME|"error text"`: the documentation of a rule, or of one of the
codes a rule gives for a form it does not take (`PL301`: its `## Skips` entry)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markdown import Markdown

from jaxmigrate.cli.common import stderr, stdout
from jaxmigrate.registry import UnknownRule, find_by_text, find_pass, rule_doc, skip_doc


def explain(
    query: Annotated[str, typer.Argument(help="A rule code, a rule name, or an error message.")],
) -> None:
    """Print what a rule does, why, its before/after, safety, skips and verification; for a
    skip code (`PL301`), why its form is not taken and where the rule says more."""
    skip = skip_doc(query)
    if skip is not None:
        stdout().print(Markdown(skip))
        return
    try:
        matches = [find_pass(query)]
    except UnknownRule:
        matches = find_by_text(query)
    if not matches:
        stderr().print(
            f"[bold red]error:[/] no rule matches {query!r}; `jaxmigrate rules` lists them"
        )
        raise typer.Exit(2)
    console = stdout()
    for p in matches:
        console.print(Markdown(rule_doc(p)))
