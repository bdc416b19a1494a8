"""Make host callbacks run inside shard_maps that leave some mesh axes automatic.

## Why
A host callback (`jax.pure_callback`, `jax.experimental.io_callback`) lowered where some mesh
axes are manual and others automatic fails at lowering (JAX 0.6 to 0.10, jit or not) with

    NotImplementedError: callbacks are only supported in spmd computations when all mesh axes
    are partitioned manually (no partial automatic sharding).

It appears when code moves to `jax.shard_map(..., axis_names={...})` (or the removed
experimental `auto=`, which the experimental-shard-map pass turns into `axis_names=` first) over
a multi-axis mesh and keeps a callback inside, directly or through a helper function.

## Before
```python
import jax
import numpy as np
from jax.sharding import Mesh, PartitionSpec as P

mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))


def body(v):
    y = jax.pure_callback(np.sin, jax.ShapeDtypeStruct(v.shape, v.dtype), v)
    return y * 2


step = jax.jit(
    jax.shard_map(body, mesh=mesh, in_specs=P("data"), out_specs=P("data"), axis_names={"data"})
)
```

## After
```python
import jax
import numpy as np
from jax.sharding import Mesh, PartitionSpec as P

mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))


def body(v):
    y = jax.shard_map(
        lambda v: jax.pure_callback(np.sin, jax.ShapeDtypeStruct(v.shape, v.dtype), v),
        in_specs=P(),
        out_specs=P(),
        axis_names={"model"},
        check_vma=False,
    )(v)
    return y * 2


step = jax.jit(
    jax.shard_map(body, mesh=mesh, in_specs=P("data"), out_specs=P("data"), axis_names={"data"})
)
```

A callback is found in the body of a `jax.shard_map` whose `axis_names=` is a strict subset of
the mesh's axes (a literal, or `frozenset(mesh.axis_names) - {...}`), the mesh's axis names
being visible in the file (`Mesh(..., ("data", "model"))` or `jax.make_mesh(...)` inline or
assigned once to the name passed as `mesh=`). The body may be a function of the file, a local
function, a lambda, `functools.partial(f, ...)`, or a decorated `def` (`@jax.shard_map(...)`,
`@partial(jax.shard_map, ...)`); calls are followed through the functions of the file, and a
shard_map nested in the body adds its axes. Three rewrites, the smallest that is correct:

- **nest** (`pure_callback`, the shard_map under `jax.jit`): the callback runs in a
  `jax.shard_map` over the remaining axes without `mesh=` (it uses the context mesh; passing
  `mesh=` raises), `in_specs=P()`, `out_specs=P()`, `check_vma=False` (cookbook case 12b). Its
  operands become the lambda's parameters, the callback call is kept as it was. The callback
  then runs once per device (duplicated along the automatic axes), which is right for a pure
  function. The rest of the body keeps its automatic sharding.
- **widen** (`pure_callback` that cannot be nested: not under `jax.jit`, where a nested
  shard_map does not run, or in a function also used elsewhere): `axis_names=` is dropped, so
  every mesh axis is manual. Allowed only when the specs never name the automatic axes and the
  functions reached never mention them, so each device computes what its manual shard computed.
- **widen and gate** (`io_callback`, ordered or not; nesting an ordered one aborts the process,
  nesting an unordered one repeats its side effect on every automatic device): the shard_map is
  widened and the callback runs on the first device along the formerly automatic axes only,
  its result shared with `psum`, so each side effect happens once per manual shard, as before:

```python
y = jax.lax.psum(
    jax.lax.cond(
        jax.lax.axis_index("model") == 0,
        lambda: io_callback(log, jax.ShapeDtypeStruct(v.shape, v.dtype), v, ordered=True),
        lambda: jnp.zeros(v.shape, v.dtype),
    ),
    "model",
)
```

(other result shapes get `jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)`; a
callback with no result, `io_callback(log, None, ...)`, is just the `cond`). The cookbook's gate
needs `check_vma=False` because its other branch, `jnp.zeros_like(v)`, varies along the manual
axes; zeros built from the result shape do not, so `check_vma` is left as it was.

`jax.debug.callback` and `jax.debug.print` work in such regions with one automatic axis (once
per manual shard) and are left alone. With two or more automatic axes JAX 0.10.2 raises
`TypeError: axis_index() takes 1 positional argument but 2 were given` from its own lowering of
them; those are widened and gated like an `io_callback`.

## Safety
unsafe: the rewrite moves where and how often a host function runs. Nested pure callbacks run
once per device instead of once per manual shard (their results are equal); the widened region
loses the automatic sharding of its other computations (same values, more memory per device).
A site is applied once verified by execution (or with `--unsafe-fixes`).

## Skips
- The mesh's axis names are not visible (a parameter, an attribute, a mesh from `jax.set_mesh`
  without `mesh=`), or `axis_names=` is computed: which axes are automatic is not known.
- The body is not a function of this file (a parameter, an attribute, an import): its callbacks
  cannot be seen. Callbacks in other modules are never seen.
- A callback passed around as a value (`partial(jax.pure_callback, ...)`), or a `pure_callback`
  to nest called with `*args`/`**kwargs` (its operands are not known).
- An `io_callback` whose shard_map cannot be widened (its specs or its functions name an
  automatic axis, or it holds another shard_map), or that sits in a function also used outside
  this shard_map, or in a nested shard_map; an `io_callback` whose result shapes are computed by
  a call (the gate repeats them).
- A `pure_callback` that can be neither nested nor widened.
- A function reached from the shard_map under two different sets of manual axes.

## Verification
the original raises, so its reference is the widened program (every mesh axis manual, the
verifier's `widened-shard-map` reference, cookbook case 12e), which is sound when the specs never
name the automatic axes; in it, `io_callback` and `jax.debug.callback` run once per manual shard,
so a target that returns what its host functions saw is compared on that too (a rewrite that
only widened would call them twice as often, and fail). The fixtures run the original's
`reference()` (that widened form, or what it computes; for `io_callback`, the side effects
counted by a `jax.debug.callback`, which runs once per manual shard) and the rewrite on an
8-device CPU mesh and compare values and side effects.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import ClassVar

import libcst as cst
from libcst.codemod import CodemodContext

from jaxmigrate.model import Safety
from jaxmigrate.toolkit.cstutil import is_reusable, jax_ref, jnp_ref
from jaxmigrate.toolkit.emit import Call, Item, code, comments_in, fresh_name, joined, new_item
from jaxmigrate.toolkit.facts import AstFacts
from jaxmigrate.toolkit.meshes import MESH_MAKERS, literal_axis_names, string_elements
from jaxmigrate.toolkit.names import dotted, walk
from jaxmigrate.toolkit.passes import Pass
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


class Skip(Exception):
    """A shard_map this pass leaves alone; the message is the reason."""


# The survey: one walk of the module ------------------------------------------------------------
@dataclass(eq=False)
class Read:
    """A name read, where it is read, and who reads it (a unit, a region's body, or the module)."""

    name: cst.Name
    scope: Scope
    reader: Unit | Region | None


@dataclass(eq=False)
class Unit:
    """A function of the module (a `def` or a lambda) whose body the pass can follow."""

    node: cst.FunctionDef | cst.Lambda
    parent: Unit | Region | None
    callbacks: list[cst.Call] = field(default_factory=list)
    opaque: list[cst.CSTNode] = field(default_factory=list)
    reads: list[Read] = field(default_factory=list)
    lambdas: list[Unit] = field(default_factory=list)
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
    unit: Unit | None
    splat: bool = False
    reads: list[Read] = field(default_factory=list)
    lambdas: list[Unit] = field(default_factory=list)
    body_def: Unit | None = None
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
        self.units: list[Unit] = []
        self.regions: list[Region] = []
        self.defs: dict[tuple[int, str], Unit] = {}  # by (id of the scope it is bound in, name)
        self.lambda_units: dict[int, Unit] = {}
        self.reads: dict[str, list[Read]] = {}
        self.jit_args: list[Read] = []
        self.jit_nodes: set[int] = set()
        self._readers: list[Unit | Region | None] = [None]
        self._called: set[int] = set()
        self._statements: list[cst.CSTNode] = [module]
        self.statement_of: dict[int, cst.CSTNode] = {}

    @property
    def reader(self) -> Unit | Region | None:
        return self._readers[-1]

    @property
    def unit(self) -> Unit | None:
        for reader in reversed(self._readers):
            if isinstance(reader, Unit):
                return reader
        return None

    def qualname(self, node: cst.BaseExpression) -> str | None:
        return self.resolver.qualified_name(node)

    # Units ---------------------------------------------------------------------------------
    def _read_in(self, unit: Unit, body: cst.CSTNode) -> None:
        self._readers.append(unit)
        walk(self, body)
        self._readers.pop()

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        for deco in node.decorators:
            walk(self, deco)
        walk(self, node.params)
        unit = Unit(node, self.reader)
        self.units.append(unit)
        self.defs[(id(self.resolver.scope_of(node.name)), node.name.value)] = unit
        unit.region, unit.jitted = self._decorations(node, unit)
        self._read_in(unit, node.body)
        return False

    def visit_Lambda(self, node: cst.Lambda) -> bool:
        walk(self, node.params)
        unit = Unit(node, self.reader)
        self.units.append(unit)
        self.lambda_units[id(node)] = unit
        if isinstance(self.reader, (Unit, Region)):
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

    def _decorations(self, node: cst.FunctionDef, unit: Unit) -> tuple[Region | None, bool]:
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
        if (qualname in CALLBACKS or qualname in DEBUG) and isinstance(self.reader, Unit):
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
        if isinstance(self.reader, (Unit, Region)):
            self.reader.reads.append(read)
        self._opaque(node)

    def _opaque(self, node: cst.Name | cst.Attribute) -> None:
        if id(node) in self._called or not isinstance(self.reader, Unit):
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
        if isinstance(self.reader, Unit) and isinstance(node.evaluated_value, str):
            self.reader.strings.add(node.evaluated_value)

    # Resolving -----------------------------------------------------------------------------
    def lookup(self, name: str, scope: Scope) -> Unit | Region | None:
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

    def resolve_value(self, value: cst.BaseExpression, scope: Scope) -> Unit | Region | None:
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


# Reaching callbacks from a region ---------------------------------------------------------------
@dataclass
class Reach:
    """The units a region's body reaches, with the manual axes each runs under."""

    manual: dict[int, frozenset[str] | None] = field(default_factory=dict)
    units: list[Unit] = field(default_factory=list)
    conflict: Unit | None = None
    nested: bool = False


@dataclass(frozen=True)
class CallbackSite:
    """One callback reached from a region, and the mesh axes that are automatic around it."""

    call: cst.Call
    unit: Unit
    kind: str
    auto: tuple[cst.SimpleString, ...]


class PartialAutoCallback(Pass):
    """Make host callbacks run inside shard_maps that leave some mesh axes automatic."""

    NAME: ClassVar[str] = "partial-auto-callback"
    CODE: ClassVar[str] = "JM203"
    SAFETY: ClassVar[Safety] = Safety.UNSAFE
    MIN_JAX: ClassVar[tuple[int, int]] = (0, 7)
    REFERENCE: ClassVar[str | None] = "widened-shard-map"
    QUALNAMES: ClassVar[tuple[str, ...]] = (SHARD_MAP, PURE, IO, *sorted(DEBUG))
    TRIGGER: ClassVar[re.Pattern[str]] = re.compile(
        r"\b(?:pure_callback|io_callback|debug|host_callback)\b"  # JM106 makes io_callbacks
    )

    @classmethod
    def applies_to(cls, source: str) -> bool:
        """A callback and a shard_map in the same file: the body is followed within it."""
        return "shard_map" in source and cls.TRIGGER.search(source) is not None

    @classmethod
    def may_apply_to(cls, facts: AstFacts) -> bool:
        """Both a shard_map and a callback; earlier passes turn the experimental shard_map
        into `jax.shard_map` (JM102) and host_callback calls into `io_callback` (JM106)."""
        return facts.mentions((SHARD_MAP, EXPERIMENTAL_SHARD_MAP)) and facts.mentions(
            (PURE, IO, *DEBUG, HOST_CALLBACK)
        )

    def __init__(self, context: CodemodContext) -> None:
        super().__init__(context)
        self.edits: dict[int, Edit] = {}
        self.survey: Survey | None = None

    def has_candidates(self, tree: cst.Module, names: ScopeModel) -> bool:
        for wanted in ((SHARD_MAP,), (PURE, IO, *DEBUG)):
            paths = names.paths_to(wanted)
            if paths is not None and not paths:
                return False
        return True

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        self.survey = Survey(tree, self.resolver)
        walk(self.survey, tree)
        covered: set[int] = set()
        for region in self.survey.regions:
            for unit in self._reach(region, [], None).units:
                covered.update(id(r) for r in unit.regions)
        for region in self.survey.regions:
            if id(region) not in covered:
                self._plan(region)
        return tree.visit(self) if self.edits else tree

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        edit = self.edits.get(id(original_node))
        return updated_node if edit is None else edit(updated_node)

    # Planning one region -------------------------------------------------------------------
    def _plan(self, region: Region) -> None:
        if not region.has_body:
            return
        try:
            axes, manual = self._axes(region)
        except Skip as why:
            if self._reach_any_callback(region):
                self.skip(region.call, str(why))
            return
        if manual is None or len(manual) == len(axes):
            return
        if not self._entries(region):
            self.skip(
                region.call,
                "the shard_map's body is not a function of this file the pass can follow (a "
                "parameter, an attribute, a method, an import): its callbacks cannot be seen",
            )
            return
        reach = self._reach(region, axes, manual)
        sites = self._sites(reach, axes)
        if not sites and not any(u.opaque for u in reach.units):
            return
        try:
            plan, message = self._choose(region, reach, sites, axes, manual)
        except Skip as why:
            self.skip(region.call, str(why))
            return
        if self.site(region.call, message):
            self.edits.update(plan)

    def _axes(self, region: Region) -> tuple[list[cst.SimpleString], frozenset[str] | None]:
        """Return the mesh's axis names and the manual ones (None: every axis)."""
        if region.splat:
            raise Skip("`**kwargs` passed to `jax.shard_map`: its mesh and axes are not known")
        names = region.keywords.get("axis_names")
        if names is None:
            return [], None
        mesh = region.keywords.get("mesh")
        if mesh is None:
            raise Skip(
                "no `mesh=`: the axes of the context mesh are not known here; pass `mesh=` or "
                "nest the callback by hand"
            )
        axes = self._mesh_axes(mesh, region.scope)
        if axes is None:
            raise Skip(
                "the mesh's axis names are not known in this file (build it with "
                "`Mesh(..., (...))` or `jax.make_mesh` and pass that name as `mesh=`)"
            )
        values = [str(a.evaluated_value) for a in axes]
        manual = self._manual(names, mesh, values)
        if manual is None:
            raise Skip("`axis_names=` is computed: which axes are automatic is not known")
        if not manual <= set(values):
            raise Skip(f"`axis_names=` names axes the mesh lacks: {sorted(manual - set(values))}")
        return axes, manual

    def _mesh_axes(
        self, node: cst.BaseExpression, scope: Scope, follow: bool = True
    ) -> list[cst.SimpleString] | None:
        assert self.survey is not None
        if isinstance(node, cst.Name) and follow:
            binding = self.resolver.assignment_seen_from(node.value, scope)
            if binding is None or binding.value is None:
                return None
            return self._mesh_axes(binding.value, scope, follow=False)
        if not isinstance(node, cst.Call) or self.qualname(node.func) not in MESH_MAKERS:
            return None
        return literal_axis_names(node)

    def _manual(
        self, node: cst.BaseExpression, mesh: cst.BaseExpression, axes: list[str]
    ) -> frozenset[str] | None:
        """Return the axes `axis_names=` makes manual (all of them for an empty set)."""
        if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Subtract):
            left, right = node.left, self._literal(node.right)
            if (
                isinstance(left, cst.Call)
                and self._builtin(left, ("frozenset", "set"))
                and len(left.args) == 1
                and dotted(left.args[0].value) is not None
                and dotted(left.args[0].value) == f"{dotted(mesh)}.axis_names"
                and right is not None
            ):
                return frozenset(axes) - right
            return None
        names = self._literal(node)
        return None if names is None else (names or frozenset(axes))

    def _literal(self, node: cst.BaseExpression) -> frozenset[str] | None:
        if isinstance(node, cst.Call) and self._builtin(node, ("frozenset", "set", "tuple")):
            if not node.args:
                return frozenset()
            if len(node.args) != 1 or node.args[0].keyword or node.args[0].star:
                return None
            node = node.args[0].value
        if isinstance(node, cst.SimpleString):
            return frozenset({str(node.evaluated_value)})
        if not isinstance(node, (cst.Set, cst.Tuple, cst.List)):
            return None
        strings = string_elements(node.elements)
        return None if strings is None else frozenset(str(s.evaluated_value) for s in strings)

    def _builtin(self, call: cst.Call, names: Sequence[str]) -> bool:
        assert self.survey is not None
        name = dotted(call.func)
        return name in names and not self.resolver.bound(name or "")

    # Reach ---------------------------------------------------------------------------------
    def _entries(self, region: Region) -> list[Unit]:
        """Return the units a region's body expression reaches first."""
        assert self.survey is not None
        if region.body_def is not None:
            return [region.body_def]
        found = list(region.lambdas)
        for read in region.reads:
            target = self.survey.lookup(read.name.value, read.scope)
            if isinstance(target, Unit) and target.region is None:
                found.append(target)
        return found

    def _reach_any_callback(self, region: Region) -> bool:
        reach = self._reach(region, [], None)
        calls = (c for u in reach.units for c in u.callbacks)
        return any(u.opaque for u in reach.units) or any(
            self.qualname(c.func) in CALLBACKS for c in calls
        )

    def _reach(
        self, region: Region, axes: Sequence[cst.SimpleString], manual: frozenset[str] | None
    ) -> Reach:
        assert self.survey is not None
        reach = Reach()
        todo: list[tuple[Unit, frozenset[str] | None]] = [
            (u, manual) for u in self._entries(region)
        ]
        while todo:
            unit, here = todo.pop()
            if id(unit) in reach.manual:
                if reach.manual[id(unit)] != here:
                    reach.conflict = unit
                continue
            reach.manual[id(unit)] = here
            reach.units.append(unit)
            todo += [(u, here) for u in unit.lambdas]
            for read in unit.reads:
                target = self.survey.lookup(read.name.value, read.scope)
                if isinstance(target, Unit) and target.region is None:
                    todo.append((target, here))
            for inner in unit.regions:
                reach.nested = True
                deeper = self._nested_manual(inner, axes, here)
                todo += [(u, deeper) for u in self._entries(inner)]
        return reach

    def _nested_manual(
        self, inner: Region, axes: Sequence[cst.SimpleString], outer: frozenset[str] | None
    ) -> frozenset[str] | None:
        names = [str(a.evaluated_value) for a in axes]
        if outer is None or inner.splat:
            return None
        value = inner.keywords.get("axis_names")
        if value is None:
            return frozenset(names)
        mesh = inner.keywords.get("mesh")
        extra = self._manual(value, mesh, names) if mesh is not None else self._literal(value)
        if extra is None:
            return None
        return outer | (extra or frozenset(names))

    def _sites(self, reach: Reach, axes: Sequence[cst.SimpleString]) -> list[CallbackSite]:
        sites = []
        for unit in reach.units:
            manual = reach.manual[id(unit)]
            for call in unit.callbacks:
                if manual is not None and len(manual) == len(axes):
                    continue
                kind = self.qualname(call.func) or PURE
                auto = tuple(
                    a for a in axes if manual is not None and a.evaluated_value not in manual
                )
                if kind not in DEBUG or len(auto) > 1:
                    sites.append(CallbackSite(call, unit, kind, auto))
        return sites

    def _exclusive(self, region: Region, reach: Reach) -> set[int]:
        """Return the ids of the reached units used by nothing but this region's body."""
        assert self.survey is not None
        inside = {id(u) for u in reach.units}
        readers: dict[int, list[Unit | Region | None]] = {}
        for unit in reach.units:
            if unit.region is not None or unit is region.body_def:
                readers[id(unit)] = [region]
                continue
            found: list[Unit | Region | None] = []
            if isinstance(unit.node, cst.Lambda):
                found.append(unit.parent)
            for read in self._reads_of(unit):
                found.append(read.reader)
            readers[id(unit)] = found
        regions = {id(region)} | {id(r) for u in reach.units for r in u.regions}
        changed = True
        while changed:
            changed = False
            for unit in reach.units:
                if id(unit) in inside and not all(
                    (isinstance(r, Region) and id(r) in regions)
                    or (isinstance(r, Unit) and id(r) in inside)
                    for r in readers[id(unit)]
                ):
                    inside.discard(id(unit))
                    changed = True
        return inside

    def _reads_of(self, unit: Unit) -> Iterable[Read]:
        assert self.survey is not None
        names = [unit.node.name.value] if isinstance(unit.node, cst.FunctionDef) else []
        if isinstance(unit.node, cst.Lambda):
            names = [
                n
                for n, bs in self.resolver.bound_names()
                if any(b.plain and b.value is unit.node for b in bs)
            ]
        for name in names:
            for read in self.survey.reads.get(name, []):
                if self.survey.lookup(name, read.scope) is unit:
                    yield read

    def _jitted(self, region: Region) -> bool:
        assert self.survey is not None
        if region.jitted or (region.unit is not None and region.unit.jitted):
            return True
        for read in self.survey.jit_args:
            target = self.survey.lookup(read.name.value, read.scope)
            if target is region or (target is not None and target is region.unit):
                return True
        return False

    # Choosing the rewrite ------------------------------------------------------------------
    def _choose(
        self,
        region: Region,
        reach: Reach,
        sites: list[CallbackSite],
        axes: list[cst.SimpleString],
        manual: frozenset[str],
    ) -> tuple[dict[int, Edit], str]:
        if reach.conflict is not None:
            raise Skip(f"{reach.conflict.label} is reached under different manual axes")
        for unit in reach.units:
            if unit.opaque:
                raise Skip(f"a callback is passed around as a value in {unit.label}")
        for s in sites:
            if s.kind == PURE and any(a.star for a in s.call.args):
                raise Skip(f"`{SHORT[s.kind]}` called with `*args`/`**kwargs`")
            positional = [a for a in s.call.args if a.keyword is None]
            if s.kind in CALLBACKS and len(positional) < 2:
                raise Skip(f"`{SHORT[s.kind]}` without its function and result shape")
        if any(not s.auto for s in sites):
            raise Skip("a nested shard_map's `axis_names=` is computed")
        auto = [a for a in axes if a.evaluated_value not in manual]
        where = (
            f"in a shard_map manual over {_names(a for a in axes if a.evaluated_value in manual)}"
            f" of a mesh with automatic {_names(auto)}"
        )
        exclusive = self._exclusive(region, reach)
        widen_why = self._why_not_widen(region, reach, auto)
        gated = [s for s in sites if s.kind != PURE]
        if gated:
            kind = f"`{SHORT[gated[0].kind]}`"
            if widen_why:
                raise Skip(
                    f"{kind} {where}: it cannot be nested (it would run on every automatic "
                    "device; an ordered io_callback aborts) and the shard_map cannot be widened: "
                    f"{widen_why}"
                )
            shared = [s.unit.label for s in gated if id(s.unit) not in exclusive]
            if shared:
                raise Skip(
                    f"{kind} {where}, in {shared[0]}, which is also used outside this "
                    "shard_map: gating it there would change that use"
                )
            plan = {id(s.call): self._gate(s) for s in gated}
            plan[id(region.call)] = self._widen(region)
            return plan, (
                f"{kind} {where}: the shard_map is made manual over every axis and the "
                f"callback runs on the first device along {_names(auto)} only, once per manual "
                "shard as before"
            )
        nest_why = self._why_not_nest(region, sites, exclusive)
        if not nest_why:
            plan = {id(s.call): self._nest(s) for s in sites}
            return plan, (
                f"`pure_callback` {where}: nested in a `jax.shard_map` over the automatic axes "
                "(no `mesh=`: the context mesh)"
            )
        if not widen_why:
            return {id(region.call): self._widen(region)}, (
                f"`pure_callback` {where}: the shard_map is made manual over every axis (its "
                f"specs never name {_names(auto)}; not nested: {nest_why})"
            )
        raise Skip(
            f"`pure_callback` {where}: it cannot be nested ({nest_why}) and the shard_map cannot "
            f"be widened ({widen_why})"
        )

    def _why_not_nest(self, region: Region, sites: list[CallbackSite], exclusive: set[int]) -> str:
        shared = [s.unit.label for s in sites if id(s.unit) not in exclusive]
        if shared:
            return f"{shared[0]} is also used outside this shard_map"
        if not self._jitted(region):
            return (
                "the shard_map is not seen under `jax.jit`, and a nested shard_map runs only there"
            )
        return ""

    def _why_not_widen(self, region: Region, reach: Reach, auto: list[cst.SimpleString]) -> str:
        names = {str(a.evaluated_value) for a in auto}
        for key in ("in_specs", "out_specs"):
            value = region.keywords.get(key)
            if value is None:
                return f"no `{key}=`"
            strings = self._spec_strings(value, region.scope)
            if strings is None:
                return f"`{key}=` is not a literal PartitionSpec structure"
            if strings & names:
                return f"`{key}=` names {_names(a for a in auto if a.evaluated_value in strings)}"
        if reach.nested:
            return "its body holds another shard_map"
        for unit in reach.units:
            if unit.strings & names:
                return f"{unit.label} mentions {_names(a for a in auto if a.evaluated_value in unit.strings)}"
        return ""

    def _spec_strings(
        self, node: cst.BaseExpression, scope: Scope | None, follow: bool = True
    ) -> set[str] | None:
        """Return the axis names a literal spec structure mentions; None if it is not literal."""
        assert self.survey is not None
        if isinstance(node, cst.Name):
            if node.value == "None":
                return set()
            binding = None
            if follow and scope is not None:
                binding = self.resolver.assignment_seen_from(node.value, scope)
            if binding is None or binding.value is None:
                return None
            return self._spec_strings(binding.value, scope, follow=False)
        if isinstance(node, (cst.Tuple, cst.List)):
            return self._union(e.value for e in node.elements if isinstance(e, cst.Element))
        if isinstance(node, cst.Dict):
            return self._union(e.value for e in node.elements if isinstance(e, cst.DictElement))
        if isinstance(node, cst.Call) and self.qualname(node.func) in SPEC_TYPES:
            out: set[str] = set()
            for arg in node.args:
                if arg.star or arg.keyword:
                    return None
                inner = arg.value
                parts = inner.elements if isinstance(inner, cst.Tuple) else [cst.Element(inner)]
                for part in parts:
                    v = part.value
                    if isinstance(v, cst.SimpleString):
                        out.add(str(v.evaluated_value))
                    elif not (isinstance(v, cst.Name) and v.value == "None"):
                        return None
            return out
        return None

    def _union(self, nodes: Iterable[cst.BaseExpression]) -> set[str] | None:
        out: set[str] = set()
        for node in nodes:
            found = self._spec_strings(node, None, follow=False)
            if found is None:
                return None
            out |= found
        return out

    # Emitting ------------------------------------------------------------------------------
    @staticmethod
    def _widen(region: Region) -> Edit:
        """Drop `axis_names=`: every mesh axis manual."""

        def edit(updated: cst.Call) -> cst.Call:
            args = list(updated.args)
            at = next(
                i for i, a in enumerate(args) if a.keyword and a.keyword.value == "axis_names"
            )
            dropped = args.pop(at)
            if args and at == len(args):
                args[-1] = args[-1].with_changes(comma=dropped.comma)
            return updated.with_changes(args=args)

        return edit

    def _gate(self, site: CallbackSite) -> Edit:
        """Run the callback on the first device along the automatic axes; share its result."""
        if site.kind == IO:
            if len(site.call.args) < 2 or site.call.args[1].keyword is not None:
                raise Skip("`io_callback` without a positional result shape")
            if not is_reusable(site.call.args[1].value, lambda c: self._is_shape(c) is not None):
                raise Skip("the `io_callback`'s result shapes are computed by a call")
        axes = _axescode(site.auto)

        def edit(updated: cst.Call) -> cst.BaseExpression:
            lax = self._lax()
            shapes = updated.args[1].value if site.kind == IO else cst.Name("None")
            has_result = not _is_none(shapes)
            one = self._is_shape(shapes) if isinstance(shapes, cst.Call) else None
            zeros = f"{code(jnp_ref(self, self.resolver))}.zeros" if has_result else ""
            empty = "None"
            if one:
                empty = f"{zeros}({', '.join(map(code, one))})"
            elif has_result:
                tree_map = code(self.jax_attr("tree.map"))
                empty = f"{tree_map}(lambda s: {zeros}(s.shape, s.dtype), {code(shapes)})"
            branches = [
                Item(cst.Arg(cst.parse_expression(f"{lax}.axis_index({axes}) == 0"))),
                _in_lambda(updated, []),
                Item(cst.Arg(cst.parse_expression(f"lambda: {empty}"))),
            ]
            cond = Call(cst.parse_expression(f"{lax}.cond"), branches)
            if has_result:  # the result is shared along the automatic axes
                cond_item = Item(cst.Arg(cond.flat()), cond)
                axes_item = Item(cst.Arg(cst.parse_expression(axes)))
                cond = Call(cst.parse_expression(f"{lax}.psum"), [cond_item, axes_item])
            return cond.laid_out(self.room(site.call), self.state.style)

        return edit

    def _is_shape(self, call: cst.Call) -> list[cst.BaseExpression] | None:
        """Return `[shape, dtype]` of `jax.ShapeDtypeStruct(shape, dtype)`; [] for another shape
        maker; None for any other call."""
        if self.qualname(call.func) not in SHAPE_MAKERS:
            return None
        args = [a.value for a in call.args if a.keyword is None and not a.star]
        return args if len(args) == len(call.args) == 2 else []

    def _nest(self, site: CallbackSite) -> Edit:
        """Run the callback in a shard_map over the automatic axes, its operands as parameters."""
        operands = self._operands(site)
        names = "{" + ", ".join(a.value for a in site.auto) + "}"

        def edit(updated: cst.Call) -> cst.BaseExpression:
            spec = jax_ref(
                self, self.resolver, "sharding.PartitionSpec", local="P", also=("jax.P",)
            )
            args = [
                a.with_changes(value=cst.Name(operands[i])) if i in operands else a
                for i, a in enumerate(updated.args)
            ]
            params = [cst.Param(cst.Name(name)) for name in operands.values()]
            in_specs = f"{code(spec)}()" if operands else "()"
            keywords = [
                new_item("in_specs", cst.parse_expression(in_specs)),
                new_item("out_specs", cst.Call(spec.deep_clone())),
                new_item("axis_names", cst.parse_expression(names)),
                new_item("check_vma", cst.Name("False")),
            ]
            nested = Call(
                self.jax_attr("shard_map"),
                [_in_lambda(updated.with_changes(args=args), params), *keywords],
            )
            values = [cst.Arg(updated.args[i].value) for i in operands]
            room = self.room(site.call)
            applied = code(cst.Call(cst.Name("f"), values))[1:]
            laid = nested.laid_out(replace(room, tail=room.tail + len(applied)), self.state.style)
            return cst.Call(laid, joined(values))

        return edit

    def _operands(self, site: CallbackSite) -> dict[int, str]:
        """Return the lambda parameter for each operand argument of the callback, by position:
        a name passed as an operand keeps its name, anything else gets a fresh one."""
        taken = set(self.resolver.all_names)
        skipped = OPTIONS[site.kind] | {"callback", "result_shape_dtypes"}
        operands: dict[int, str] = {}
        for i, arg in enumerate(site.call.args):
            if (arg.keyword is None and i < 2) or (arg.keyword and arg.keyword.value in skipped):
                continue
            if isinstance(arg.value, cst.Name) and arg.value.value not in operands.values():
                operands[i] = arg.value.value
            else:
                operands[i] = fresh_name(["operand", *(f"operand{k}" for k in range(1, 9))], taken)
            taken.add(operands[i])
        return operands

    def _lax(self) -> str:
        local = self.resolver.module_binding("jax.lax")
        if local is not None and not self.resolver.bound_below_module(local):
            return local
        return code(self.jax_attr("lax"))


def _in_lambda(call: cst.Call, params: list[cst.Param]) -> Item:
    """Return `lambda params: call` as an argument whose call is laid out in turn (kept as
    written when it holds a comment or unpacks arguments)."""
    head = code(cst.Lambda(cst.Parameters(params), cst.Name("x")))[:-1]
    wrap = lambda c: cst.Lambda(cst.Parameters(params), c)
    value = wrap(call)
    if comments_in(call) or any(a.star for a in call.args):
        return Item(cst.Arg(value))
    return Item(cst.Arg(value), Call.of(call), wrap=wrap, head=len(head))


def _names(axes: Iterable[cst.SimpleString]) -> str:
    return ", ".join(repr(str(a.evaluated_value)) for a in axes)


def _axescode(axes: Sequence[cst.SimpleString]) -> str:
    if len(axes) == 1:
        return axes[0].value
    return "(" + ", ".join(a.value for a in axes) + ")"


def _is_none(node: cst.BaseExpression) -> bool:
    return isinstance(node, cst.Name) and node.value == "None"
