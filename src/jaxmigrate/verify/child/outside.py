"""Folders outside the project that a recorded call is given: kept as they were, for the replays.

`train_and_evaluate(config, workdir)` with `workdir = tempfile.mkdtemp()` (or a path on the
command line) writes its checkpoint outside the project, where the copy of the tree the command
ran in does not isolate it. A replay on that path would restore the checkpoint the recording
wrote and run zero steps, on both sides: agreeing, and showing nothing. Or the folder is gone
(a `TemporaryDirectory`) and both sides fail.

So when a call is recorded, each argument that is an absolute path outside the project (and
outside the interpreter's installation) is kept as it was just before the call: the folder or
file is copied next to the record (`<record>.jaxmigrate-snap<k>`), or noted as absent. A replay
gets the argument pointed at `<record>.jaxmigrate-live<k>`, which is laid afresh from that copy
before every call on either side, so each side's every call starts from the same files. A path
too large to copy is recorded with the reason, and the site is then `unverified`.

Only arguments of the call itself are seen: a path the function builds or reads from elsewhere
(a fixed `~/.cache`, an environment variable) is not.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import PurePath
from typing import Any

LIMIT = 256 * 2**20  # bytes copied per argument, at most
SNAP = ".jaxmigrate-snap"
LIVE = ".jaxmigrate-live"
SYSTEM = ("/dev/", "/proc/", "/sys/")


def inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def outside_arguments(
    args: Sequence[Any], kwargs: dict[str, Any], tree: Sequence[str]
) -> list[tuple[str, str]]:
    """Return (key, path) of each argument naming a path outside `tree`: `0`, `1`... or a name."""
    installed = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix)}
    mine = [os.path.realpath(p) for p in tree] + sorted(installed)
    found = []
    for key, value in [*((str(i), a) for i, a in enumerate(args)), *kwargs.items()]:
        if not isinstance(value, (str, PurePath)):
            continue
        path = os.fspath(value)
        if not os.path.isabs(path) or "\n" in path or len(path) > 4096:
            continue
        real = os.path.realpath(path)
        if real == os.sep or real.startswith(SYSTEM) or any(inside(real, m) for m in mine):
            continue
        if os.path.lexists(real) or os.path.isdir(os.path.dirname(real)):
            found.append((key, path))
    return found


def size_of(path: str, limit: int) -> int:
    """Return the bytes under `path`, counting no further than just past `limit`."""
    if not os.path.isdir(path):
        return os.path.getsize(path)
    total = 0
    for folder, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(folder, name)).st_size
            except OSError:
                continue
            if total > limit:
                return total
    return total


def keep(found: list[tuple[str, str]], base: str) -> list[dict[str, Any]]:
    """Copy each found path as it is now to `<base>.jaxmigrate-snap<k>`; return the entries."""
    entries = []
    for k, (key, path) in enumerate(found):
        entry: dict[str, Any] = {"key": key, "path": path, "present": os.path.lexists(path)}
        copy = f"{base}{SNAP}{k}"
        try:
            if entry["present"] and size_of(path, LIMIT) > LIMIT:
                entry["error"] = f"holds more than {LIMIT // 2**20} MiB, too much to copy"
            elif os.path.isdir(path):
                shutil.copytree(path, copy, symlinks=True)
            elif entry["present"]:
                shutil.copy2(path, copy, follow_symlinks=False)
        except OSError as exc:
            entry["error"] = f"could not be copied: {exc}"
        entries.append(entry)
    return entries


def rename(entries: list[dict[str, Any]], old: str, new: str) -> None:
    """Move the copies made under the record name `old` to the record name `new`."""
    for k, entry in enumerate(entries):
        if os.path.lexists(f"{old}{SNAP}{k}"):
            os.replace(f"{old}{SNAP}{k}", f"{new}{SNAP}{k}")


def discard(entries: list[dict[str, Any]], base: str) -> None:
    for k in range(len(entries)):
        remove(f"{base}{SNAP}{k}")


def remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        os.remove(path)


class NotKept(Exception):
    """A path argument outside the project could not be kept as it was: no honest replay."""


def pointed(call: Any, entries: list[dict[str, Any]], base: str) -> Any:
    """Return the recorded call with each kept argument pointed at its live copy."""
    if not entries:
        return call
    args, kwargs = list(call[0]), dict(call[1])
    for k, entry in enumerate(entries):
        if entry.get("error"):
            raise NotKept(
                f"the recorded call's argument `{entry['key']}` is `{entry['path']}`, outside the "
                f"project, which {entry['error']}: its replays could not start from the files as "
                "they were when the call was recorded (give the command a smaller folder, or one "
                "inside the project: it runs in a copy)"
            )
        live = f"{base}{LIVE}{k}"
        key = entry["key"]
        old = args[int(key)] if key.isdigit() else kwargs[key]
        new = type(old)(live) if isinstance(old, PurePath) else live
        if key.isdigit():
            args[int(key)] = new
        else:
            kwargs[key] = new
    return tuple(args), kwargs


def lay(args: Sequence[Any], kwargs: dict[str, Any]) -> None:
    """Lay each live copy among the arguments afresh from its kept copy, before a call."""
    for value in [*args, *kwargs.values()]:
        if not isinstance(value, (str, PurePath)):
            continue
        path = os.fspath(value)
        if not isinstance(path, str) or LIVE not in path:
            continue
        base, _, k = path.rpartition(LIVE)
        if k.isdigit():
            lay_path(path, f"{base}{SNAP}{k}")


def lay_path(path: str, snap: str) -> None:
    """Make `path` what `snap` holds (a folder or a file), or absent if `snap` is."""
    remove(path)
    if os.path.isdir(snap):
        shutil.copytree(snap, path, symlinks=True)
    elif os.path.lexists(snap):
        shutil.copy2(snap, path, follow_symlinks=False)
