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
    f, *, axis_name, in_specs, out_specs, devices=None, backend=None, **jit_options
):
    \"\"\"Run `f` as `jax.pmap` does, in `jax.jit`: one call per device, on its slice.\"\"\"
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

    def mesh_of(args, kwargs, processes):  # pmap's: the first devices, by process
        sizes = []
        at_mapped_axes(
            specs, (args, kwargs), lambda x, ax: sizes.append([x.shape[a] for a in ax])
        )
        shape = [sizes[0][0] * processes, *sizes[0][1:]]
        pool = jax.devices(backend) if devices is None else devices
        pool = sorted(pool, key=lambda d: d.process_index)
        return jax.sharding.Mesh(np.reshape(pool[: np.prod(shape)], shape), names)

    def on_devices(*args, **kwargs):  # runs when jax.jit traces: devices are found then
        mesh = mesh_of(args, kwargs, 1)
        # check_vma=False as in pmap: True would sum the gradients of replicated values
        return jax.shard_map(
            per_device, mesh=mesh, in_specs=specs, out_specs=out_specs, check_vma=False
        )(args, kwargs)

    jitted = jax.jit(on_devices, **jit_options)

    def call(*args, **kwargs):
        processes = jax.process_count(backend)
        if processes == 1:
            return jitted(*args, **kwargs)
        # As pmap: each process passes its own devices' slices, and gets its own back.
        from jax.experimental import multihost_utils as hosts

        def to_global(spec, tree):  # Python scalars stay: jax.jit takes them as given
            def put(x):
                return hosts.host_local_array_to_global_array(x, mesh, spec)

            return jax.tree.map(lambda x: put(x) if hasattr(x, "shape") else x, tree)

        mesh = mesh_of(args, kwargs, processes)
        args, kwargs = jax.tree.map(
            lambda s, t: t if s is None else to_global(s, t),
            specs,
            (args, kwargs),
            is_leaf=lambda s: s is None,
        )
        out = jitted(*args, **kwargs)
        return hosts.global_array_to_host_local_array(out, mesh, out_specs)

    return call


@functools.partial(
    shard_map_per_device,
    axis_name="batch",
    in_specs=P("batch"),
    out_specs=P("batch"),
    donate_argnums=(0,),
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
The helper owns the `jax.jit` (`static_argnums`/`donate_argnums` are passed through to it): on a
multi-process job (`jax.distributed`), as in pmap, each process passes its own devices' slices;
they become its part of global arrays (`multihost_utils.host_local_array_to_global_array`) before
the jitted call, over a mesh of every device of the job, each process's devices together (pmap's
order), and each process gets its own part of the results back
(`global_array_to_host_local_array`). In one process the call is `jax.jit`'s and nothing else.

## Two forms: program-level (the default) and faithful
`pmap-style = "idiomatic"` (`[tool.jaxmigrate]`, `--pmap-style` on `run` and `check`; the
default) takes the **program-level** form wherever the data flow around the step is fully visible:
the step is made and called in one function, its arguments are replicated values
(`flax.jax_utils.replicate`, `jnp.broadcast_to(x, (n,) + x.shape)` or its `jax.tree.map`,
`jnp.stack([x] * n)`), splits of a flat batch (`x.reshape((n, -1) + x.shape[1:])` or its
`jax.tree.map`, `common_utils.shard`), `in_axes=None` or static arguments, or its own results fed
back; its results are read only as `r[0]`, `jax.tree.map(lambda v: v[0], r)`, `unreplicate(r)`,
`step(...)[0]` or fed back; and each result is the same on every device (a `pmean`/`psum`/`pmax`/
`pmin` result, or computed from replicated values alone, read from the body's straight-line code),
or is read only flattened over the devices (`r.reshape(-1)`, `r.reshape((-1,) + r.shape[2:])`:
per-example predictions), which gets `P(axis)` and becomes this process's part of the flat result
(`multihost_utils.global_array_to_host_local_array`; in one process, all of it).
The device axis then disappears, as in the public migrations (big_vision, AlgoPerf, flax lm1b):

```python
def main():
    n = jax.local_device_count()
    p_train_step = jax.pmap(train_step, axis_name="batch", donate_argnums=(0,))
    params = jax.tree.map(lambda x: jnp.broadcast_to(x, (n,) + x.shape), params)
    for x, y in batches:
        batch = jax.tree.map(lambda v: v.reshape((n, -1) + v.shape[1:]), {"x": x, "y": y})
        params, loss = p_train_step(params, batch)
        log(loss[0])
    params = jax.tree.map(lambda x: x[0], params)
```
becomes
```python
def main():
    n = jax.local_device_count()
    mesh = jax.sharding.Mesh(jax.devices(), ("batch",))
    batch_sharding = jax.sharding.NamedSharding(mesh, P("batch"))
    p_train_step = jax.jit(
        jax.shard_map(
            train_step,
            mesh=mesh,
            in_specs=(P(), P("batch")),
            out_specs=(P(), P()),
            check_vma=False,
        ),
        donate_argnums=(0,),
    )
    for x, y in batches:
        batch = jax.make_array_from_process_local_data(batch_sharding, {"x": x, "y": y})
        params, loss = p_train_step(params, batch)
        log(loss)
```
The mesh (every device of the job, `jax.devices()` order) is made once, where the step was made;
replicated arguments and results are `P()` and passed or read as they are (the replication and
the readbacks are deleted); a batch is `P(axis)`: its per-device block is exactly the old
per-device slice, so the body is unchanged, collectives included; on a multi-process job each
process's flat batch becomes its part of the global batch (`make_array_from_process_local_data`;
in one process, the batch itself). `in_axes=None` -> `P()`, `static_broadcasted_argnums` ->
`static_argnums` (spec `None`), `donate_argnums` kept. `check_vma=False` keeps pmap's numbers: the
body's `pmean` of per-device gradients of a `P()` parameter (with `check_vma=True` those come out
already summed over devices; cookbook rule 9). The step and every replicate/split/readback edit
are one group of sites: written together or not at all. Anything else (a step made at module
level or by a decorator, passed to other code, arguments from outside the function, a result that
differs between devices, a body with control flow) gets the faithful form below, and the site's
message says why the program-level form was not taken. `pmap-style = "faithful"` selects the
faithful form everywhere. Fixtures: `tests/fixtures/pmap/program_*.py`, each paired with a
`faithful_program_*.py` of the same program (both executed on 8 CPU devices).

Forms: `jax.pmap(f, ...)` anywhere in an expression (assigned, on attributes, called inline,
`f = jax.pmap(f)`), `@jax.pmap`, `@functools.partial(jax.pmap, ...)`, with `jax` under any alias
or `pmap` imported by name, at module level or in a function. Arguments:
- `axis_name` (positional or keyword) is kept; an unnamed axis gets a name no string in the module
  uses (`"device"`); `in_axes`/`out_axes` become `in_specs`/`out_specs` of the same structure
  (`0` -> `P(name)`, `1` -> `P(None, name)`, `None` -> `P()`, tuples and dicts stay so);
- `static_broadcasted_argnums` -> `static_argnums=` of the helper's `jax.jit`, the static
  positions of `in_specs` set to `None` (passed through, not sharded); `donate_argnums` is carried
  to `jax.jit` unchanged (both count static arguments);
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
`lax.scan` whose carry starts replicated raises). On multi-process jobs a call made while tracing
(the pmapped function called inside another `jax.jit`) is not converted to global arrays.

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
`tests/test_pmap_multihost.py` runs a pmap train step and its rewrite as a real 2-process job
(gloo collectives, 4 CPU devices per process): every process gets the numpy oracle's weights.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import ClassVar

import libcst as cst
from jaxmigrate.codemods._pmap_program import NotVisible, Program, analyze, names_in
from jaxmigrate.codemods._specs import (
    Untranslatable,
    argnums,
    partition_spec,
    spec_tree,
    tuple_of,
    with_statics,
)
from libcst.codemod import CodemodContext

from jaxmigrate.model import Safety
from jaxmigrate.toolkit.emit import (
    Call,
    Item,
    code,
    fit_lines,
    fresh_name,
    is_plain_reusable,
    items_of,
    new_item,
)
from jaxmigrate.toolkit.names import dotted, walk
from jaxmigrate.toolkit.passes import Pass
from jaxmigrate.toolkit.scope import BindingKind, ScopeModel

PMAP = "jax.pmap"
PARTIAL = "functools.partial"
PARTITION_SPEC = "jax.sharding.PartitionSpec"
HELPER = "shard_map_per_device"
HELPER_DOC = "Run `f` as `jax.pmap` does, in `jax.jit`: one call per device, on its slice."
KEYWORDS = frozenset(
    {"in_axes", "out_axes", "static_broadcasted_argnums", "donate_argnums"}
    | {"devices", "backend", "axis_size"}
)
SCOPES = (cst.FunctionDef, cst.Lambda, cst.ClassDef)  # where a step may be made and called
UNNAMED = "device"  # the name of an unnamed mapped axis, unless the module uses it
STATIC_MIN_JAX = (0, 8)  # `in_specs` entries `None` (static arguments): JAX 0.7.1
PROGRAM_MESSAGE = (
    "`jax.pmap` -> `jax.jit(jax.shard_map(...))` over the flat data (program-level): replicated "
    "arguments and results `P()`, batches `P({axis})`, the device axis gone"
)
MESSAGE = "`jax.pmap` -> `jax.jit` of `shard_map_per_device`, the body keeping its per-device view"

# Written one statement per line, 4-space indented: `emit.fit_lines` breaks the lines too long
# for the file's width, after the indentation is the file's own.
HELPER_SOURCE = '''\
def shard_map_per_device(f, *, axis_name, in_specs, out_specs, devices=None, backend=None, **jit_options):
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

    def mesh_of(args, kwargs, processes):  # pmap's: the first devices, by process
        sizes = []
        at_mapped_axes(specs, (args, kwargs), lambda x, ax: sizes.append([x.shape[a] for a in ax]))
        shape = [sizes[0][0] * processes, *sizes[0][1:]]
        pool = {jax}.devices(backend) if devices is None else devices
        pool = sorted(pool, key=lambda d: d.process_index)
        return {jax}.sharding.Mesh({np}.reshape(pool[: {np}.prod(shape)], shape), names)

    def on_devices(*args, **kwargs):  # runs when jax.jit traces: devices are found then
        mesh = mesh_of(args, kwargs, 1)
        # check_vma=False as in pmap: True would sum the gradients of replicated values
        return {jax}.shard_map(per_device, mesh=mesh, in_specs=specs, out_specs=out_specs, check_vma=False)(args, kwargs)

    jitted = {jax}.jit(on_devices, **jit_options)

    def call(*args, **kwargs):
        processes = {jax}.process_count(backend)
        if processes == 1:
            return jitted(*args, **kwargs)
        # As pmap: each process passes its own devices' slices, and gets its own back.
        from jax.experimental import multihost_utils as hosts

        def to_global(spec, tree):  # Python scalars stay: jax.jit takes them as given
            def put(x):
                return hosts.host_local_array_to_global_array(x, mesh, spec)

            return {jax}.tree.map(lambda x: put(x) if hasattr(x, "shape") else x, tree)

        mesh = mesh_of(args, kwargs, processes)
        args, kwargs = {jax}.tree.map(
            lambda s, t: t if s is None else to_global(s, t),
            specs,
            (args, kwargs),
            is_leaf=lambda s: s is None,
        )
        out = jitted(*args, **kwargs)
        return hosts.global_array_to_host_local_array(out, mesh, out_specs)

    return call
'''


SHARED_MODULE = "_pmap_compat"
SHARED_DOC = """\
`shard_map_per_device`: `jax.pmap` as `jax.jit` of `jax.shard_map`, for this project.

Written by jaxmigrate (JM202, pmap) for the modules whose `jax.pmap` it rewrote; they
import the helper from here. `jaxmigrate explain JM202` says what it does and why.
"""


def shared_source() -> str:
    """Return the text of the project module holding the helper, in canonical spelling."""
    helper = HELPER_SOURCE.format(doc=HELPER_DOC, jax="jax", np="np", P="P")
    imports = "import jax\nimport numpy as np\nfrom jax.sharding import PartitionSpec as P\n"
    return f'"""{SHARED_DOC}"""\n\n{imports}\n\n{helper}'


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
class Survey(cst.CSTVisitor):
    """One walk over a module: each `jax.pmap` reference with its ancestors, and the strings.

    Which names are bound, and how, is the scope model's (`defs`, `rebound`)."""

    def __init__(self, names: ScopeModel) -> None:
        super().__init__()
        self.names = names
        self.refs: list[tuple[cst.BaseExpression, tuple[cst.CSTNode, ...]]] = []
        self.strings: set[str] = set()
        self._stack: list[cst.CSTNode] = []
        self._paths = names.paths_to((PMAP,))  # the nodes leading to a use, when known

    def on_visit(self, node: cst.CSTNode) -> bool:
        # Exact types, not isinstance: libcst's node classes are concrete and never subclassed,
        # and isinstance against them (ABCs) is what this walk over every node spent most on.
        kind = type(node)
        if kind is cst.Attribute or kind is cst.Name:
            is_ref = kind is cst.Attribute or self.names.is_read(node)  # type: ignore[arg-type]
            if self._paths is not None and id(node) not in self._paths:
                is_ref = False
            if is_ref and self.names.qualified_name(node) == PMAP:  # type: ignore[arg-type]
                self.refs.append((node, tuple(self._stack)))  # type: ignore[arg-type]
        elif kind is cst.SimpleString:
            self.strings.add(str(node.evaluated_value))  # type: ignore[attr-defined]
        self._stack.append(node)
        return True

    def on_leave(self, original_node: cst.CSTNode) -> None:
        self._stack.pop()

    def defs(self, name: str) -> list[cst.FunctionDef]:
        """Return every `def name` of the module, in any scope."""
        found = (b.node for b in self.names.bindings(name) if b.kind is BindingKind.DEF)
        return [d for d in found if isinstance(d, cst.FunctionDef)]

    def rebound(self, name: str) -> bool:
        """Return True if anything but a `def` binds `name` anywhere in the module."""
        return any(b.kind is not BindingKind.DEF for b in self.names.bindings(name))


@dataclass
class Site:
    """One pmap site: where it is reported, its pmaps (outer first) and what it maps."""

    node: cst.CSTNode  # the pmap call or decorator, or the reference left alone
    pmaps: list[cst.Call | cst.Decorator]
    ref: cst.BaseExpression
    ancestors: tuple[cst.CSTNode, ...]
    mapped: cst.CSTNode | None = None  # the def or lambda it maps, when visible
    skip: str = ""
    fallback: str = ""  # why the program-level form was not taken, when it was looked for

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
    REFERENCE: ClassVar[str | None] = "vmap-oracle"
    LITERALS: ClassVar[tuple[str, ...]] = ("pmap",)
    TRIGGER: ClassVar[re.Pattern[str]] = re.compile(r"\bpmap\b")
    QUALNAMES: ClassVar[tuple[str, ...]] = (PMAP,)

    def __init__(self, context: CodemodContext) -> None:
        super().__init__(context)
        self.survey: Survey | None = None
        self.sites: dict[int, Site] = {}  # by id of the (outer) pmap call or decorator
        self.lower: set[int] = set()  # the inner one of two stacked pmap decorators
        self.applied: list[Site] = []
        self.applied_keys: list[str] = []
        self.reuse_helper = False
        self.programs: dict[int, tuple[Site, Program]] = {}  # by id of the function they are in

    def has_candidates(self, tree: cst.Module, names: ScopeModel) -> bool:
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
        if self.state.pmap_style == "idiomatic":
            self._find_programs(node)

    def _find_programs(self, module: cst.Module) -> None:
        """Take the sites whose whole data flow is visible to the program-level form."""
        hosts: dict[int, list[Site]] = {}
        for site in self.sites.values():
            host = next((a for a in reversed(site.ancestors) if isinstance(a, SCOPES)), None)
            hosts.setdefault(id(host), []).append(site)
        for key, site in list(self.sites.items()):
            try:
                host, program = self._program(module, site)
                if len(hosts[id(host)]) > 1:
                    raise NotVisible("the function makes several pmapped steps")
            except NotVisible as why:
                site.fallback = str(why)
                continue
            del self.sites[key]
            self.programs[id(host)] = (site, program)

    def _program(self, module: cst.Module, site: Site) -> tuple[cst.FunctionDef, Program]:
        """Return the function making the step and its program; raise NotVisible for why not."""
        host = next((a for a in reversed(site.ancestors) if isinstance(a, SCOPES)), None)
        if not isinstance(site.node, cst.Call) or len(site.pmaps) != 1:
            raise NotVisible("a decorator or nested pmap: its calls are not followed (yet)")
        if not isinstance(host, cst.FunctionDef) or host is site.mapped:
            raise NotVisible("the step is made outside a function: its calls are not followed")
        if not isinstance(site.mapped, cst.FunctionDef) or site.mapped not in module.body:
            raise NotVisible("the pmapped function is not a def of this module")
        statement = site.ancestors[-3] if len(site.ancestors) > 3 else None
        if not isinstance(statement, cst.SimpleStatementLine):
            raise NotVisible("the step is not made by a statement of its own")
        return host, analyze(host, statement, site.node, site.mapped, self.qualname)

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
        defs = self.survey.defs(name)
        return defs[0] if len(defs) == 1 and not self.survey.rebound(name) else None

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
        defs = self.survey.defs(HELPER)
        rebound = self.survey.rebound(HELPER)
        ours = [d for d in defs if d in module.body and _docstring(d) == HELPER_DOC]
        self.reuse_helper = len(defs) == len(ours) == 1 and not rebound
        if (defs or rebound) and not self.reuse_helper:
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
        if site.fallback:
            notes.append(f"program-level form not taken: {site.fallback}")
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
        local = self.resolver.module_binding(PARTITION_SPEC)  # one no function rebinds
        if local is not None:
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
        mapped = [plan.fun] if plan.fun is not None else []
        jit = Call(cst.Name(HELPER), [*mapped, *plan.helper, *plan.jit])
        jit = replace(jit, opening=Call.of(updated_node).opening)
        laid = jit.laid_out(self.room(original_node), self.state.style)
        return laid.with_changes(lpar=updated_node.lpar, rpar=updated_node.rpar)

    def leave_FunctionDef(
        self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef
    ) -> cst.FunctionDef:
        if id(original_node) in self.programs:
            return self._rewrite_program(*self.programs[id(original_node)], updated_node)
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

    def _rewrite_program(
        self, site: Site, program: Program, updated: cst.FunctionDef
    ) -> cst.FunctionDef:
        """Record the step and its edits as one group; rewrite them all, or nothing."""
        line, col = self.where(site.node)
        group = f"{self.CODE}:program:{line}:{col}"
        axis = code(program.axis)
        enabled = [self.site(site.node, PROGRAM_MESSAGE.format(axis=axis), group=group)]
        for node_id, why in program.reasons.items():
            enabled.append(self.site(program.nodes[node_id], why, group=group))
        if not all(enabled):
            return updated
        spec, spec_import = self._spec_ref()
        if spec_import is not None:
            self.need_import(*spec_import)
        if isinstance(site.ref, cst.Name):
            self.drop_import_if_unused(site.ref.value)
        program.jax = dotted(self.module_ref("jax")) or "jax"
        if any(program.varying):  # results read flattened: each process reads its own part
            program.hosts = self._multihost_utils()
        program.spec = spec
        taken = set(names_in(program.host))
        program.mesh = self._fresh("mesh", taken)
        program.sharding = self._fresh("batch_sharding", taken)
        return program.rewrite(self.room(program.statement).indent, self.state.style)

    def _multihost_utils(self) -> str:
        """Return how to spell `jax.experimental.multihost_utils` here, importing it if needed."""
        bound = self.resolver.module_binding("jax.experimental.multihost_utils")
        if bound is not None:
            return bound
        if self.resolver.is_free("multihost_utils"):
            self.need_import("jax.experimental", "multihost_utils")
            return "multihost_utils"
        return dotted(self.module_ref("jax.experimental.multihost_utils")) or "multihost_utils"

    def _fresh(self, name: str, taken: set[str]) -> str:
        """Return `name`, or `name_1`, ...: one neither the function nor the module uses."""
        candidates = (name, *(f"{name}_{k}" for k in range(1, len(taken) + 2)))
        return next(c for c in candidates if c not in taken and self.resolver.is_free(c))

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
        self.applied_keys.append(self.state.sites[-1].key)
        spec_import = self._spec_ref()[1]
        if spec_import is not None and len(self.applied) == 1:
            self.need_import(*spec_import)
        if isinstance(site.ref, cst.Name):
            self.drop_import_if_unused(site.ref.value)
        return plan

    def _decorators(self, site: Site, plan: Plan, new: cst.Decorator) -> list[cst.Decorator]:
        """Return `@partial(shard_map_per_device, ...)`, `jax.jit`'s arguments last."""
        partial = self._partial(site)
        room = self.room(site.node)
        room = replace(room, column=room.column + 1, tail=0)  # after the `@`
        helper = Call(partial, [Item(cst.Arg(cst.Name(HELPER))), *plan.helper, *plan.jit])
        return [new.with_changes(decorator=helper.laid_out(room, self.state.style))]

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
        shared = self.shared_module(SHARED_MODULE, shared_source(), self.applied_keys)
        if shared is not None:  # one helper for the whole project, imported where needed
            self.need_import(shared, HELPER)
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
