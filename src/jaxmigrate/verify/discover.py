"""The project's own tests that call a function the `--verify-with` command never called.

numpyro's `MCMC` tests (the command a user gives) never call `vsbc_diagnostic`, whose pmap is
another site of the same migration; `test/infer/test_calibration.py` does. When the command made
no call of a function target, the tests that name it (module-level `test_*` functions and
methods of `Test*` classes whose source holds the name as a word, in the project's
`test_*.py` / `*_test.py` files) are run with the recorder, as a second recording command, and
only for such targets. Only the calls that run the site are recorded (`child/reach.py`), and the
verdict names the tests its inputs came from.
"""

from __future__ import annotations

import ast
import os
import re
import shlex
from collections.abc import Iterator
from pathlib import Path

LIMIT = 40  # tests run for all such targets together, at most
SKIP = {".git", ".hg", ".venv", "venv", "node_modules", "__pycache__", "build", "dist", ".tox"}


def test_files(root: Path) -> Iterator[Path]:
    """Yield the project's test files (`test_*.py`, `*_test.py`), in a stable order."""
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in SKIP and not d.startswith("."))
        for name in sorted(files):
            if name.endswith(".py") and (name.startswith("test_") or name.endswith("_test.py")):
                yield Path(folder) / name


def tests_in(tree: ast.Module, text: str, word: re.Pattern[str]) -> list[str]:
    """Return the node ids (after `file::`) of the tests whose source names `word`."""
    found = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if node.name.startswith("test") and word.search(
                ast.get_source_segment(text, node) or ""
            ):
                found.append(node.name)
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            for item in node.body:
                if not isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                source = ast.get_source_segment(text, item) or ""
                if item.name.startswith("test") and word.search(source):
                    found.append(f"{node.name}::{item.name}")
    return found


def tests_calling(root: Path, name: str) -> list[str]:
    """Return the node ids (`path/to/test_x.py::test_y`, relative to `root`) naming `name`."""
    word = re.compile(rf"\b{re.escape(name)}\b")
    ids = []
    for path in test_files(root):
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        if not word.search(text):
            continue
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        rel = path.relative_to(root).as_posix()
        ids += [f"{rel}::{test}" for test in tests_in(tree, text, word)]
    return ids


def pytest_command(python: str, tree: Path, ids: list[str]) -> str:
    """Return the shell command running the tests `ids` (relative to `tree`) with pytest."""
    args = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    return " ".join(shlex.quote(a) for a in [*args, *(str(tree / i) for i in ids)])


def described(ids: list[str]) -> str:
    """Return the tests in a few words: `test/infer/test_calibration.py (12 tests)`."""
    files = sorted({i.split("::")[0] for i in ids})
    shown = ", ".join(files[:2]) + (f" and {len(files) - 2} more files" if len(files) > 2 else "")
    return f"{shown} ({len(ids)} test{'s' if len(ids) != 1 else ''})"
