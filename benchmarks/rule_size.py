"""How large a rule is: its code lines by module, optionally against another revision.

    python benchmarks/rule_size.py [--rule pmap] [--vs REV]

A code line is a line holding a token of code: blank lines, comments and docstrings (a module's,
a class's or a def's first statement when it is a string) do not count, so deleting comments
does not move the figure; wrapping does (a call `ruff format` lays out over six lines, with a
magic trailing comma, counts six, three without it), so both sides of a comparison are laid out
by the same `ruff format`. `--vs REV` reads the
rule's files at a git revision (`git show`) and prints both columns and the change; the
closing notes quote this table.
"""

from __future__ import annotations

import argparse
import ast
import io
import subprocess
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SKIPPED = {
    tokenize.COMMENT,
    tokenize.NL,
    tokenize.NEWLINE,
    tokenize.INDENT,
    tokenize.DEDENT,
    tokenize.ENDMARKER,
}
DOCUMENTED = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


def code_lines(source: str) -> int:
    """Return how many lines of `source` hold a token of code outside a docstring."""
    docstrings: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, DOCUMENTED) and node.body:
            first = node.body[0]
            value = first.value if isinstance(first, ast.Expr) else None
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                end = first.end_lineno or first.lineno
                docstrings.update(range(first.lineno, end + 1))
    lines: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in SKIPPED:
            lines.update(range(token.start[0], token.end[0] + 1))
    return len(lines - docstrings)


def sizes_now(rule: str) -> dict[str, int]:
    """Return the code lines of each module of the rule in the working tree, by file name."""
    folder = ROOT / "codemods" / rule
    return {p.name: code_lines(p.read_text()) for p in sorted(folder.glob("*.py"))}


def sizes_at(rule: str, rev: str) -> dict[str, int]:
    """Return the code lines of each module of the rule at git revision `rev`, by file name."""
    folder = f"codemods/{rule}"
    listed = subprocess.run(
        ["git", "ls-tree", "--name-only", f"{rev}:{folder}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    sizes = {}
    for name in sorted(n for n in listed if n.endswith(".py")):
        source = subprocess.run(
            ["git", "show", f"{rev}:{folder}/{name}"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        sizes[name] = code_lines(source)
    return sizes


def main() -> None:
    """Print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rule", default="pmap", help="the folder under codemods/")
    parser.add_argument("--vs", metavar="REV", help="a git revision to compare against")
    args = parser.parse_args()
    now = sizes_now(args.rule)
    if args.vs is None:
        for name, size in sorted(now.items(), key=lambda kv: -kv[1]):
            print(f"{name:<20} {size:>6,}")
        print(f"{'total':<20} {sum(now.values()):>6,}")
        return
    then = sizes_at(args.rule, args.vs)
    print(f"{'module':<20} {args.vs[:12]:>12} {'now':>8} {'change':>8}")
    for name in sorted(then.keys() | now.keys(), key=lambda n: -max(then.get(n, 0), now.get(n, 0))):
        old, new = then.get(name, 0), now.get(name, 0)
        print(f"{name:<20} {old:>12,} {new:>8,} {new - old:>+8,}")
    old, new = sum(then.values()), sum(now.values())
    print(f"{'total':<20} {old:>12,} {new:>8,} {new - old:>+8,}")


if __name__ == "__main__":
    main()
