"""`jaxmigrate explain CODE|NAME|"error text"`: the documentation of a rule, or of one of the
codes a rule gives for a form it does not take (`PL301`: its `## Skips` entry)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markdown import Markdown

from jaxmigrate.cli.common import stderr, stdout
from jaxmigrate.registry import UnknownRule, find_by_text, find_pass, find_skip, rule_doc


def explain(
    query: Annotated[str, typer.Argument(help="A rule code, a rule name, or an error message.")],
) -> None:
    """Print what a rule does, why, its before/after, safety, skips and verification; for a
    skip code (`PL301`), why its form is not taken and where the rule says more."""
    skip = find_skip(query)
    if skip is not None:
        rule, code, entry = skip
        stdout().print(
            Markdown(
                f"# {code}: a form {rule.CODE} {rule.NAME} does not take\n\n{entry}\n\n"
                f"The site keeps the form its message names, and the message names the value "
                f"that blocks. `jaxmigrate explain {rule.CODE}` documents the whole rule, its "
                f"`[tool.jaxmigrate]` settings included."
            )
        )
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
