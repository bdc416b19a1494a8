"""The forms the program-level pmap migration recognizes in a function: replications, splits,
readbacks of values around one pmapped step, and where each name is bound and read."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TypeGuard

import libcst as cst
import libcst.matchers as m

from jaxmigrate.toolkit.emit import code

from ._imported import NO_IMPORTS, Imported
from ._layout import (
    TRANSFERS,
    Layout,
    Match,
    Role,
    Transfer,
    as_row,
    counts_devices,
    droppable,
    fewer,
    holes_of,
    lifted,
    match,
    rows,
    tree_mapped,
)
from ._reach import Flow, replaced
from ._summary import Summaries, Values, called_value, name_reads

Qualname = Callable[[cst.BaseExpression], "str | None"]
NameTest = Callable[[cst.BaseExpression, str], bool]  # is the expression such a form of the name?

ARRAY_ATTRIBUTES = frozenset(
    {"T", "mT", "at", "dtype", "flat", "imag", "itemsize", "nbytes", "ndim", "real", "shape"}
    | {"sharding", "size", "addressable_shards", "global_shards", "aval", "weak_type"}
)
DEVICE_GET = frozenset({"jax.device_get"})
# The same values as a host (or device) array: a copy, no reordering.
RESHAPES = frozenset({"numpy.reshape", "jax.numpy.reshape"})
HOST_COPIES = frozenset({"numpy.asarray", "numpy.array", "jax.device_get", "jax.numpy.asarray"})
REPLICATIONS = rows(Role.PRODUCER, Layout.REPLICAS)
SPLITS = rows(Role.PRODUCER, Layout.PER_DEVICE)
KEY_SPLITS = rows(Role.PRODUCER, Layout.KEYS)
READBACKS = tuple(r for r in TRANSFERS if r.name in ("unreplicate", "index"))


def target_names(target: cst.BaseExpression) -> list[str]:
    if isinstance(target, cst.Name):
        return [target.value]
    if isinstance(target, (cst.Tuple, cst.List)):
        return [n for e in target.elements for n in target_names(e.value)]
    return ["?"]  # attributes, subscripts, starred: not followed


def single_name(node: cst.BaseExpression) -> str | None:
    return node.value if isinstance(node, cst.Name) else None


def base_of(node: cst.BaseExpression) -> cst.BaseExpression:
    """`x` of `x.a["k"].b`: what its attributes and items are read from."""
    while isinstance(node, (cst.Attribute, cst.Subscript)):
        node = node.value
    return node


def positional(call: cst.Call, count: int) -> list[cst.BaseExpression] | None:
    if len(call.args) != count or any(a.keyword is not None or a.star for a in call.args):
        return None
    return [a.value for a in call.args]


def bound_arguments(
    callee: cst.FunctionDef, call: cst.Call
) -> dict[str, cst.BaseExpression] | None:
    """The value `call` passes to each parameter of `callee` it fills; None when that is not
    visible (`*args`, `**kwargs`, positional-only parameters, a keyword it lacks)."""
    params = callee.params
    if params.posonly_params or isinstance(params.star_arg, cst.Param) or params.star_kwarg:
        return None
    if any(a.star for a in call.args):
        return None
    named = {p.name.value for p in (*params.params, *params.kwonly_params)}
    plain = [a.value for a in call.args if a.keyword is None]
    if len(plain) > len(params.params):
        return None
    found = {p.name.value: v for p, v in zip(params.params, plain)}
    for arg in call.args:
        if arg.keyword is not None:
            if arg.keyword.value not in named or arg.keyword.value in found:
                return None
            found[arg.keyword.value] = arg.value
    return found


KEY = m.Subscript(slice=[m.SubscriptElement(m.Index(m.SimpleString()))])  # `...["k"]`
FILLS = frozenset(
    f"{np}.{fill}" for np in ("numpy", "jax.numpy") for fill in ("ones", "zeros", "full", "empty")
)


class Forms:
    """Recognizes the stacking and readback forms, by meaning."""

    def __init__(
        self,
        qualname: Qualname,
        counts: Callable[[cst.BaseExpression], bool] = lambda _: True,
        defs: Mapping[str, cst.FunctionDef] | None = None,
        named: Callable[[str], cst.Lambda | None] = lambda _: None,
        values: Callable[[cst.Name], cst.BaseExpression | None] | None = None,
        bound: Values | None = None,
        imported: Imported = NO_IMPORTS,
        elsewhere: Callable[[str, Sequence[cst.FunctionDef]], str] = lambda *_: "",
    ) -> None:
        self.qualname = qualname
        self.elsewhere = elsewhere  # see `ModuleFacts.elsewhere`
        self.imported = imported  # the code base's modules the module imports: their defs
        self.values = values  # the one value a read name may have (tuples are read through)
        self.counts = counts  # is this the number of local devices (pmap's mapped size)?
        # The module's functions, by name, that the host does not shadow: helpers splitting or
        # replicating their argument (`shard_batch(b)`), or flattening a result (`tohost(r)`).
        self.defs: Mapping[str, cst.FunctionDef] = defs or {}
        self.named = named  # the lambda a name of the function is bound to, if any
        # The module's names bound once, at module level (`ModuleFacts.values`), the function
        # does not bind: a call (`cross_replica_mean`), a number (`LR = 0.05`), ...
        self.bound = bound or {}
        self.summaries = Summaries(self.defs, qualname, self.bound)

    def _is(self, node: cst.BaseExpression, names: frozenset[str]) -> bool:
        return isinstance(node, cst.Call) and self.qualname(node.func) in names

    def _copied_zeros(self, node: cst.BaseExpression) -> cst.BaseExpression | None:
        """`jax.tree.map(lambda v: np.array(v[0]), x)` -> x: device 0's copy of each leaf,
        fetched to the host."""
        mapped = tree_mapped(node, self.qualname, self.named)
        copied = mapped is not None and self.host_copy(mapped[1], mapped[0], "{v}[0]")
        return mapped[2] if mapped is not None and copied else None

    def transfer(
        self, node: cst.BaseExpression, table: tuple[Transfer, ...], loose: bool = False
    ) -> Match | None:
        """Return the row of `table` that `node` is, itself or leaf by leaf (`jax.tree.map`);
        `loose`: whatever count or devices it names (`match`)."""
        if self.values is not None:  # `x.reshape(prefix + x.shape[1:])`, `prefix = (n, k)`
            node = _tuples_inlined(node, self.values)
        found = match(called_value(node, self.bound), self.qualname, self.counts, table, loose)
        found = found or lifted(node, self.qualname, self.counts, table, self.named, loose)
        return found or (None if loose else self.summaries.read(node, table, self.counts))

    def over_part(self, node: cst.BaseExpression) -> cst.BaseExpression | None:
        """Return the count or devices a replication, split or key split `node` is stacks over
        when they are not visibly every device of this process, else None (`_layout.fewer`)."""
        found = self.transfer(node, REPLICATIONS + SPLITS + KEY_SPLITS, loose=True)
        return None if found is None else fewer(found, self.qualname, self.counts)

    def replicated_source(self, node: cst.BaseExpression) -> cst.BaseExpression | None:
        """Return x of a replication of x, else None."""
        found = self.transfer(node, REPLICATIONS)
        return found.source if found is not None else None

    def split(self, node: cst.BaseExpression) -> Match | None:
        """Return the split of a flat batch into per-device slices that `node` is (its source:
        the flat batch), else None.

        A dict or tuple written out of splits (`{"x": x.reshape((n, -1) + x.shape[1:]), ...}`)
        is the split of the same literal of their sources: each leaf is split alike."""
        if isinstance(node, (cst.Dict, cst.Tuple)) and node.elements:
            return as_row("shard", self._split_literal(node), node)
        if (found := self.transfer(node, SPLITS)) is not None:
            return found
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute):
            return as_row("shard", self._split_to_rows(node) or self._filled_flat(node), node)
        return None

    def _filled_flat(self, node: cst.Call) -> cst.BaseExpression | None:
        """`jnp.ones([n, b, ...])` (`zeros`, `full`, `empty`; numpy's too), `n` the number of
        local devices: n equal blocks of b rows, the split of `jnp.ones([n * b, ...])`; else
        None."""
        if self.qualname(node.func) not in FILLS or not node.args or node.args[0].keyword:
            return None
        shape = node.args[0].value
        if not isinstance(shape, (cst.List, cst.Tuple)) or len(shape.elements) < 2:
            return None
        dims = [e.value for e in shape.elements if type(e) is cst.Element]  # not `*rest`
        if len(dims) != len(shape.elements) or not self.counts(dims[0]):
            return None
        rows = dims[1]
        if isinstance(rows, cst.BinaryOperation):
            rows = rows.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
        merged = cst.BinaryOperation(dims[0], cst.Multiply(), rows)
        first = shape.elements[0].with_changes(value=merged)
        if len(shape.elements) == 2:  # now the last: `(n * b,)`, `[n * b]`, not `(n * b, )`
            tuple_ = isinstance(shape, cst.Tuple)
            first = first.with_changes(comma=cst.Comma() if tuple_ else cst.MaybeSentinel.DEFAULT)
        shape = shape.with_changes(elements=[first, *shape.elements[2:]])
        return node.with_changes(args=[node.args[0].with_changes(value=shape), *node.args[1:]])

    def shard_source(self, node: cst.BaseExpression) -> cst.BaseExpression | None:
        """Return x of a split of a flat batch x into per-device slices, else None."""
        found = self.split(node)
        return found.source if found is not None else None

    def _split_literal(self, node: cst.Dict | cst.Tuple) -> cst.BaseExpression | None:
        """The sources of a dict or tuple of splits, in the same literal; else None."""
        sources: list[cst.BaseExpression] = []
        for element in node.elements:
            if not isinstance(element, (cst.DictElement, cst.Element)):
                return None  # `**d` or `*t`: leaves not written out
            if (source := self.shard_source(element.value)) is None:
                return None
            sources.append(source)
        changed = [e.with_changes(value=v) for e, v in zip(node.elements, sources)]
        text = code(node)
        if "\n" in text and "#" not in text:  # laid out for the splits: written anew, compact
            return _compact(node, sources)
        return node.with_changes(elements=changed)

    def _split_to_rows(self, node: cst.Call) -> cst.BaseExpression | None:
        """`x.reshape(n, -1, 3)` -> `x.reshape(-1, 3)`: device i's slice is the i-th of n equal
        blocks of rows of that (row-major order, the same elements); else None.

        The shape as arguments, a tuple or a list, of the array's method or of
        `np.reshape(x, shape)`/`jnp.reshape`, its spelling kept. The block's row count is any
        expression without a call (`-1`, `x.shape[0] // n`: a reshape that succeeds has one
        value there) and becomes `-1`; the other dimensions, no call either, stay."""
        if any(a.keyword or a.star for a in node.args):
            return None
        function = self.qualname(node.func) in RESHAPES
        method = isinstance(node.func, cst.Attribute) and node.func.attr.value == "reshape"
        if (function and len(node.args) != 2) or not (function or method):
            return None
        shape = [node.args[1].value] if function else [a.value for a in node.args]
        literal = shape[0] if len(shape) == 1 else None
        if isinstance(literal, (cst.Tuple, cst.List)):
            if any(isinstance(e, cst.StarredElement) for e in literal.elements):
                return None
            shape = [e.value for e in literal.elements]
        elif function:
            return None
        if len(shape) < 2 or not self.counts(shape[0]):
            return None
        if not all(droppable(d, self.qualname) for d in shape[1:]):
            return None  # a call: another shape, maybe one that reads the split value
        if any(holes_of("-1", d) is not None for d in shape[2:]):
            return None  # `x.reshape(n, 8, -1)`: the rows are given, the columns left to fill
        dims = [cst.UnaryOperation(cst.Minus(), cst.Integer("1")), *shape[2:]]
        if not isinstance(literal, (cst.Tuple, cst.List)):  # the shape as arguments
            return node.with_changes(args=[cst.Arg(d) for d in dims])
        written = literal.with_changes(elements=[cst.Element(d) for d in dims])  # `(-1,)` too
        return node.with_changes(args=[*node.args[:-1], node.args[-1].with_changes(value=written)])

    def key_split(self, node: cst.BaseExpression) -> Match | None:
        """Return the per-device keys `node` makes (`jax.random.split(k, n)`, n the number of
        local devices; `common_utils.shard_prng_key(k)`), else None."""
        return match(node, self.qualname, self.counts, KEY_SPLITS)

    def host_copy(self, node: cst.BaseExpression, var: str, read: str = "{v}") -> bool:
        """`np.asarray(var)`, `np.array(var)`, `jax.device_get(var)`: `var`'s values, copied
        (`read`: of `var` read so, `np.array(var[0])` for `"{v}[0]"`)."""
        args = positional(node, 1) if self._is(node, HOST_COPIES) else None  # type: ignore[arg-type]
        holes = holes_of(read, args[0]) if args is not None else None
        return holes is not None and single_name(holes["v"]) == var

    def readback_of(self, node: cst.BaseExpression, var: str) -> bool:
        """`var[0]`, `jax.device_get(var)[0]`, `jax.tree.map(lambda v: v[0], var)`,
        `unreplicate(var)`: device 0's copy of the whole of `var`; also fetched to the host
        (`jax.device_get(unreplicate(var))`, `np.asarray(var[0])`): the same values."""
        args = positional(node, 1) if self._is(node, HOST_COPIES) else None  # type: ignore[arg-type]
        if args is not None and self.readback_value(args[0], var) is not None:
            node = args[0]
        # `tree.map(lambda v: np.array(v[0]), var)`: each leaf's copy on the host
        if (copied := self._copied_zeros(node)) is not None:
            return single_name(copied) == var and self.readback_value(node, var) is not None
        read = self.readback_value(node, var)
        if read is None or read[1] is read[0]:
            return read is not None
        args = positional(read[1], 1) if isinstance(read[1], cst.Call) else None
        return args is not None and args[0] is read[0]  # `jax.device_get(var)[0]`

    def indexes_whole(self, node: cst.BaseExpression) -> bool:
        """Whether `node`, a readback, indexes the value whole (`x[0]`, a def returning `p[0]`),
        not leaf by leaf (`jax.tree.map(lambda v: v[0], x)`, `unreplicate(x)`)."""
        found = self.transfer(node, READBACKS)
        return found is not None and found.row.name == "index" and not found.lifted

    def readback_value(
        self, node: cst.BaseExpression, var: str
    ) -> tuple[cst.Name, cst.BaseExpression] | None:
        """Return (the `var` read, what is left once device 0's copy is the value) of a readback
        of `var` or of a field of it: `var.a.b[0]` -> `var.a.b`, `jax.device_get(var)[0]` ->
        `jax.device_get(var)`, `unreplicate(var.a)` -> `var.a`, `jax.tree.map(lambda v: v[0],
        var)` -> `var`; else None."""
        found = self.transfer(node, READBACKS)  # the table's rows, lifted, or a summary
        if found is None:  # `jax.tree.map(lambda v: np.array(v[0]), var)`: each leaf's copy
            copied = self._copied_zeros(node)
            root = root_name(copied) if copied is not None else None
            if root is None or root.value != var:
                return None
            assert isinstance(node, cst.Call)
            fn, tree = node.args  # two, by position (`tree_mapped`)
            if not isinstance(fn.value, cst.Lambda):  # `to_host = lambda v: ...` read elsewhere
                return None  # too: it is not rewritten here
            if self._is(fn.value.body, DEVICE_GET):
                assert isinstance(fn.value.body, cst.Call)  # `jax.device_get(x)`
                return root, fn.value.body.with_changes(
                    args=[tree.with_changes(comma=cst.MaybeSentinel.DEFAULT)]
                )
            return root, _copy_per_leaf(node)
        path = found.source  # `jax.device_get(var)[0]`: `var`'s copy on the host
        got = path if found.row.name == "index" and self._is(path, DEVICE_GET) else None
        root = root_name(got.args[0].value if isinstance(got, cst.Call) and got.args else path)
        return (root, found.source) if root is not None and root.value == var else None


def _tuples_inlined(
    node: cst.BaseExpression, values: Callable[[cst.Name], cst.BaseExpression | None]
) -> cst.BaseExpression:
    """`node` with each name read whose one value is a tuple literal replaced by that tuple."""
    reads = name_reads(node)
    return replaced(node, {id(n): v for n in reads if isinstance(v := values(n), cst.Tuple)})


def _copy_per_leaf(node: cst.BaseExpression) -> cst.BaseExpression:
    """`jax.tree.map(lambda v: np.array(v[0]), x)` -> `jax.tree.map(lambda v: np.array(v), x)`."""
    assert isinstance(node, cst.Call)
    fn = node.args[0].value
    assert isinstance(fn, cst.Lambda) and isinstance(fn.body, cst.Call)
    leaf = fn.body.args[0]
    assert isinstance(leaf.value, cst.Subscript)
    body = fn.body.with_changes(args=[leaf.with_changes(value=leaf.value.value)])
    mapped = node.args[0].with_changes(value=fn.with_changes(body=body))
    return node.with_changes(args=[mapped, *node.args[1:]])


def root_name(node: cst.BaseExpression) -> cst.Name | None:
    """`x` of `x`, `x.a.b` or `x["k"].a`: a field of a pytree; None for anything else.

    An array's own attributes (`x.shape[0]`, `x.T[0]`) are no field: device 0 is not read there.
    A field of a replicated pytree is replicated; of a batch split per leaf, split the same way.
    """
    while _is_field(node):
        node = node.value
    return node if isinstance(node, cst.Name) else None


def field_top(flow: Flow, use: cst.Name) -> cst.BaseExpression:
    """The outermost field `use.a["k"].b` read around `use` (`use` itself when none)."""
    node: cst.BaseExpression = use
    parent = flow.parent.get(id(node))
    while _is_field(parent) and parent.value is node:
        node = parent
        parent = flow.parent.get(id(node))
    return node


def readback_around(
    flow: Flow, forms: Forms, use: cst.Name, name: str
) -> tuple[cst.BaseExpression, cst.BaseExpression] | None:
    """Return the readback of device 0 reading `use` and what it becomes, else None."""
    # var[0]: 1 up; var.a.b[0]: 3; jax.device_get(var.a)[0]: 5
    for node in list(flow.ancestors(use))[:6]:
        if isinstance(node, cst.BaseExpression):
            read = forms.readback_value(node, name)
            if read is not None and read[0] is use:
                return node, read[1]
    return None


def _is_field(node: cst.CSTNode | None) -> TypeGuard[cst.Attribute | cst.Subscript]:
    """`.a` or `["k"]`, a field of a pytree read: not an array's own attribute (`ARRAY_ATTRIBUTES`)
    nor an index (an array cannot be indexed by a string: `["k"]` is a dict's entry)."""
    if isinstance(node, cst.Attribute):
        return node.attr.value not in ARRAY_ATTRIBUTES
    return isinstance(node, cst.Subscript) and m.matches(node, KEY)


def is_device_count(
    node: cst.BaseExpression, flow: Flow, qualname: Qualname, seen: frozenset[str] = frozenset()
) -> bool:
    """`jax.local_device_count()`, or a name bound only to it in the function.

    Stacking over another number (pmap over some of the devices) keeps the faithful form: the
    mesh of the program-level form spans every device.
    """
    if isinstance(node, cst.Call):
        return counts_devices(node, qualname)
    name = single_name(node)
    if name is None or name in seen:  # `n = n`, or names bound to each other
        return False
    # `n` of the function a nested def (`one_step`) is written in
    if (outer := flow.free(name)) is not None:
        return is_device_count(node, outer, qualname, seen)
    stores = flow.stores.get(name, [])
    return bool(stores) and all(
        isinstance(b, cst.Assign) and is_device_count(b.value, flow, qualname, seen | {name})
        for b in stores
    )


FLATTENINGS = (
    "{x}.reshape(-1)",
    "{x}.reshape((-1,) + {v}.shape[2:])",
    "{x}.reshape(-1, *{v}.shape[2:])",
)


def flattens(node: cst.Call, var: str, copied: NameTest = lambda *_: False) -> bool:
    """`var.reshape(-1)` or `var.reshape((-1,) + var.shape[2:])`, `var` maybe `copied` first
    (`np.asarray(var).reshape(-1)`)."""
    for text in FLATTENINGS:
        holes = holes_of(text, node)
        if holes is not None and single_name(holes.get("v", cst.Name(var))) == var:
            return single_name(holes["x"]) == var or copied(holes["x"], var)
    return False


def _compact(node: cst.Dict | cst.Tuple, values: list[cst.BaseExpression]) -> cst.BaseExpression:
    """`node` with `values`, in default whitespace (`(x, y)`, `{"x": x}`): the line breaks were
    the splits' (the edited statement is laid out again when it no longer fits)."""
    if isinstance(node, cst.Tuple):
        return cst.Tuple([cst.Element(v) for v in values])
    keys = [e.key for e in node.elements if isinstance(e, cst.DictElement)]
    return cst.Dict([cst.DictElement(k, v) for k, v in zip(keys, values)])
