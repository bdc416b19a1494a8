"""Who else in a code base uses a module's public functions, and whether they read the results.

A pass decides on one module at a time, but some decisions depend on the module's callers: the
pmap rule keeps a value returned from a public function in its old layout when anyone reads that
function's result, and leaves a def whose readback it would delete alone when other code calls
it. `Project.outside_uses` answers from here, read-only and once per folder, and the engine hands
the answer to the pass (`FileState.outside`): passes do no I/O.

Timid by design. A module of a package (or of a namespace folder inside one), or at the root of
its code base, may be imported from outside the code base (a library's API, a `py_modules`
entry): every function of it counts as called and its result as read, whatever the code base
does, but its private functions (`_evaluate`): those count as used where a module of the code
base (any `.py` file or notebook under its root) names one, as a closed code base's do; no
module outside it is taken to import a private name. A module of a folder of scripts (no
`__init__.py`: flax's `examples/imagenet`) is imported by its bare name, which only code whose
folder is first on `sys.path` can do: its siblings, the
`.py` files and notebooks of that folder. Each sibling that imports it (`import train`,
`from train import f`) is read with Python's `ast` (a notebook's code cells joined, its IPython
lines blanked). A use of a function is called there when it is the function of a call; the result
is unread when the call is a statement of its own, or bound to a name by an assignment and
rebound before any read (the notebook's `state = train.train_and_evaluate(...)` in a loop, then
`state = train.create_train_state(...)` before `state` is read; no def that might run in between
reads the name). Anything else is a read: the module passed as a value, `from train import *`, a
sibling that does not parse, a name left bound at module level (another module may import it).
"""

from __future__ import annotations

import ast
import json
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path

from jaxmigrate.toolkit.passes import Callers, Outside

MAX_BYTES = 8 << 20  # a file larger than this is not read for the imports of its folder
SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)
MAGIC = re.compile(r"^([ \t]*)[!%].*$|^([ \t]*)\S.*\?$", re.MULTILINE)  # IPython lines


@dataclass
class Siblings:
    """The folders of scripts read so far: which of a folder's files may import each module by
    its bare name (one pass over their text), and the uses those files make of a module's
    functions (each importer parsed once per module)."""

    importers: dict[Path, dict[str, list[tuple[Path, str]]]] = field(default_factory=dict)
    uses: dict[tuple[Path, str], dict[str, Outside]] = field(default_factory=dict)

    def of(self, path: Path) -> Callers:
        """Return the uses the siblings of the script module at `path` make of it."""
        folder, module = path.parent, path.stem
        if (folder, module) not in self.uses:
            found: dict[str, Outside] = {}
            for file, text in self._importers(folder).get(module, []):
                if file != path:
                    for name, use in _uses_in(file, text, module).items():
                        found[name] = _merged(found.get(name), use)
            self.uses[(folder, module)] = found
        return Callers(uses=self.uses[(folder, module)])

    def _importers(self, folder: Path) -> dict[str, list[tuple[Path, str]]]:
        if folder not in self.importers:
            found: dict[str, list[tuple[Path, str]]] = {}
            try:
                entries = sorted(folder.iterdir())
            except OSError:
                entries = []
            for entry in entries:
                if entry.suffix not in (".py", ".ipynb"):
                    continue
                try:  # a regular file only: opening a FIFO waits for a writer forever
                    if not stat.S_ISREG(entry.stat().st_mode) or entry.stat().st_size > MAX_BYTES:
                        continue
                    text = entry.read_text(encoding="utf-8", errors="replace")
                except OSError:
                    continue
                for module in _imported(text):
                    found.setdefault(module, []).append((entry, text))
            self.importers[folder] = found
        return self.importers[folder]


def package_module(path: Path, top: Path) -> Callers:
    """The uses of a module of the package `top` (or at the root of its code base, `top` that
    folder): anyone may import it, so every function counts as called and read."""
    if top == path.parent and not (top / "__init__.py").is_file():
        why = f"from outside the code base maybe (`{path.name}` is at its root)"
    else:
        dotted = ".".join(path.relative_to(top.parent).with_suffix("").parts)
        why = f"from outside the code base maybe (`{dotted}` is in package `{top.name}`)"
    return Callers(everywhere=why)


def closed_uses(dotted: str, files: list[tuple[Path, str, str | None]]) -> Callers:
    """The uses the code base's `files` ((path, text, dotted package or None) each, the module
    itself left out) make of the functions of the module `dotted`: all of them when the code
    base says nothing outside it imports its modules (`closed-code-base`), else its private
    ones. Text that cannot name the module (neither its last name nor a dynamic import) is not
    parsed."""
    last = dotted.rpartition(".")[2]
    found: dict[str, Outside] = {}
    for file, text, package in files:
        if last in text or "import_module" in text or "__import__" in text:
            for name, use in _package_uses_in(file, text, dotted, package).items():
                found[name] = _merged(found.get(name), use)
    return Callers(uses=found)


def _absolute(node: ast.ImportFrom, package: str | None) -> str | None:
    """The dotted module `from <module> import ...` reads (a relative one against `package`)."""
    if not node.level:
        return node.module
    if package is None:
        return None
    parts = package.split(".")
    if node.level - 1 >= len(parts):
        return None
    head = ".".join(parts[: len(parts) - (node.level - 1)])
    return f"{head}.{node.module}" if node.module else head


DYNAMIC = frozenset({"importlib.import_module", "import_module", "__import__"})


def _dynamic_prefix(call: ast.Call) -> str | None:
    """The text every module a dynamic import (`importlib.import_module(f"bv.evals.{name}")`)
    may load begins with ("" when nothing is known of it); None for any other call."""
    if ast.unparse(call.func) not in DYNAMIC or not call.args:
        return None
    arg = call.args[0]
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return "" if arg.value.startswith(".") else arg.value
    first = arg.values[0] if isinstance(arg, ast.JoinedStr) and arg.values else None
    if isinstance(arg, ast.BinOp) and isinstance(arg.op, ast.Add):
        first = arg.left
    if isinstance(first, ast.Constant) and isinstance(first.value, str):
        return first.value
    return ""


def _package_uses_in(file: Path, text: str, dotted: str, package: str | None) -> dict[str, Outside]:
    """How the code of `file` (in the package `package`) uses the functions of the module
    `dotted` of its code base, by name ("*": every function): through the names it binds to the
    module or to a package around it (`import a.b.c as m`, `from a.b import c`, `import a`
    read as `a.b.c.f`; a relative import; a dynamic import whose name may be the module's, its
    result bound to a name), or to one of its functions (`from a.b.c import f`; at module level,
    called and read there: another module may import it from this one). A name bound
    to the module and read other than by one of its attributes, a star import, a dynamic
    import whose result goes elsewhere (but to one of its attributes, `import_module(...).f`:
    that name), or code that does not parse: every function. A name a
    dynamic import binds is its module where read after that binding, in the text of the same
    function (a read before it, reached again by a loop, is taken as the name's other value:
    big_vision's `module = importlib.import_module(f"big_vision.evaluators.{module}")`)."""
    code, starts = _code_of(file, text)
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError, RecursionError):
        if not _may_import(code, dotted):
            return {}  # a config with a typo naming `mean` in a string imports nothing of it
        where = f"in `{file.name}`, which does not parse"
        return {"*": Outside(called=where, read=where)}
    parents = {id(c): p for p in ast.walk(tree) for c in ast.iter_child_nodes(p)}
    modules: dict[str, str] = {}  # a name bound to the module or a package around it -> which
    dynamic: dict[str, list[tuple[ast.AST | None, tuple[int, int]]]] = {}  # (scope, bound at)
    names: dict[str, str] = {}  # a name bound to one of its functions -> the function's name
    found: dict[str, Outside] = {}

    def around(module: str) -> bool:  # the module itself, or a package holding it
        return dotted == module or dotted.startswith(module + ".")

    def everything(node: ast.AST) -> None:
        where = _place(file, node, starts)
        found["*"] = Outside(called=where, read=where)

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname and around(alias.name):
                    modules[alias.asname] = alias.name
                elif not alias.asname and around(alias.name.split(".")[0]):
                    modules[alias.name.split(".")[0]] = alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node, package)
            for alias in node.names if base is not None else ():
                if alias.name == "*" and base is not None and around(base):
                    everything(node)  # the module's functions, or the module from its package
                elif base == dotted:
                    names[alias.asname or alias.name] = alias.name
                    if isinstance(parents.get(id(node)), ast.Module):  # others may import it
                        where = _place(file, node, starts)
                        found[alias.name] = Outside(called=where, read=where)
                elif around(f"{base}.{alias.name}"):
                    modules[alias.asname or alias.name] = f"{base}.{alias.name}"
        elif isinstance(node, ast.Call):
            prefix = _dynamic_prefix(node)
            if prefix is None or not (dotted.startswith(prefix) or around(prefix)):
                continue
            parent = parents.get(id(node))
            if isinstance(parent, ast.Expr):
                continue  # imported for its effects (registering, say)
            targets = parent.targets if isinstance(parent, ast.Assign) else []
            plain = "__" not in ast.unparse(node.func)  # `__import__` gives the top package
            if isinstance(parent, ast.Attribute) and parent.value is node and plain:
                # `importlib.import_module(f"bv.evals.{name}").Evaluator(...)`: that one name
                where = _place(file, parent, starts)
                read = "" if _unread(parent, parents, tree) else where
                found[parent.attr] = _merged(found.get(parent.attr), Outside(where, read))
                continue
            if len(targets) == 1 and isinstance(targets[0], ast.Name) and plain:
                assert isinstance(parent, ast.Assign)
                end = (parent.end_lineno or 0, parent.end_col_offset or 0)
                dynamic.setdefault(targets[0].id, []).append((_scope(parent, parents), end))
            else:
                everything(node)
    for node in ast.walk(tree):
        if not isinstance(node, ast.Name) or not isinstance(node.ctx, ast.Load):
            continue
        use: ast.expr = node
        here = (node.lineno, node.col_offset)
        bound = [e for scope, e in dynamic.get(node.id, []) if _scope(node, parents) is scope]
        if node.id in names:
            name = names[node.id]
        elif node.id in modules or any(here > end for end in bound):
            module = modules.get(node.id, dotted)
            while module != dotted:  # `a.b.c.f`: up the attributes to the module's own
                parent = parents.get(id(use))
                if not isinstance(parent, ast.Attribute) or parent.value is not use:
                    break
                use, module = parent, f"{module}.{parent.attr}"
            parent = parents.get(id(use))
            if not around(module):
                continue  # another module of a package around it (`a.utils.f`)
            if module != dotted or not isinstance(parent, ast.Attribute) or parent.value is not use:
                everything(use)  # the module (or a package holding it) as a value
                continue
            use, name = parent, parent.attr
        else:
            continue
        where = _place(file, use, starts)
        read = "" if _unread(use, parents, tree) else where
        found[name] = _merged(found.get(name), Outside(called=where, read=read))
    return found


# `from a import ...`, `import a, b as c`: the first name of each module (anywhere in the text:
# a notebook's JSON holds its lines in strings). A name found wrongly only costs a parse.
_IMPORT = re.compile(r"\bfrom[ \t]+(\w+)[ \t]+import\b|\bimport[ \t]+([\w \t,.]+)")


def _imported(text: str) -> set[str]:
    """Return the names of the modules `text` may import by their bare name."""
    found = set()
    for head, plain in _IMPORT.findall(text):
        parts = [head] if head else [p.split()[0] for p in plain.split(",") if p.split()]
        found |= {p.split(".")[0] for p in parts}
    return found


def _code_of(file: Path, text: str) -> tuple[str, list[int]]:
    """Return the code of `file` (a notebook's code cells joined, IPython lines blanked) and the
    line each notebook cell starts at (empty for a `.py` file)."""
    if file.suffix != ".ipynb":
        return text, []
    try:
        cells = json.loads(text).get("cells", [])
    except (ValueError, AttributeError):
        return "", []
    parts, starts, line = [], [], 1
    for cell in cells:
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        source = cell.get("source", "")
        source = "".join(source) if isinstance(source, list) else str(source)
        source = MAGIC.sub(lambda m: (m.group(1) or m.group(2) or "") + "pass", source)
        starts.append(line)
        parts.append(source.rstrip("\n") + "\n")
        line += parts[-1].count("\n")
    return "".join(parts), starts


def _uses_in(file: Path, text: str, module: str) -> dict[str, Outside]:
    """Return how the code of `file` uses the functions of `module` it imports, by name; "*" for
    every function (the module passed as a value, a star import, code that does not parse)."""
    code, starts = _code_of(file, text)
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError, RecursionError):
        where = f"in `{file.name}`, which does not parse"
        return {"*": Outside(called=where, read=where)}
    parents = {id(c): p for p in ast.walk(tree) for c in ast.iter_child_nodes(p)}
    aliases: set[str] = set()  # names the module is bound to
    names: dict[str, str] = {}  # names its functions are bound to -> the function's name
    found: dict[str, Outside] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            aliases |= {a.asname or a.name for a in node.names if a.name == module}
        elif isinstance(node, ast.ImportFrom) and node.module == module and not node.level:
            for alias in node.names:
                if alias.name == "*":
                    where = _place(file, node, starts)
                    found["*"] = Outside(called=where, read=where)
                names[alias.asname or alias.name] = alias.name
    for node in ast.walk(tree):
        if not isinstance(node, ast.Name) or not isinstance(node.ctx, ast.Load):
            continue
        parent = parents.get(id(node))
        if node.id in aliases:
            if isinstance(parent, ast.Attribute) and parent.value is node:
                use: ast.expr = parent
                name = parent.attr
            else:
                where = _place(file, node, starts)
                found["*"] = Outside(called=where, read=where)
                continue
        elif node.id in names:
            use, name = node, names[node.id]
        else:
            continue
        where = _place(file, use, starts)
        read = "" if _unread(use, parents, tree) else where
        found[name] = _merged(found.get(name), Outside(called=where, read=read))
    return found


def _may_import(code: str, dotted: str) -> bool:
    """Whether `code`, which does not parse, may import the module `dotted`: an import statement
    naming its last name (`from a.b import mean`, `import a.b.mean`, `from a.b.mean import f`),
    or a dynamic import."""
    last = re.escape(dotted.rpartition(".")[2])
    named = rf"\bimport\b[^\n]*\b{last}\b|\bfrom\s+[\w.]*\b{last}\b[\w.]*\s+import\b"
    return bool(re.search(named, code)) or "import_module" in code or "__import__" in code


def _scope(node: ast.AST, parents: dict[int, ast.AST]) -> ast.AST | None:
    """The function (or module) whose scope `node` is in."""
    scope = parents.get(id(node))
    while scope is not None and not isinstance(scope, (ast.Module, *SCOPES)):
        scope = parents.get(id(scope))
    return scope


def _unread(use: ast.expr, parents: dict[int, ast.AST], tree: ast.Module) -> bool:
    """Return True if `use` is the function of a call whose result nobody reads: a statement of
    its own, or bound to a name that is rebound before any read."""
    call = parents.get(id(use))
    if not isinstance(call, ast.Call) or call.func is not use:
        return False
    around = parents.get(id(call))
    if isinstance(around, ast.Expr):
        return True
    if not isinstance(around, ast.Assign) or len(around.targets) != 1:
        return False
    target = around.targets[0]
    return isinstance(target, ast.Name) and _dead(around, target.id, parents, tree)


def _dead(binding: ast.Assign, name: str, parents: dict[int, ast.AST], tree: ast.Module) -> bool:
    """Return True if the value `binding` gives `name` is read nowhere: not in the statement of
    its scope holding it (a loop may come back to it), and the scope's next statements bind
    the name again, by a plain assignment, before any of them reads it, and no def or lambda of
    the scope made before that reads the name (it might be called in between)."""
    node: ast.AST = binding
    scope = parents.get(id(node))
    while scope is not None and not isinstance(scope, (ast.Module, *SCOPES)):
        node, scope = scope, parents.get(id(scope))
    body = getattr(scope, "body", None)
    if not isinstance(body, list) or node not in body or isinstance(scope, ast.ClassDef):
        return False
    at = body.index(node)
    if _loads(node, name):
        return False
    for statement in body[at + 1 :]:
        rebinds = isinstance(statement, ast.Assign) and all(
            isinstance(t, ast.Name) for t in statement.targets
        )
        if rebinds and any(t.id == name for t in statement.targets):  # type: ignore[attr-defined]
            if _loads(statement.value, name):  # type: ignore[attr-defined]
                return False
            made = body[: body.index(statement)]
            return not any(
                _loads(d, name) for s in made for d in ast.walk(s) if isinstance(d, SCOPES)
            )
        if _loads(statement, name):
            return False
    if isinstance(scope, ast.Module):
        return False  # left bound at module level: another module may import it
    return not any(_loads(d, name) for s in body for d in ast.walk(s) if isinstance(d, SCOPES))


def _loads(node: ast.AST, name: str) -> bool:
    return any(
        isinstance(n, ast.Name) and n.id == name and not isinstance(n.ctx, ast.Store)
        for n in ast.walk(node)
    ) or any(isinstance(n, (ast.Global, ast.Nonlocal)) and name in n.names for n in ast.walk(node))


def _place(file: Path, node: ast.AST, starts: list[int]) -> str:
    """Where `node` is: "in `main.py:60`", or "in `nb.ipynb[cell 17]`" (its code cells
    counted from 1, as the run's messages count them)."""
    line = getattr(node, "lineno", 0)
    if not starts:
        return f"in `{file.name}:{line}`"
    cell = sum(1 for start in starts if start <= line)
    return f"in `{file.name}[cell {cell}]`"


def _merged(old: Outside | None, new: Outside) -> Outside:
    """The first place each of `old` and `new` says the function is called and read at."""
    if old is None:
        return new
    return Outside(called=old.called or new.called, read=old.read or new.read)


# The modules of its code base a module imports -------------------------------------------------
MAX_IMPORTED = 64  # a module importing more of its code base than this gets the first ones


def imported_names(text: str, package: str | None) -> list[str]:
    """Return the dotted names of the modules `text` may import, in order: `import a.b as u`
    gives `a.b`; `from a import b` gives `a.b` (if `b` is a module) and `a`; a relative import
    is read against `package` (the file's own, dotted; None: the file is in none, and it names
    nothing). Only module-level and function-level import statements Python's `ast` reads."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                if package is None:
                    continue
                parts = package.split(".")
                if node.level - 1 >= len(parts):
                    continue
                head = ".".join(parts[: len(parts) - (node.level - 1)])
                base = f"{head}.{base}" if base else head
            if not base:
                continue
            found += [f"{base}.{alias.name}" for alias in node.names if alias.name != "*"]
            found.append(base)
    return list(dict.fromkeys(found))


def read_module(file: Path) -> str | None:
    """Return the text of the regular file `file` (at most MAX_BYTES), else None."""
    try:
        status = file.stat()
        if not stat.S_ISREG(status.st_mode) or status.st_size > MAX_BYTES:
            return None
        return file.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
