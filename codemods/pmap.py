"""Rewrite `jax.pmap` as `jax.jit(jax.shard_map(...))`.

## Why
Since JAX 0.8.0 `jax.pmap` is a thin shim over `jit` + `shard_map` with behaviour changes of its
own (nested pmap no longer runs, negative axes are wrong, inputs committed to one device are
rejected), and the JAX team asks users to move to `jax.jit(jax.shard_map(...))` (docs:
`migrate_pmap`). The two differ in one way that silently changes numbers: pmap removes the mapped
axis before calling the function, shard_map hands it a block that keeps it (size 1), so
`x.shape[0]`, `x.sum()`, a 1-D `jnp.dot`, an untiled `all_gather` or a PRNG key mean something
else in the body.

## Before
```python
import functools

import jax


@functools.partial(jax.pmap, axis_name="batch", donate_argnums=(0,))
def train_step(params, batch):
    grads = jax.grad(loss)(params, batch)
    return params - 0.1 * jax.lax.pmean(grads, "batch")
```

## After
```python
import functools

import jax
import numpy as np
from jax.sharding import PartitionSpec as P


def shard_map_per_device(
    f, *, axis_name, in_specs, out_specs, devices=None, backend=None
):
    \"\"\"Shard-map `f` like `jax.pmap`: one call per device, on that device's slice.\"\"\"
    names = axis_name if isinstance(axis_name, tuple) else (axis_name,)
    specs = (in_specs, P(*names))  # pmap maps keyword arguments over their leading axis

    def at_mapped_axes(specs, tree, fn):  # fn(leaf, axes) on each leaf its spec maps
        def under(spec, subtree):
            axes = tuple(tuple(spec).index(n) for n in names if n in (spec or ()))
            return jax.tree.map(lambda x: fn(x, axes), subtree) if axes else subtree

        return jax.tree.map(under, specs, tree, is_leaf=lambda s: s is None)

    def per_device(args, kwargs):
        args, kwargs = at_mapped_axes(specs, (args, kwargs), jax.lax.squeeze)
        return at_mapped_axes(out_specs, f(*args, **kwargs), jax.lax.expand_dims)

    def on_devices(*args, **kwargs):  # runs when jax.jit traces: devices are found then
        sizes = []
        at_mapped_axes(
            specs, (args, kwargs), lambda x, ax: sizes.append([x.shape[a] for a in ax])
        )
        pool = jax.devices(backend) if devices is None else devices
        shape = sizes[0]  # pmap's mesh: the first devices, as many as the mapped size
        mesh = jax.sharding.Mesh(np.reshape(pool[: np.prod(shape)], shape), names)
        # check_vma=False as in pmap: True would sum the gradients of replicated values
        return jax.shard_map(
            per_device, mesh=mesh, in_specs=specs, out_specs=out_specs, check_vma=False
        )(args, kwargs)

    return on_devices


@functools.partial(jax.jit, donate_argnums=(0,))
@functools.partial(
    shard_map_per_device, axis_name="batch", in_specs=P("batch"), out_specs=P("batch")
)
def train_step(params, batch):
    grads = jax.grad(loss)(params, batch)
    return params - 0.1 * jax.lax.pmean(grads, "batch")
```

The body is left exactly as it was: `shard_map_per_device`, written once per module, gives it
pmap's per-device view (each mapped axis squeezed on entry, every output expanded back on exit,
which is what JAX 0.10.2's own pmap does), so every body keeps its meaning, and callers keep
theirs: outputs still carry the leading device axis, so `flax.jax_utils.replicate/unreplicate`,
`shard(batch)`, `out[0]` and `jax.local_device_count()` reshapes work unchanged. The mesh is
pmap's: an Auto `Mesh` of the first n devices in `jax.devices()` order, n the size of the mapped
axis, built when `jax.jit` first traces a call (never at import, so `jax.distributed.initialize()`
and `XLA_FLAGS` set in `main()` still take effect), or of `devices=` / `backend=` when given.

Forms: `jax.pmap(f, ...)` anywhere in an expression (assigned, on attributes, called inline,
`f = jax.pmap(f)`), `@jax.pmap`, `@functools.partial(jax.pmap, ...)`, with `jax` under any alias
or `pmap` imported by name, at module level or in a function. Arguments:
- `axis_name` (positional or keyword) is kept; an unnamed axis gets a name no string in the module
  uses (`"device"`); `in_axes`/`out_axes` become `in_specs`/`out_specs` of the same structure
  (`0` -> `P(name)`, `1` -> `P(None, name)`, `None` -> `P()`, tuples and dicts stay so);
- `static_broadcasted_argnums` -> `jax.jit(static_argnums=...)`, the static positions of
  `in_specs` set to `None` (passed through, not sharded); `donate_argnums` is carried to `jax.jit`
  unchanged (both count static arguments);
- `devices=` and `backend=` go to the mesh; `axis_size=` is dropped: in one process it only checks
  the mapped size, which the mesh is built from;
- keyword arguments of the call are mapped over their leading axis, as pmap maps them;
- `jax.pmap(jax.pmap(f, axis_name="j"), axis_name="i")` and two stacked pmap decorators become one
  shard_map over a 2-D mesh `("i", "j")` (nested pmap no longer runs on JAX 0.10.2).

The body is never rewritten into the "idiomatic" shard_map form (seeing a size-1 block): whether
a body is indifferent to that extra axis cannot be proven from its text in general (it calls
other functions), and the per-device form costs nothing to keep: the squeeze and expand are free
in XLA, and `jax.jit` dispatches faster than pmap did (`benchmarks/pmap_step.py`).

## Safety
unsafe. The per-device form keeps each body's meaning, but the program around it changes: `jit`
(not pmap) now places inputs, so inputs already sharded differently are resharded instead of
rejected; `out_axes=None` still returns device 0's value without proof that all devices agree
(`check_vma=False`, as pmap: with `check_vma=True` a gradient taken in the body with respect to a
replicated or closed-over value comes out summed over devices, 8x too large on 8 devices, and a
`lax.scan` whose carry starts replicated raises); the semantics are pmap's in one process: on
multi-process platforms the function now takes global arrays, not per-host ones.

## Skips
- `in_axes`/`out_axes` that are computed, negative (they need the rank), booleans, a top-level
  list or dict (pmap rejects those), or unpack with `*`/`**`.
- `static_broadcasted_argnums` that is computed, or with one `in_axes` for all arguments when the
  function's arity is not visible (a lambda, `partial`, an attribute, `*args`, defaults).
- `axis_name` that is computed (a call or subscript: it would be evaluated twice) or a tuple.
- Calls with `*args`/`**kwargs`, unknown keywords, more positional arguments than pmap takes, or
  `fun=` by keyword; `functools.partial(jax.pmap, ...)` kept as a value and `jax.pmap` passed
  around as a value (its calls are not visible).
- `functools.partial(jax.pmap, ...)` binding positional arguments (they would fill `fun`).
- Nested pmap that is not visible in one expression or one def (a pmapped function whose body
  pmaps again, `jax.pmap(g)` of a `g` pmapped in another statement), whose levels take other
  arguments than `axis_name` (and `donate_argnums` outside), or that is three levels deep; pmap
  decorators that are not adjacent.
- Every site of a module where `shard_map_per_device` already names something else.

## Verification
The fixtures run each original (or, for nested pmap, the nested-`vmap` oracle) and its rewrite in
separate processes on an 8-device CPU mesh and compare outputs: rank-sensitive bodies, PRNG keys,
`out_axes=None`, static arguments, 4 of 8 devices, kwargs, nested pmap and `pure_callback` in the
body, and `check_vma` traps (a gradient of a closed-over value, a `lax.scan` with a replicated
initial carry). `jaxmigrate run` verifies each site the same way on the user's own inputs.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import ClassVar

import libcst as cst
from libcst.codemod import CodemodContext

from jaxmigrate.emit import (
    Call,
    Item,
    code,
    fit_lines,
    fresh_name,
    is_plain_reusable,
    is_read,
    items_of,
    new_item,
)
from jaxmigrate.model import Safety
from jaxmigrate.names import Names, dotted, walk
from jaxmigrate.passes import Pass
from jaxmigrate.specs import (
    Untranslatable,
    argnums,
    partition_spec,
    spec_tree,
    tuple_of,
    with_statics,
)

PMAP = "jax.pmap"
PARTIAL = "functools.partial"
PARTITION_SPEC = "jax.sharding.PartitionSpec"
HELPER = "shard_map_per_device"
HELPER_DOC = "Shard-map `f` like `jax.pmap`: one call per device, on that device's slice."
KEYWORDS = frozenset(
    {"in_axes", "out_axes", "static_broadcasted_argnums", "donate_argnums"}
    | {"devices", "backend", "axis_size"}
)
UNNAMED = "device"  # the name of an unnamed mapped axis, unless the module uses it
STATIC_MIN_JAX = (0, 8)  # `in_specs` entries `None` (static arguments): JAX 0.7.1
MESSAGE = "`jax.pmap` -> `jax.jit` of `shard_map_per_device`, the body keeping its per-device view"

# Written one statement per line, 4-space indented: `emit.fit_lines` breaks the lines too long
# for the file's width, after the indentation is the file's own.
HELPER_SOURCE = '''\
def shard_map_per_device(f, *, axis_name, in_specs, out_specs, devices=None, backend=None):
    """{doc}"""
    names = axis_name if isinstance(axis_name, tuple) else (axis_name,)
    specs = (in_specs, {P}(*names))  # pmap maps keyword arguments over their leading axis

    def at_mapped_axes(specs, tree, fn):  # fn(leaf, axes) on each leaf its spec maps
        def under(spec, subtree):
            axes = tuple(tuple(spec).index(n) for n in names if n in (spec or ()))
            return {jax}.tree.map(lambda x: fn(x, axes), subtree) if axes else subtree

        return {jax}.tree.map(under, specs, tree, is_leaf=lambda s: s is None)

    def per_device(args, kwargs):
        args, kwargs = at_mapped_axes(specs, (args, kwargs), {jax}.lax.squeeze)
        return at_mapped_axes(out_specs, f(*args, **kwargs), {jax}.lax.expand_dims)

    def on_devices(*args, **kwargs):  # runs when jax.jit traces: devices are found then
        sizes = []
        at_mapped_axes(specs, (args, kwargs), lambda x, ax: sizes.append([x.shape[a] for a in ax]))
        pool = {jax}.devices(backend) if devices is None else devices
        shape = sizes[0]  # pmap's mesh: the first devices, as many as the mapped size
        mesh = {jax}.sharding.Mesh({np}.reshape(pool[: {np}.prod(shape)], shape), names)
        # check_vma=False as in pmap: True would sum the gradients of replicated values
        return {jax}.shard_map(per_device, mesh=mesh, in_specs=specs, out_specs=out_specs, check_vma=False)(args, kwargs)

    return on_devices
'''


class Skip(Exception):
    """A pmap site this pass leaves alone; the message is the reason."""


# Reading one pmap -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Pmapped:
    """Which argument of one `jax.pmap(...)` (or `partial(jax.pmap, ...)`) is which: indices."""

    fun: int | None
    axis_name: int | None
    options: dict[str, int]


def read_pmap(args: Sequence[cst.Arg], *, has_fun: bool) -> Pmapped:
    """Return which of `args` is which pmap parameter; raise Skip for a call not understood."""
    positional = ("fun", "axis_name") if has_fun else ()
    found: dict[str, int] = {}
    for i, arg in enumerate(args):
        if arg.star:
            raise Skip(f"`{arg.star}` unpacking: which parameters it fills is not known")
        if arg.keyword is None and i >= len(positional):
            raise Skip("more positional arguments than `jax.pmap` takes")
        name = positional[i] if arg.keyword is None else arg.keyword.value
        if name == "fun" and arg.keyword is not None:
            raise Skip("`fun=` passed by keyword")
        if name not in {*positional, "axis_name", *KEYWORDS} or name in found:
            raise Skip(f"unexpected argument `{name}`: the call fails today")
        found[name] = i
    if has_fun and "fun" not in found:
        raise Skip("no function to map")
    return Pmapped(found.pop("fun", None), found.pop("axis_name", None), found)


# Finding every pmap ---------------------------------------------------------------------------
def _bound_names(target: cst.CSTNode) -> set[str]:
    if isinstance(target, cst.Name):
        return {target.value}
    if isinstance(target, (cst.Tuple, cst.List)):
        return {n for e in target.elements for n in _bound_names(e.value)}
    if isinstance(target, cst.StarredElement):
        return _bound_names(target.value)
    return set()


TARGETED = (cst.AssignTarget, cst.AnnAssign, cst.AugAssign, cst.For, cst.CompFor, cst.NamedExpr)


SCOPES = (cst.FunctionDef, cst.Lambda, cst.ClassDef)


class Survey(cst.CSTVisitor):
    """One walk over a module: each `jax.pmap` reference with its ancestors, and context."""

    def __init__(self, names: Names) -> None:
        super().__init__()
        self.names = names
        self.refs: list[tuple[cst.BaseExpression, tuple[cst.CSTNode, ...]]] = []
        self.defs: dict[str, list[cst.FunctionDef]] = {}
        self.rebound: set[str] = set()  # names bound by anything but a `def`
        self.strings: set[str] = set()
        self.local: set[str] = set()  # names bound in a function or class (may shadow)
        self._stack: list[cst.CSTNode] = []
        self._paths = names.paths_to((PMAP,))  # the nodes leading to a use, when known

    def on_visit(self, node: cst.CSTNode) -> bool:
        # Exact types, not isinstance: libcst's node classes are concrete and never subclassed,
        # and isinstance against them (ABCs) is what this walk over every node spent most on.
        kind = type(node)
        if kind is cst.Attribute or kind is cst.Name:
            parent = self._stack[-1] if self._stack else None
            is_ref = kind is cst.Attribute or is_read(node, parent)  # type: ignore[arg-type]
            if self._paths is not None and id(node) not in self._paths:
                is_ref = False
            if is_ref and self.names.qualified_name(node) == PMAP:  # type: ignore[arg-type]
                self.refs.append((node, tuple(self._stack)))  # type: ignore[arg-type]
        elif kind in _NOTED:
            self._note(node)
        self._stack.append(node)
        return True

    def on_leave(self, original_node: cst.CSTNode) -> None:
        self._stack.pop()

    def _note(self, node: cst.CSTNode) -> None:
        bound: set[str] = set()
        if isinstance(node, cst.FunctionDef):
            self.defs.setdefault(node.name.value, []).append(node)
        elif isinstance(node, cst.SimpleString):
            self.strings.add(str(node.evaluated_value))
        elif isinstance(node, (cst.Param, cst.ClassDef)):
            bound = {node.name.value}
        elif isinstance(node, cst.ImportAlias):
            bound = {str(node.evaluated_alias or node.evaluated_name).split(".")[0]}
        elif isinstance(node, cst.AsName):
            bound = _bound_names(node.name)
        elif isinstance(node, TARGETED):
            bound = _bound_names(node.target)
        self.rebound |= bound
        if bound and any(isinstance(n, SCOPES) for n in self._stack):
            self.local |= bound


# The node types `Survey._note` records something for.
_NOTED = frozenset(
    {
        cst.FunctionDef,
        cst.SimpleString,
        cst.Param,
        cst.ClassDef,
        cst.ImportAlias,
        cst.AsName,
        *TARGETED,
    }
)


@dataclass
class Site:
    """One pmap site: where it is reported, its pmaps (outer first) and what it maps."""

    node: cst.CSTNode  # the pmap call or decorator, or the reference left alone
    pmaps: list[cst.Call | cst.Decorator]
    ref: cst.BaseExpression
    ancestors: tuple[cst.CSTNode, ...]
    mapped: cst.CSTNode | None = None  # the def or lambda it maps, when visible
    skip: str = ""

    @property
    def statement(self) -> cst.CSTNode:
        """Return the top-level statement holding the site."""
        return self.ancestors[1] if len(self.ancestors) > 1 else self.node

    @property
    def scope(self) -> int | None:
        """Return (the id of) the function its result is bound in; None for the module."""
        for node in reversed(self.ancestors):
            if isinstance(node, (cst.FunctionDef, cst.Lambda)) and node is not self.mapped:
                return id(node)
        return None


@dataclass
class Plan:
    """What one site becomes: the helper's arguments and `jax.jit`'s, with notes for the report."""

    fun: Item | None
    helper: list[Item]
    jit: list[Item] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    min_jax: tuple[int, int] | None = None

    @property
    def message(self) -> str:
        """Return the site's message."""
        return "; ".join([MESSAGE, *self.notes])


Layers = list[tuple[Pmapped, list[Item]]]


def arity(node: cst.CSTNode | None) -> int | None:
    """Return how many positional arguments a visible def takes, when that number is fixed."""
    if not isinstance(node, cst.FunctionDef) or isinstance(node.params.star_arg, cst.Param):
        return None
    positional = (*node.params.posonly_params, *node.params.params)
    return None if any(p.default is not None for p in positional) else len(positional)


def _fun_arg(call: cst.Call) -> cst.Arg | None:
    first = call.args[0] if call.args else None
    return first if first is not None and first.keyword is None and not first.star else None


def _with_blank_lines(
    statement: cst.SimpleStatementLine | cst.BaseCompoundStatement,
) -> cst.SimpleStatementLine | cst.BaseCompoundStatement:
    """Return `statement` with at least two blank lines above it."""
    leading = list(statement.leading_lines)
    blank = next((i for i, line in enumerate(leading) if line.comment), len(leading))
    missing = [cst.EmptyLine()] * max(0, 2 - blank)
    return statement.with_changes(leading_lines=missing + leading)


class Pmap(Pass):
    """Rewrite `jax.pmap` as `jax.jit(jax.shard_map(...))`."""

    NAME: ClassVar[str] = "pmap"
    CODE: ClassVar[str] = "JM202"
    SAFETY: ClassVar[Safety] = Safety.UNSAFE
    MIN_JAX: ClassVar[tuple[int, int]] = (0, 7)  # `jax.shard_map` is public from JAX 0.6.1
    LITERALS: ClassVar[tuple[str, ...]] = ("pmap",)
    TRIGGER: ClassVar[re.Pattern[str]] = re.compile(r"\bpmap\b")
    QUALNAMES: ClassVar[tuple[str, ...]] = (PMAP,)

    def __init__(self, context: CodemodContext) -> None:
        super().__init__(context)
        self.survey: Survey | None = None
        self.sites: dict[int, Site] = {}  # by id of the (outer) pmap call or decorator
        self.lower: set[int] = set()  # the inner one of two stacked pmap decorators
        self.applied: list[Site] = []
        self.reuse_helper = False

    def has_candidates(self, tree: cst.Module, names: Names) -> bool:
        return "pmap" in names.all_names

    # Finding ------------------------------------------------------------------------------
    def visit_Module(self, node: cst.Module) -> None:
        self.survey = Survey(self.resolver)
        walk(self.survey, node)
        found = [self._classify(ref, ancestors) for ref, ancestors in self.survey.refs]
        sites = self._stack_decorators([s for s in found if s is not None])
        self._mark_nested(sites)
        self._check_helper_name(node, sites)
        for site in sites:
            if site.skip:
                self.skip(site.node, site.skip)
            else:
                self.sites[id(site.node)] = site

    def _classify(self, ref: cst.BaseExpression, ancestors: tuple[cst.CSTNode, ...]) -> Site | None:
        """Return the site a reference to `jax.pmap` belongs to; None if another covers it."""
        parent = ancestors[-1]
        if isinstance(parent, cst.Call) and parent.func is ref:
            return None if self._is_inner(ancestors) else self._call_site(parent, ref, ancestors)
        if isinstance(parent, cst.Decorator):
            return Site(parent, [parent], ref, ancestors, mapped=ancestors[-2])
        if isinstance(parent, cst.Arg) and self._is_partial(ancestors[-2], parent):
            if isinstance(ancestors[-3], cst.Decorator):
                return Site(ancestors[-3], [ancestors[-3]], ref, ancestors, mapped=ancestors[-4])
            why = "`functools.partial(jax.pmap, ...)` kept as a value: its calls are not visible"
            return Site(ref, [], ref, ancestors, skip=why)
        if isinstance(parent, cst.Assign) and parent.value is ref:
            return None  # an alias: the calls through it are sites of their own
        why = "`jax.pmap` passed around as a value: the calls made with it are not visible"
        return Site(ref, [], ref, ancestors, skip=why)

    def _is_partial(self, node: cst.CSTNode, first: cst.Arg) -> bool:
        return (
            isinstance(node, cst.Call)
            and node.args[0] is first
            and first.keyword is None
            and self.qualname(node.func) == PARTIAL
        )

    def _is_inner(self, ancestors: tuple[cst.CSTNode, ...]) -> bool:
        """Return True for the `jax.pmap(g)` of `jax.pmap(jax.pmap(g))`: the outer one has it."""
        outer = ancestors[-3] if len(ancestors) > 2 else None
        return (
            isinstance(outer, cst.Call)
            and _fun_arg(outer) is ancestors[-2]
            and self.qualname(outer.func) == PMAP
        )

    def _call_site(
        self, call: cst.Call, ref: cst.BaseExpression, ancestors: tuple[cst.CSTNode, ...]
    ) -> Site:
        pmaps: list[cst.Call | cst.Decorator] = [call]
        fun = _fun_arg(call)
        while fun is not None and isinstance(fun.value, cst.Call):
            if self.qualname(fun.value.func) != PMAP:
                break
            pmaps.append(fun.value)
            fun = _fun_arg(fun.value)
        site = Site(call, pmaps, ref, ancestors, self._visible(fun))
        if len(pmaps) > 2:
            site.skip = "three or more levels of nested pmap"
        return site

    def _visible(self, fun: cst.Arg | None) -> cst.CSTNode | None:
        """Return the lambda, or the one def of this module, that `fun` is."""
        assert self.survey is not None
        if fun is not None and isinstance(fun.value, cst.Lambda):
            return fun.value
        if fun is None or not isinstance(fun.value, cst.Name):
            return None
        name = fun.value.value
        defs = self.survey.defs.get(name, [])
        return defs[0] if len(defs) == 1 and name not in self.survey.rebound else None

    def _stack_decorators(self, sites: list[Site]) -> list[Site]:
        """Merge two stacked pmap decorators of one def into one site, a nested pmap."""
        by_def: dict[int, list[Site]] = {}
        for site in sites:
            if isinstance(site.node, cst.Decorator) and isinstance(site.mapped, cst.FunctionDef):
                by_def.setdefault(id(site.mapped), []).append(site)
        for group in (g for g in by_def.values() if len(g) > 1):
            upper, lower = group[0], group[-1]
            assert isinstance(upper.mapped, cst.FunctionDef)
            decorators: list[cst.CSTNode] = list(upper.mapped.decorators)
            if len(group) > 2 or decorators.index(lower.node) != decorators.index(upper.node) + 1:
                for site in group:
                    site.skip = "more than two pmap decorators, or not adjacent ones"
                continue
            upper.pmaps.append(lower.node)  # type: ignore[arg-type]
            self.lower.add(id(lower.node))
            sites.remove(lower)
        return sites

    def _mark_nested(self, sites: list[Site]) -> None:
        """Skip pmaps nested across functions or statements: one mesh needs both in view."""
        mapping: dict[int, list[Site]] = {}
        producing: dict[str, list[Site]] = {}
        for site in sites:
            if site.mapped is not None:
                mapping.setdefault(id(site.mapped), []).append(site)
            name = self._bound_to(site)
            if name is not None:
                producing.setdefault(name, []).append(site)
        why = (
            "nested pmap in two statements: only nesting within one expression or def is rewritten"
        )
        for site in sites:
            outer = [s for a in site.ancestors for s in mapping.get(id(a), [])]
            innermost = site.pmaps[-1] if site.pmaps else None
            fun = _fun_arg(innermost) if isinstance(innermost, cst.Call) else None
            if fun is not None and isinstance(fun.value, cst.Name):
                scopes = {None, *(id(a) for a in site.ancestors)}
                made = producing.get(fun.value.value, [])
                outer += [s for s in made if s.scope in scopes]
            for other in (s for s in outer if s is not site):
                other.skip, site.skip = other.skip or why, site.skip or why

    def _bound_to(self, site: Site) -> str | None:
        """Return the name a site's result is bound to (`f = jax.pmap(g)`, `@jax.pmap def f`)."""
        if isinstance(site.node, cst.Decorator) and isinstance(site.mapped, cst.FunctionDef):
            return site.mapped.name.value
        parent = site.ancestors[-2] if len(site.ancestors) > 1 else None  # [-1] is the call
        if isinstance(parent, cst.Assign) and len(parent.targets) == 1:
            target = parent.targets[0].target
            return target.value if isinstance(target, cst.Name) else None
        return None

    def _check_helper_name(self, module: cst.Module, sites: list[Site]) -> None:
        """Reuse the helper of an earlier run; skip everything if the name means another thing."""
        assert self.survey is not None
        defs = self.survey.defs.get(HELPER, [])
        ours = [d for d in defs if d in module.body and _docstring(d) == HELPER_DOC]
        self.reuse_helper = len(defs) == len(ours) == 1 and HELPER not in self.survey.rebound
        if (defs or HELPER in self.survey.rebound) and not self.reuse_helper:
            for site in sites:
                site.skip = site.skip or f"the name `{HELPER}` is already used in this module"

    # Planning -----------------------------------------------------------------------------
    def _layers(self, site: Site, updated: Sequence[cst.CSTNode]) -> Layers:
        """Return each pmap of a site (outer first), read, with its arguments as updated."""
        layers: Layers = []
        for original, new in zip(site.pmaps, updated):
            if isinstance(original, cst.Call) and isinstance(new, cst.Call):
                layers.append((read_pmap(original.args, has_fun=True), items_of(new)))
            elif isinstance(original, cst.Decorator) and isinstance(original.decorator, cst.Call):
                assert isinstance(new, cst.Decorator) and isinstance(new.decorator, cst.Call)
                pmapped = read_pmap(original.decorator.args[1:], has_fun=False)
                layers.append((pmapped, items_of(new.decorator)[1:]))
            else:
                layers.append((Pmapped(None, None, {}), []))
        return layers

    def _plan(self, site: Site, layers: Layers) -> Plan:
        """Return what the site becomes; raise Skip for what is not translated."""
        (outer, items), notes = layers[0], list[str]()
        names = self._axis_names(layers, notes)
        if len(layers) > 1:
            self._check_nested(layers)
        spec = self._spec_ref()[0]

        def make(axis: int | None) -> cst.BaseExpression:
            return partition_spec(spec, names, axis)

        in_specs = self._specs(outer, items, "in_axes", make)
        out_specs = self._specs(outer, items, "out_axes", make)
        statics = self._statics(outer, items)
        if statics:
            in_specs = with_statics(in_specs, statics, arity(site.mapped))
        innermost, innermost_items = layers[-1]
        fun = innermost_items[innermost.fun] if innermost.fun is not None else None
        name = names[0] if len(names) == 1 else tuple_of(names)
        axis = items[outer.axis_name] if outer.axis_name is not None else Item(cst.Arg(name))
        helper = [
            axis.keyword("axis_name", name),
            self._spec_item(outer, items, "in_axes", "in_specs", in_specs),
            self._spec_item(outer, items, "out_axes", "out_specs", out_specs),
        ]
        plan = Plan(fun, helper, notes=notes, min_jax=STATIC_MIN_JAX if statics else None)
        for keyword, i in outer.options.items():
            if keyword in ("devices", "backend"):
                plan.helper.append(items[i])
            elif keyword == "donate_argnums" or (keyword.startswith("static_") and statics):
                plan.jit.append(items[i].keyword(keyword.replace("_broadcasted", "")))
            elif keyword == "axis_size":
                notes.append("`axis_size=` dropped: in one process it only checks the mapped size")
        return plan

    def _axis_names(self, layers: Layers, notes: list[str]) -> list[cst.BaseExpression]:
        """Return the axis name of each pmap, naming the unnamed ones."""
        assert self.survey is not None
        names: list[cst.BaseExpression] = []
        taken = set(self.survey.strings)
        for pmapped, items in layers:
            value = items[pmapped.axis_name].arg.value if pmapped.axis_name is not None else None
            if value is None or (isinstance(value, cst.Name) and value.value == "None"):
                candidates = (UNNAMED, *(f"{UNNAMED}_{k}" for k in range(1, len(taken) + 2)))
                fresh = fresh_name(candidates, taken)
                taken.add(fresh)
                notes.append(f'the unnamed mapped axis is called "{fresh}"')
                value = self.state.style.string(fresh)
            elif isinstance(value, cst.Tuple):
                raise Skip("a tuple `axis_name`: shard_map would read it as several mesh axes")
            elif not is_plain_reusable(value):
                raise Skip("a computed `axis_name`: the rewrite would evaluate it twice")
            names.append(value)
        return names

    def _check_nested(self, layers: Layers) -> None:
        for depth, (pmapped, items) in enumerate(layers):
            allowed = {"in_axes", "out_axes", *(("donate_argnums",) if depth == 0 else ())}
            extra = sorted(set(pmapped.options) - allowed)
            if extra:
                raise Skip(f"nested pmap with `{extra[0]}=`: only axis names are translated")
            for keyword in ("in_axes", "out_axes"):
                value = (
                    items[pmapped.options[keyword]].arg.value
                    if keyword in pmapped.options
                    else None
                )
                if value is not None and not (
                    isinstance(value, cst.Integer) and value.value == "0"
                ):
                    raise Skip(f"nested pmap with `{keyword}=` other than 0")

    def _specs(
        self,
        pmapped: Pmapped,
        items: list[Item],
        keyword: str,
        make: Callable[[int | None], cst.BaseExpression],
    ) -> cst.BaseExpression:
        """Return the specs for `in_axes`/`out_axes` (0, pmap's default, when not given)."""
        if keyword not in pmapped.options:
            return make(0)
        value = items[pmapped.options[keyword]].arg.value
        if keyword == "in_axes" and isinstance(value, (cst.List, cst.Dict)):
            raise Skip("a list or dict as `in_axes`: pmap rejects it (it wants a tuple)")
        try:
            return spec_tree(value, make)
        except Untranslatable as why:
            raise Skip(f"`{keyword}`: {why}") from None

    def _spec_item(
        self, pmapped: Pmapped, items: list[Item], old: str, new: str, value: cst.BaseExpression
    ) -> Item:
        if old in pmapped.options:
            return items[pmapped.options[old]].keyword(new, value)
        return new_item(new, value)

    def _statics(self, pmapped: Pmapped, items: list[Item]) -> tuple[int, ...]:
        if "static_broadcasted_argnums" not in pmapped.options:
            return ()
        try:
            return argnums(items[pmapped.options["static_broadcasted_argnums"]].arg.value)
        except Untranslatable as why:
            raise Skip(f"`static_broadcasted_argnums`: {why}") from None

    def _spec_ref(self) -> tuple[cst.BaseExpression, tuple[str, str, str | None] | None]:
        """Return how to spell `PartitionSpec` here, and the import that spelling needs."""
        assert self.survey is not None
        local = self.resolver.module_binding(PARTITION_SPEC)
        if local is not None and local not in self.survey.local:
            return cst.Name(local), None
        for name, asname in (("P", "P"), ("PartitionSpec", None)):
            if local is None and self.resolver.is_free(name):
                return cst.Name(name), ("jax.sharding", "PartitionSpec", asname)
        jax = self.resolver.module_alias("jax") or "jax"
        return cst.parse_expression(f"{jax}.sharding.PartitionSpec"), None

    # Rewriting ----------------------------------------------------------------------------
    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        site = self.sites.get(id(original_node))
        if site is None:
            return updated_node
        calls = [updated_node]
        while len(calls) < len(site.pmaps):
            fun = _fun_arg(calls[-1])
            assert fun is not None and isinstance(fun.value, cst.Call)
            calls.append(fun.value)
        plan = self._planned(site, calls)
        if plan is None:
            return updated_node
        helper = Call(cst.Name(HELPER), [i for i in (plan.fun,) if i is not None] + plan.helper)
        jit = Call(self.jax_attr("jit"), [Item(cst.Arg(helper.func), helper), *plan.jit])
        jit = replace(jit, opening=Call.of(updated_node).opening)
        laid = jit.laid_out(self.room(original_node), self.state.style)
        return laid.with_changes(lpar=updated_node.lpar, rpar=updated_node.rpar)

    def leave_FunctionDef(
        self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef
    ) -> cst.FunctionDef:
        decorators: list[cst.Decorator] = []
        pending = list(zip(original_node.decorators, updated_node.decorators))
        while pending:
            original, new = pending.pop(0)
            site = self.sites.get(id(original))
            stacked = [new, *(n for _, n in pending[: len(site.pmaps) - 1])] if site else []
            plan = self._planned(site, stacked) if site is not None else None
            if site is None or plan is None:
                decorators.append(new)
                continue
            del pending[: len(site.pmaps) - 1]
            decorators += self._decorators(site, plan, new)
        return updated_node.with_changes(decorators=decorators)

    def _planned(self, site: Site, updated: Sequence[cst.CSTNode]) -> Plan | None:
        """Return the plan of a site to rewrite now, once recorded; None to leave it."""
        try:
            plan = self._plan(site, self._layers(site, updated))
        except (Skip, Untranslatable) as why:
            self.skip(site.node, str(why))
            return None
        if not self.site(site.node, plan.message, min_jax=plan.min_jax):
            return None
        self.applied.append(site)
        spec_import = self._spec_ref()[1]
        if spec_import is not None and len(self.applied) == 1:
            self.need_import(*spec_import)
        if isinstance(site.ref, cst.Name):
            self.drop_import_if_unused(site.ref.value)
        return plan

    def _decorators(self, site: Site, plan: Plan, new: cst.Decorator) -> list[cst.Decorator]:
        """Return `@jax.jit` (with its arguments) and `@partial(shard_map_per_device, ...)`."""
        partial = self._partial(site)
        room, style = self.room(site.node), self.state.style
        room = replace(room, column=room.column + 1, tail=0)  # after the `@`
        jit: cst.BaseExpression = self.jax_attr("jit")
        if plan.jit:
            jit = Call(partial, [Item(cst.Arg(jit)), *plan.jit]).laid_out(room, style)
        helper = Call(partial.deep_clone(), [Item(cst.Arg(cst.Name(HELPER))), *plan.helper])
        return [
            new.with_changes(decorator=jit),
            cst.Decorator(decorator=helper.laid_out(room, style)),
        ]

    def _partial(self, site: Site) -> cst.BaseExpression:
        """Return `functools.partial` as the site or the module spells it."""
        for deco in site.pmaps:
            if isinstance(deco, cst.Decorator) and isinstance(deco.decorator, cst.Call):
                return deco.decorator.func.deep_clone()
        local = self.resolver.module_binding(PARTIAL)
        if local is not None:
            return cst.Name(local)
        return cst.Attribute(value=self.module_ref("functools"), attr=cst.Name("partial"))

    # The helper ---------------------------------------------------------------------------
    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        if not self.applied or self.reuse_helper:
            return updated_node
        jax = dotted(self.module_ref("jax")) or "jax"
        np = self.resolver.module_alias("numpy")
        if np is None:
            np = "np" if self.resolver.is_free("np") else "numpy"
            self.need_import("numpy", None, "np" if np == "np" else None)
        source = HELPER_SOURCE.format(doc=HELPER_DOC, jax=jax, np=np, P=code(self._spec_ref()[0]))
        style = self.state.style
        source = fit_lines(style.reindent(source), style)
        helper = cst.parse_statement(source, config=updated_node.config_for_parsing)
        helper = helper.with_changes(leading_lines=[cst.EmptyLine(), cst.EmptyLine()])
        body = list(updated_node.body)
        at = self._helper_position(original_node)
        if at < len(body):
            body[at] = _with_blank_lines(body[at])
        body.insert(at, helper)
        return updated_node.with_changes(body=body)

    def _helper_position(self, module: cst.Module) -> int:
        """Return where the helper goes: after the imports above the first rewritten site."""
        first = min(module.body.index(s.statement) for s in self.applied)  # type: ignore[arg-type]
        imports = [
            i
            for i, statement in enumerate(module.body[:first])
            if isinstance(statement, cst.SimpleStatementLine)
            and all(isinstance(s, (cst.Import, cst.ImportFrom)) for s in statement.body)
        ]
        return imports[-1] + 1 if imports else first


def _docstring(node: cst.FunctionDef) -> str | None:
    docstring = node.get_docstring()
    return None if docstring is None else " ".join(docstring.split())  # wrapped or not
