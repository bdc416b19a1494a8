"""Unified diffs (difflib) rendered in colour with rich."""

from __future__ import annotations

import difflib

from rich.console import Console
from rich.text import Text


def unified_diff(old: str, new: str, path: str, context: int = 3) -> list[str]:
    """Return the lines of a unified diff of `old` -> `new` for `path`."""
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


def print_diff(console: Console, old: str, new: str, path: str, context: int = 3) -> None:
    """Print a coloured unified diff (nothing when the texts are equal)."""
    lines = unified_diff(old, new, path, context)
    if lines:
        console.print(diff_text(lines), end="", soft_wrap=True, highlight=False)
