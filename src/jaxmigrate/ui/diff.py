"""Unified diffs (difflib) rendered in colour with rich; a notebook's diff is one per cell."""

from __future__ import annotations

import difflib

from rich.console import Console
from rich.text import Text

from jaxmigrate.model import place
from jaxmigrate.pipeline.notebook import NotebookError, changed_cells


def unified_diff(old: str, new: str, path: str, context: int = 3) -> list[str]:
    """Return the lines of a unified diff of `old` -> `new` for `path`."""
    if old == new:
        return []
    return list(
        difflib.unified_diff(
            old.splitlines(keepends=True),
            new.splitlines(keepends=True),
            fromfile=f"a/{path}",
            tofile=f"b/{path}",
            n=context,
        )
    )


def diff_text(lines: list[str]) -> Text:
    """Return diff lines as coloured rich Text."""
    out = Text()
    for line in lines:
        body = line if line.endswith("\n") else line + "\n\\ No newline at end of file\n"
        if line.startswith(("+++", "---")):
            out.append(body, style="bold")
        elif line.startswith("@@"):
            out.append(body, style="cyan")
        elif line.startswith("+"):
            out.append(body, style="green")
        elif line.startswith("-"):
            out.append(body, style="red")
        else:
            out.append(body, style="default")
    return out


def file_diff(old: str, new: str, path: str, context: int = 3) -> list[str]:
    """Return the diff lines of a file; a notebook's per changed cell (`a/nb.ipynb[cell 3]`)."""
    if path.endswith(".ipynb"):
        try:
            cells = changed_cells(old, new)
        except NotebookError:
            cells = None  # not a notebook we read: show its text as it is
        if cells is not None:
            return [
                line
                for number, before, after in cells
                for line in unified_diff(*_ended(before, after), place(path, number), context)
            ]
    return unified_diff(old, new, path, context)


def _ended(old: str, new: str) -> tuple[str, str]:
    """Cells rarely end with a newline: say so only when a rewrite changed that."""
    if not old.endswith("\n") and not new.endswith("\n"):
        return old + "\n", new + "\n"
    return old, new


def print_diff(console: Console, old: str, new: str, path: str, context: int = 3) -> None:
    """Print a coloured unified diff (nothing when the texts are equal)."""
    lines = file_diff(old, new, path, context)
    if lines:
        console.print(diff_text(lines), end="", soft_wrap=True, highlight=False)
