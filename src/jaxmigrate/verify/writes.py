"""Writes outside the scratch copies: the project tree and the home folder, before and after.

Verification runs the project's code in copies, but the code can still write by absolute path
(into the project itself, or under `~`). Such writes are not blocked; they are found by
comparing a snapshot taken before verification with one taken after, and reported on every
site's verdict (`outside_writes`). Covered: every file and folder of the project tree (name,
size, modification time; version-control, virtualenv and cache folders left out, at most
`LIMIT` entries), and the names directly in the home folder (a new file or folder there).
Not covered: deeper under `~` (`~/.cache/...`), and elsewhere on the machine.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from jaxmigrate.verify.workspace import NOT_THE_PROJECT

LIMIT = 50_000
LEFT_OUT = {*NOT_THE_PROJECT, ".jaxmigrate_cache"}
SHOWN = 5

Snapshot = dict[str, tuple[int, int, bool]]  # path -> (size, mtime_ns, is a folder)


def tree(root: Path) -> Snapshot:
    """Return the files and folders under `root` (at most LIMIT), without following links."""
    found: Snapshot = {}
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in LEFT_OUT)
        for name in [*dirs, *files]:
            path = os.path.join(folder, name)
            try:
                info = os.lstat(path)
            except OSError:
                continue
            found[path] = (info.st_size, info.st_mtime_ns, name in dirs)
            if len(found) >= LIMIT:
                return found
    return found


def home(folder: Path, skip: Path) -> Snapshot:
    """Return the names directly in `folder`, except the one holding `skip` (the project).

    By name only: dotfiles there change all the time (shell histories), a new entry does not.
    """
    try:
        names = os.listdir(folder)
    except OSError:
        return {}
    paths = [folder / name for name in names]
    return {str(p): (0, 0, True) for p in paths if not (p == skip or skip.is_relative_to(p))}


def changed(before: Snapshot, after: Snapshot) -> list[str]:
    """Return what was created, changed or removed between two snapshots."""
    out = []
    for path in sorted(before.keys() | after.keys()):
        old, new = before.get(path), after.get(path)
        if old is None:
            out.append(f"created {path}")
        elif new is None:
            out.append(f"removed {path}")
        elif not new[2] and old != new:
            out.append(f"changed {path}")
    return out


@contextmanager
def watched(root: Path) -> Iterator[list[str]]:
    """Yield a list that, after the block, holds what changed outside the copies."""
    root = root.resolve()
    user_home = Path.home().resolve()
    before = tree(root), home(user_home, root)
    found: list[str] = []
    try:
        yield found
    finally:
        after = tree(root), home(user_home, root)
        found += changed(before[0], after[0]) + changed(before[1], after[1])


def note(found: list[str]) -> str:
    """Return the one-line note on writes outside the copies, or ''."""
    if not found:
        return ""
    shown = "; ".join(found[:SHOWN]) + (
        f"; and {len(found) - SHOWN} more" if len(found) > SHOWN else ""
    )
    return f"while verification ran, files outside its copies changed (not blocked): {shown}"
