"""The program-level pmap migration: follow the data around one pmapped step and drop the device axis.

`analyze` reads one function that makes a pmapped step and calls it (a training loop), and says
whether the whole flow is visible and of a shape this module rewrites; `Program.rewrite` returns
the function rewritten. The shape taken (anything else keeps the faithful form, with the reason):

- `step = jax.pmap(body, axis_name="a"[, donate_argnums=...])` in the function, `body` a def of
  the module with positional parameters and straight-line code (assignments and one `return`);
- every use of `step` in the function is a call `out = step(x1, ..., xk)` with names as
  arguments; each argument is assigned in the function only by a replication of a value
  (`flax.jax_utils.replicate(x)`, `jnp.broadcast_to(x, (n,) + x.shape)` or its `jax.tree.map`,
  `jnp.stack([x] * n)`), only by a split of a flat batch (`x.reshape((n, -1) + x.shape[1:])` or
  its `jax.tree.map`, `flax.training.common_utils.shard(x)`), or by a replicated result of `step`
  fed back;
- every result of `step` is read only as `r[0]`, `jax.tree.map(lambda v: v[0], r)`,
  `flax.jax_utils.unreplicate(r)`, or fed back as a replicated argument, and is the same on every
  device: a `pmean`/`psum`/`pmax`/`pmin` result, or computed from replicated values alone.

The rewrite: a mesh over every device of the job (`jax.devices()`, pmap's order) is made once,
where the step was made; the step becomes `jax.jit(jax.shard_map(body, mesh=..., in_specs=...,
out_specs=P(), check_vma=False), donate_argnums=...)` with `P()` for replicated arguments and
`P(a)` for batches; replications and readbacks are deleted (the value itself is passed and read);
a split batch becomes its process's part of a global batch sharded over the axis
(`jax.make_array_from_process_local_data`: in one process, the flat batch itself). The per-device
block of the flat batch is exactly the old per-device slice, so the body is unchanged, with its
collectives; `check_vma=False` keeps pmap's gradients of replicated parameters (`pmean` of
per-device gradients; under `check_vma=True` they would come out summed over devices first).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import libcst as cst

from jaxmigrate.toolkit.emit import Call, Room, Style, code
from jaxmigrate.toolkit.names import dotted

Qualname = Callable[[cst.BaseExpression], "str | None"]

REPLICATE = frozenset({"flax.jax_utils.replicate"})
SHARD = frozenset({"flax.training.common_utils.shard"})
UNREPLICATE = frozenset({"flax.jax_utils.unreplicate"})
TREE_MAP = frozenset({"jax.tree.map", "jax.tree_util.tree_map", "jax.tree_map"})
BROADCAST = frozenset({"jax.numpy.broadcast_to", "numpy.broadcast_to"})
STACK = frozenset({"jax.numpy.stack", "numpy.stack"})
REDUCED = frozenset({f"jax.lax.{op}" for op in ("pmean", "psum", "pmax", "pmin")})
VARYING = frozenset({"jax.lax.axis_index"})
KEYWORDS = frozenset({"axis_name", "donate_argnums", "in_axes", "static_broadcasted_argnums"})


class NotVisible(Exception):
    """The flow around the step is not fully visible or not of the shape taken; why."""


@dataclass
class Program:
    """One step and the edits that go with it, in the function that makes and calls it."""

    host: cst.FunctionDef
    statement: cst.SimpleStatementLine  # `step = jax.pmap(...)`
    body: cst.Name
    axis: cst.BaseExpression
    donate: cst.Arg | None
    batches: list[bool]  # per argument: a split batch (True) or replicated (False)
    outputs: int | None  # how many results the body returns as a tuple; None: one result
    edits: dict[int, Callable[[cst.BaseExpression], cst.BaseExpression]] = field(
        default_factory=dict
    )  # by id of an original expression: what it becomes
    jax: str = "jax"  # how the module spells `jax`
    spec: cst.BaseExpression = field(default_factory=lambda: cst.Name("P"))  # PartitionSpec
    mesh: str = "mesh"  # the name the mesh is bound to
    sharding: str = "batch_sharding"  # the name the sharding of batches is bound to
    fixed: dict[int, str] = field(default_factory=dict)  # unmapped positions: "none", "static"
    varying: list[bool] = field(default_factory=list)  # per result: differs between devices
    hosts: str = "jax.experimental.multihost_utils"  # how the module spells that module
    statics: cst.Arg | None = None  # `static_broadcasted_argnums`, as written
    made_at: int = 0  # where the step is made, in `_Parents.order`
    nodes: dict[int, cst.CSTNode] = field(default_factory=dict)  # the edited nodes, by id
    reasons: dict[int, str] = field(default_factory=dict)  # what each edit does, by id

    def edit(
        self, node: cst.BaseExpression, why: str, new: Callable[[], cst.BaseExpression]
    ) -> None:
        """Replace `node` (original) by what `new` returns when the function is rewritten."""
        self.nodes[id(node)], self.reasons[id(node)] = node, why
        self.edits[id(node)] = lambda _: new()

    def rewrite(self, indent: str, style: Style) -> cst.FunctionDef:
        """Return the host function rewritten; `indent` is its body's indentation."""
        out = self.host.visit(_Edit(self, indent, style))
        assert isinstance(out, cst.FunctionDef)
        return out

    def step_statements(self, indent: str, style: Style) -> list[cst.SimpleStatementLine]:
        """Return the mesh, made once, and the step as `jax.jit` of `jax.shard_map`."""
        jax, spec = self.jax, code(self.spec)
        axis = code(self.axis)
        mesh = f"{self.mesh} = {jax}.sharding.Mesh({jax}.devices(), ({axis},))"
        specs = [
            "None" if self.fixed.get(i) == "static" else f"{spec}({axis})" if batch else f"{spec}()"
            for i, batch in enumerate(self.batches)
        ]
        in_specs = f"({', '.join(specs)}{',' if len(specs) == 1 else ''})"
        outs = [f"{spec}({axis})" if v else f"{spec}()" for v in self.varying]
        out_specs = f"({', '.join(outs)})" if self.outputs is not None else outs[0]
        target = code(self.statement.body[0].targets[0].target)  # type: ignore[attr-defined]
        inner = [
            self.body.value,
            f"mesh={self.mesh}",
            f"in_specs={in_specs}",
            f"out_specs={out_specs}",
            "check_vma=False",
        ]
        outer = [f"{jax}.shard_map({', '.join(inner)})"]
        if self.statics is not None:
            value = code(self.statics.value)
            outer.append(f"static_argnums={value}")
        if self.donate is not None:
            outer.append(code(self.donate.with_changes(comma=cst.MaybeSentinel.DEFAULT)))
        flat = f"{target} = {jax}.jit({', '.join(outer)})"
        texts = [mesh, flat]
        if any(self.batches):
            sharding = f"{jax}.sharding.NamedSharding({self.mesh}, {spec}({axis}))"
            texts.insert(1, f"{self.sharding} = {sharding}")
        statements = [_laid_out(cst.parse_statement(text), indent, style) for text in texts]
        assert all(isinstance(s, cst.SimpleStatementLine) for s in statements)
        first = statements[0].with_changes(leading_lines=self.statement.leading_lines)
        return [first, *statements[1:]]  # type: ignore[list-item]


def _laid_out(statement: cst.BaseStatement, indent: str, style: Style) -> cst.BaseStatement:
    """Return `target = call(...)`, the call laid out by the emitter when the line is too long."""
    if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
        return statement
    assign = statement.body[0]
    if not isinstance(assign, cst.Assign) or not isinstance(assign.value, cst.Call):
        return statement
    head = len(indent) + len(code(assign)) - len(code(assign.value))
    laid = Call.of(assign.value).laid_out(Room(indent, head), style)
    return statement.with_changes(body=[assign.with_changes(value=laid)])


def names_in(node: cst.CSTNode) -> Iterator[str]:
    if isinstance(node, cst.Name):
        yield node.value
    for child in node.children:
        yield from names_in(child)


def _calls_in(node: cst.CSTNode) -> Iterator[cst.Call]:
    if isinstance(node, cst.Call):
        yield node
    for child in node.children:
        yield from _calls_in(child)


class _Parents(cst.CSTVisitor):
    def __init__(self) -> None:
        super().__init__()
        self.parent: dict[int, cst.CSTNode] = {}
        self.stack: list[cst.CSTNode] = []
        self.loads: dict[str, list[cst.Name]] = {}
        self.stores: dict[str, list[cst.CSTNode]] = {}  # name -> the Assign (or other) binding
        self.order: dict[int, int] = {}  # the place of each node in the function's text
        self.targets: set[int] = set()  # the names assignments bind (not loads)

    def on_visit(self, node: cst.CSTNode) -> bool:
        self.order[id(node)] = len(self.order)
        if self.stack:
            self.parent[id(node)] = self.stack[-1]
        self.stack.append(node)
        if isinstance(node, cst.Assign):
            for target in node.targets:
                for name in _target_names(target.target):
                    self.stores.setdefault(name, []).append(node)
                self.targets |= {id(n) for n in _target_nodes(target.target)}
        elif isinstance(node, (cst.AugAssign, cst.AnnAssign, cst.For, cst.CompFor, cst.With)):
            for name in names_in(getattr(node, "target", None) or cst.Name("_")):
                self.stores.setdefault(name, []).append(node)
        elif isinstance(node, (cst.Param, cst.FunctionDef, cst.ClassDef, cst.NamedExpr)):
            self.stores.setdefault(_bound(node), []).append(node)
        return True

    def on_leave(self, original_node: cst.CSTNode) -> None:
        self.stack.pop()
        if isinstance(original_node, cst.Name) and id(original_node) not in self.targets:
            parent = self.parent.get(id(original_node))
            if (
                not isinstance(parent, (cst.Attribute, cst.AssignTarget, cst.Param, cst.Arg))
                or isinstance(parent, cst.Attribute)
                and parent.value is original_node
                or isinstance(parent, cst.Arg)
                and parent.value is original_node
            ):
                self.loads.setdefault(original_node.value, []).append(original_node)


def _bound(node: cst.CSTNode) -> str:
    if isinstance(node, cst.NamedExpr):
        return dotted(node.target) or "?"
    name = getattr(node, "name", None)
    return name.value if isinstance(name, cst.Name) else "?"


def _target_nodes(target: cst.BaseExpression) -> list[cst.Name]:
    if isinstance(target, cst.Name):
        return [target]
    if isinstance(target, (cst.Tuple, cst.List)):
        return [n for e in target.elements for n in _target_nodes(e.value)]
    return []


def _target_names(target: cst.BaseExpression) -> list[str]:
    if isinstance(target, cst.Name):
        return [target.value]
    if isinstance(target, (cst.Tuple, cst.List)):
        return [n for e in target.elements for n in _target_names(e.value)]
    return ["?"]  # attributes, subscripts, starred: not followed


def _single_name(node: cst.BaseExpression) -> str | None:
    return node.value if isinstance(node, cst.Name) else None


def _is_zero_index(node: cst.BaseExpression, var: str) -> bool:
    """`var[0]`."""
    if not isinstance(node, cst.Subscript) or _single_name(node.value) != var:
        return False
    if len(node.slice) != 1 or not isinstance(node.slice[0].slice, cst.Index):
        return False
    index = node.slice[0].slice.value
    return isinstance(index, cst.Integer) and index.value == "0"


def _lambda_of(node: cst.BaseExpression) -> tuple[str, cst.BaseExpression] | None:
    """`lambda v: expr` -> (v, expr)."""
    if not isinstance(node, cst.Lambda) or len(node.params.params) != 1:
        return None
    params = node.params
    if params.star_arg is not cst.MaybeSentinel.DEFAULT and params.star_arg is not None:
        return None
    if params.kwonly_params or params.posonly_params or params.star_kwarg is not None:
        return None
    return node.params.params[0].name.value, node.body


def _positional(call: cst.Call, count: int) -> list[cst.BaseExpression] | None:
    if len(call.args) != count or any(a.keyword is not None or a.star for a in call.args):
        return None
    return [a.value for a in call.args]


class _Forms:
    """Recognizes the stacking and readback forms, by meaning."""

    def __init__(
        self, qualname: Qualname, counts: Callable[[cst.BaseExpression], bool] = lambda _: True
    ) -> None:
        self.qualname = qualname
        self.counts = counts  # is this the number of local devices (pmap's mapped size)?

    def _is(self, node: cst.BaseExpression, names: frozenset[str]) -> bool:
        return isinstance(node, cst.Call) and self.qualname(node.func) in names

    def _tree_mapped(
        self, node: cst.BaseExpression, leaf: Callable[[cst.BaseExpression, str], bool]
    ) -> cst.BaseExpression | None:
        """`jax.tree.map(lambda v: <leaf(v)>, x)` -> x."""
        if not self._is(node, TREE_MAP):
            return None
        assert isinstance(node, cst.Call)
        args = _positional(node, 2)
        fn = _lambda_of(args[0]) if args else None
        if args is None or fn is None or not leaf(fn[1], fn[0]):
            return None
        return args[1]

    def _broadcast(self, node: cst.BaseExpression, var: str) -> bool:
        """`jnp.broadcast_to(var, (n,) + var.shape)` or `jnp.stack([var] * n)`."""
        if self._is(node, BROADCAST):
            assert isinstance(node, cst.Call)
            args = _positional(node, 2)
            return (
                args is not None
                and _single_name(args[0]) == var
                and _adds_leading(args[1], var)
                and self.counts(args[1].left.elements[0].value)  # type: ignore[attr-defined]
            )
        if self._is(node, STACK):
            assert isinstance(node, cst.Call)
            args = _positional(node, 1)
            item = args[0] if args else None
            return (
                isinstance(item, cst.BinaryOperation)
                and isinstance(item.operator, cst.Multiply)
                and isinstance(item.left, cst.List)
                and len(item.left.elements) == 1
                and _single_name(item.left.elements[0].value) == var
                and self.counts(item.right)
            )
        return False

    def replicated_source(self, node: cst.BaseExpression) -> cst.BaseExpression | None:
        """Return x of a replication of x, else None."""
        if self._is(node, REPLICATE):
            assert isinstance(node, cst.Call)
            args = _positional(node, 1)
            return args[0] if args else None
        mapped = self._tree_mapped(node, self._broadcast)
        if mapped is not None:
            return mapped
        if isinstance(node, cst.Call) and self._is(node, BROADCAST | STACK):
            first = node.args[0].value if node.args else None
            if isinstance(first, cst.BinaryOperation) and isinstance(first.left, cst.List):
                first = first.left.elements[0].value if first.left.elements else None
            name = _single_name(first) if first is not None else None
            return first if name is not None and self._broadcast(node, name) else None
        return None

    def shard_source(self, node: cst.BaseExpression) -> cst.BaseExpression | None:
        """Return x of a split of a flat batch x into per-device slices, else None."""
        if self._is(node, SHARD):
            assert isinstance(node, cst.Call)
            args = _positional(node, 1)
            return args[0] if args else None
        mapped = self._tree_mapped(node, self._splits)
        if mapped is not None:
            return mapped
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute):
            owner = node.func.value
            name = _single_name(owner)
            if name is not None and self._splits(node, name):
                return owner
        return None

    def _splits(self, node: cst.BaseExpression, var: str) -> bool:
        """`var.reshape((n, -1) + var.shape[1:])`, n the number of local devices."""
        if not _splits(node, var):
            return False
        shape = node.args[0].value  # type: ignore[attr-defined]
        return self.counts(shape.left.elements[0].value)

    def readback_of(self, node: cst.BaseExpression, var: str) -> bool:
        """`var[0]`, `jax.tree.map(lambda v: v[0], var)`, `unreplicate(var)`."""
        if _is_zero_index(node, var):
            return True
        if self._is(node, UNREPLICATE):
            assert isinstance(node, cst.Call)
            args = _positional(node, 1)
            return args is not None and _single_name(args[0]) == var
        mapped = self._tree_mapped(node, lambda body, v: _is_zero_index(body, v))
        return mapped is not None and _single_name(mapped) == var


def _adds_leading(node: cst.BaseExpression, var: str) -> bool:
    """`(n,) + var.shape`."""
    return (
        isinstance(node, cst.BinaryOperation)
        and isinstance(node.operator, cst.Add)
        and isinstance(node.left, cst.Tuple)
        and len(node.left.elements) == 1
        and dotted(node.right) == f"{var}.shape"
    )


def _splits(node: cst.BaseExpression, var: str) -> bool:
    """`var.reshape((n, -1) + var.shape[1:])`."""
    if not isinstance(node, cst.Call) or not isinstance(node.func, cst.Attribute):
        return False
    if node.func.attr.value != "reshape" or _single_name(node.func.value) != var:
        return False
    args = _positional(node, 1)
    shape = args[0] if args else None
    if not (isinstance(shape, cst.BinaryOperation) and isinstance(shape.operator, cst.Add)):
        return False
    head, rest = shape.left, shape.right
    minus_one = (
        isinstance(head, cst.Tuple)
        and len(head.elements) == 2
        and isinstance(head.elements[1].value, cst.UnaryOperation)
        and isinstance(head.elements[1].value.expression, cst.Integer)
        and head.elements[1].value.expression.value == "1"
    )
    tail = (
        isinstance(rest, cst.Subscript)
        and dotted(rest.value) == f"{var}.shape"
        and len(rest.slice) == 1
        and isinstance(rest.slice[0].slice, cst.Slice)
        and isinstance(rest.slice[0].slice.lower, cst.Integer)
        and rest.slice[0].slice.lower.value == "1"
        and rest.slice[0].slice.upper is None
    )
    return minus_one and tail


@dataclass
class _Call:
    """One `out = step(args)` statement."""

    assign: cst.CSTNode  # the `out = step(...)` assignment, or the `step(...)[0]` around it
    call: cst.Call
    args: list[str]
    targets: list[str]  # the names results are bound to, by output position
    readback: cst.Subscript | None = None  # `step(...)[0]`, the call read back at once


def analyze(
    host: cst.FunctionDef,
    statement: cst.SimpleStatementLine,
    pmap: cst.Call,
    body: cst.FunctionDef,
    qualname: Qualname,
) -> Program:
    """Return the program of a step made by `statement` in `host`; raise NotVisible for why not."""
    assign = statement.body[0]
    if len(statement.body) != 1 or not isinstance(assign, cst.Assign) or assign.value is not pmap:
        raise NotVisible("the pmapped step is not simply assigned to a name")
    step = _single_name(assign.targets[0].target) if len(assign.targets) == 1 else None
    if step is None:
        raise NotVisible("the pmapped step is not simply assigned to a name")
    options = _options(pmap)
    arity = _arity(body)
    fixed = _fixed_positions(options, arity)
    flow = _Parents()
    host.body.visit(flow)
    if id(statement) not in flow.order:
        raise NotVisible("the step is not made in the function that calls it")
    if len(flow.stores.get(step, [])) != 1:
        raise NotVisible(f"`{step}` is bound more than once in `{host.name.value}`")
    calls = [_step_call(flow, use, step, arity, fixed) for use in flow.loads.get(step, [])]
    if not calls:
        raise NotVisible(f"`{step}` is not called in `{host.name.value}`")
    for call in calls:  # a call in a nested def or lambda runs when that is called: not followed
        if any(isinstance(a, (cst.FunctionDef, cst.Lambda)) for a in _ancestors(flow, call.call)):
            raise NotVisible(f"`{step}` is called in a nested function")
    program = Program(
        host, statement, options.fun, options.axis, options.donate, [False] * arity, None
    )
    program.fixed, program.statics = fixed, options.statics_arg
    program.made_at = flow.order[id(statement)]
    forms = _Forms(qualname, lambda node: _is_device_count(node, flow, qualname))
    for position in range(arity):
        if position not in fixed:
            _follow_argument(program, flow, forms, calls, position)
    program.outputs, program.varying = _body_outputs(body, program.batches, qualname)
    for call in calls:
        wanted = 1 if program.outputs is None else program.outputs
        if call.readback is None and len(call.targets) != wanted:
            raise NotVisible(f"a call of `{step}` binds its results other than one name each")
        if call.readback is not None:
            if program.outputs is not None or program.varying[0]:
                raise NotVisible(f"`{step}(...)[0]` of a tuple or of a per-device result")
            _read_at_once(program, call.readback, step)
        for output, name in enumerate(call.targets):
            _follow_result(program, flow, forms, calls, step, name, output)
    return program


@dataclass
class _Options:
    fun: cst.Name
    axis: cst.BaseExpression
    donate: cst.Arg | None = None
    in_axes: cst.BaseExpression | None = None
    statics: tuple[int, ...] = ()
    statics_arg: cst.Arg | None = None


def _options(pmap: cst.Call) -> _Options:
    fun = pmap.args[0].value if pmap.args and pmap.args[0].keyword is None else None
    if not isinstance(fun, cst.Name):
        raise NotVisible("the pmapped function is not a def of this module named directly")
    found: dict[str, cst.Arg] = {}
    for i, arg in enumerate(pmap.args[1:], 1):
        keyword = arg.keyword.value if arg.keyword else ("axis_name" if i == 1 else None)
        if keyword not in KEYWORDS or arg.star:
            raise NotVisible(f"pmap's `{keyword or 'argument'}` is not taken by this form yet")
        found[keyword] = arg
    axis = found["axis_name"].value if "axis_name" in found else None
    if not isinstance(axis, cst.SimpleString):
        raise NotVisible("the mapped axis has no literal name")
    options = _Options(fun, axis, found.get("donate_argnums"))
    options.in_axes = found["in_axes"].value if "in_axes" in found else None
    if "static_broadcasted_argnums" in found:
        options.statics_arg = found["static_broadcasted_argnums"]
        options.statics = _literal_ints(options.statics_arg.value)
    return options


def _literal_ints(node: cst.BaseExpression) -> tuple[int, ...]:
    items = [e.value for e in node.elements] if isinstance(node, cst.Tuple) else [node]
    if not all(isinstance(i, cst.Integer) for i in items):
        raise NotVisible("`static_broadcasted_argnums` is not a literal")
    return tuple(int(i.value) for i in items)  # type: ignore[attr-defined]


def _fixed_positions(options: _Options, arity: int) -> dict[int, str]:
    """Return the positions not mapped: `in_axes` None ("none") and static ones ("static")."""
    fixed = {i: "static" for i in options.statics}
    if any(i >= arity or i < 0 for i in fixed):
        raise NotVisible("`static_broadcasted_argnums` out of range")
    axes = options.in_axes
    if axes is None:
        return fixed
    items = [e.value for e in axes.elements] if isinstance(axes, cst.Tuple) else None
    if items is None or len(items) != arity:
        raise NotVisible("`in_axes` is not a tuple with one entry per argument")
    for i, item in enumerate(items):
        if isinstance(item, cst.Name) and item.value == "None":
            fixed.setdefault(i, "none")
        elif not (isinstance(item, cst.Integer) and item.value == "0"):
            raise NotVisible("an `in_axes` entry other than 0 or None")
    return fixed


def _arity(body: cst.FunctionDef) -> int:
    params = body.params
    extra = params.star_arg not in (None, cst.MaybeSentinel.DEFAULT)
    if extra or params.kwonly_params or params.star_kwarg or params.posonly_params:
        raise NotVisible("the body takes more than plain positional parameters")
    if any(p.default is not None for p in params.params):
        raise NotVisible("the body has parameters with defaults")
    return len(params.params)


def _step_call(
    flow: _Parents, use: cst.Name, step: str, arity: int, fixed: dict[int, str]
) -> _Call:
    call = flow.parent.get(id(use))
    around = flow.parent.get(id(call)) if call is not None else None
    if not isinstance(call, cst.Call) or call.func is not use:
        raise NotVisible(f"`{step}` is used other than called")
    values = _positional(call, arity)
    args = [_single_name(v) or ("" if i in fixed else None) for i, v in enumerate(values or [])]
    if values is None or None in args:
        raise NotVisible(f"a call of `{step}` passes other than its {arity} arguments by name")
    names = [a or "" for a in args]
    if isinstance(around, cst.Subscript) and _is_zero_index(
        around.with_changes(value=cst.Name("_")), "_"
    ):
        return _Call(around, call, names, [], readback=around)  # `step(...)[0]`
    if not isinstance(around, cst.Assign) or len(around.targets) != 1:
        raise NotVisible(f"`{step}` is called other than as `out = {step}(...)`")
    targets = _target_names(around.targets[0].target)
    if "?" in targets:
        raise NotVisible(f"a result of `{step}` is not bound to a plain name")
    return _Call(around, call, names, targets)


def _body_outputs(
    body: cst.FunctionDef, batches: list[bool], qualname: Qualname
) -> tuple[int | None, list[bool]]:
    """Return how many results the body returns as a tuple (None: one, not a tuple), and
    which of them may differ between devices (the others are the same on every device)."""
    params = [p.name.value for p in body.params.params]
    varying = {p for p, batch in zip(params, batches) if batch}
    returned: cst.BaseExpression | None = None
    statements = list(body.body.body) if isinstance(body.body, cst.IndentedBlock) else []
    for line in statements:
        small = line.body if isinstance(line, cst.SimpleStatementLine) else None
        if small is None or len(small) != 1:
            raise NotVisible("the body has control flow or compound statements")
        node = small[0]
        if isinstance(node, cst.Assign):
            names = [n for t in node.targets for n in _target_names(t.target)]
            if _is_varying(node.value, varying, qualname):
                varying |= set(names)
            else:
                varying -= set(names)
        elif isinstance(node, cst.Return) and node.value is not None:
            returned = node.value
        elif not (isinstance(node, cst.Expr) and isinstance(node.value, cst.SimpleString)):
            raise NotVisible("the body has statements other than assignments and a return")
    if returned is None:
        raise NotVisible("the body does not end in one return")
    results = list(returned.elements) if isinstance(returned, cst.Tuple) else None
    values = [e.value for e in results] if results is not None else [returned]
    flags = [_is_varying(value, varying, qualname) for value in values]
    return (len(values) if results is not None else None), flags


def _is_varying(node: cst.CSTNode, varying: set[str], qualname: Qualname) -> bool:
    """Return True unless `node` is the same on every device: reduced, or from replicated values.

    A `pmean`/`psum`/`pmax`/`pmin` call is the same on every device whatever it reduces; an
    `axis_index` differs; a name differs when it was computed from what differs.
    """
    if isinstance(node, cst.Call):
        name = qualname(node.func)
        if name in REDUCED:
            return False
        if name in VARYING:
            return True
    if isinstance(node, cst.Name):
        return node.value in varying
    return any(_is_varying(child, varying, qualname) for child in node.children)


def _follow_argument(
    program: Program, flow: _Parents, forms: _Forms, calls: list[_Call], position: int
) -> None:
    """Classify the argument at `position` from every binding of every name passed there.

    A binding of the plain value that a later `x = replicate(x)` (or split) stacks, before any
    call, is where the value comes from, not what the step gets: it is not counted.
    """
    kinds: set[str] = set()
    for call in calls:
        name = call.args[position]
        first_call = min(flow.order[id(c.assign)] for c in calls if c.args[position] == name)
        found = [
            (flow.order[id(b)], b, _binding_kind(program, b, name, forms, calls, flow))
            for b in flow.stores.get(name, [])
        ]
        if not found:  # a global, or a name bound outside the function: not followed
            kinds.add("other")
        stacking = [
            at
            for at, b, kind in found
            if kind in ("replicated", "batch") and _stacks_itself(b, name, forms)
        ]
        for at, _, kind in found:
            upstream = any(at < s < first_call for s in stacking)
            if not (kind == "other" and upstream):
                kinds.add(kind)
    kinds.discard("read back")
    if not kinds or "other" in kinds or ("batch" in kinds and kinds != {"batch"}):
        why = "comes from elsewhere" if "other" in kinds or not kinds else "is mixed"
        raise NotVisible(f"argument {position + 1} of the step {why}: its layout is not visible")
    program.batches[position] = kinds == {"batch"}


def _stacks_itself(binding: cst.CSTNode, name: str, forms: _Forms) -> bool:
    """`x = replicate(x)`: the stacked value is bound to the name of the value it stacks."""
    assert isinstance(binding, cst.Assign)
    source = forms.replicated_source(binding.value) or forms.shard_source(binding.value)
    return source is not None and _single_name(source) == name


def _binding_kind(
    program: Program,
    binding: cst.CSTNode,
    name: str,
    forms: _Forms,
    calls: list[_Call],
    flow: _Parents,
) -> str:
    """Return how a binding of an argument makes it: replicated, a batch, fed back, other."""
    if not isinstance(binding, cst.Assign) or len(binding.targets) != 1:
        return "other"
    if any(binding is c.assign for c in calls):
        return "fed back"  # a result of the step: replicated, as every result is
    if forms.readback_of(binding.value, name):
        return "read back"  # `x = unreplicate(x)`: becomes `x = x`, dropped
    if _single_name(binding.targets[0].target) != name:
        return "other"
    replicated = forms.replicated_source(binding.value)
    if replicated is not None:
        why = "a replication deleted: the value is passed as it is, replicated (`P()`)"
        program.edit(binding.value, why, lambda: replicated)
        return "replicated"
    batch = forms.shard_source(binding.value)
    if batch is not None and program.made_at < flow.order.get(id(binding), -1):
        why = "a split into per-device slices -> this process's part of a batch sharded on the mesh"
        program.edit(binding.value, why, lambda: _global_batch(program, batch))
        return "batch"
    return "other"


def _global_batch(program: Program, source: cst.BaseExpression) -> cst.BaseExpression:
    """`jax.make_array_from_process_local_data(<NamedSharding(mesh, P(axis))>, source)`."""
    text = f"{program.jax}.make_array_from_process_local_data({program.sharding}, SOURCE)"
    filled = cst.parse_expression(text).visit(_Fill({"SOURCE": source}))
    assert isinstance(filled, cst.BaseExpression)
    return filled


class _Edit(cst.CSTTransformer):
    """Apply a program's edits to its host function (original nodes, by id)."""

    def __init__(self, program: Program, indent: str, style: Style) -> None:
        super().__init__()
        self.program, self.indent, self.style = program, indent, style

    def on_leave(self, original_node: cst.CSTNode, updated_node: cst.CSTNode) -> Any:
        edit = self.program.edits.get(id(original_node))
        if edit is not None and isinstance(updated_node, cst.BaseExpression):
            return edit(updated_node)
        if original_node is self.program.statement:
            return cst.FlattenSentinel(self.program.step_statements(self.indent, self.style))
        if _is_self_assignment(updated_node) and not _is_self_assignment(original_node):
            return cst.RemovalSentinel.REMOVE  # `x = replicate(x)` with the replication gone
        return updated_node


def _is_self_assignment(statement: cst.CSTNode) -> bool:
    """`x = x`, which deleting a replication or a readback leaves: dropped."""
    if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
        return False
    node = statement.body[0]
    return (
        isinstance(node, cst.Assign)
        and len(node.targets) == 1
        and isinstance(node.targets[0].target, cst.Name)
        and isinstance(node.value, cst.Name)
        and node.targets[0].target.value == node.value.value
    )


class _Fill(cst.CSTTransformer):
    def __init__(self, values: dict[str, cst.BaseExpression]) -> None:
        super().__init__()
        self.values = values

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.BaseExpression:
        return self.values.get(original_node.value, updated_node)


def _follow_result(
    program: Program,
    flow: _Parents,
    forms: _Forms,
    calls: list[_Call],
    step: str,
    name: str,
    output: int,
) -> None:
    """Check every read of a result: a readback (then deleted) or fed back to the step.

    A result that differs between devices must be read only flattened over the devices
    (`r.reshape(-1)`, `r.reshape((-1,) + r.shape[2:])`): the flat result is that already.
    """
    if program.varying[output]:
        _follow_flattened(program, flow, calls, step, name)
        return
    for binding in flow.stores.get(name, []):
        fed = any(binding is c.assign for c in calls)
        read = isinstance(binding, cst.Assign) and forms.readback_of(binding.value, name)
        if not fed and not read and not _before(flow, binding, calls):
            raise NotVisible(f"`{name}` holds a result of `{step}` and something else")
    feeds = {id(c.call.args[i].value) for c in calls for i, a in enumerate(c.args) if a == name}
    last = max(flow.order[id(c.assign)] for c in calls)
    settled = [  # `x = unreplicate(x)` after the last call: later reads see the read-back value
        b
        for b in flow.stores.get(name, [])
        if isinstance(b, cst.Assign)
        and forms.readback_of(b.value, name)
        and flow.order[id(b)] > last
        and not _in_loop_with(flow, b, calls)
    ]
    for use in flow.loads.get(name, []):
        if id(use) in feeds or _upstream(flow, use, calls):
            continue
        if not _in_loop_with(flow, use, calls) and any(
            flow.order[id(b)] < flow.order[id(use)] and b not in _ancestors(flow, use)
            for b in settled
        ):
            continue
        readback = _readback_around(flow, forms, use, name)
        if readback is None:
            raise NotVisible(f"`{name}`, a result of `{step}`, is read other than as `{name}[0]`")
        why = f"a readback of device 0 deleted: `{name}` is the same on every device"
        program.edit(readback, why, lambda: cst.Name(name))
    del output


DEVICE_COUNTS = frozenset({"jax.local_device_count", "jax.device_count"})


def _is_device_count(node: cst.BaseExpression, flow: _Parents, qualname: Qualname) -> bool:
    """`jax.local_device_count()`, or a name bound only to it in the function.

    Stacking over another number (pmap over some of the devices) keeps the faithful form: the
    mesh of the program-level form spans every device.
    """
    if isinstance(node, cst.Call):
        return not node.args and qualname(node.func) in DEVICE_COUNTS
    name = _single_name(node)
    stores = flow.stores.get(name, []) if name is not None else []
    return bool(stores) and all(
        isinstance(b, cst.Assign) and _is_device_count(b.value, flow, qualname) for b in stores
    )


def _ancestors(flow: _Parents, node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    parent = flow.parent.get(id(node))
    while parent is not None:
        yield parent
        parent = flow.parent.get(id(parent))


def _upstream(flow: _Parents, use: cst.Name, calls: list[_Call]) -> bool:
    """Return True for a read before any call could have made the value (not in their loop)."""
    if not _before(flow, use, calls):
        return False
    return not _in_loop_with(flow, use, calls)


def _in_loop_with(flow: _Parents, node: cst.CSTNode, calls: list[_Call]) -> bool:
    """Return True if `node` is in a loop that also makes a call of the step."""
    loops = {id(a) for a in _ancestors(flow, node) if isinstance(a, (cst.For, cst.While))}
    return any(id(a) in loops for c in calls for a in _ancestors(flow, c.assign))


def _follow_flattened(
    program: Program, flow: _Parents, calls: list[_Call], step: str, name: str
) -> None:
    for binding in flow.stores.get(name, []):
        if not any(binding is c.assign for c in calls) and not _before(flow, binding, calls):
            raise NotVisible(f"`{name}` holds a result of `{step}` and something else")
    for use in flow.loads.get(name, []):
        if _upstream(flow, use, calls):
            continue
        around = list(_ancestors(flow, use))[:6]  # `r.reshape(...)`, `r` in its shape too
        node = next((a for a in around if isinstance(a, cst.Call) and _flattens(a, name)), None)
        if node is None:
            why = f"`{name}`, a per-device result of `{step}`, is read other than flattened"
            raise NotVisible(why)
        reason = f"a flattening of `{name}` over devices deleted: the result is flat already"
        program.edit(node, reason, lambda: _local_part(program, name))


def _flattens(node: cst.Call, var: str) -> bool:
    """`var.reshape(-1)` or `var.reshape((-1,) + var.shape[2:])`."""
    if not isinstance(node.func, cst.Attribute) or node.func.attr.value != "reshape":
        return False
    if _single_name(node.func.value) != var:
        return False
    args = _positional(node, 1)
    shape = args[0] if args else None
    if _is_minus_one(shape):
        return True
    return (
        isinstance(shape, cst.BinaryOperation)
        and isinstance(shape.operator, cst.Add)
        and isinstance(shape.left, cst.Tuple)
        and len(shape.left.elements) == 1
        and _is_minus_one(shape.left.elements[0].value)
        and code(shape.right) in (f"{var}.shape[2:]",)
    )


def _is_minus_one(node: cst.BaseExpression | None) -> bool:
    return (
        isinstance(node, cst.UnaryOperation)
        and isinstance(node.operator, cst.Minus)
        and isinstance(node.expression, cst.Integer)
        and node.expression.value == "1"
    )


def _local_part(program: Program, name: str) -> cst.BaseExpression:
    """This process's part of a result sharded over the devices (in one process, all of it)."""
    spec = f"{code(program.spec)}({code(program.axis)})"
    text = f"{program.hosts}.global_array_to_host_local_array({name}, {program.mesh}, {spec})"
    return cst.parse_expression(text)


def _read_at_once(program: Program, readback: cst.Subscript, step: str) -> None:
    """`step(...)[0]` -> `step(...)`: the result is the same on every device."""
    node_id = id(readback)
    program.nodes[node_id] = readback
    program.reasons[node_id] = f"a readback of device 0 deleted: `{step}`'s result is replicated"
    program.edits[node_id] = lambda updated: updated.value  # type: ignore[attr-defined]


def _before(flow: _Parents, binding: cst.CSTNode, calls: list[_Call]) -> bool:
    """Return True for a binding before the first call (an argument's plain value)."""
    return flow.order[id(binding)] < min(flow.order[id(c.assign)] for c in calls)


def _readback_around(
    flow: _Parents, forms: _Forms, use: cst.Name, name: str
) -> cst.BaseExpression | None:
    node: cst.CSTNode | None = use
    for _ in range(4):  # var[0]: 1 up; tree.map(lambda v: v[0], var): Arg, Call
        node = flow.parent.get(id(node)) if node is not None else None
        if isinstance(node, cst.BaseExpression) and forms.readback_of(node, name):
            return node
    return None
