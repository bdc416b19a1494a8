"""The functions of the code base's other modules that a module calls, read where they are defined.

big_vision's trainers call `u.mixup(rng, images, labels)` inside their step and
`u.chrono.pause(wait_for=params_repl)` around it; both are defs of `big_vision/utils.py`. The
engine hands the pass the text of the code base's modules a module imports (`FileState.modules`,
read by `Project.imported_modules`: passes do no I/O); this module parses one when first asked and
resolves a qualified name to its def: a function of the module (`big_vision.utils.mixup`), or a
method of an instance the module binds once at its level (`chrono = Chrono()`, then
`big_vision.utils.chrono.pause`: the method, its first parameter bound). The def is read with its
own module's names (`qualname`) and helpers (`defs`), never with the caller's.

Timid: a name bound more than once at the module's level, a class whose methods may come from a
base class, a module that does not parse all resolve to nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

import libcst as cst

from jaxmigrate.toolkit.scope import ScopeModel

Qualname = Callable[[cst.BaseExpression], "str | None"]


@dataclass(frozen=True)
class Function:
    """A def of another module: `fn`, whether its first parameter is bound (a method of an
    instance), and how its module spells names (`qualname`) and which helpers it has (`defs`)."""

    fn: cst.FunctionDef
    bound: bool
    qualname: Qualname
    defs: Mapping[str, cst.FunctionDef]

    @property
    def params(self) -> list[str]:
        """The names of the parameters a caller fills by position (`self` left out)."""
        names = [p.name.value for p in self.fn.params.params]
        return names[1:] if self.bound else names


@dataclass
class _Module:
    tree: cst.Module
    names: ScopeModel
    defs: dict[str, cst.FunctionDef]
    classes: dict[str, cst.ClassDef]
    instances: dict[str, str]  # `chrono = Chrono()`: the name, its class


class Imported:
    """The code base's modules a module imports (dotted name -> text), each parsed when first
    asked (`function`)."""

    def __init__(self, modules: tuple[tuple[str, str], ...] = ()) -> None:
        self.texts = dict(modules)
        self.parsed: dict[str, _Module | None] = {}

    def function(self, qualname: str | None) -> Function | None:
        """Return the def `qualname` names in one of the modules, else None."""
        if not qualname or not self.texts:
            return None
        parts = qualname.split(".")
        for cut in range(len(parts) - 1, 0, -1):
            name = ".".join(parts[:cut])
            if name in self.texts:
                module = self._module(name)
                return None if module is None else _resolve(module, parts[cut:])
        return None

    def _module(self, name: str) -> _Module | None:
        if name not in self.parsed:
            self.parsed[name] = _parsed(self.texts[name])
        return self.parsed[name]


NO_IMPORTS = Imported()


def _parsed(text: str) -> _Module | None:
    try:
        tree = cst.parse_module(text)
    except (cst.ParserSyntaxError, RecursionError, ValueError):
        return None
    names = ScopeModel(tree)
    counts: dict[str, int] = {}
    for name in _module_bindings(tree):
        counts[name] = counts.get(name, 0) + 1
    once = {n for n, c in counts.items() if c == 1}
    defs = {d.name.value: d for d in tree.body if isinstance(d, cst.FunctionDef)}
    classes = {c.name.value: c for c in tree.body if isinstance(c, cst.ClassDef)}
    instances = {}
    for statement in tree.body:
        assign = _single_assign(statement)
        if assign is None:
            continue
        target, value = assign
        if (
            isinstance(value, cst.Call)
            and isinstance(value.func, cst.Name)
            and value.func.value in classes
            and target in once
        ):
            instances[target] = value.func.value
    return _Module(
        tree,
        names,
        {k: v for k, v in defs.items() if k in once},
        {k: v for k, v in classes.items() if k in once},
        instances,
    )


def _resolve(module: _Module, rest: list[str]) -> Function | None:
    def qualname(node: cst.BaseExpression) -> str | None:
        return module.names.qualified_name(node)

    if len(rest) == 1 and rest[0] in module.defs:
        return Function(module.defs[rest[0]], False, qualname, module.defs)
    if len(rest) == 2 and (rest[0] in module.instances or rest[0] in module.classes):
        # `chrono.pause` of `chrono = Chrono()` there, or `Chrono.pause` of an instance the
        # caller made (`_flow._callee_name`): the method, its first parameter bound
        cls = module.classes[module.instances.get(rest[0], rest[0])]
        if any(not _is_object(b.value) for b in cls.bases):
            return None  # a method may come from a base class
        methods = [
            s
            for s in (cls.body.body if isinstance(cls.body, cst.IndentedBlock) else ())
            if isinstance(s, cst.FunctionDef) and s.name.value == rest[1]
        ]
        if len(methods) != 1 or methods[0].decorators or not methods[0].params.params:
            return None
        return Function(methods[0], True, qualname, module.defs)
    return None


def _is_object(node: cst.BaseExpression) -> bool:
    return isinstance(node, cst.Name) and node.value == "object"


def _single_assign(statement: cst.CSTNode) -> tuple[str, cst.BaseExpression] | None:
    if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
        return None
    small = statement.body[0]
    if not isinstance(small, cst.Assign) or len(small.targets) != 1:
        return None
    target = small.targets[0].target
    return (target.value, small.value) if isinstance(target, cst.Name) else None


def _module_bindings(tree: cst.Module) -> Iterator[str]:
    """Every name the module's own statements bind (defs, classes, assignments, imports), each
    time it is bound: a name bound twice is not resolved."""
    for statement in tree.body:
        if isinstance(statement, (cst.FunctionDef, cst.ClassDef)):
            yield statement.name.value
        elif isinstance(statement, cst.SimpleStatementLine):
            for small in statement.body:
                if isinstance(small, cst.Assign):
                    for t in small.targets:
                        yield from _target_names(t.target)
                elif isinstance(small, (cst.AnnAssign, cst.AugAssign)):
                    yield from _target_names(small.target)
                elif isinstance(small, (cst.Import, cst.ImportFrom)) and not isinstance(
                    small.names, cst.ImportStar
                ):
                    for alias in small.names:
                        bound = alias.asname.name if alias.asname else alias.name
                        if isinstance(bound, cst.Name):
                            yield bound.value
                        elif isinstance(bound, cst.Attribute):  # `import a.b` binds `a`
                            yield _head(bound)
        else:  # `if`/`try`/`for`/`with` at module level: what they bind counts as bound twice
            for node in _walk(statement):
                names: list[str] = []
                if isinstance(node, (cst.FunctionDef, cst.ClassDef)):
                    names = [node.name.value]
                elif isinstance(node, cst.Assign):
                    names = [n for t in node.targets for n in _target_names(t.target)]
                elif isinstance(node, (cst.AnnAssign, cst.AugAssign, cst.For)):
                    names = list(_target_names(node.target))
                elif isinstance(node, cst.AsName):
                    names = list(_target_names(node.name))  # type: ignore[arg-type]
                elif isinstance(node, cst.ImportAlias):
                    names = [_head(node.name)]
                yield from names + names


def _head(node: cst.BaseExpression) -> str:
    while isinstance(node, cst.Attribute):
        node = node.value
    return node.value if isinstance(node, cst.Name) else ""


def _target_names(node: cst.BaseExpression) -> Iterator[str]:
    if isinstance(node, cst.Name):
        yield node.value
    elif isinstance(node, (cst.Tuple, cst.List)):
        for e in node.elements:
            yield from _target_names(e.value)
    elif isinstance(node, cst.StarredElement):
        yield from _target_names(node.value)


def _walk(node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    yield node
    for child in node.children:
        yield from _walk(child)


def only_waits_on(function: Function, param: str) -> bool:
    """Return True if every read of `param` in the def waits for it and reads nothing else:
    `jax.block_until_ready(param)` or `param.block_until_ready()`, each a statement of its own
    (big_vision's `Chrono.pause(self, wait_for=())`)."""
    fn = function.fn
    parents: dict[int, cst.CSTNode] = {}
    for node in _walk(fn.body):
        for child in node.children:
            parents[id(child)] = node
    reads = [n for n in _walk(fn.body) if isinstance(n, cst.Name) and n.value == param]
    return bool(reads) and all(_waits(parents, r, function.qualname) for r in reads)


def _waits(parents: Mapping[int, cst.CSTNode], use: cst.Name, qualname: Qualname) -> bool:
    around = parents.get(id(use))
    if isinstance(around, cst.Attribute) and around.value is use:
        call = parents.get(id(around))
        waits = (
            around.attr.value == "block_until_ready"
            and isinstance(call, cst.Call)
            and call.func is around
            and not call.args
        )
    else:
        call = parents.get(id(around))
        waits = (
            isinstance(around, cst.Arg)
            and around.keyword is None
            and isinstance(call, cst.Call)
            and len(call.args) == 1
            and qualname(call.func) == "jax.block_until_ready"
        )
    return waits and isinstance(parents.get(id(call)), cst.Expr)
