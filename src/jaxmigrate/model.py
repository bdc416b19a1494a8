"""The frozen records every layer passes around: sites, skips and per-file results."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

# The newest JAX minor version the passes know; the default `--target-jax`.
LATEST_JAX = (0, 10)
# How pmap is migrated: program-level where the data flow is visible, or always per device.
PMAP_STYLES = ("idiomatic", "faithful")


class Safety(StrEnum):
    """Whether a rewrite provably keeps behaviour (`safe`) or can change it (`unsafe`)."""

    SAFE = "safe"
    UNSAFE = "unsafe"


class Status(StrEnum):
    """What execution said about a site."""

    VERIFIED = "verified"
    FAILED = "failed"
    UNVERIFIED = "unverified"
    NOT_NEEDED = "not-needed"


class Bucket(StrEnum):
    """The one outcome of a file."""

    CHANGED = "changed"
    UNCHANGED = "unchanged"
    SKIPPED = "skipped"
    FAILED = "failed"


@dataclass(frozen=True)
class Site:
    """One rewrite of one legacy construct, located in the original source."""

    code: str
    name: str
    line: int
    col: int
    safety: Safety
    message: str
    key: str
    group: str | None = None
    status: Status = Status.UNVERIFIED
    applied: bool = False
    reason: str = ""
    details: dict[str, Any] = field(default_factory=dict, compare=False)
    cell: int | None = None
    # A site of a form that has a fallback (the program-level pmap form and its edits): the key
    # that asks its pass for the fallback form instead (`fallbacks` of the run). On the site
    # written in the fallback form, the same key.
    fallback: str | None = None

    @property
    def group_step(self) -> bool:
        """A step of a program-level group: the pmap made `jax.jit(jax.shard_map(...))`, whose
        calls can be recorded (its `layout`, the original's step taken flat)."""
        return self.group is not None and "layout" in self.details

    @property
    def group_edit(self) -> bool:
        """Another edit of a program-level group (a replication deleted, a readback gone): it
        makes nothing whose calls could be recorded."""
        return self.group is not None and "layout" not in self.details

    def to_json(self, path: str) -> dict[str, Any]:
        """Return the report form of this site."""
        out: dict[str, Any] = {
            "code": self.code,
            "name": self.name,
            "path": path,
            "line": self.line,
            "col": self.col,
            "safety": str(self.safety),
            "status": str(self.status),
            "applied": self.applied,
            "message": self.message,
        }
        if self.cell is not None:
            out["cell"] = self.cell
        if self.reason:
            out["reason"] = self.reason
        if self.details:
            out["details"] = self.details
        return out


@dataclass(frozen=True)
class Skip:
    """A legacy construct a pass saw and deliberately left alone, with the reason."""

    code: str
    name: str
    line: int
    col: int
    reason: str
    suppressed: bool = False
    cell: int | None = None
    needs_jax: str = ""  # the JAX its rewrite needs, above the run's target ("0.7"), or ""
    target_jax: str = ""  # with `needs_jax`: the run's target ("0.5")
    target_source: str = ""  # with `needs_jax`: where that target came from (`Options`)

    def to_json(self, path: str) -> dict[str, Any]:
        """Return the report form of this skip."""
        out: dict[str, Any] = {
            "code": self.code,
            "name": self.name,
            "path": path,
            "line": self.line,
            "col": self.col,
            "reason": self.reason,
            "suppressed": self.suppressed,
        }
        if self.cell is not None:
            out["cell"] = self.cell
        if self.needs_jax:
            out["needs_jax"] = self.needs_jax
        return out


def place(path: str, cell: int | None) -> str:
    """Return how a location is named to the user: `nb.ipynb[cell 3]` in a notebook, else `path`.

    Cells are numbered from 1 among the notebook's code cells, as ruff numbers them.
    """
    return path if cell is None else f"{path}[cell {cell}]"


@dataclass(frozen=True)
class ProjectFile:
    """A module of the user's project that rewritten code imports (a helper shared by many files).

    A pass requests it (`Pass.shared_module`); the engine keeps it when a site in `keys` is
    applied, and the run creates or updates it together with the files that import it.
    """

    path: str
    text: str
    keys: frozenset[str] = frozenset()  # the sites of the requesting file that need it


@dataclass(frozen=True)
class FileResult:
    """Everything one file came to: its bucket, its sites and skips, and both texts."""

    path: str
    bucket: Bucket
    sites: tuple[Site, ...] = ()
    skips: tuple[Skip, ...] = ()
    reason: str = ""
    old_text: str | None = None
    new_text: str | None = None
    written: bool = False
    files: tuple[ProjectFile, ...] = ()  # the project modules its new text imports
    # The fallback forms verification chose (`Site.fallback` key -> why), rendered with them.
    fallbacks: Mapping[str, str] = field(default_factory=dict, compare=False)

    @property
    def pending(self) -> tuple[Site, ...]:
        """Sites found but not applied."""
        return tuple(s for s in self.sites if not s.applied)

    def to_json(self) -> dict[str, Any]:
        """Return the report form of this file."""
        out: dict[str, Any] = {
            "path": self.path,
            "bucket": str(self.bucket),
            "sites": [s.to_json(self.path) for s in self.sites],
            "skips": [s.to_json(self.path) for s in self.skips],
        }
        if self.reason:
            out["reason"] = self.reason
        return out


@dataclass(frozen=True)
class Options:
    """What the user asked for that changes which rewrites are made and applied."""

    select: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()
    unsafe_fixes: bool = False
    target_jax: tuple[int, int] = LATEST_JAX
    # Where `target_jax` came from, for the reasons of skipped sites (`--target-jax 0.6`, the
    # project's `jax>=0.4.30` in pyproject.toml, ...); '' when given in code.
    target_source: str = ""
    pmap_style: str = "idiomatic"  # PMAP_STYLES: the program-level form where the flow is visible
    # `[tool.jaxmigrate] pmap-replicated`: defs whose callers pass these parameters as equal
    # copies per device (`Evaluator.run(params)`), read by the pmap rule (`codemods/pmap`)
    pmap_replicated: tuple[str, ...] = ()
