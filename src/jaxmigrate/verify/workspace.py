"""The temporary directory a verification run works in; the user's tree is only ever read.

<base>/original/   a copy of the project, each requested file as its original text
<base>/candidate/  a copy of the project, each requested file as its rewritten text
<base>/child/_jaxmigrate_child/   the worker-side package (on the children's PYTHONPATH)
<base>/boot/sitecustomize.py      the recorder's bootstrap (only for the recorded command)
<base>/io/        inputs and outputs passed from original to candidate workers
<base>/records/   calls recorded while the user's command ran
<base>/logs/      the workers' and the command's stderr
<base>/owner      the pid (and start time) of the run that made it (`lifetime.sweep`)
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from jaxmigrate.verify.lifetime import PREFIX, claim

CHILD_PACKAGE = "_jaxmigrate_child"
# Folders a verification neither copies nor watches: version control, environments, caches.
NOT_THE_PROJECT = (
    ".git",
    ".hg",
    ".svn",
    ".venv",
    "venv",
    "__pycache__",
    ".mypy_cache",
    ".pytest_cache",
    ".ruff_cache",
    ".tox",
    ".nox",
    "node_modules",
)
SKIP = shutil.ignore_patterns(*NOT_THE_PROJECT, "*.pyc", "*.egg-info")


@dataclass(frozen=True)
class Workspace:
    """The directories of one verification run."""

    base: Path

    @property
    def original(self) -> Path:
        return self.base / "original"

    @property
    def candidate(self) -> Path:
        return self.base / "candidate"

    @property
    def child(self) -> Path:
        return self.base / "child"

    @property
    def boot(self) -> Path:
        return self.base / "boot"

    @property
    def io(self) -> Path:
        return self.base / "io"

    @property
    def records(self) -> Path:
        return self.base / "records"

    @property
    def logs(self) -> Path:
        return self.base / "logs"

    def tree(self, side: str) -> Path:
        """Return the copy of the project for `side` ("original" or "candidate")."""
        return self.original if side == "original" else self.candidate

    def write(self, side: str, relpath: str, text: str) -> None:
        """Write one file of one side's copy."""
        path = self.tree(side) / relpath
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def install_child(ws: Workspace) -> None:
    """Copy the worker-side package and the recorder's bootstrap into the workspace."""
    source = Path(__file__).with_name("child")
    shutil.copytree(source, ws.child / CHILD_PACKAGE, ignore=SKIP)
    ws.boot.mkdir()
    shutil.copyfile(source / "bootstrap.py", ws.boot / "sitecustomize.py")


# An outside file a symlink points to is copied up to this size, else linked like a folder.
COPY_OUTSIDE_FILE = 16 * 2**20


def copy_project(root: Path, dest: Path) -> None:
    """Copy the project into `dest`, never following a symbolic link into a loop or a copy.

    A link to a file or folder inside the tree stays a link, to the same place in the copy (as
    relative link: `loop -> .` stays a loop, as in the project, and is copied once). A link
    that leaves the tree is linked, not copied, when it is a folder (a dataset) or a file over
    `COPY_OUTSIDE_FILE`: the code reads it where it is. A broken or looping link is left out,
    as discovery leaves it out; so are sockets, FIFOs and devices. A verifier's workspace
    (this one, where the root holds the temporary directory, or another run's) is no part of
    the project: copied, the copy would walk into itself.
    """
    real_root = os.path.realpath(root)

    def place(link: str, target: Path) -> None:
        try:
            real = os.path.realpath(link, strict=True)
        except (OSError, RuntimeError):
            return  # broken, or a loop
        inside = real == real_root or real.startswith(real_root + os.sep)
        if inside:
            mirrored = os.path.join(dest, os.path.relpath(real, real_root))
            os.symlink(os.path.relpath(mirrored, target.parent), target)
        elif os.path.isdir(real) or os.path.getsize(real) > COPY_OUTSIDE_FILE:
            os.symlink(real, target)
        elif os.path.isfile(real):
            shutil.copy2(real, target)

    def walk(folder: str, into: Path) -> None:
        into.mkdir(parents=True, exist_ok=True)
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError:
            return  # a folder that cannot be listed (discovery skips it too)
        ignored = SKIP(folder, [e.name for e in entries])
        for entry in entries:
            if entry.name in ignored or entry.name.startswith(PREFIX):
                continue
            target = into / entry.name
            try:
                if entry.is_symlink():
                    place(entry.path, target)
                elif entry.is_dir(follow_symlinks=False):
                    walk(entry.path, target)
                elif entry.is_file(follow_symlinks=False):
                    shutil.copy2(entry.path, target)
            except OSError:
                continue  # unreadable: the copy lacks it, as the code would lack it here

    walk(str(root), dest)


@contextmanager
def workspace(
    root: Path, originals: Mapping[str, str], candidates: Mapping[str, str]
) -> Iterator[Workspace]:
    """Create a workspace for `root` with the given file texts per side; remove it after."""
    base = Path(tempfile.mkdtemp(prefix=PREFIX))
    ws = Workspace(base)
    try:
        claim(base)  # a run killed by SIGKILL leaves it: the next run removes it (`sweep`)
        for side, texts in (("original", originals), ("candidate", candidates)):
            copy_project(root, ws.tree(side))
            for relpath, text in texts.items():
                ws.write(side, relpath, text)
        for folder in (ws.io, ws.records, ws.logs):
            folder.mkdir()
        install_child(ws)
        yield ws
    finally:
        shutil.rmtree(base, ignore_errors=True)


def module_name(root: Path, relpath: str) -> tuple[str, str]:
    """Return the dotted name of the module at `relpath` and the sys.path entry it needs.

    Folders without `__init__.py` inside a regular package are namespace folders of it
    (big_vision's `big_vision/trainers/proj/flexi/train.py` is
    `big_vision.trainers.proj.flexi.train`, as its trainers are run): the name goes through
    them to the package. A folder of scripts in no package is its own entry."""
    path = Path(relpath)
    parts = [] if path.stem == "__init__" else [path.stem]
    folder = _packages_up(root, path.parent, parts)
    gap: list[str] = []
    above = folder
    while above != Path(".") and not (root / above / "__init__.py").exists():
        gap.insert(0, above.name)
        above = above.parent
    if folder != Path(".") and above != Path(".") and all(n.isidentifier() for n in gap):
        parts[:0] = gap  # namespace folders of the package `above`
        folder = _packages_up(root, above, parts)
    return ".".join(parts) or path.parent.name, str(folder)


def _packages_up(root: Path, folder: Path, parts: list[str]) -> Path:
    """Prepend to `parts` the regular packages from `folder` up; return the folder above them."""
    while folder != Path(".") and (root / folder / "__init__.py").exists():
        parts.insert(0, folder.name)
        folder = folder.parent
    return folder
