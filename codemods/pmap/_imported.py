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

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import libcst as cst
import libcst.matchers as m

from jaxmigrate.toolkit.scope import BindingKind, ScopeModel

from ._reach import Flow

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
        return [p.name.value for p in self.fn.params.params[1 if self.bound else 0 :]]


class Imported:
    """The code base's modules a module imports (dotted name -> text), each parsed when first
    asked (`function`)."""

    def __init__(self, modules: tuple[tuple[str, str], ...] = ()) -> None:
        self.texts = dict(modules)
        self.parsed: dict[str, ScopeModel | None] = {}

    def function(self, qualname: str | None) -> Function | None:
        """Return the def `qualname` names in one of the modules, else None."""
        found = self._module_of(qualname)
        return None if found is None else _resolve(*found)

    def klass(self, qualname: str | None) -> tuple[cst.ClassDef, Qualname] | None:
        """Return the class `qualname` names in one of the modules (bound once at its level),
        with how that module spells names; else None."""
        found = self._module_of(qualname)
        if found is None or len(found[1]) != 1:
            return None
        cls = _once(found[0].module_scope, found[1][0], cst.ClassDef)
        return None if cls is None else (cls, found[0].qualified_name)

    def modules(self, words: Sequence[str]) -> list[cst.Module]:
        """The modules given whose text holds one of `words`, each parsed once."""
        return [
            names.module
            for name, text in self.texts.items()
            if any(word in text for word in words) and (names := self._parsed(name)) is not None
        ]

    def scope(self, module: str) -> ScopeModel | None:
        """The module `module` of the code base, parsed (once); None if it is not one."""
        return self._parsed(module) if module in self.texts else None

    def constant(self, names: ScopeModel, spelled: str) -> str | None:
        """The string a name of the code base's other modules is bound to once, at that
        module's level (ferminet's `constants.PMAP_AXIS_NAME = "qmc_pmap_axis"`), spelled as
        `names`' module reaches it: `constants.PMAP_AXIS_NAME` after `from ferminet import
        constants`, `ferminet.constants.PMAP_AXIS_NAME` after `import ferminet.constants`,
        `PMAP_AXIS_NAME` after `from ferminet.constants import PMAP_AXIS_NAME`, when that module
        binds it once, at its level, to a string literal; else None. Only that module is
        parsed."""
        head, *rest = spelled.split(".")
        bindings = names.module_scope.bindings.get(head, [])
        qualname = bindings[0].qualname if len(bindings) == 1 else None
        if qualname is None or bindings[0].kind is not BindingKind.IMPORT:
            return None
        module, _, name = ".".join([qualname, *rest]).rpartition(".")
        other = self.scope(module)
        bindings = other.module_scope.bindings.get(name, []) if other is not None else []
        value = bindings[0].value if len(bindings) == 1 and bindings[0].plain else None
        if isinstance(value, cst.SimpleString) and isinstance(value.evaluated_value, str):
            return value.evaluated_value
        return None

    def _module_of(self, qualname: str | None) -> tuple[ScopeModel, list[str]] | None:
        """The module of the longest prefix of `qualname` that is one, and the rest."""
        parts = qualname.split(".") if qualname and self.texts else []
        for cut in range(len(parts) - 1, 0, -1):
            if (name := ".".join(parts[:cut])) in self.texts:
                names = self._parsed(name)
                return None if names is None else (names, parts[cut:])
        return None

    def _parsed(self, name: str) -> ScopeModel | None:
        """The module `name` parsed (once), None if it does not parse."""
        if name not in self.parsed:
            try:
                self.parsed[name] = ScopeModel(cst.parse_module(self.texts[name]))
            except (cst.ParserSyntaxError, RecursionError, ValueError):
                self.parsed[name] = None
        return self.parsed[name]


NO_IMPORTS = Imported()


def _once(scope: Any, name: str, kind: type[cst.CSTNode]) -> Any:
    """The node of kind `kind` that alone binds `name` in `scope`, else None."""
    bindings = scope.bindings.get(name, [])
    return bindings[0].node if len(bindings) == 1 and isinstance(bindings[0].node, kind) else None


def _resolve(names: ScopeModel, rest: list[str]) -> Function | None:
    """`f`: a def of the module; `obj.m` of `obj = C()` there, or `C.m`: the method `m` of the
    class `C` of the module, its first parameter bound. Each name bound once at module level."""
    scope = names.module_scope
    defs = {n: d for n in scope.bindings if (d := _once(scope, n, cst.FunctionDef)) is not None}
    if len(rest) == 1 and rest[0] in defs:
        return Function(defs[rest[0]], False, names.qualified_name, defs)
    if len(rest) != 2:
        return None
    match _once(scope, rest[0], cst.Assign):
        case cst.Assign(value=cst.Call(func=cst.Name(made))):  # `chrono = Chrono()`
            cls = _once(scope, made, cst.ClassDef)
        case _:  # `Chrono.pause` of an instance the caller made
            cls = _once(scope, rest[0], cst.ClassDef)
    if cls is None or any(not m.matches(b.value, m.Name("object")) for b in cls.bases):
        return None  # a method may come from a base class
    found = [s for s in cls.body.body if isinstance(s, cst.FunctionDef) and s.name.value == rest[1]]
    if len(found) != 1 or found[0].decorators or not found[0].params.params:
        return None
    return Function(found[0], True, names.qualified_name, defs)


def only_waits_on(function: Function, param: str) -> bool:
    """Return True if every read of `param` in the def waits for it and reads nothing else
    (`waits`: big_vision's `Chrono.pause(self, wait_for=())`)."""
    flow = Flow(function.fn)
    reads = flow.loads.get(param, [])
    return bool(reads) and all(waits(flow.parent, r, function.qualname) for r in reads)


def waits(parent: Mapping[int, cst.CSTNode], use: cst.Name, qualname: Qualname) -> bool:
    """`use.block_until_ready()` or `jax.block_until_ready(use)`, a statement of its own: it
    waits for the value and reads nothing of its layout."""
    around = parent.get(id(use))
    call = parent.get(id(around))
    if not isinstance(call, cst.Call) or not isinstance(parent.get(id(call)), cst.Expr):
        return False
    if isinstance(around, cst.Attribute):  # `use` is its value: a name is no attribute's `attr`
        return m.matches(call, m.Call(m.Attribute(attr=m.Name("block_until_ready")), args=[]))
    alone = m.matches(call, m.Call(args=[m.Arg(keyword=None)]))  # the `Arg` around `use`
    return alone and qualname(call.func) == "jax.block_until_ready"
