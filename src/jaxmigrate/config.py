"""`[tool.jaxmigrate]` in the nearest `pyproject.toml`; command-line flags win over it."""

from __future__ import annotations

import configparser
import re
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
    pmap_replicated: tuple[str, ...] | None = None
    # nothing outside the code base imports its modules (an application, not a library): read
    # by `Project.outside_uses` from the code base's own pyproject.toml (`closed_code_base`)
    closed_code_base: bool | None = None
    verify_project_tests: bool | None = None
    reference_jax: str | None = None
    reference_python: str | None = None


_LISTS = {"select", "ignore", "exclude", "pmap-replicated"}
# `Evaluator.run(params)`: a def of the code base (a function, or a method of a class of a module)
# and the parameters its callers pass copies of one value to, one per local device (pmap's layout)
REPLICATED = re.compile(
    r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)?\(\s*[A-Za-z_]\w*(\s*,\s*[A-Za-z_]\w*)*\s*\)"
)
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
    "closed-code-base": bool,
    "verify-project-tests": bool,
    "reference-jax": str,
    "reference-python": str,
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
        wrong = [v for v in value if key == "pmap-replicated" and not REPLICATED.fullmatch(v)]
        if wrong:
            raise ConfigError(
                f"{where}: {wrong[0]!r} is not a def and its parameters, as "
                "'Evaluator.run(params)' or 'evaluate(params, state)'"
            )
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


# The project's formatter settings ---------------------------------------------------------------
@dataclass(frozen=True)
class Formatting:
    """What one directory's configuration files say about line width and indentation."""

    width: int | None = None
    indent: str | None = None
    root: bool = False  # the directory is a project root: the search stops there


def formatting_in(directory: Path) -> Formatting:
    """Return the line width (and indentation) configured in `directory`'s own files.

    Formatters come before linters: ruff (`ruff.toml`, `.ruff.toml`, `[tool.ruff]`), black,
    pyink, yapf (`.style.yapf`, `setup.cfg [yapf]`), then flake8/pycodestyle (`setup.cfg`,
    `tox.ini`, `.flake8`). Unreadable files count as saying nothing.
    """
    found: list[tuple[int | None, str | None]] = []
    for name in ("ruff.toml", ".ruff.toml"):
        table = _toml(directory / name)
        if table is not None:
            found.append((_int(table.get("line-length")), _spaces(table.get("indent-width"))))
    pyproject = _toml(directory / "pyproject.toml")
    tool = pyproject.get("tool", {}) if pyproject is not None else {}
    tool = tool if isinstance(tool, dict) else {}
    for name in ("ruff", "black", "pyink"):
        table = tool.get(name)
        if isinstance(table, dict):
            indent = table.get("indent-width") if name == "ruff" else table.get("pyink-indentation")
            found.append((_int(table.get("line-length")), _spaces(indent)))
    for name, section, key in _INI_KEYS:
        value = _ini(directory / name, section, key)
        if value is not None:
            found.append(value)
    width = next((w for w, _ in found if w is not None), None)
    indent = next((i for _, i in found if i is not None), None)
    root = pyproject is not None or _exists(directory / ".git") or _exists(directory / "setup.py")
    return Formatting(width, indent, root)


_INI_KEYS = (
    (".style.yapf", "style", "column_limit"),
    ("setup.cfg", "yapf", "column_limit"),
    ("setup.cfg", "flake8", "max-line-length"),
    ("setup.cfg", "pycodestyle", "max-line-length"),
    ("tox.ini", "flake8", "max-line-length"),
    (".flake8", "flake8", "max-line-length"),
)


def _exists(path: Path) -> bool:
    """Return True if `path` exists; a directory we may not read has nothing in it."""
    try:
        return path.exists()
    except OSError:
        return False


def closed_code_base(directory: Path) -> bool:
    """Return True if the pyproject.toml of `directory`, a code base's root, says that nothing
    outside the code base imports its modules (`[tool.jaxmigrate] closed-code-base = true`)."""
    table = (_toml(directory / "pyproject.toml") or {}).get("tool", {})
    value = table.get("jaxmigrate", {}) if isinstance(table, dict) else {}
    return isinstance(value, dict) and value.get("closed-code-base") is True


def _toml(path: Path) -> dict[str, Any] | None:
    if not _exists(path):
        return None
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return None


def _ini(path: Path, section: str, key: str) -> tuple[int | None, str | None] | None:
    if not _exists(path):
        return None
    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read(path, encoding="utf-8")
    except (OSError, UnicodeDecodeError, configparser.Error):
        return None
    if not parser.has_section(section):
        return None
    options = {k.replace("_", "-"): v for k, v in parser.items(section)}
    width = _int(options.get(key.replace("_", "-")))
    indent = _spaces(options.get("indent-width"))
    if width is None and section in ("style", "yapf"):
        based = options.get("based-on-style", "").strip().lower()
        width = {"pep8": 79, "google": 80, "yapf": 80, "facebook": 80}.get(based)
    return (width, indent) if width is not None or indent is not None else None


def _int(value: object) -> int | None:
    if isinstance(value, str):
        value = value.strip()
        value = int(value) if value.isdigit() else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _spaces(value: object) -> str | None:
    width = _int(value)
    return " " * width if width in (2, 4, 8) else None


def project_formatting(
    path: Path, cache: dict[Path, Formatting] | None = None
) -> tuple[int | None, str | None]:
    """Return the line width and indentation the nearest configuration above `path` sets.

    Each directory's files are read once into `cache`; the search stops at the project root
    (a directory with `pyproject.toml`, `setup.py` or `.git`).
    """
    cache = {} if cache is None else cache
    start = path.absolute().parent
    width = indent = None
    for directory in (start, *start.parents):
        if directory not in cache:
            cache[directory] = formatting_in(directory)
        here = cache[directory]
        width = width if width is not None else here.width
        indent = indent if indent is not None else here.indent
        if (width is not None and indent is not None) or here.root:
            break
    return width, indent


# The project's distribution name ---------------------------------------------------------------
_SETUP_NAME = re.compile(r"""\bname\s*=\s*["']([A-Za-z0-9][A-Za-z0-9._-]*)["']""")


def distribution_name(directory: Path) -> str | None:
    """Return the name a project root declares for its distribution (`[project] name` of
    `pyproject.toml`, `[metadata] name` of `setup.cfg`, a literal `name=` in `setup.py`), or None."""
    pyproject = _toml(directory / "pyproject.toml")
    project = pyproject.get("project") if pyproject is not None else None
    if isinstance(project, dict) and isinstance(project.get("name"), str):
        return str(project["name"])
    if _exists(directory / "setup.cfg"):
        parser = configparser.ConfigParser(interpolation=None)
        try:
            parser.read(directory / "setup.cfg", encoding="utf-8")
            name = parser.get("metadata", "name", fallback=None)
        except (OSError, UnicodeDecodeError, configparser.Error):
            name = None
        if name:
            return name.strip()
    try:
        setup = (directory / "setup.py").read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    found = _SETUP_NAME.search(setup)
    return found.group(1) if found else None


# The JAX the project's own pins ask for ---------------------------------------------------------
# `jax>=0.4.30`, `jax[cpu]==0.6.2`, `jax ~= 0.5.0` (jaxlib, jax-triton... are other packages)
_JAX_PIN = re.compile(
    r"""(?:^|[\s"',;])jax\s*(?:\[[^\]]*\])?\s*(?:\([^)]*?)?(?:,?\s*[<!][^,;"']*,)*\s*"""
    r"""(===|==|>=|~=)\s*v?(\d+\.\d+(?:\.\d+)*)""",
    re.MULTILINE,
)
_REQUIREMENTS = ("requirements.txt", "requirements.in", "requirements-base.txt")


@dataclass(frozen=True)
class JaxPin:
    """The oldest JAX a project's own pins allow: `version`, as written in `where`."""

    version: str
    spec: str
    where: str


def jax_pin(root: Path) -> JaxPin | None:
    """Return the lower bound the project at `root` puts on `jax`, or None.

    Read, first found wins: `[project] dependencies` of `pyproject.toml`, `install_requires` of
    `setup.cfg`, `requirements.txt`/`.in`, the text of `setup.py`. `==X`, `>=X`, `~=X` and `===X`
    give X; a bare or upper-bounded `jax` gives none. Optional dependencies (extras) are not
    read: they say what some users install, not what the code needs.
    """
    pyproject = _toml(root / "pyproject.toml")
    project = pyproject.get("project") if pyproject is not None else None
    if isinstance(project, dict):
        items = project.get("dependencies")
        if isinstance(items, list):
            found = _pin_in("\n".join(str(i) for i in items), "pyproject.toml")
            if found is not None:
                return found
    if _exists(root / "setup.cfg"):
        parser = configparser.ConfigParser(interpolation=None)
        try:
            parser.read(root / "setup.cfg", encoding="utf-8")
            requires = parser.get("options", "install_requires", fallback="")
        except (OSError, UnicodeDecodeError, configparser.Error):
            requires = ""
        found = _pin_in(requires, "setup.cfg")
        if found is not None:
            return found
    for name in (*_REQUIREMENTS, "setup.py"):
        try:
            text = (root / name).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        lines = [ln.split("#", 1)[0] for ln in text.splitlines()]
        found = _pin_in("\n".join(lines), name)
        if found is not None:
            return found
    return None


def _pin_in(text: str, where: str) -> JaxPin | None:
    for line in text.splitlines():
        match = _JAX_PIN.search(line)
        if match is not None:
            spec = line[match.start() :].strip(" \"',;")
            return JaxPin(match.group(2), spec, where)
    return None
