"""Summaries of the code base's own helpers: a def whose return value is one row of the
transfer table applied to one of its parameters.

`def replicate(tree, n): return jax.tree.map(lambda a: np.broadcast_to(a, (n, *a.shape)), tree)`
is the `broadcast_to` row of `tree`, given that `n` is the number of local devices; a call
`replicate(params, jax.local_device_count())` is then read as that row of `params`, and
rewritten as the row's template at the call site. The summary is read from the helper's body
with the same table (`match`, `lifted`), once per helper and analysis.

A row that leaves its value as it is (`{x}`, the same layout: the mean over devices of equal
copies) may also be applied to one field of the parameter, the parameter otherwise returned
whole: `return state.replace(batch_stats=mean(state.batch_stats))` (a flax `TrainState`),
`return state.copy({"batch_stats": mean(state["batch_stats"])})` (a flax `FrozenDict`) is that
row of `state`. A name bound once at module level to a function (`cross_replica_mean =
jax.pmap(...)`) is read as that function where it is called (`values`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import libcst as cst
import libcst.matchers as m

from jaxmigrate.toolkit.emit import code
from jaxmigrate.toolkit.imports import is_docstring

from ._imported import NO_IMPORTS, Imported
from ._layout import _HOLE, Counts, Match, Qualname, Transfer, counts_devices, lifted, match
from ._reach import nodes_in, replaced

# The holes a summarised row's template may have besides its source: the module's spellings.
CONTEXT = frozenset({"value", "jax", "jnp", "sharding", "mesh", "hosts", "spec", "axis", "np"})


@dataclass(frozen=True)
class Summary:
    """What a helper returns: `row` of its parameter at `source`, the parameters at `counts`
    being the number of local devices (the call must pass that number there)."""

    row: Transfer
    source: int
    counts: tuple[int, ...]
    lifted: bool


def summarize(
    fn: cst.FunctionDef, qualname: Qualname, values: Values | None = None
) -> Summary | None:
    """Return what `fn` returns of its parameters, read with the transfer table; None unless
    its body is `n = jax.local_device_count()` lines, then `return <row of a parameter>`
    (or of one field of it, for a row keeping its value: `_field_carried`)."""
    params, lines = fn.params, list(fn.body.body if isinstance(fn.body, cst.IndentedBlock) else ())
    names = [p.name.value for p in params.params]
    if not _plain(fn):
        return None
    lines = lines[1 if lines and is_docstring(lines[0]) else 0 :]
    nested: dict[str, cst.Lambda] = {}
    while lines and isinstance(lines[0], cst.FunctionDef):  # `def f(leaf): ...` it maps
        fun = as_lambda(lines[0])
        if fun is None or lines[0].name.value in names:
            return None
        nested[lines[0].name.value] = fun
        lines = lines[1:]
    one = m.SimpleStatementLine([m.DoNotCare()])  # a line of one statement
    if not lines or not all(m.matches(line, one) for line in lines):
        return None
    smalls = [cst.ensure_type(line, cst.SimpleStatementLine).body[0] for line in lines]
    counted = {
        n.target.value
        for a in smalls[:-1]
        if isinstance(a, cst.Assign) and counts_devices(a.value, qualname)
        for n in a.targets
        if isinstance(n.target, cst.Name) and n.target.value not in names
    }
    last = smalls[-1]
    if len(counted) != len(smalls) - 1 or not isinstance(last, cst.Return) or not last.value:
        return None  # a statement besides `n = jax.local_device_count()`, or no `return x`

    def counts(node: cst.BaseExpression) -> bool:
        if isinstance(node, cst.Name):
            return node.value in counted or node.value in names
        return counts_devices(node, qualname)

    seen = {k: v for k, v in (values or {}).items() if k not in names and k not in counted}
    value = called_value(last.value, seen)  # a module name the helper does not shadow
    found = match(value, qualname, counts)
    found = found or lifted(value, qualname, counts, named=nested.get)
    found = found or _field_carried(last.value, qualname, seen)
    source = found.source if found is not None and found.row.template else None
    if not isinstance(source, cst.Name) or source.value not in names or found is None:
        return None
    if set(_HOLE.findall(found.row.template or "")) - {found.row.source} - CONTEXT:
        return None  # a hole of the rewrite the call site cannot fill
    by_count = [
        names.index(h.value)
        for k in found.row.counts
        if isinstance(h := found.holes[k], cst.Name) and h.value in names
    ]
    if set(range(len(names))) - {names.index(source.value), *by_count}:
        return None  # a parameter the row does not read: the helper is more than the row
    return Summary(found.row, names.index(source.value), tuple(by_count), found.lifted)


def as_lambda(fn: cst.FunctionDef) -> cst.Lambda | None:
    """`def f(v): v = g(v); return h(v)` as the one lambda it is, `lambda v: h(g(v))`: one
    parameter, rebound only by assignments of an expression of it; else None."""
    if not _plain(fn) or fn.asynchronous or len(fn.params.params) != 1:
        return None
    name, lines = fn.params.params[0].name.value, fn.body.body
    if not isinstance(fn.body, cst.IndentedBlock) or not lines:
        return None
    body: cst.BaseExpression = cst.Name(name)
    for i, line in enumerate(lines):
        last = i == len(lines) - 1
        kind = m.Return() if last else m.Assign(targets=[m.AssignTarget(m.Name(name))])
        matched = m.matches(line, m.SimpleStatementLine([kind]))  # one statement, of that kind
        value = line.body[0].value if matched else None  # type: ignore[attr-defined]
        if value is None or _binds(value):
            return None  # not `v = f(v)`, then `return g(v)`; or names of its own (`:=`, ...)
        body = replaced(value, {id(n): body for n in name_reads(value) if n.value == name})
    return cst.Lambda(cst.Parameters([cst.Param(cst.Name(name))]), body)


def _plain(fn: cst.FunctionDef) -> bool:
    """Return True for a def without decorators whose parameters are all plain ones (no
    `*args`, `**kwargs`, keyword-only or positional-only ones) without defaults."""
    params = fn.params
    if fn.decorators or params.kwonly_params or params.posonly_params or params.star_kwarg:
        return False
    return not isinstance(params.star_arg, cst.Param) and not any(p.default for p in params.params)


SCOPED = (cst.Lambda, cst.ListComp, cst.SetComp, cst.DictComp, cst.GeneratorExp, cst.NamedExpr)


def _binds(node: cst.CSTNode) -> bool:
    return isinstance(node, SCOPED) or any(_binds(c) for c in node.children)


def name_reads(node: cst.CSTNode) -> list[cst.Name]:
    """The names `node` reads: not an attribute's name (`x.shape`) or a keyword's."""
    other = {id(a.attr) for a in nodes_in(node, cst.Attribute)}
    other |= {id(a.keyword) for a in nodes_in(node, cst.Arg) if a.keyword is not None}
    return [n for n in nodes_in(node, cst.Name) if id(n) not in other]


@dataclass
class Summaries:
    """The summaries of the module's helpers, each read once (`defs`: the helpers by name;
    `values`: the module's names bound once to a value, read where called)."""

    defs: Mapping[str, cst.FunctionDef]
    qualname: Qualname
    values: Values
    known: dict[str, Summary | None] = field(default_factory=dict)

    def read(
        self, node: cst.BaseExpression, table: tuple[Transfer, ...], counts: Counts
    ) -> Match | None:
        """Return `node`, a call of a helper, read as its summary's row of the argument, when
        that row is in `table` and the call passes the number of local devices where the
        helper needs it; else None."""
        if not isinstance(node, cst.Call) or not isinstance(node.func, cst.Name):
            return None
        fn = self.defs.get(node.func.value)
        if fn is None or any(a.keyword or a.star for a in node.args):
            return None
        if fn.name.value not in self.known:
            self.known[fn.name.value] = summarize(fn, self.qualname, self.values)
        found, args = self.known[fn.name.value], [a.value for a in node.args]
        if found is None or found.row not in table or len(args) != len(fn.params.params):
            return None
        if not all(counts(args[i]) for i in found.counts):
            return None
        return Match(found.row, {found.row.source: args[found.source], "value": node}, found.lifted)


Values = Mapping[str, cst.BaseExpression]  # names bound once at module level, by value


@dataclass(frozen=True)
class Declarable:
    """A def as `[tool.jaxmigrate] pmap-replicated` names it (`Evaluator.run`, `evaluate`), and
    the parameters that entry says its callers pass as equal copies, one per local device."""

    spelling: str
    copies: frozenset[str] = frozenset()
    # Who says the callers pass copies: "" for `[tool.jaxmigrate] pmap-replicated`, else
    # what the analysis saw (every call of the def in the code base passing a replication)
    seen: str = ""
    # By parameter not seen so: the first call passing another value (`_survey._copies_seen`)
    unseen: Mapping[str, str] = field(default_factory=dict)


NOT_DECLARABLE = Declarable("")  # a def no entry can name (nested in another def)


@dataclass(frozen=True)
class ModuleFacts:
    """What the analyses know of the module: its `defs` by name (the helpers a body or a call
    may reach), its names bound once, at module level, by a plain assignment (`values`: a call
    is read where called, `called_value`; a number, `NUMBERS`, as a Python float) or to a string
    (`constants`: `_AXIS = "i"`, or a field `self._axis_name` set once in `__init__`: an axis's
    literal name)."""

    defs: Mapping[str, cst.FunctionDef] = field(default_factory=dict)
    values: Values = field(default_factory=dict)
    constants: Mapping[str, str] = field(default_factory=dict)
    imported: Imported = NO_IMPORTS  # the code base's modules it imports: their defs
    # By id of a def of the module or a method of its classes: how `[tool.jaxmigrate]
    # pmap-replicated` names it, and the parameters it says its callers pass as equal copies,
    # one per local device (`_flow._declared_copies`)
    replicated: Mapping[int, Declarable] = field(default_factory=dict)
    # Where code other than the defs given may use a def of the module (another function,
    # another module: `_passon.elsewhere`), "" when nowhere
    elsewhere: Callable[[str, Sequence[cst.FunctionDef]], str] = lambda *_: ""
    # The axes every batch norm of the module and of those it imports averages its statistics
    # over (`_body.averaged_axes`); empty when none is known
    norm_axes: frozenset[str] = frozenset()


NO_FACTS = ModuleFacts()
NUMBERS = (cst.Float, cst.Integer, cst.UnaryOperation)  # the `values` read as numbers (`LR = 0.05`)


def called_value(node: cst.BaseExpression, values: Values) -> cst.BaseExpression:
    """Return `node`, a call `f(x)` of a name `values` binds to a call (a function made by a
    call: `jax.pmap(...)`), as that function called (`jax.pmap(...)(x)`, matched by the table); else `node`. The arguments are `node`'s
    own (a match's source is the code at the call site)."""
    func = node.func if isinstance(node, cst.Call) else None
    if isinstance(func, cst.Name) and isinstance(value := values.get(func.value), cst.Call):
        return node.with_changes(func=value)
    return node


def is_mean(pmap: cst.BaseExpression, qualname: Qualname) -> bool:
    """`jax.pmap(lambda x: lax.pmean(x, "x"), "x")`: the table's mean over devices, once called."""
    found = match(cst.Call(pmap, [cst.Arg(cst.Name("x"))]), qualname)
    return found is not None and found.row.name == "cross_device_mean"


def _field_carried(node: cst.BaseExpression, qualname: Qualname, values: Values) -> Match | None:
    """Return `p.replace(f=<row of p.f>)` / `p.copy({"k": <row of p["k"]>})` as that row of
    `p`, for a row that leaves the value as it is (its template `{x}`, its layout kept): the
    whole of `p` is then what it was, field by field; else None."""
    match node:
        case cst.Call(
            func=cst.Attribute(cst.Name(owner), cst.Name("replace")),  # a dataclass's
            args=[cst.Arg(field, keyword=cst.Name(key), star="")],
        ):
            wanted: cst.BaseExpression = cst.Attribute(cst.Name(owner), cst.Name(key))
        case cst.Call(
            func=cst.Attribute(cst.Name(owner), cst.Name("copy")),  # a FrozenDict's
            args=[cst.Arg(cst.Dict([cst.DictElement(key_node, field)]), keyword=None, star="")],
        ):
            wanted = cst.Subscript(cst.Name(owner), [cst.SubscriptElement(cst.Index(key_node))])
        case _:
            return None
    found = match(called_value(field, values), qualname)
    if found is None or found.row.template != "{x}" or found.row.takes is not found.row.gives:
        return None
    if code(found.source) != code(wanted):
        return None  # the row of another value than the field it replaces
    return Match(found.row, {found.row.source: cst.Name(owner), "value": node})
