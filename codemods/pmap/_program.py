"""The program-level pmap migration: follow the data around one pmapped step and drop the device axis.

`analyze` reads one function that makes a pmapped step and calls it (a training loop), and says
whether the whole flow is visible and of a shape this module rewrites; `rewrite_host` returns
the function rewritten. The shape taken (anything else keeps the faithful form, with the reason):

- `step = jax.pmap(body, axis_name="a"[, donate_argnums=...])` in the function (`step` may be
  `body`'s own name), `body` a def of the module or of the function (or `functools.partial(body, k=...)`: the parameters it binds are replicated, later
  ones keep their defaults) with positional parameters, whose results are read from its code
  (`_body.py`: nested defs, closures, `if`/`else`, loops); several such steps in one function
  share one mesh, and a result of one fed to another is replicated on both sides; a step made
  outside any function (a pmap decorator on a def of the module, `step = jax.pmap(...)` at
  module level) is read by `_outer`;
- every use of `step` in the function is a call `out = step(x1, ..., xk)`; each argument is a
  name assigned in the function only by a replication of a value (`flax.jax_utils.replicate(x)`,
  `jnp.broadcast_to(x, (n,) + x.shape)` or its `jax.tree.map`, `jnp.stack([x] * n)`), only by a
  split of a flat batch (`x.reshape((n, -1) + x.shape[1:])` or its `jax.tree.map`,
  `flax.training.common_utils.shard(x)`), only by per-device keys (`jax.random.split(k, n)`,
  `common_utils.shard_prng_key(k)`), or by a replicated result of `step` fed back; or one of
  those expressions written in the call;
- every result of `step` is read only as device 0's copy (`r[0]`, `r.field[0]`, `r["k"][0]`,
  `jax.device_get(r)[0]`, `jax.tree.map(lambda v: v[0], r)`, `flax.jax_utils.unreplicate(r)`),
  appended to a list read by `common_utils.get_metrics`, or fed back as a replicated argument, and
  is the same on every device (`_body.py`); or it differs and is read only reshaped on the host.

The rewrite: a mesh over every device of the job (`jax.devices()`, pmap's order) is made once,
where the step was made; the step becomes `jax.jit(jax.shard_map(body, mesh=..., in_specs=...,
out_specs=P(), check_vma=False), donate_argnums=...)` with `P()` for replicated arguments and
`P(a)` for batches and per-device keys (each device takes its own key, `key[0]`, in a lambda
around the body); replications and readbacks are deleted (the value itself is passed and read);
a split batch becomes its process's part of a global batch sharded over the axis
(`jax.make_array_from_process_local_data`: in one process, the flat batch itself). The per-device
block of the flat batch is exactly the old per-device slice, so the body is unchanged, with its
collectives; `check_vma=False` keeps pmap's gradients of replicated parameters (`pmean` of
per-device gradients; under `check_vma=True` they would come out summed over devices first).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from itertools import count
from typing import Any

import libcst as cst
import libcst.matchers as m

from jaxmigrate.toolkit.cstutil import names_in
from jaxmigrate.toolkit.emit import (
    Call,
    Room,
    Style,
    broken_comprehension,
    code,
    exploded_sequence,
    with_keyword,
    with_lambda_calls,
)
from jaxmigrate.toolkit.imports import is_docstring

from ._dead import bound_name, without
from ._declines import Decline
from ._layout import Layout, fill
from ._reach import nodes_in, read_names, replaced
from ._specs import tuple_of, with_static_tail

Edit = Callable[[cst.BaseExpression], cst.BaseExpression]  # an expression, as rewritten -> new


@dataclass
class Program:
    """One step and the edits that go with it, in the function that makes and calls it."""

    host: cst.FunctionDef
    # `step = jax.pmap(...)`, or the def a pmap decorator makes the step; None: made elsewhere
    statement: cst.SimpleStatementLine | cst.FunctionDef | None
    body: cst.BaseExpression  # the def's name, or `functools.partial(name, k=...)`
    axis: cst.BaseExpression
    donate: cst.Arg | None
    batches: list[bool]  # per argument: a split batch (True) or replicated (False)
    outputs: int | None  # how many results the body returns as a tuple; None: one result
    edits: dict[int, Edit] = field(default_factory=dict)  # by id of an original: what it becomes
    jax: str = "jax"  # how the module spells `jax`
    jnp: str = "jax.numpy"  # how the module spells `jax.numpy`
    partial: str = "functools.partial"  # how the module spells it (a decorated step's)
    spec: cst.BaseExpression = field(default_factory=lambda: cst.Name("P"))  # PartitionSpec
    mesh: str = "mesh"  # the name the mesh is bound to
    sharding: str = "batch_sharding"  # the name the sharding of batches is bound to
    fixed: dict[int, str] = field(default_factory=dict)  # unmapped positions: "none", "static"
    varying: list[bool] = field(default_factory=list)  # per result: differs between devices
    hosts: str = "jax.experimental.multihost_utils"  # how the module spells that module
    flat_reads: bool = False  # a result differing between devices is read flattened (`hosts`)
    # A batch drawn from an iterator not followed is converted where it is passed, by the
    # module's helper of this name (`_flow._convert_drawn`)
    converts: bool = False
    converter: str = "global_batch"
    copies: bool = False  # a replicated value is given as copies to a call not followed
    copier: str = "device_copies"
    # The host's parameters its callers pass as equal copies per device (declared by the
    # project): those the step reads become one value at the host's entry, by `uncopier`
    declared: frozenset[str] = frozenset()
    spelling: str = ""  # the host as a `pmap-replicated` entry names it ("" for a nested def)
    seen: str = ""  # how the analysis saw its callers pass copies ("": the entry says so)
    unseen: Mapping[str, str] = field(default_factory=dict)  # see `Declarable.unseen`
    uncopied: list[str] = field(default_factory=list)
    uncopier: str = "from_device_copies"
    # `step = factory(...)` made the step: the factory's def and its `return jax.pmap(...)`,
    # which becomes the step (`step_statements` keeps `statement`, making only what it needs)
    factory: tuple[cst.FunctionDef, cst.SimpleStatementLine] | None = None
    # How the module spells numpy when this process's part of a flat result must be read into
    # numpy: under `jax.set_mesh`, whose mesh spans every process, a jax op on an array of this
    # process's devices alone raises ("incompatible devices"); None: read as it is.
    numpy: str | None = None
    statics: cst.Arg | None = None  # `static_broadcasted_argnums`, as written
    tail: cst.BaseExpression | None = None  # how many star arguments, all static (`_specs`)
    # The binding of `host` making the step (`step = jax.pmap(...)`, the decorated def); None:
    # made outside `host`, before it runs
    made: cst.Assign | cst.FunctionDef | None = None
    nodes: dict[int, cst.CSTNode] = field(default_factory=dict)  # the edited nodes, by id
    reasons: dict[int, str] = field(default_factory=dict)  # what each edit does, by id
    calls: list[cst.Call] = field(default_factory=list)  # the calls of the step in `host`
    make_mesh: bool = True  # False: an existing mesh of pmap's, `mesh`, is reused
    make_sharding: bool = True  # False: another step of the function made `sharding` already
    siblings: set[int] = field(default_factory=set)  # `out = other_step(...)` in the function
    sibling_feeds: set[int] = field(default_factory=set)  # the arguments of those calls
    params: list[str] = field(default_factory=list)  # the body's parameters, as the calls fill them
    keywords: tuple[str, ...] = ()  # the last of `params`, which the calls pass by keyword
    keywords_bound: bool = False  # the def itself takes them by position (a decorated step)
    unnamed: bool = False  # pmap's axis had no name: `axis` is the one the rewrite gives it
    # What the body's reading took as given beyond the body (`_body`: a batch norm's statistics),
    # said in the site's message
    assumed: tuple[str, ...] = ()
    squeezed: set[int] = field(default_factory=set)  # per-device stacks: the body takes x[0]
    arithmetic: dict[int, set[str]] = field(default_factory=dict)  # `x = x - lr * g`: results read
    means: set[int] = field(default_factory=set)  # `state = sync_batch_stats(state)`: its value
    # Names bound once to the number of devices or a lambda (a replicating one): their binding
    # is deleted when the rewrite leaves them unread.
    helpers: set[str] = field(default_factory=set)
    # A step passed to a def of the module (`_callee.py`): in that def, the layout of a
    # parameter read at ENTRY, from the caller's argument (a layout, or raises NotVisible); the
    # parameters so read; and, in the caller, the programs of the defs it is passed to.
    given: Callable[[Program, str, int], Layout] | None = None
    entries: dict[str, Layout] = field(default_factory=dict)  # each laid out so, by the caller
    callees: list[Program] = field(default_factory=list)
    # In that def, each read `return ..., r, ...` of a result of the step (or of a parameter the
    # caller gives as equal copies), by id: its index in the tuple returned (None: the value
    # whole) and the step's output (None: the parameter); in the caller, by id of the statement
    # binding that def's call, the names it binds to those results (`_callee.carried_back`).
    carries: bool = False  # the caller follows what the def returns
    entry: list[cst.SimpleStatementLine] = field(default_factory=list)  # made at its entry
    carried_out: dict[int, tuple[int | None, int | None]] = field(default_factory=dict)
    carried: dict[int, frozenset[str]] = field(default_factory=dict)
    carried_read: set[str] = field(default_factory=set)  # of those, laid out as results
    # A value stacked for the step passed on to a def of the module reading only device 0's
    # copy, and `return value` (`_passon.py`): checked against every read of those names.
    passed_on: list[cst.Call] = field(default_factory=list)
    returns: list[tuple[str, Decline]] = field(default_factory=list)  # the name, if read
    # The reads of the defs making its input iterator (`_inputs.py`), checked likewise.
    inputs: list[cst.Name] = field(default_factory=list)

    def edit(
        self, node: cst.BaseExpression, why: str, new: Callable[[], cst.BaseExpression]
    ) -> None:
        """Replace `node` (original) by what `new` returns when the function is rewritten."""
        self.rewrite(node, why, lambda _: new())

    def rewrite(self, node: cst.CSTNode, why: str, edit: Edit) -> None:
        """Replace `node` (original) by what `edit` makes of it as rewritten (the edits inside
        it made)."""
        self.nodes[id(node)], self.reasons[id(node)], self.edits[id(node)] = node, why, edit

    def shard_map_options(self, mesh: str | None) -> list[cst.Arg]:
        """Return `jax.shard_map`'s arguments besides the body: no `mesh=` when `mesh` is None
        (the mesh the program sets with `jax.set_mesh` is used)."""

        def spec(varying: bool) -> cst.BaseExpression:
            return cst.Call(self.spec, [cst.Arg(self.axis)] if varying else [])

        ins = [
            cst.Name("None") if self.fixed.get(i) == "static" else spec(batch)
            for i, batch in enumerate(self.batches)
        ]
        outs = [spec(varying) for varying in self.varying]
        options = {"mesh": cst.parse_expression(mesh)} if mesh is not None else {}
        options["in_specs"] = tuple_of(ins)
        if self.tail is not None:  # `(P(), P(axis)) + (None,) * len(names)`
            options["in_specs"] = with_static_tail(options["in_specs"], len(ins), self.tail)
        options["out_specs"] = tuple_of(outs) if self.outputs is not None else outs[0]
        options["check_vma"] = cst.Name("False")
        return [keyword(k, v) for k, v in options.items()]

    def jit_options(self) -> list[cst.Arg]:
        """Return `jax.jit`'s arguments besides the function: static and donated ones."""
        options = []
        if self.statics is not None:
            options.append(keyword("static_argnums", self.statics.value))
        if self.donate is not None:
            options.append(self.donate.with_changes(comma=cst.MaybeSentinel.DEFAULT))
        return options

    def step(self, mesh: str | None) -> cst.Call:
        """Return `jax.jit(jax.shard_map(body, ...), ...)`; no `mesh=` when `mesh` is None (the
        mesh the program sets with `jax.set_mesh` is used)."""
        inner = [cst.Arg(self.per_device_body()), *self.shard_map_options(mesh)]
        shard_map = cst.Call(self._jax("shard_map"), inner)
        return cst.Call(self._jax("jit"), [cst.Arg(shard_map), *self.jit_options()])

    def new_mesh(self) -> cst.BaseExpression:
        """`jax.sharding.Mesh(jax.devices(), (axis,))`: pmap's mesh, every device in its order."""
        return fill("{jax}.sharding.Mesh({jax}.devices(), ({axis},))", self.context())

    def new_sharding(self, mesh: str) -> cst.BaseExpression:
        """`jax.sharding.NamedSharding(mesh, P(axis))`: a batch split over the axis of `mesh`."""
        template = "{jax}.sharding.NamedSharding({mesh}, {spec}({axis}))"
        return fill(template, self.context() | {"mesh": cst.parse_expression(mesh)})

    def _jax(self, name: str) -> cst.BaseExpression:
        """`jax.name` (`jax.jit`), `jax` spelled as the module does."""
        return cst.Attribute(cst.parse_expression(self.jax), cst.Name(name))

    def step_statements(
        self, indent: str, style: Style, updated: cst.CSTNode
    ) -> list[cst.BaseStatement]:
        """Return the mesh, made once, and the step as `jax.jit` of `jax.shard_map` (a def the
        pmap decorated, `updated` as rewritten, gets their decorators; `step = factory(...)`
        stays): never none, the step is made or kept."""
        assert self.statement is not None
        made: list[cst.SimpleStatementLine] = []
        if self.make_mesh and (self.factory is None or any(self.batches)):
            made.append(assign(self.mesh, self.new_mesh()))
        if any(self.batches) and self.make_sharding:
            made.append(assign(self.sharding, self.new_sharding(self.mesh)))
        if not isinstance(self.statement, cst.FunctionDef) and self.factory is None:
            target = self.statement.body[0].targets[0].target  # type: ignore[attr-defined]
            step = assign(target, self.step(self.mesh))
            # the statement's own comment (`)  # eos token, max_length are constant`) stays
            made.append(step.with_changes(trailing_whitespace=self.statement.trailing_whitespace))
        statements = [laid_out(statement, indent, style) for statement in made]
        if isinstance(updated, cst.FunctionDef):  # `self.decorators`, laid out after the `@`
            decorators = self.decorators(self.mesh, Room(indent, len(indent) + 1), style)
            statements.append(updated.with_changes(decorators=decorators))
        elif self.factory is not None and isinstance(updated, cst.SimpleStatementLine):
            # `step = factory(...)`, as it was; its comments go first, above the mesh
            statements.append(updated.with_changes(leading_lines=()))
        first = statements[0].with_changes(leading_lines=self.statement.leading_lines)  # type: ignore[attr-defined]
        if len(statements) > 1 and isinstance(statements[-1], cst.FunctionDef):
            # One blank line before an inner def after statements, as black writes it; two
            # before a def of the module (a script's step).
            statements[-1] = statements[-1].with_changes(
                leading_lines=[cst.EmptyLine(indent=False)] * (1 if indent else 2)
            )
        return [first, *statements[1:]]

    def factory_rewritten(self, indent: str, style: Style) -> cst.FunctionDef:
        """The factory's def with its `return jax.pmap(...)` making the step on a mesh of its
        own (equal to the caller's: the same devices and axis)."""
        assert self.factory is not None
        factory, made = self.factory
        taken = set(names_in(factory))
        mesh = numbered("mesh", lambda name: name not in taken)
        returned = made.with_changes(body=[cst.Return(self.step(mesh))], leading_lines=[])
        new = [laid_out(s, indent, style) for s in (assign(mesh, self.new_mesh()), returned)]
        new[0] = new[0].with_changes(leading_lines=made.leading_lines)  # type: ignore[union-attr]
        assert isinstance(factory.body, cst.IndentedBlock)
        body = [*factory.body.body[:-1], *new]
        return factory.with_changes(body=factory.body.with_changes(body=body))

    def decorators(self, mesh: str | None, room: Room, style: Style) -> list[cst.Decorator]:
        """`@partial(jax.jit, ...)` over `@partial(jax.shard_map, ...)`, laid out in `room`; no
        `mesh=` when `mesh` is None (the mesh the program sets with `jax.set_mesh` is used)."""
        partial, jit_options = cst.parse_expression(self.partial), self.jit_options()
        jit = cst.Call(partial, [cst.Arg(self._jax("jit")), *jit_options])
        shard_map = [cst.Arg(self._jax("shard_map")), *self.shard_map_options(mesh)]
        top = Call.of(jit).laid_out(room, style) if jit_options else self._jax("jit")
        laid = Call.of(cst.Call(partial, shard_map)).laid_out(room, style)
        return [cst.Decorator(top), cst.Decorator(laid)]

    def context(self) -> dict[str, cst.BaseExpression]:
        """Return how the rewrite spells what the table's templates name (`{jax}`, ...)."""
        spelled = {"jax": self.jax, "jnp": self.jnp, "sharding": self.sharding, "np": self.numpy}
        spelled |= {"mesh": self.mesh, "hosts": self.hosts}
        found = {k: cst.parse_expression(v) for k, v in spelled.items() if v is not None}
        return found | {"spec": self.spec, "axis": self.axis}

    def wrapped(self) -> bool:
        """Return True if the body is called from a lambda (per-device stacks, keywords)."""
        return bool(self.squeezed or self.keywords and not self.keywords_bound)

    def per_device_body(self) -> cst.BaseExpression:
        """The body, or a lambda calling it with its own `x[0]` of each per-device stack.

        A stack of per-device values that is not a split batch (keys, one per device) comes to
        each device as a block of one: the body takes that block's only element, as pmap
        gave it (brax's ES migration does the same)."""
        if not self.wrapped():
            return self.body
        first = len(self.params) - len(self.keywords)  # then passed by keyword, as they were
        args = []
        for i, param in enumerate(self.params):
            value = cst.parse_expression(f"{param}[0]") if i in self.squeezed else cst.Name(param)
            args.append(keyword(param, value) if i >= first else cst.Arg(value))
        fun = self.body
        if isinstance(fun, cst.Call):  # `partial(f, k=v)`: `f(..., k=v)`, the same call
            args += [a.with_changes(comma=cst.MaybeSentinel.DEFAULT) for a in fun.args[1:]]
            fun = fun.args[0].value
        params = cst.Parameters([cst.Param(cst.Name(p)) for p in self.params])
        return cst.Lambda(params, cst.Call(fun, args))


def numbered(base: str, free: Callable[[str], bool]) -> str:
    """Return the first of `base`, `base_1`, `base_2`, ... that `free` accepts."""
    names = (f"{base}_{k}" if k else base for k in count())
    return next(n for n in names if free(n))


def keyword(name: str, value: cst.BaseExpression) -> cst.Arg:
    """`name=value`, spaced as a keyword argument is."""
    return with_keyword(cst.Arg(value), name)


def assign(
    target: str | cst.BaseAssignTargetExpression, value: cst.BaseExpression
) -> cst.SimpleStatementLine:
    """`target = value`, a statement of its own."""
    if isinstance(target, str):
        target = cst.ensure_type(cst.parse_expression(target), cst.Name)
    return cst.SimpleStatementLine([cst.Assign([cst.AssignTarget(target)], value)])


COPY = "a replication -> a copy"  # how the edit of a replication a step donates begins
COPIED = "-> a copy of the value"  # in each edit copying a value a step donates


def edit_owners(programs: list[Program]) -> dict[int, Program]:
    """For each node the programs edit, the program whose edit is made: a copy of a replication
    (or of a readback) one step donates wins over another step's deleting it (both take the
    value replicated)."""
    owners: dict[int, Program] = {}
    for program in programs:  # else the last program's
        for key in program.edits:
            if key not in owners or COPIED not in owners[key].reasons[key]:
                owners[key] = program
    return owners


def laid_out(statement: cst.BaseStatement, indent: str, style: Style) -> cst.BaseStatement:
    """Return `target = call(...)`, `call(...)` or `return call(...)`, the call laid out by the
    emitter when the line is too long; in `call(...).method()` the first call is laid out, as
    black splits the last bracket that is not empty."""
    if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
        return statement
    node = statement.body[0]
    if not isinstance(node, (cst.Assign, cst.AugAssign, cst.Expr, cst.Return)):
        return statement
    value = node.value
    if isinstance(node, cst.Assign) and value is not None and not isinstance(value, cst.Call):
        wrapped = node.with_changes(value=_wrapped(value, indent, style))
        return statement.with_changes(body=[wrapped])
    if isinstance(value, cst.Call):  # the call, or the first of `call(...).method()`
        method = value.func if not value.args and isinstance(value.func, cst.Attribute) else None
        inner = method.value if method is not None and isinstance(method.value, cst.Call) else value
        found: tuple[cst.Call, int] | None = inner, len(code(value)) - len(code(inner))
    else:  # `return a, f(x)`, `y = f(x) / 255.0`: black splits f's brackets
        found = _last_bracket(value) if value is not None else None
    if value is None or found is None:
        return statement
    call, tail = found
    head = len(indent) + len(code(node)) - tail - len(code(call))
    laid = with_lambda_calls(Call.of(call)).laid_out(Room(indent, head, tail), style)
    return statement.with_changes(body=[node.with_changes(value=replaced(value, {id(call): laid}))])


def _wrapped(value: cst.BaseExpression, indent: str, style: Style) -> cst.BaseExpression:
    """An assigned value other than a call, too long for its line, in parentheses on a line of
    its own, as black writes it (`x = (\n    a / 255.0\n)`); as it is where that is too long."""
    inner = indent + style.continuation
    if isinstance(value, (cst.ListComp, cst.SetComp, cst.DictComp)):
        return broken_comprehension(value, indent, inner, style.width)
    if value.lpar or "\n" in code(value):
        return value
    if isinstance(value, cst.Tuple):  # one element a line, each with its comma (the emitter's)
        parenthesized = value.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
        laid = exploded_sequence(parenthesized, indent, inner, style.width)
        return value if laid is parenthesized else laid
    if len(inner) + len(code(value)) > style.width:
        return value

    def broken(at: str) -> cst.ParenthesizedWhitespace:
        return cst.ParenthesizedWhitespace(indent=False, last_line=cst.SimpleWhitespace(at))

    return value.with_changes(
        lpar=[cst.LeftParen(whitespace_after=broken(inner))],
        rpar=[cst.RightParen(whitespace_before=broken(indent))],
    )


def _last_bracket(value: cst.BaseExpression) -> tuple[cst.Call, int] | None:
    """`a, f(x)` (a `return`'s, a tuple written without parentheses ending in a call): that
    call, whose brackets black splits first, and how many characters follow it; else None."""
    if not m.matches(value, m.Tuple([m.ZeroOrMore(), m.Element(m.Call(lpar=[]))], lpar=[])):
        return None
    last = cst.ensure_type(value, cst.Tuple).elements[-1]
    call = cst.ensure_type(last.value, cst.Call)
    return call, len(code(last.comma)) if isinstance(last.comma, cst.Comma) else 0


# The statement the mesh is set before, the statements making it, `jax.set_mesh(mesh)`, and the
# statement it is unset before (None: the function's end)
Setup = tuple[cst.CSTNode, list[cst.SimpleStatementLine], cst.BaseExpression, cst.CSTNode | None]


def rewrite_host(
    host: cst.FunctionDef,
    programs: list[Program],
    setup: Setup | None,
    indent: str,
    style: Style,
    produced: Mapping[int, cst.CSTNode] | None = None,
) -> cst.FunctionDef:
    """Return `host` with the edits of `programs` (steps it calls) and the mesh `setup`; and
    with what other sites' rewrites `produced` of its nodes (by id of the original node: a
    pmap of its own the programs do not take, rewritten in its faithful form)."""
    edit = _Edit(host, programs, setup, indent, style, produced or {})
    out = cst.ensure_type(host.visit(edit), cst.FunctionDef)
    helpers = set().union(*(p.helpers for p in programs))
    # the sharding of batches made with the step, which only a def it is passed to may convert
    # with (`_callee.py`: over a mesh of its own), is a helper too
    helpers |= {p.sharding for p in programs if p.sharding.isidentifier()}
    # `x = x` a deletion left, then `n = jax.local_device_count()`, `rep = lambda x: ...`, no
    # longer read
    out = without(out, {id(node) for node in edit.copies})
    while unread := helpers - set(read_names(out)):
        helpers -= unread
        lines = nodes_in(out.body, cst.SimpleStatementLine)
        out = without(out, {id(line) for line in lines if bound_name(line) in unread})
    return out


class _Edit(cst.CSTTransformer):
    """Apply programs' edits to their host function (original nodes, by id)."""

    def __init__(
        self,
        host: cst.FunctionDef,
        programs: list[Program],
        setup: Setup | None,
        indent: str,
        style: Style,
        produced: Mapping[int, cst.CSTNode],
    ) -> None:
        super().__init__()
        self.host, self.programs, self.setup = host, programs, setup
        self.produced = produced
        self.indent, self.style = indent, style
        self.edits = {k: p.edits[k] for k, p in edit_owners(programs).items()}
        self.made = {id(p.statement): p for p in programs if p.statement is not None}
        self.before: cst.CSTNode | None = None  # the setup's statement, as rewritten
        self.after: cst.CSTNode | None = None  # the statement it ends before, as rewritten
        self.blocks: list[str] = []  # the indentation of each block we are in
        self.edited = False  # whether the statement being left had an edit
        self.touched: set[int] = set()  # the original nodes edited
        self.scoped = False  # past the setup's statement: in `with jax.set_mesh(...)`, deeper
        # `x = replicate(x)` left `x = x`: dropped after (kept alive: their ids stay theirs)
        self.copies: list[cst.CSTNode] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        if self.setup is not None:  # in from the setup's statement on, out from the one it ends
            self.scoped = node is self.setup[0] or (self.scoped and node is not self.setup[3])
        if isinstance(node, (cst.IndentedBlock, cst.Match)):  # a `match`'s cases: a level
            unit = node.indent if node.indent is not None else self.style.indent
            self.blocks.append(self.blocks[-1] + unit if self.blocks else self.indent)
        if isinstance(node, cst.SimpleStatementLine):
            self.edited = False
        return True

    def on_leave(self, original_node: cst.CSTNode, updated_node: cst.CSTNode) -> Any:
        if isinstance(original_node, (cst.IndentedBlock, cst.Match)):
            self.blocks.pop()
        here = (self.blocks[-1] if self.blocks else self.indent) + self.style.indent * self.scoped
        edit = self.edits.get(id(original_node))
        if edit is not None and isinstance(updated_node, cst.BaseExpression):
            self.edited = True
            self.touched.add(id(original_node))
            return edit(updated_node)
        if (program := self.made.get(id(original_node))) is not None:
            return cst.FlattenSentinel(program.step_statements(here, self.style, updated_node))
        if (made := self._produced(original_node, updated_node)) is not None:
            return made
        if _is_self_assignment(updated_node) and not _is_self_assignment(original_node):
            self.copies.append(updated_node)
            return updated_node
        if original_node is self.host.body:
            assert isinstance(updated_node, cst.IndentedBlock)
            if self.setup is not None:
                updated_node = self._with_setup(updated_node)
            return self._with_entry(updated_node)
        if (self.edited or self.scoped) and isinstance(updated_node, cst.SimpleStatementLine):
            # edited (the mesh may come before), or moved under `with jax.set_mesh(...)`
            updated_node = fitted(updated_node, here, self.style, moved=not self.edited)
        elif (
            isinstance(original_node, cst.For)
            and isinstance(updated_node, cst.For)
            and any(id(n) in self.touched for n in nodes_in(original_node.iter, object))
        ):
            updated_node = _fitted_for(updated_node, here, self.style)
        # Laid out anew, the setup's statement and the one it ends before: `_with_setup` finds them
        if self.setup is not None and original_node is self.setup[0]:
            self.before = updated_node
        if self.setup is not None and original_node is self.setup[3]:
            self.after = updated_node
        return updated_node

    def _produced(self, original: cst.CSTNode, updated: cst.CSTNode) -> cst.CSTNode | None:
        """What another site's rewrite made of `original` (a pmap the programs do not take,
        in its faithful form): as it was made, or, for a def holding the programs' edits, its
        decorators alone; None when there is none."""
        made = self.produced.get(id(original))
        if made is None or original is self.host:
            return None
        inside = {id(n) for n in nodes_in(original, object)} - {id(original)}
        if not inside & (self.edits.keys() | self.made.keys()):
            return made
        if isinstance(made, cst.FunctionDef) and isinstance(updated, cst.FunctionDef):
            return updated.with_changes(decorators=made.decorators)
        return None

    def _with_entry(self, block: cst.IndentedBlock) -> cst.IndentedBlock:
        """Make the parameters the callers pass as copies per device one value each, first
        (after the docstring): `params = from_device_copies(params)`."""
        texts = {f"{n} = {p.uncopier}({n})": None for p in self.programs for n in p.uncopied}
        entry = {code(s): s for p in self.programs for s in p.entry}  # a def's mesh, once
        if not texts and not entry:
            return block
        made = [laid_out(cst.parse_statement(t), self.indent, self.style) for t in texts]
        made += [laid_out(s, self.indent, self.style) for s in entry.values()]
        body = list(block.body)
        at = 1 if body and is_docstring(body[0]) else 0  # the next keeps its comments
        return block.with_changes(body=[*body[:at], *made, *body[at:]])

    def _with_setup(self, block: cst.IndentedBlock) -> cst.IndentedBlock:
        """Make the mesh before the setup's statement, and run the rest under `with
        jax.set_mesh(mesh):` (its leading comments and blank lines go first), up to the
        statement the setup ends before, if any (a generator's first `yield`)."""
        assert self.setup is not None
        body = list(block.body)
        at = next(i for i, s in enumerate(body) if s is self.before)
        end = next((i for i, s in enumerate(body) if s is self.after), len(body))
        leading = getattr(body[at], "leading_lines", ())
        body[at] = body[at].with_changes(leading_lines=())  # type: ignore[call-arg]
        made = [laid_out(statement, self.indent, self.style) for statement in self.setup[1]]
        scoped = cst.With([cst.WithItem(self.setup[2])], cst.IndentedBlock(body[at:end]))
        head = [*made, scoped]
        head[0] = head[0].with_changes(leading_lines=leading)  # type: ignore[call-arg]
        return block.with_changes(body=[*body[:at], *head, *body[end:]])


def fitted(
    statement: cst.SimpleStatementLine, indent: str, style: Style, moved: bool = False
) -> cst.BaseStatement:
    """An edited `target = call(...)` laid out again when it no longer fits its line, or is
    a call written over several lines an edit put into another and holds no comment. `moved`:
    a statement only moved one block deeper (under `with jax.set_mesh(...)`, at `indent`),
    laid out again, as the formatter would, when its lines fitted the width before the move,
    no longer do, and hold no comment."""
    text = code(statement.with_changes(leading_lines=[]))
    first, *rest = text.splitlines()  # continuation lines carry their own indentation
    if moved:
        before = len(indent) - len(style.indent)  # its column before the move (`indent` ends so)
        fit = before + len(first) <= style.width
        fit &= all(len(line) <= style.width - len(style.indent) for line in rest)
        keep = "#" in text or not fit or len(indent) + len(first) <= style.width
    else:
        fits = len(indent) + len(first) <= style.width and all(len(n) <= style.width for n in rest)
        keep = fits and (not rest or "#" in text)
    return statement if keep else laid_out(statement, indent, style)


def _fitted_for(node: cst.For, indent: str, style: Style) -> cst.For:
    """A `for` whose iterated call an edit changed, the call laid out again when the header
    no longer fits its line (`for k, v in evaluator.run(device_copies(params)):`)."""
    head = f"for {code(node.target)} in "
    header = head + code(node.iter).strip() + ":"
    if not isinstance(node.iter, cst.Call) or (
        "\n" not in header and len(indent) + len(header) <= style.width
    ):
        return node
    laid = with_lambda_calls(Call.of(node.iter)).laid_out(
        Room(indent, len(indent) + len(head), 1), style
    )
    return node.with_changes(iter=laid)


def _is_self_assignment(statement: cst.CSTNode) -> bool:
    """`x = x`, which deleting a replication or a readback leaves: dropped."""
    if not m.matches(statement, m.SimpleStatementLine([m.Assign()])):
        return False
    value = statement.body[0].value  # type: ignore[attr-defined]
    return isinstance(value, cst.Name) and bound_name(statement) == value.value
