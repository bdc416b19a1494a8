"""A per-file cache of the engine's results, as ruff keeps one, so unchanged files cost a read.

An entry answers for one file's bytes under one set of settings. The settings are in the folder
name: a digest of jaxmigrate's version and the source of its engine and passes (an edited
checkout never reuses stale answers), the passes chosen (module, class, code, name, safety),
`--select`/`--ignore`, `--unsafe-fixes`, the target JAX, the installed JAX (from its metadata,
never imported), Python's and libcst's versions. The entry's name is a digest of the file's
bytes and kind (`.py` or `.ipynb`); the path is not part of the key, as the engine's result does
not depend on it.

Entries are written for files with sites or skips, and for any other file that took longer to
decide than an entry costs to write (`files.WORTH_CACHING`); a file without a text trigger,
most files, is decided again in microseconds.

Only the pure engine result is kept: bucket, sites and skips as the default policy decided them,
and the new text (or "unchanged"). Verification always runs after the engine and is never
cached, so `run` re-verifies cached unsafe sites like fresh ones. Failed files (parse errors,
internal errors) are not cached either: they are rare and cheap to redo, and an internal error
may not happen twice.

Entries are written atomically (a temporary file renamed into place), so worker processes and
concurrent runs (pre-commit runs hooks in parallel) can share the cache; the last writer of an
identical entry wins. Each entry carries a digest of its payload: an entry that is truncated,
corrupt, or from another format is a miss, never an error. A cache that cannot be written (a
read-only tree) is silently not written.

Layout, under the project root::

    .jaxmigrate_cache/
        .gitignore  CACHEDIR.TAG
        v1/<settings digest>/<content digest>.json

A dry run (`run --dry-run`, `check`) writes nothing in the user's tree: its cache is the same
layout under the user's cache directory, one folder per project root (`user_cache_root`:
`$XDG_CACHE_HOME/jaxmigrate/<digest of the root's absolute path>`, `~/.cache` without
`XDG_CACHE_HOME`), so repeated checks (pre-commit) stay fast.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, fields
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any

from jaxmigrate._version import __version__
from jaxmigrate.model import Bucket, FileResult, Options, Safety, Site, Skip, Status
from jaxmigrate.registry import chosen_passes

CACHE_DIR = ".jaxmigrate_cache"
FORMAT = 1
TAG = (
    "Signature: 8a477f597d28d172789f06886806bc55\n"
    "# This file is a cache directory tag created by jaxmigrate.\n"
    "# For information about cache directory tags see https://bford.info/cachedir/\n"
)


def _digest(*parts: bytes) -> str:
    h = hashlib.blake2b(digest_size=16)
    for part in parts:
        h.update(part)
    return h.hexdigest()


@cache
def code_digest() -> str:
    """Return a digest of the source of the jaxmigrate package and its passes."""
    import jaxmigrate.codemods

    package = Path(__file__).resolve().parent.parent  # src/jaxmigrate, from its pipeline/
    roots = {package, Path(jaxmigrate.codemods.__file__).resolve().parent}
    h = hashlib.blake2b(digest_size=16)
    for root in sorted(roots):
        for file in sorted(root.rglob("*.py")):
            h.update(file.relative_to(root).as_posix().encode() + b"\0")
            h.update(file.read_bytes() + b"\0")
    return h.hexdigest()


def user_cache_root(root: Path) -> Path:
    """Return the folder holding the dry-run cache of the project at `root`, outside it."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "jaxmigrate" / _digest(str(root.absolute()).encode("utf-8"))


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def settings_digest(options: Options, runtime: Mapping[str, Any] | None = None) -> str:
    """Return the digest of everything besides a file's bytes that its result depends on.

    `runtime` is what verification runs on (the interpreters of both sides and the JAX they
    have: `Settings.runtime`): a verdict reached on other JAX releases is another result.
    """
    settings = {
        "format": FORMAT,
        "jaxmigrate": __version__,
        "code": code_digest(),
        "passes": [
            [p.__module__, p.__qualname__, p.CODE, p.NAME, str(p.SAFETY), list(p.MIN_JAX)]
            for p in chosen_passes(options)
        ],
        "select": list(options.select),
        "ignore": list(options.ignore),
        "unsafe_fixes": options.unsafe_fixes,
        "target_jax": list(options.target_jax),
        "target_source": options.target_source,
        "pmap_style": options.pmap_style,
        "pmap_replicated": list(options.pmap_replicated),
        "jax": _version("jax"),
        "libcst": _version("libcst"),
        "python": list(sys.version_info[:2]),
        "runtime": dict(runtime or {}),
    }
    return _digest(json.dumps(settings, sort_keys=True).encode())


def _record_to_json(record: Site | Skip) -> dict[str, Any]:
    return {f.name: _plain(getattr(record, f.name)) for f in fields(record)}


def _plain(value: Any) -> Any:
    return str(value) if isinstance(value, (Safety, Status)) else value


def _site(data: dict[str, Any]) -> Site:
    return Site(**{**data, "safety": Safety(data["safety"]), "status": Status(data["status"])})


@dataclass(frozen=True)
class ResultCache:
    """The cache folder of one run's settings; cheap to pickle into worker processes."""

    directory: Path

    @classmethod
    def open(
        cls,
        root: Path,
        options: Options,
        runtime: Mapping[str, Any] | None = None,
        *,
        in_tree: bool = True,
    ) -> ResultCache:
        """Return the cache for `options` under `root/.jaxmigrate_cache` (made if missing), or
        not `in_tree` (dry runs), under the user's cache directory (`user_cache_root`)."""
        base = root / CACHE_DIR if in_tree else user_cache_root(root)
        try:
            base.mkdir(parents=True, exist_ok=True)
            for name, text in (
                (".gitignore", "# Created by jaxmigrate.\n*\n"),
                ("CACHEDIR.TAG", TAG),
            ):
                if not (base / name).exists():
                    (base / name).write_text(text, encoding="utf-8")
        except OSError:
            pass  # a tree we cannot write to: every store below fails quietly too
        return cls(base / f"v{FORMAT}" / settings_digest(options, runtime))

    def key(self, data: bytes, *, notebook: bool, context: str = "") -> str:
        """Return the entry name for a file's bytes (and what else its result depends on: the
        project's formatter settings and own modules)."""
        return _digest(b"ipynb\0" if notebook else b"py\0", context.encode("utf-8"), b"\0", data)

    def load(self, key: str, path: str, text: str) -> FileResult | None:
        """Return the cached result for `key`, as `path` with its decoded `text`; None if absent."""
        try:
            raw = (self.directory / f"{key}.json").read_bytes()
            check, _, payload = raw.partition(b"\n")
            if check.decode("ascii") != _digest(payload):
                return None
            entry = json.loads(payload)
            texts, new = bool(entry["texts"]), entry["new_text"]
            return FileResult(
                path,
                Bucket(entry["bucket"]),
                sites=tuple(_site(s) for s in entry["sites"]),
                skips=tuple(Skip(**s) for s in entry["skips"]),
                reason=entry["reason"],
                old_text=text if texts else None,
                new_text=(text if new is None else new) if texts else None,
            )
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None

    def store(self, key: str, result: FileResult) -> None:
        """Keep `result` under `key` (failed results are never kept); never raises."""
        if result.bucket is Bucket.FAILED:
            return
        changed = result.new_text is not None and result.new_text != result.old_text
        entry = {
            "bucket": str(result.bucket),
            "reason": result.reason,
            "sites": [_record_to_json(s) for s in result.sites],
            "skips": [_record_to_json(s) for s in result.skips],
            "texts": result.old_text is not None,
            "new_text": result.new_text if changed else None,
        }
        try:
            payload = json.dumps(entry, ensure_ascii=False).encode()
        except (TypeError, ValueError):
            return  # details that are not JSON: not worth caching
        self._write(f"{key}.json", _digest(payload).encode() + b"\n" + payload)

    def _write(self, name: str, data: bytes) -> None:
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=self.directory)
        except OSError:
            return
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
            os.replace(tmp, self.directory / name)
        except OSError:
            try:
                os.unlink(tmp)
            except OSError:
                pass
