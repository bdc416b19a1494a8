"""`jaxmigrate rules`: every pass with its code, name, safety and one line.

`--markdown` prints the same rows as the README's rules table, which a test keeps identical.
"""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from jaxmigrate.cli.common import stdout
from jaxmigrate.registry import all_passes
from jaxmigrate.toolkit.passes import version_text

COLUMNS = ("code", "name", "safety", "output needs JAX", "what it does")


def rule_rows() -> list[tuple[str, str, str, str, str]]:
    """Return one row per rule, in the order the passes run: the facts each pass declares."""
    return [
        (p.CODE, p.NAME, str(p.SAFETY), f">= {version_text(p.MIN_JAX)}", p.summary())
        for p in all_passes()
    ]


def markdown_table() -> str:
    """Return the rules as a Markdown table (the README's)."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(row) + " |" for row in rule_rows()]
    return "\n".join(lines) + "\n"


def rules(
    markdown: Annotated[
        bool, typer.Option("--markdown", help="Print a Markdown table (the README's).")
    ] = False,
) -> None:
    """List every rule: code, name, safety, the JAX its output needs, and what it does."""
    if markdown:
        typer.echo(markdown_table(), nl=False)
        return
    table = Table(show_edge=False)
    for column in COLUMNS:
        table.add_column(column)
    for row in rule_rows():
        table.add_row(*row)
    stdout().print(table)
