"""Finding the files to migrate: `.py` and `.ipynb` under the given paths, minus ignored ones.

Paths named explicitly are always taken (as ruff does); directories are walked with `.gitignore`
files honoured at every level (pathspec's `GitIgnoreSpec`, the rules git uses), sensible
default excludes, and `--exclude` globs. Symlinked directories are not followed, and a symlinked
file whose target leaves the tree is reported rather than migrated.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pathspec

DEFAULT_EXCLUDES = (
    ".git",
    ".hg",
    ".svn",
    ".venv",
    "venv",
    ".env",
    "env",
    "__pycache__",
    "node_modules",
    "build",
    "dist",
    "site-packages",
    ".tox",
    ".nox",
    ".eggs",
    "*.egg-info",
    ".mypy_cache",
    ".ruff_cache",
    ".pytest_cache",
    ".ipynb_checkpoints",
    ".jaxmigrate_cache",
)
SUFFIXES = (".py", ".ipynb")


@dataclass(frozen=True)
class Found:
    """A discovered file, or a path that cannot be migrated and why (`problem`)."""

    path: Path
    problem: str = ""


def _spec(patterns: Iterable[str]) -> pathspec.PathSpec:
    # GitIgnoreSpec (pathspec >= 0.10) matches as git does and as the "gitwildmatch" patterns
    # did; pathspec 1.0 deprecates "gitwildmatch", and its replacement "gitignore" changes what
    # `foo/*` matches (and does not exist before 1.0).
    return pathspec.GitIgnoreSpec.from_lines(patterns)


@dataclass(frozen=True)
class _Ignore:
    base: Path
    spec: pathspec.PathSpec

    def matches(self, path: Path, is_dir: bool) -> bool:
        rel = path.relative_to(self.base).as_posix()
        return self.spec.match_file(rel + "/" if is_dir else rel)


def _read_gitignore(directory: Path) -> _Ignore | None:
    gitignore = directory / ".gitignore"
    try:
        lines = gitignore.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return None
    return _Ignore(directory, _spec(lines))


def _git_root(start: Path) -> Path | None:
    for parent in (start, *start.parents):
        if (parent / ".git").exists():
            return parent
    return None


def _inherited_ignores(directory: Path) -> list[_Ignore]:
    """Return the .gitignore rules of the directories above `directory`, up to its git root."""
    root = _git_root(directory)
    if root is None:
        return []
    chain = [directory, *directory.parents]
    above = chain[1 : chain.index(root) + 1] if root in chain and root != directory else []
    return [ig for d in reversed(above) if (ig := _read_gitignore(d)) is not None]


class Discovery:
    """Walks paths and yields the files to migrate; one instance per run."""

    def __init__(
        self,
        excludes: Sequence[str] = (),
        use_default_excludes: bool = True,
        suffixes: Sequence[str] = SUFFIXES,
    ) -> None:
        patterns = [*(DEFAULT_EXCLUDES if use_default_excludes else ()), *excludes]
        self.exclude = _spec(patterns)
        self.suffixes = tuple(suffixes)

    def _excluded(self, path: Path, root: Path, is_dir: bool) -> bool:
        rel = path.relative_to(root).as_posix()
        return self.exclude.match_file(rel + "/" if is_dir else rel) or self.exclude.match_file(
            path.name + ("/" if is_dir else "")
        )

    def find(self, paths: Sequence[Path]) -> Iterator[Found]:
        """Yield every file to migrate under `paths`, in a stable order, each once."""
        seen: set[Path] = set()
        for given in paths:
            for found in self._find_one(given):
                key = found.path.absolute() if found.problem else found.path.resolve()
                if key not in seen:
                    seen.add(key)
                    yield found

    def _find_one(self, given: Path) -> Iterator[Found]:
        if given.is_symlink() and not given.exists():
            yield Found(given, "broken symbolic link")
        elif not given.exists():
            yield Found(given, "no such file or directory")
        elif given.is_file():
            yield Found(given)
        elif given.is_dir():
            root = given.resolve()
            yield from self._walk(root, given, root, _inherited_ignores(root))
        else:
            yield Found(given, "not a regular file or directory")

    def _walk(
        self, directory: Path, shown: Path, root: Path, ignores: list[_Ignore]
    ) -> Iterator[Found]:
        own = _read_gitignore(directory)
        if own is not None:
            ignores = [*ignores, own]
        try:
            entries = sorted(os.scandir(directory), key=lambda e: e.name)
        except OSError as exc:
            yield Found(shown, f"cannot list directory: {exc.strerror}")
            return
        for entry in entries:
            path = directory / entry.name
            is_dir = entry.is_dir(follow_symlinks=False)
            if self._excluded(path, root, is_dir):
                continue
            if any(ig.matches(path, is_dir) for ig in ignores):
                continue
            if is_dir:
                yield from self._walk(path, shown / entry.name, root, ignores)
            elif entry.is_symlink() and path.is_dir():
                continue  # symlinked directories are not followed: no loops, no escapes
            elif path.suffix in self.suffixes:
                yield self._check_file(path, shown / entry.name, root, entry)

    def _check_file(self, path: Path, shown: Path, root: Path, entry: os.DirEntry[str]) -> Found:
        if entry.is_symlink():
            try:
                target = path.resolve(strict=True)
            except (OSError, RuntimeError):
                return Found(shown, "broken or looping symbolic link")
            if not _under(target, root):
                return Found(shown, f"symbolic link leaves the tree (to {target})")
            return Found(shown, "symbolic link; its target in the tree is migrated instead")
        if not entry.is_file(follow_symlinks=False):
            return Found(shown, "not a regular file")
        return Found(shown)


def _under(path: Path, base: Path) -> bool:
    return path == base or base in path.parents
