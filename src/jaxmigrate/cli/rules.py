"""`jaxmigrate rules`: every pass with its code, name, safety and one line."""

from __future__ import annotations

from rich.table import Table

from jaxmigrate.cli.common import stdout
from jaxmigrate.passes import version_text
from jaxmigrate.registry import all_passes


def rules() -> None:
    """List every rule: code, name, safety, the JAX its output needs, and what it does."""
    table = Table(show_edge=False)
    for column in ("code", "name", "safety", "needs JAX", "what it does"):
        table.add_column(column)
    for p in all_passes():
        table.add_row(p.CODE, p.NAME, str(p.SAFETY), f">= {version_text(p.MIN_JAX)}", p.summary())
    stdout().print(table)
