"""What the engine reads about the code base a file lives in, once per directory.

One walk of the file system serves every question the engine asks about a file's place: the
formatter's line width and indentation (`style`), the project's own top-level modules, so new
imports go above theirs (`first_party`), and where a module shared by many files goes (`home`).

## Where a shared module goes (`home`)
A code base has one home for the modules passes share (the pmap helper `_pmap_compat.py`): its
**main package**. The code base is the folder of the nearest project root above the file (a
`pyproject.toml`, `setup.py` or `.git`), else the folder holding the file's top-level package;
its packages are the regular packages (an identifier name and an `__init__.py`) in that folder
and in its `src/`. The main package is, in this order:

1. the package named after the distribution (`[project] name`, `setup.cfg`, a literal `name=` in
   `setup.py`; `-` and `.` read as `_`; `dm-haiku` names `haiku`, the part after a prefix);
2. the only package whose name is not a conventional folder of non-library code (`tests`,
   `examples`, `docs`, `benchmarks`, `scripts`, ...);
3. the package with the most Python files.

A file uses the main package's module (`from main._pmap_compat import ...`) when it is inside the
main package (namespace folders without `__init__.py` included, as big_vision's
`evaluators/proj/`), when it imports the main package by name (JAX's `tests/` import `jax`,
flax's `examples/` import `flax`), or when it is inside or imports another package of the code
base sitting beside the main package (AlgoPerf's `algorithms/` and `tests/` packages): that
package's folder is then on `sys.path`, so the main package is importable too.

Otherwise a file in a package uses its own top-level package; a file in a folder without
`__init__.py` that imports by name a regular package around it belongs to that package. Only a
file in no package that imports none of its code base gets the module beside it, imported by its
bare name: `python script.py`, pytest's default `prepend` import mode and a `conftest.py`-less
test folder all put the file's own folder first on `sys.path`, and nothing else is sure to be
there, so two such folders cannot share one module. A folder whose files import their siblings by
bare name (`import models`, flax's `examples/imagenet`) is such a script folder even inside a
package, unless the file imports the main package too. A folder whose name is no identifier
(`algorithmic-efficiency`) is never a package, even with an `__init__.py`.
"""

from __future__ import annotations

import hashlib
import os
import re
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from pathlib import Path

from jaxmigrate.config import (
    Formatting,
    closed_code_base,
    distribution_name,
    formatting_in,
    project_formatting,
)
from jaxmigrate.pipeline.codebase import (
    MAX_IMPORTED,
    Siblings,
    closed_uses,
    imported_names,
    package_module,
    read_module,
)
from jaxmigrate.toolkit.emit import Style, infer_style, infer_width
from jaxmigrate.toolkit.meshes import LEGACY_MESH_READ as LEGACY_MESH_READ_TEXT
from jaxmigrate.toolkit.passes import Callers, Home

# Folders of a code base that hold no library code: never its main package when another is there.
NOT_LIBRARY = frozenset(
    {
        "benchmark",
        "benchmarks",
        "doc",
        "docs",
        "example",
        "examples",
        "script",
        "scripts",
        "test",
        "tests",
        "testing",
        "tools",
    }
)
SHARED = "_pmap_compat"  # a shared module next to a file is no sibling the file chose to import
PRIVATE_NAME = re.compile(r"\b_\w+")  # a name a file may import or call a private def by
# A private name a module binds at its top level, which another module may import: `def
# _evaluate(`, `class _Cache`, `_step = jax.pmap(...)` (a method is no name of the module)
PRIVATE_DEF = re.compile(
    r"^(?:(?:async[ \t]+)?def[ \t]+|class[ \t]+)?(_\w+)\b(?=[ \t]*[(:=])", re.MULTILINE
)


@dataclass
class Project:
    """What the engine learns about the code bases the files it migrates live in, read once per
    directory: formatter settings, packages, modules and each code base's main package."""

    formatting: dict[Path, Formatting] = field(default_factory=dict)
    modules: dict[Path, frozenset[str]] = field(default_factory=dict)
    packages: dict[Path, bool] = field(default_factory=dict)
    mains: dict[Path, Path | None] = field(default_factory=dict)
    mesh_reads: dict[tuple[Path, bool], tuple[str, ...]] = field(default_factory=dict)
    widths: dict[Path, int | None] = field(default_factory=dict)
    siblings: Siblings = field(default_factory=Siblings)
    texts: dict[Path, str | None] = field(default_factory=dict)
    imports: dict[tuple[str, int], tuple[tuple[str, str], ...]] = field(default_factory=dict)
    closed: dict[Path, list[tuple[Path, str, str | None]]] = field(default_factory=dict)
    closed_modules: dict[tuple[Path, str], Callers] = field(default_factory=dict)
    privates: dict[Path, dict[Path, frozenset[str]]] = field(default_factory=dict)

    # Style and first-party modules -------------------------------------------------------
    def style(self, code: str, path: str | None) -> Style:
        """Return the style of `code`, the text of the file at `path` (None: the code alone)."""
        if path is None:
            return infer_style(code)
        width, indent = project_formatting(Path(path), self.formatting)
        if width is None and infer_width(code.splitlines()) is None:
            width = self.neighbours_width(Path(path).absolute().parent)
        return infer_style(code, width=width, indent=indent)

    def neighbours_width(self, directory: Path) -> int | None:
        """Return the width the Python files of `directory` (else of its parents, up to the
        project's root; without one, up to the folder holding its outermost package) were
        evidently wrapped at, read together: a file too short to tell is written as its
        neighbours are (an 80-column code base's small module stays in 80)."""
        root = self.root(directory)
        if root is not None:
            folders = [directory, *directory.parents]
            folders = folders[: folders.index(root) + 1]
        else:  # no project around it: its own folder and the packages it is in
            folders = [directory, *self._package_chain(directory)[1:]]
            chain = self._package_chain(directory)
            if chain:
                folders.append(chain[-1].parent)
        for folder in dict.fromkeys(folders):
            if folder not in self.widths:
                self.widths[folder] = _width_of_files(folder)
            if self.widths[folder] is not None:
                return self.widths[folder]
        return None

    def first_party(self, path: str | None) -> frozenset[str]:
        """Return the top-level modules that are the project's own for a file at `path`: those
        beside it, the packages it is in, and those at its project's root."""
        if path is None:
            return frozenset()
        here = Path(path).absolute().parent
        names = set(self.modules_in(here))
        names.update(folder.name for folder in self._package_chain(here))
        root = self.root(here)
        if root is not None:
            names |= self.modules_in(root) | self.modules_in(root / "src")
        return frozenset(names)

    def context(
        self, path: str, text: str = "", imports: bool = False, callers: bool = True
    ) -> str:
        """Return what a file's result depends on besides its bytes and the options: the
        project's formatter settings and own modules, the legacy mesh reads of the code the
        file holding `text` may run, (`callers`: a pass reading them will run) how other modules
        use its functions, and (`imports`: likewise) the text of the code base's modules it
        imports (part of its result cache key)."""
        width, indent = project_formatting(Path(path), self.formatting)
        reads = self.legacy_mesh_reads(path, text)
        outside = self.outside_uses(path) if callers else None
        modules = self.imported_modules(path, text) if imports else ()
        digest = hashlib.blake2b(repr(modules).encode(), digest_size=16).hexdigest()
        return repr((width, indent, sorted(self.first_party(path)), *reads, outside, digest))

    # Reads of the legacy mesh context --------------------------------------------------------
    def legacy_mesh_reads(self, path: str | None, text: str = "") -> tuple[str, ...]:
        """Return where the code the file at `path` (holding `text`) may run reads the legacy
        mesh context that `with mesh:` sets and `jax.set_mesh` leaves empty (`thread_resources`,
        t5x's partitioning), as `file:line`: its own top-level package (else the modules of its
        folder), and the code base's other packages it imports by name. Each folder is read
        once."""
        if path is None:
            return ()
        file = Path(path).absolute()
        here = file.parent
        top = self.top_package(here)
        units = [(top, True) if top is not None else (here, False)]
        base = self.code_base(here)
        if base is not None:
            names = imported(text)
            units += [(p, True) for p in self.packages_of(base) if p.name in names and p != top]
        found: list[str] = []
        for folder, deep in units:
            if (folder, deep) not in self.mesh_reads:
                files = _python_files_under(folder, deep)
                shown = folder.parent if deep else folder
                self.mesh_reads[(folder, deep)] = tuple(_mesh_reads(shown, files))
            found += self.mesh_reads[(folder, deep)]
        return tuple(found)

    # Who else uses a module's functions ------------------------------------------------------
    def outside_uses(self, path: str | None) -> Callers | None:
        """Return how the other modules of its code base use the functions of the file at
        `path` (the rules: `pipeline/codebase.py`); None when no file is known."""
        if path is None:
            return None
        file = Path(path).absolute()
        if file.suffix != ".py":
            return Callers()  # a notebook: no module imports it
        here = file.parent
        top = self.top_package(here)
        around = next((f for f in here.parents if self.is_package(f)), None)
        if top is None and around is not None:
            top = self.top_package(around)
        base = self.code_base(here)
        if top is None and here != base:
            return self.siblings.of(file)
        if base is None:  # anyone may import it
            return package_module(file, top or here)
        files = self._code_base_files(base)
        parts = file.relative_to(top.parent if top is not None else here).with_suffix("").parts
        dotted = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        if (file, dotted) not in self.closed_modules:
            others = [f for f in files if f[0] != file]
            uses = closed_uses(dotted, others) if closed_code_base(base) else None
            if uses is None:
                # Anyone may import it: every public function counts as used from outside; a
                # private one (`_evaluate`) by the modules of the code base that import it
                # (only those texts that name one are read).
                own = next((t for f, t, _ in files if f == file), "")
                private = {n for n in PRIVATE_DEF.findall(own) if not n.startswith("__")}
                named = self._private_names(base)
                others = [f for f in others if private & named[f[0]]] if private else []
                uses = replace(
                    package_module(file, top or here), uses=closed_uses(dotted, others).uses
                )
            self.closed_modules[(file, dotted)] = uses
        return self.closed_modules[(file, dotted)]

    def _private_names(self, base: Path) -> dict[Path, frozenset[str]]:
        """By file of the code base at `base`: the private names (`_evaluate`) its text holds."""
        if base not in self.privates:
            files = self._code_base_files(base)
            self.privates[base] = {f: frozenset(PRIVATE_NAME.findall(t)) for f, t, _ in files}
        return self.privates[base]

    def _code_base_files(self, base: Path) -> list[tuple[Path, str, str | None]]:
        """The code base at `base`'s `.py` files and notebooks, each with its text and the
        dotted package it is in (None: none), read once."""
        if base not in self.closed:
            found = []
            for parent, dirs, names in os.walk(base):
                dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in NOT_SCANNED)
                folder = Path(parent)
                chain = self._package_chain(folder)
                package = ".".join(folder.relative_to(chain[-1].parent).parts) if chain else None
                for name in sorted(names):
                    if name.endswith((".py", ".ipynb")):
                        text = read_module(folder / name)
                        if text is not None:
                            found.append((folder / name, text, package))
            self.closed[base] = found
        return self.closed[base]

    # The code base's modules a file imports -------------------------------------------------
    def imported_modules(self, path: str | None, text: str) -> tuple[tuple[str, str], ...]:
        """Return the modules of its code base the file at `path` (holding `text`) imports, as
        (dotted name, text) pairs in import order: a module of a package of the code base
        (`import big_vision.utils as u`, `from . import utils`), or, for a script, a module
        beside it (`import input_pipeline`). Passes read them to follow a call into a helper
        of another module (`FileState.modules`); each file is read once."""
        if path is None:
            return ()
        key = (path, hash(text))  # asked for the cache key, then by the engine: parsed once
        if key not in self.imports:
            self.imports[key] = self._imported_modules(Path(path).absolute(), text)
        return self.imports[key]

    def _imported_modules(self, file: Path, text: str) -> tuple[tuple[str, str], ...]:
        here = file.parent
        chain = self._package_chain(here)
        package = ".".join(f.name for f in reversed(chain)) if chain else None
        roots = [chain[-1].parent] if chain else [here]
        base = self.code_base(here)
        if base is not None:
            roots += [base, base / "src"]
        found: list[tuple[str, str]] = []
        for name in imported_names(text, package):
            module = self._module_file(name, dict.fromkeys(roots))
            if module is None or module == file:
                continue
            if module not in self.texts:
                self.texts[module] = read_module(module)
            source = self.texts[module]
            if source is not None:
                found.append((name, source))
            if len(found) == MAX_IMPORTED:
                break
        return tuple(found)

    def _module_file(self, name: str, roots: dict[Path, None]) -> Path | None:
        """Return the file of the module `name` (dotted) under one of `roots`, else None."""
        parts = name.split(".")
        for root in roots:
            if parts[0] not in self.modules_in(root):
                continue
            folder = root.joinpath(*parts[:-1])
            if len(parts) > 1 and not self.is_package(root / parts[0]):
                continue
            for candidate in (folder / f"{parts[-1]}.py", folder / parts[-1] / "__init__.py"):
                if candidate.is_file():
                    return candidate
        return None

    # Where shared modules go ---------------------------------------------------------------
    def home(self, path: Path, text: str = "") -> Home | None:
        """Return where the modules shared by the file at `path` (holding `text`) go, and why
        (the rules are in this module's docstring). None for a notebook."""
        if path.suffix != ".py":
            return None
        here = path.absolute().parent
        names = imported(text)
        main = self._main_home(here, names)
        folder, package, why = main or self._own_home(here, text, names)
        shown = os.path.relpath(folder) if not path.is_absolute() else str(folder)
        return Home(shown, package, why, main=main is not None)

    def notebook_home(self, path: Path, code: str) -> Home:
        """Return where the modules shared by the notebook at `path` (its cells' `code`) go: the
        code base's main package when the notebook imports it (or a package beside it), which is
        then importable where the notebook runs. Else a Home without a folder: the helper is
        defined in the notebook itself, and `why` says so."""
        here = path.absolute().parent
        main = self._main_home(here, imported(code))
        if main is not None and main[2].startswith("this file imports"):
            folder, package, why = main
            shown = os.path.relpath(folder) if not path.is_absolute() else str(folder)
            return Home(shown, package, why.replace("this file", "this notebook"), main=True)
        return Home("", None, "this notebook imports no package of its code base")

    def _main_home(self, here: Path, names: frozenset[str]) -> tuple[Path, str, str] | None:
        """Return the main package's home when the file can import it (see the docstring)."""
        top = self.top_package(here)
        base = self.code_base(here)
        main = self.main_package(base) if base is not None else None
        if base is None or main is None:
            return None
        name = main.name
        if _under(here, main) and not self._script(here, names):
            return main, name, f"this file is in `{name}`, the code base's main package"
        if self._imports_package(here, names, main):
            return main, name, f"this file imports `{name}`, the code base's main package"
        if top is not None and top != main and top.parent == main.parent:
            why = f"this file is in package `{top.name}`, beside `{name}`, the main package"
            return main, name, why
        for other in self.packages_of(base):
            if other.parent == main.parent and self._imports_package(here, names, other):
                why = f"this file imports `{other.name}`, beside `{name}`, the main package"
                return main, name, why
        return None

    def _imports_package(self, here: Path, names: frozenset[str], package: Path) -> bool:
        """Return True if the file imports `package` by name (`names`: what it imports): not a
        module of the file's own folder of that name, which a script running there would import
        instead."""
        shadowed = here != package.parent and package.name in self.modules_in(here)
        return package.name in names and not shadowed

    def _own_home(
        self, here: Path, text: str, names: frozenset[str]
    ) -> tuple[Path, str | None, str]:
        """Return the home of a file the main package's home is not for."""
        top = self.top_package(here)
        if top is not None:
            return top, top.name, f"this file is in package `{top.name}`"
        for folder in reversed(here.parents):  # outermost first
            if self.is_package(folder) and self._imports_from(text, folder):
                why = f"this file imports `{folder.name}`, the package around its folder"
                return folder, folder.name, why
        around = next((f for f in here.parents if self.is_package(f)), None)
        if around is not None and not self._script(here, names):
            outer = self.top_package(around) or around
            why = f"this file's folder is a namespace folder of package `{outer.name}`"
            return outer, outer.name, why
        why = "this file is in no package and imports none of its code base"
        return here, None, why

    def _imports_from(self, text: str, package: Path) -> bool:
        """Return True if `text` imports a module of the package folder `package` by its absolute
        name (`from big_vision import utils`, `import big_vision.utils`). A bare `import jax`
        is not enough: in a folder named `jax` (AlgoPerf's `lamb/jax/`) it means JAX."""
        modules = self.modules_in(package)
        for head, names, plain in _IMPORTED.findall(text):
            for module in [head] if head else [m.split()[0] for m in plain.split(",") if m.strip()]:
                first, _, rest = module.partition(".")
                if first != package.name:
                    continue
                wanted = {rest.partition(".")[0]} if rest else set(re.findall(r"\w+", names))
                if wanted & modules:
                    return True
        return False

    def _script(self, here: Path, names: frozenset[str]) -> bool:
        """Return True if a file in the folder `here` importing `names` is a script: its folder is
        no package and it imports a module of its own folder by bare name."""
        siblings = self.modules_in(here) - {SHARED}
        return not self.is_package(here) and not siblings.isdisjoint(names)

    # The code base's layout ----------------------------------------------------------------
    def root(self, here: Path) -> Path | None:
        """Return the nearest project root at or above the folder `here`, or None."""
        for directory in (here, *here.parents):
            if directory not in self.formatting:
                self.formatting[directory] = formatting_in(directory)
            if self.formatting[directory].root:
                return directory
        return None

    def code_base(self, here: Path) -> Path | None:
        """Return the folder of the code base the folder `here` is in: its project root, else
        the folder holding the outermost package around it, else None."""
        root = self.root(here)
        if root is not None:
            return root
        around = next((f for f in (here, *here.parents) if self.is_package(f)), None)
        top = self.top_package(around) if around is not None else None
        return top.parent if top is not None else None

    def is_package(self, folder: Path) -> bool:
        """Return True if `folder` is a regular package a module can be imported from by name (a
        folder named `algorithmic-efficiency` may hold an `__init__.py`, but is no package)."""
        if folder not in self.packages:
            self.packages[folder] = folder.name.isidentifier() and _is_file(folder / "__init__.py")
        return self.packages[folder]

    def _package_chain(self, here: Path) -> list[Path]:
        """Return the regular packages `here` is in, innermost first (`here` itself first)."""
        chain = []
        folder = here
        while self.is_package(folder) and folder.parent != folder:
            chain.append(folder)
            folder = folder.parent
        return chain

    def top_package(self, here: Path) -> Path | None:
        """Return the outermost regular package the folder `here` is in, or None."""
        chain = self._package_chain(here)
        return chain[-1] if chain else None

    def packages_of(self, base: Path) -> list[Path]:
        """Return the top-level packages of the code base at `base` (and in its `src/`)."""
        found = []
        for folder in (base, base / "src"):
            for name in sorted(self.modules_in(folder)):
                if self.is_package(folder / name):
                    found.append(folder / name)
        return found

    def main_package(self, base: Path) -> Path | None:
        """Return the main package of the code base at `base` (the rule: module docstring)."""
        if base not in self.mains:
            self.mains[base] = self._find_main(base)
        return self.mains[base]

    def _find_main(self, base: Path) -> Path | None:
        packages = self.packages_of(base)
        if len(packages) <= 1:
            return packages[0] if packages else None
        named = _named_after(distribution_name(base), packages)
        if named is not None:
            return named
        library = [p for p in packages if p.name.lower() not in NOT_LIBRARY]
        if len(library) == 1:
            return library[0]
        return max(library or packages, key=lambda p: (_python_files(p), p.name))

    def modules_in(self, directory: Path) -> frozenset[str]:
        """Return the names of the modules and packages importable from `directory`."""
        if directory not in self.modules:
            try:
                entries = list(directory.iterdir())
            except OSError:
                entries = []
            self.modules[directory] = frozenset(
                e.stem if e.suffix == ".py" else e.name
                for e in entries
                if (e.suffix == ".py" and e.stem.isidentifier()) or self.is_package(e)
            )
        return self.modules[directory]


# `from a.b import c, d` (head `a.b`, names `c, d`) or `import a.b` (plain), at a line's start.
_IMPORTED = re.compile(
    r"^[ \t]*(?:from[ \t]+([\w.]+)[ \t]+import[ \t]+\(?([\w, \t]*)|import[ \t]+([\w., \t]+))",
    re.MULTILINE,
)


def imported(text: str) -> frozenset[str]:
    """Return the top-level names `text` imports absolutely (`jax` for `from jax.numpy import
    x`, `import jax.numpy as jnp`, `import os, jax`), wherever the import statement is."""
    found = set()
    for head, _, plain in _IMPORTED.findall(text):
        for module in [head] if head else plain.split(","):
            first = module.strip().split(".")[0].split(" ")[0]
            if first:
                found.add(first)
    return frozenset(found)


def _named_after(distribution: str | None, packages: list[Path]) -> Path | None:
    """Return the package the distribution is named after (`dm-haiku` -> `haiku`), or None."""
    if not distribution:
        return None
    name = re.sub(r"[-.]+", "_", distribution).lower()
    for package in packages:
        if package.name.lower() == name:
            return package
    for package in packages:
        if name.endswith("_" + package.name.lower()):
            return package
    return None


def _python_files(folder: Path) -> int:
    try:
        return sum(1 for p in folder.rglob("*.py") if p.stem != SHARED)
    except OSError:
        return 0


LEGACY_MESH_READ = re.compile(LEGACY_MESH_READ_TEXT.encode(), re.MULTILINE)
NOT_SCANNED = frozenset({"__pycache__", "site-packages", "node_modules"})


def _python_files_under(folder: Path, deep: bool) -> list[Path]:
    """Return the `.py` files of `folder` (`deep`: and of its subfolders, without hidden ones
    and installed packages)."""
    if not deep:
        try:
            return sorted(p for p in folder.iterdir() if p.suffix == ".py" and _is_file(p))
        except OSError:
            return []
    found = []
    for parent, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in NOT_SCANNED)
        found += [Path(parent, f) for f in sorted(files) if f.endswith(".py")]
    return found


def _mesh_reads(base: Path, files: list[Path]) -> list[str]:
    """Return `file:line` of each line of `files` that reads the legacy mesh context."""
    out: list[str] = []
    for file in files:
        try:
            data = file.read_bytes()
        except OSError:
            continue
        if b"thread_resources" not in data and b"t5x" not in data:
            continue
        for match in LEGACY_MESH_READ.finditer(data):
            line = data.count(b"\n", 0, match.start()) + 1
            where = f"{os.path.relpath(file, base)}:{line}"
            if not out or out[-1] != where:
                out.append(where)
    return out


def _under(folder: Path, package: Path) -> bool:
    return folder == package or package in folder.parents


def _is_file(path: Path) -> bool:
    """Return True if `path` is a file; a directory we may not read has none."""
    try:
        return path.is_file()
    except OSError:
        return False


NEIGHBOURS = 40  # Python files of a directory read to learn its width, at most
NEIGHBOUR_BYTES = 200_000  # and at most this much of each


def _width_of_files(directory: Path) -> int | None:
    """Return the width the Python files directly in `directory` were wrapped at, or None."""
    try:
        files = sorted(p for p in directory.glob("*.py") if p.is_file())[:NEIGHBOURS]
    except OSError:
        return None
    lines: list[str] = []
    for file in files:
        try:
            with file.open(encoding="utf-8", errors="replace") as handle:
                lines.extend(handle.read(NEIGHBOUR_BYTES).splitlines())
        except OSError:
            continue
    return infer_width(lines) if lines else None


# The code base as a verification reads it (`verify.results.verify_results` sets it): every file
# it renders again, its candidates and what it writes, reads the code base once through it (a
# fresh `Project` read it all again each time). The tree does not change while it runs.
VERIFYING: ContextVar[Project | None] = ContextVar("verifying", default=None)


def verifying() -> Project:
    """Return the project of the verification in progress, else a fresh one."""
    return VERIFYING.get() or Project()
