"""`jaxmigrate explain CODE|NAME|"error text"`: the documentation of a rule."""

from __future__ import annotations

import inspect
import sys
from typing import Annotated

import typer
from rich.markdown import Markdown

from jaxmigrate.cli.common import stderr, stdout
from jaxmigrate.passes import Pass
from jaxmigrate.registry import UnknownRule, all_passes, find_pass


def rule_doc(pass_cls: type[Pass]) -> str:
    """Return the rule's documentation: its module docstring, headed by code and name."""
    module = sys.modules[pass_cls.__module__]
    doc = inspect.cleandoc(module.__doc__ or pass_cls.__doc__ or "")
    return f"# {pass_cls.CODE} {pass_cls.NAME} ({pass_cls.SAFETY})\n\n{doc}\n"


def find_by_text(text: str) -> list[type[Pass]]:
    """Return the passes whose documentation mentions `text` (pasted error messages, APIs)."""
    needle = " ".join(text.lower().split())
    found = []
    for p in all_passes():
        doc = " ".join(rule_doc(p).lower().split())
        if needle and needle in doc:
            found.append(p)
    return found


def explain(
    query: Annotated[str, typer.Argument(help="A rule code, a rule name, or an error message.")],
) -> None:
    """Print what a rule does, why, its before/after, safety, skips and verification."""
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
