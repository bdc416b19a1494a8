"""`[tool.jaxmigrate]` in the nearest `pyproject.toml`; command-line flags win over it."""

from __future__ import annotations

import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class ConfigError(ValueError):
    """A configuration the user must fix; the message names the file and the key."""


@dataclass(frozen=True)
class FileConfig:
    """The settings read from `pyproject.toml` (None where the file says nothing)."""

    path: Path | None = None
    select: tuple[str, ...] | None = None
    ignore: tuple[str, ...] | None = None
    exclude: tuple[str, ...] = ()
    unsafe_fixes: bool | None = None
    jobs: int | None = None
    devices: int | None = None
    verify_with: str | None = None
    target_jax: str | None = None
    python: str | None = None
    timeout: float | None = None
    processes: int | None = None
    pmap_style: str | None = None


_LISTS = {"select", "ignore", "exclude"}
_TYPES: dict[str, type] = {
    "unsafe-fixes": bool,
    "jobs": int,
    "devices": int,
    "verify-with": str,
    "target-jax": str,
    "python": str,
    "timeout": float,
    "processes": int,
    "pmap-style": str,
}


def find_pyproject(paths: Sequence[Path]) -> Path | None:
    """Return the nearest `pyproject.toml` above the first path (or the working directory)."""
    start = (paths[0] if paths else Path.cwd()).absolute()
    if start.is_file() or not start.exists():
        start = start.parent
    for directory in (start, *start.parents):
        candidate = directory / "pyproject.toml"
        if candidate.is_file():
            return candidate
    return None


def load_config(pyproject: Path | None) -> FileConfig:
    """Read `[tool.jaxmigrate]`; raise ConfigError for bad TOML, unknown keys or wrong types."""
    if pyproject is None:
        return FileConfig()
    try:
        data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{pyproject}: cannot read it: {exc}") from None
    table = data.get("tool", {}).get("jaxmigrate", {})
    if not isinstance(table, dict):
        raise ConfigError(f"{pyproject}: [tool.jaxmigrate] must be a table")
    values: dict[str, Any] = {}
    for key, value in table.items():
        values[key.replace("-", "_")] = _check(pyproject, key, value)
    return FileConfig(path=pyproject, **values)


def _check(pyproject: Path, key: str, value: Any) -> Any:
    where = f"{pyproject}: [tool.jaxmigrate] {key}"
    if key in _LISTS:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{where} must be a list of strings")
        return tuple(value)
    if key not in _TYPES:
        known = ", ".join(sorted({*_LISTS, *_TYPES}))
        raise ConfigError(f"{where}: unknown key (known keys: {known})")
    expected = _TYPES[key]
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
        raise ConfigError(f"{where} must be a {expected.__name__}")
    if isinstance(value, int) and not isinstance(value, bool) and value < 1:
        raise ConfigError(f"{where} must be at least 1")
    return value
