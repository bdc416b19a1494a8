"""The survey of the partial-auto-callback rule: one walk of the module that records its functions,
its shard_map regions, the names they read and the callbacks they call."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import libcst as cst

from jaxmigrate.toolkit.names import walk
from jaxmigrate.toolkit.scope import Scope, ScopeModel

SHARD_MAP = "jax.shard_map"
EXPERIMENTAL_SHARD_MAP = "jax.experimental.shard_map.shard_map"  # JM102 runs first
HOST_CALLBACK = "jax.experimental.host_callback"  # JM106 runs first
PURE = "jax.pure_callback"
IO = "jax.experimental.io_callback"
CALLBACKS = frozenset({PURE, IO})
# Fine with one automatic axis; with two or more, JAX 0.10.2 raises `TypeError: axis_index()
# takes 1 positional argument but 2 were given` (its own partial-auto lowering of them).
DEBUG = frozenset({"jax.debug.callback", "jax.debug.print"})
PARTIAL = "functools.partial"
JITS = frozenset({"jax.jit", "jax.experimental.pjit.pjit"})
# `helper = jax.jit(f)`, `partial(f, ...)`: calling `helper` runs `f`.
WRAPPERS = JITS | {PARTIAL, "jax.vmap", "jax.checkpoint", "jax.remat", "jax.named_call"}
SPEC_TYPES = frozenset({"jax.P", "jax.sharding.PartitionSpec"})
SHAPE_MAKERS = frozenset({"jax.ShapeDtypeStruct", "jax.core.ShapedArray"})
OPTIONS = {
    PURE: frozenset({"sharding", "vmap_method", "vectorized"}),
    IO: frozenset({"sharding", "ordered"}),
}
SHORT = {
    PURE: "pure_callback",
    IO: "io_callback",
    "jax.debug.callback": "jax.debug.callback",
    "jax.debug.print": "jax.debug.print",
}
Edit = Callable[[cst.Call], cst.BaseExpression]


class LeftAlone(Exception):
    """A shard_map this pass leaves alone; the message is the reason."""


# The survey: one walk of the module ------------------------------------------------------------
@dataclass(eq=False)
class Read:
    """A name read, where it is read, and who reads it (a unit, a region's body, or the module)."""

    name: cst.Name
    scope: Scope
    reader: Function | Region | None


@dataclass(eq=False)
class Function:
    """A function of the module (a `def` or a lambda) whose body the pass can follow."""

    node: cst.FunctionDef | cst.Lambda
    parent: Function | Region | None
    callbacks: list[cst.Call] = field(default_factory=list)
    opaque: list[cst.CSTNode] = field(default_factory=list)
    reads: list[Read] = field(default_factory=list)
    lambdas: list[Function] = field(default_factory=list)
    regions: list[Region] = field(default_factory=list)
    strings: set[str] = field(default_factory=set)
    region: Region | None = None  # set for a def decorated with a shard_map
    jitted: bool = False

    @property
    def label(self) -> str:
        return f"`{self.node.name.value}`" if isinstance(self.node, cst.FunctionDef) else "a lambda"


@dataclass(eq=False)
class Region:
    """One `jax.shard_map` (call, decorator factory or partial) and the body it maps."""

    call: cst.Call
    keywords: dict[str, cst.BaseExpression]
    scope: Scope
    unit: Function | None
    splat: bool = False
    reads: list[Read] = field(default_factory=list)
    lambdas: list[Function] = field(default_factory=list)
    body_def: Function | None = None
    has_body: bool = False
    jitted: bool = False


def _head(node: cst.BaseExpression) -> cst.Name:
    """Return the leftmost name of a callee that resolves (`jax` of `jax.shard_map`)."""
    while not isinstance(node, cst.Name):
        assert isinstance(node, (cst.Attribute, cst.Call))
        node = node.value if isinstance(node, cst.Attribute) else node.func
    return node


class Survey(cst.CSTVisitor):
    """The module's units, regions, reads and callbacks; bindings are the scope model's."""

    def __init__(self, module: cst.Module, names: ScopeModel) -> None:
        super().__init__()
        self.resolver = names
        self.units: list[Function] = []
        self.regions: list[Region] = []
        self.defs: dict[tuple[int, str], Function] = {}  # by (id of the scope it is bound in, name)
        self.lambda_units: dict[int, Function] = {}
        self.reads: dict[str, list[Read]] = {}
        self.jit_args: list[Read] = []
        self.jit_nodes: set[int] = set()
        self._readers: list[Function | Region | None] = [None]
        self._called: set[int] = set()
        self._statements: list[cst.CSTNode] = [module]
        self.statement_of: dict[int, cst.CSTNode] = {}

    @property
    def reader(self) -> Function | Region | None:
        return self._readers[-1]

    @property
    def unit(self) -> Function | None:
        for reader in reversed(self._readers):
            if isinstance(reader, Function):
                return reader
        return None

    def qualname(self, node: cst.BaseExpression) -> str | None:
        return self.resolver.qualified_name(node)

    # Units ---------------------------------------------------------------------------------
    def _read_in(self, unit: Function, body: cst.CSTNode) -> None:
        self._readers.append(unit)
        walk(self, body)
        self._readers.pop()

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        for deco in node.decorators:
            walk(self, deco)
        walk(self, node.params)
        unit = Function(node, self.reader)
        self.units.append(unit)
        self.defs[(id(self.resolver.scope_of(node.name)), node.name.value)] = unit
        unit.region, unit.jitted = self._decorations(node, unit)
        self._read_in(unit, node.body)
        return False

    def visit_Lambda(self, node: cst.Lambda) -> bool:
        walk(self, node.params)
        unit = Function(node, self.reader)
        self.units.append(unit)
        self.lambda_units[id(node)] = unit
        if isinstance(self.reader, (Function, Region)):
            self.reader.lambdas.append(unit)
        self._read_in(unit, node.body)
        return False

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        for part in (*node.decorators, *node.bases, *node.keywords, node.body):
            walk(self, part)
        return False

    def visit_Param(self, node: cst.Param) -> bool:
        for part in (node.default, node.annotation):
            if part is not None:
                walk(self, part)
        return False

    def _comprehension(self, *parts: cst.CSTNode) -> bool:
        for part in parts:  # the loops first, as they run first
            walk(self, part)
        return False

    def visit_ListComp(self, node: cst.ListComp) -> bool:
        return self._comprehension(node.for_in, node.elt)

    def visit_SetComp(self, node: cst.SetComp) -> bool:
        return self._comprehension(node.for_in, node.elt)

    def visit_GeneratorExp(self, node: cst.GeneratorExp) -> bool:
        return self._comprehension(node.for_in, node.elt)

    def visit_DictComp(self, node: cst.DictComp) -> bool:
        return self._comprehension(node.for_in, node.key, node.value)

    def _decorations(self, node: cst.FunctionDef, unit: Function) -> tuple[Region | None, bool]:
        region, jitted = None, False
        for deco in node.decorators:
            expr = deco.decorator
            if self.qualname(expr) in JITS or (isinstance(expr, cst.Call) and self._jit(expr)):
                jitted = True
            if isinstance(expr, cst.Call) and self._factory(expr) is not None:
                region = self._region(expr, self._factory(expr) or [])
                region.body_def, region.has_body = unit, True
        if region is not None:
            region.jitted = region.jitted or jitted
        return region, jitted

    def _jit(self, call: cst.Call) -> bool:
        """`partial(jax.jit, ...)`."""
        return (
            self.qualname(call.func) == PARTIAL
            and bool(call.args)
            and self.qualname(call.args[0].value) in JITS
        )

    def _factory(self, call: cst.Call) -> list[cst.Arg] | None:
        """The keywords of `jax.shard_map(mesh=...)` or `partial(jax.shard_map, mesh=...)`."""
        if self.qualname(call.func) == SHARD_MAP and all(a.keyword or a.star for a in call.args):
            return list(call.args)
        if (
            self.qualname(call.func) == PARTIAL
            and call.args
            and not call.args[0].keyword
            and self.qualname(call.args[0].value) == SHARD_MAP
        ):
            return list(call.args[1:])
        return None

    def _region(self, call: cst.Call, args: Sequence[cst.Arg]) -> Region:
        region = Region(call, {}, self.resolver.scope_of(_head(call.func)), self.unit)
        for arg in args:
            if arg.star or arg.keyword is None:
                region.splat = True
            else:
                region.keywords[arg.keyword.value] = arg.value
        self.regions.append(region)
        if region.unit is not None:
            region.unit.regions.append(region)
        return region

    # Calls ---------------------------------------------------------------------------------
    def visit_Call(self, node: cst.Call) -> bool:
        qualname = self.qualname(node.func)
        if (qualname in CALLBACKS or qualname in DEBUG) and isinstance(self.reader, Function):
            self.reader.callbacks.append(node)
            self._called.add(id(node.func))
            self.statement_of[id(node)] = self._statements[-1]
        if qualname in JITS and node.args:
            first = node.args[0].value
            self.jit_nodes.add(id(first))
            if isinstance(first, cst.Name):
                self.jit_args.append(Read(first, self.resolver.scope_of(first), self.reader))
        body: cst.BaseExpression | None = None
        region: Region | None = None
        if (
            qualname == SHARD_MAP
            and node.args
            and not node.args[0].keyword
            and not node.args[0].star
        ):
            region = self._region(node, node.args[1:])
            body = node.args[0].value
        elif isinstance(node.func, cst.Call) and self._factory(node.func) is not None and node.args:
            region = self._region(node.func, self._factory(node.func) or [])
            body = node.args[0].value
        if region is None or body is None:
            return True
        region.has_body = True
        region.jitted = id(node) in self.jit_nodes or id(region.call) in self.jit_nodes
        walk(self, node.func)
        self._readers.append(region)
        walk(self, body)
        self._readers.pop()
        for arg in node.args[1:]:
            walk(self, arg)
        return False

    def on_visit(self, node: cst.CSTNode) -> bool:
        if isinstance(node, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
            self._statements.append(node)
        # an import binds names (the scope model's), it reads none
        return super().on_visit(node) and not isinstance(node, (cst.Import, cst.ImportFrom))

    def on_leave(self, original_node: cst.CSTNode) -> None:
        if isinstance(original_node, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
            self._statements.pop()
        super().on_leave(original_node)

    # Reads and strings ---------------------------------------------------------------------
    def visit_Name(self, node: cst.Name) -> None:
        read = Read(node, self.resolver.scope_of(node), self.reader)
        self.reads.setdefault(node.value, []).append(read)
        if isinstance(self.reader, (Function, Region)):
            self.reader.reads.append(read)
        self._opaque(node)

    def _opaque(self, node: cst.Name | cst.Attribute) -> None:
        if id(node) in self._called or not isinstance(self.reader, Function):
            return
        if self.qualname(node) in CALLBACKS:
            self.reader.opaque.append(node)

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        self._opaque(node)
        walk(self, node.value)
        return False

    def visit_Arg(self, node: cst.Arg) -> bool:
        walk(self, node.value)
        return False

    def visit_SimpleString(self, node: cst.SimpleString) -> None:
        if isinstance(self.reader, Function) and isinstance(node.evaluated_value, str):
            self.reader.strings.add(node.evaluated_value)

    # Resolving -----------------------------------------------------------------------------
    def lookup(self, name: str, scope: Scope) -> Function | Region | None:
        """Return the unit (or region, for `f = jax.shard_map(...)`) a read of `name` in `scope`
        means."""
        model = self.resolver
        if model.star_import or model.declared(name):
            return None
        owner = model.lookup(name, scope)
        here = [] if owner is None else owner.assigning(name)
        if owner is None or len(here) != 1:
            return None
        if not here[0].plain or here[0].value is None:
            return self.defs.get((id(owner), name))
        return self.resolve_value(here[0].value, owner)

    def resolve_value(self, value: cst.BaseExpression, scope: Scope) -> Function | Region | None:
        if isinstance(value, cst.Lambda):
            return self.lambda_units.get(id(value))
        if isinstance(value, cst.Name):
            return self.lookup(value.value, scope)
        if isinstance(value, cst.Call):
            for region in self.regions:
                if region.call is value or (
                    isinstance(value.func, cst.Call) and region.call is value.func
                ):
                    return region
            if self.qualname(value.func) in WRAPPERS and value.args:
                return self.resolve_value(value.args[0].value, scope)
        return None


@dataclass(frozen=True)
class CallbackSite:
    """One callback reached from a region, and the mesh axes that are automatic around it."""

    call: cst.Call
    unit: Function
    kind: str
    auto: tuple[cst.SimpleString, ...]
