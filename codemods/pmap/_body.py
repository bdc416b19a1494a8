"""Which results of a pmapped body are the same on every device, read from the body's code.

A result gets `out_specs=P()` (one value, device 0's, with `check_vma=False`) only when it is
the same on every device, so the analysis is sound and timid: a value is the same on every
device when it is a `pmean`/`psum`/`pmax`/`pmin`/`all_gather` over the step's axis (no
`axis_index_groups`), or computed from such values and replicated arguments alone; it differs
when it is computed from a mapped argument (a batch, per-device keys), `axis_index`, a
`ppermute`-like collective, a function of the module that uses one, or a closure (a nested def,
a lambda) reading anything that differs anywhere in the body. Control flow merges: after an
`if`, a name differs when it differs on either branch; a loop runs to a fixed point. A
statement the analysis does not model raises NotVisible (the faithful form is kept).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeAlias, TypeVar, cast

import libcst as cst
import libcst.matchers as m

from jaxmigrate.toolkit.cstutil import names_in
from jaxmigrate.toolkit.emit import code
from jaxmigrate.toolkit.names import walk

from ._declines import Decline, NotVisible
from ._forms import Qualname, single_name, target_names
from ._imported import NO_IMPORTS, Function, Imported
from ._layout import TREE_MAPS
from ._passon import parameter_for
from ._reach import (
    SCOPES,
    Comprehension,
    Flow,
    Reach,
    assign_targets,
    else_of,
    nodes_in,
    params_of,
    statements,
)

REDUCED = frozenset({f"jax.lax.{op}" for op in ("pmean", "psum", "pmax", "pmin", "all_gather")})
PER_DEVICE = frozenset(
    f"jax.lax.{op}"
    for op in ("axis_index", "ppermute", "pshuffle", "pswapaxes", "all_to_all", "psum_scatter")
)
Defs = Mapping[str, cst.FunctionDef]
# Whether a value differs between devices, part by part where it is a tuple the body builds or
# unpacks (`return loss, (new_state, logits)`): a bool, or a tuple of them
Tree: TypeAlias = "bool | tuple[Tree, ...]"
Varying: TypeAlias = frozenset[str] | set[str]  # the names that may differ between devices
T = TypeVar("T")
STATISTICS = "batch_stats"  # the collection flax's `BatchNorm` updates in training
APPLIES = frozenset({"apply", "apply_fn"})  # flax's `model.apply`, `TrainState.apply_fn`
TRACED = frozenset({"shape", "ndim", "dtype", "size", "itemsize"})  # one trace: the same everywhere
ONE_CALL = m.Assign([m.AssignTarget()], m.Call())  # `name = f(...)`, one target
NOT_FOLLOWED = "the body has a `{}` statement, not followed"  # a statement's kind: not modelled


@dataclass(frozen=True)
class Summary:
    """A library function made by a method call, `grad_fn = obj.method(fun, ..., axis=step's
    axis)`, then called, `a, b, ... = grad_fn(*args)`: per result, whether it is the same on every
    device ("same"), as the object is ("receiver"), or as anything passed is ("call")."""

    method: str
    axis: str  # the keyword naming the axis it reduces over (a literal or a module constant)
    results: tuple[str, ...]


SUMMARIES = (
    # flax.training.dynamic_scale.DynamicScale.value_and_grad(fun, ..., axis_name=axis): returns
    # (new scale, is finite, value, grads); grads `pmean`ed over the axis and the finite check
    # made on them (`jax.value_and_grad` has no `axis_name`).
    Summary("value_and_grad", "axis_name", ("receiver", "same", "call", "same")),
)
# Methods whose value is the object or holds what it holds (`out.get("d")`, `out.items()`,
# a shallow `copy()`): a store into that value may change the object's.
PARTS = frozenset({"get", "setdefault", "pop", "popitem", "items", "values", "copy"})
MUTATING = frozenset(
    {"append", "extend", "insert", "update", "setdefault", "pop", "popitem", "clear", "remove"}
    | {"add", "discard", "sort", "reverse", "__setitem__", "__setattr__"}
)


def body_outputs(
    body: cst.FunctionDef,
    mapped: list[bool],
    axis: str,
    qualname: Qualname,
    defs: Defs,
    spellings: frozenset[str] = frozenset(),
    imported: Imported = NO_IMPORTS,
    norm_axes: frozenset[str] = frozenset(),
    assumed: set[str] | None = None,
) -> tuple[int | None, list[bool]]:
    """Return how many results the body returns as a tuple (None: one, not a tuple), and
    which of them may differ between devices; `mapped`: per parameter, differs between devices.

    `defs` are the module's functions the body may call (a call of one that uses a per-device
    collective differs between devices), `imported` the code base's other modules, whose defs
    it may call too. `spellings`: module constants that name `axis`. `norm_axes`: the axes every
    batch norm of the code base averages its statistics over (`averaged_axes`); `assumed`
    collects what the reading took as given beyond the code it read, for the site's message.
    """
    start = {p.name.value for p, m in zip(body.params.params, mapped) if m}
    reader = _Reader(axis, qualname, defs, set(start))
    reader.spellings, reader.imported, reader.norm_axes = spellings, imported, norm_axes
    reader.assumed = assumed if assumed is not None else set()
    _run(reader, body, start)
    return _results(reader)


def _run(reader: _Reader, body: cst.FunctionDef, start: set[str]) -> None:
    """Read `body`, its parameters `start` differing between devices."""
    if not isinstance(body.body, cst.IndentedBlock) or not _ends_in_return(body.body.body):
        raise NotVisible("the body does not end in a return", Decline.BODY)
    # `if (m := x.mean(0)) is not None:` binds a value the statements never see (a test is
    # not a value of the body: pmap's are concrete), so any `:=` in it declines
    if next(nodes_in(body.body, cst.NamedExpr), None) is not None:
        raise NotVisible("the body binds a name inside an expression", Decline.BODY)
    reader.local = set(Flow(body).stores)
    reader.aliases = alias_classes(body)
    reader.reach = Reach(body.body)
    while True:  # closures read names at call time: rerun until what ever differs is stable
        seen = set(reader.ever)
        reader.returns = []
        reader.block(body.body.body, set(start))
        if reader.ever == seen:
            break


def _results(reader: _Reader) -> tuple[int | None, list[bool]]:
    arities = set()
    flags: list[bool] = []
    for value, varying in reader.returns:
        items = list(value.elements) if isinstance(value, cst.Tuple) else None
        if items is not None and any(isinstance(e, cst.StarredElement) for e in items):
            raise NotVisible("the body returns a starred tuple", Decline.BODY)
        values = [e.value for e in items] if items is not None else [value]
        arities.add(len(values) if items is not None else None)
        here = [reader.varies(v, varying) for v in values]
        flags = [a or b for a, b in zip(flags, here)] if flags else here
    if len(arities) != 1:
        raise NotVisible("the body's returns differ in shape", Decline.BODY)
    return arities.pop(), flags


# Reductions over every axis when given no `axis` (`jnp.sum(x)`, `x.mean()`): a number per device
FULL_REDUCTIONS = frozenset({"sum", "mean", "max", "min", "prod", "std", "var", "all", "any"})


def scalar_outputs(body: cst.FunctionDef, qualname: Qualname) -> dict[int, cst.BaseExpression]:
    """The results (by index; 0 for one not in a tuple) some `return` of `body` gives as one
    number per device: a literal number, a full reduction (`jnp.sum(x)`, `x.mean()`, no
    `axis`), or a name the body binds once to one; with that value. Such a result has no axis
    to lay the devices' values side by side on (`out_specs=P(axis)` needs one)."""
    flow = Flow(body)
    found: dict[int, cst.BaseExpression] = {}
    # the values the body returns, not a nested def's (`loss_fn`)
    returned = (r.value for r in nodes_in(body.body, cst.Return, SCOPES) if r.value is not None)
    for value in returned:
        items = [e.value for e in value.elements] if isinstance(value, cst.Tuple) else [value]
        for index, item in enumerate(items):
            bound = flow.value(item.value) if isinstance(item, cst.Name) else None
            value = bound if bound is not None else item
            reduced = full_reduction(value, qualname)
            if isinstance(value, (cst.Integer, cst.Float)) or (
                reduced is not None and reduced[0] in FULL_REDUCTIONS
            ):
                found.setdefault(index, value)
    return found


def full_reduction(
    node: cst.BaseExpression, qualname: Qualname
) -> tuple[str, cst.BaseExpression] | None:
    """`jnp.sum(x)`, `np.mean(x)`, `x.max()`: a numpy or jax.numpy reduction (or an array's
    method) given no axis nor any keyword, as (its name, `x`); else None."""
    if not isinstance(node, cst.Call) or any(a.keyword is not None for a in node.args):
        return None
    name = qualname(node.func) or ""
    head, _, op = name.rpartition(".")
    if head in ("jax.numpy", "numpy"):
        alone = len(node.args) == 1 and not node.args[0].star
        return (op, node.args[0].value) if alone else None
    if not isinstance(node.func, cst.Attribute) or node.args or name.startswith(("jax", "numpy")):
        return None
    return node.func.attr.value, node.func.value


def _ends_in_return(lines: Iterable[cst.BaseStatement]) -> bool:
    """Whether the last of `lines` returns a value or raises (an `if`: on both branches)."""
    match list(lines)[-1:]:
        case [
            cst.SimpleStatementLine(body=[*_, cst.Raise() | cst.Return(value=cst.BaseExpression())])
        ]:
            return True
        case [cst.If() as node]:
            return _ends_in_return(statements(node.body)) and _ends_in_return(else_of(node))
    return False


class _Reader:
    """Walks the body's statements, tracking the names that may differ between devices."""

    def __init__(self, axis: str, qualname: Qualname, defs: Defs, ever: set[str]) -> None:
        self.axis, self.qualname, self.defs = axis, qualname, defs
        self.ever = ever  # every name that differs somewhere in the body
        self.aliases: dict[str, set[str]] = {}  # see `alias_classes`
        self.closures: dict[str, cst.FunctionDef] = {}  # the body's nested defs
        self.returns: list[tuple[cst.BaseExpression, frozenset[str]]] = []
        self.inside: frozenset[str] = frozenset()  # the module helpers being read (no recursion)
        self.local: set[str] = set()  # the names the function binds (no module helper then)
        self.spellings: frozenset[str] = frozenset()  # module constants naming the axis
        self.reach: Reach | None = None  # the bindings reaching each read of the body
        self.made: dict[int, tuple[Summary, bool, bool, cst.Call]] = {}  # see `summarised`
        self.imported: Imported = NO_IMPORTS  # the code base's other modules: their defs
        self.norm_axes: frozenset[str] = frozenset()  # see `averaged_axes`
        self.assumed: set[str] = set()  # see `body_outputs`, shared with the readers it makes
        # By binding (an assignment, outside loops) and name: the parts of the tuple it binds
        self.parts: dict[tuple[int, str], Tree] = {}
        self.looping = 0  # how many loops of the body the statement read is in
        # By nested def and the names differing as it is called: its returns (`closure_tree`)
        self.closure_trees: dict[tuple[int, frozenset[str]], Tree | None] = {}
        # By helper, the parameters filled with what differs and the helpers being read: its
        # results (`helper_results`), shared by the readers one reading of a body makes
        self.helpers: dict[tuple[int, frozenset[str], frozenset[str]], tuple[bool, ...] | None] = {}

    # Statements ---------------------------------------------------------------------------
    def block(self, statements: Iterable[cst.BaseStatement], varying: set[str]) -> set[str]:
        for statement in statements:
            varying = self.statement(statement, varying)
        return varying

    def statement(self, node: cst.BaseStatement, varying: set[str]) -> set[str]:
        if isinstance(node, cst.SimpleStatementLine):
            for small in node.body:
                varying = self.small(small, varying)
            return varying
        if isinstance(node, cst.If):
            taken = self.block(statements(node.body), set(varying))
            return taken | self.block(else_of(node), set(varying))
        if isinstance(node, (cst.For, cst.While)):
            return self.loop(node, varying)
        if isinstance(node, cst.With):
            for item in node.items:
                if item.asname is not None:
                    varying = self.bind(item.asname.name, self.varies(item.item, varying), varying)
            return self.block(statements(node.body), varying)
        if isinstance(node, cst.FunctionDef):
            self.closures[node.name.value] = node  # read when called, see `closure_varies`
            return varying - {node.name.value}
        raise NotVisible(NOT_FOLLOWED.format(type(node).__name__), Decline.BODY)

    def loop(self, node: cst.For | cst.While, varying: set[str]) -> set[str]:
        self.looping += 1
        try:
            while True:  # a name that differs after one pass differs on the next: a fixed point
                inner = set(varying)
                if isinstance(node, cst.For):
                    inner = self.bind(node.target, self.varies(node.iter, varying), inner)
                after = varying | self.block(statements(node.body), inner)
                if after == varying:
                    break
                varying = after
            return self.block(else_of(node), varying)
        finally:
            self.looping -= 1

    def small(self, node: cst.BaseSmallStatement, varying: set[str]) -> set[str]:
        varying = self.filled_by_defs(node, varying)
        if isinstance(node, cst.Assign):
            varies = self.varies(node.value, varying)
            results = self.summarised(node, varying)
            if results is None:
                tree = self.tree(node.value, varying)
                results = list(tree) if isinstance(tree, tuple) else None
            if results is not None:
                for target in node.targets:
                    varying = self.bind_each(target.target, results, varying, node)
                return varying
            for target in node.targets:
                varying = self.bind(target.target, varies, varying)
        elif isinstance(node, cst.AnnAssign) and node.value is not None:
            varying = self.bind(node.target, self.varies(node.value, varying), varying)
        elif isinstance(node, cst.AugAssign):
            varies = self.varies(node.value, varying) or self.varies(node.target, varying)
            varying = self.bind(node.target, varies, varying)
        elif isinstance(node, cst.Expr):
            varying = self.mutation(node.value, varying)
        elif isinstance(node, cst.Return) and node.value is not None:
            self.returns.append((node.value, frozenset(varying)))
        elif isinstance(node, (cst.Global, cst.Nonlocal)):
            raise NotVisible(NOT_FOLLOWED.format(type(node).__name__), Decline.BODY)
        return varying

    def mutation(self, node: cst.BaseExpression, varying: set[str]) -> set[str]:
        """`metrics.update(x)`, `out.append(x)`: the object differs when what it takes does."""
        if not isinstance(node, cst.Call) or not isinstance(node.func, cst.Attribute):
            return varying
        if any(self.varies(a.value, varying) for a in node.args):
            return self.changed(aliased(node.func.value), varying)
        return varying

    def changed(self, owners: set[str], varying: set[str]) -> set[str]:
        """`varying` with the objects of `owners` now differing between devices, and every
        name of the body that may be one of them or hold one (`aliases`)."""
        found = set().union(*(self.aliases.get(n, {n}) for n in owners))
        self.ever |= found
        return varying | found

    def filled_by_defs(self, node: cst.CSTNode, varying: set[str]) -> set[str]:
        """`add_metrics(metrics, x)` (a module helper) or `log("loss", loss)` (a nested def): a
        def storing into (or calling a method of) what it is passed or, nested, an object of the
        body it closes over (`metrics[name] = v`), called or passed on in `node`: what it stores
        into differs when the def (nested) or what it is called with does."""
        calls = list(nodes_in(node, cst.Call))
        for ref in nodes_in(node, cst.Name):
            nested = self.closures.get(ref.value)
            fn = nested or (self.defs.get(ref.value) if ref.value not in self.local else None)
            if fn is None:
                continue
            params = {p.name.value for p in params_of(fn.params)}
            if nested is not None:
                stored = stored_into(nested, {**self.defs, **self.closures})
                owners = stored & self.local - params
            else:
                stored = set(_once(self.defs, fn, partial(stored_into, fn, self.defs)))
                owners = set()
            if not owners and not stored & params:
                continue
            call = next((c for c in calls if c.func is ref), None)
            # passed on (`map(fill, [out])`): called with what it is passed with, at the most
            taker = next((c for c in calls if any(a.value is ref for a in c.args)), None)
            args = call.args if call is not None else taker.args if taker is not None else ()
            if (
                call is None
                or (nested is not None and self.closure_varies(nested))
                or any(self.varies(a.value, varying) for a in args)
            ):
                # `def fill(d, v): d["a"] = v`: what is passed
                if call is not None:
                    owners |= passed_into(call, fn, stored & params)
                elif stored & params:
                    owners |= set().union(*(aliased(a.value) for a in args))
                varying = self.changed(owners, varying)
        return varying

    def summarised(self, node: cst.Assign, varying: set[str]) -> list[Tree] | None:
        """`grad_fn = obj.value_and_grad(..., axis_name=axis)` (a row of SUMMARIES) is recorded
        with whether `obj` and the whole call differ; `a, b, c, d = grad_fn(*args)`, where every
        binding reaching `grad_fn` is such a row, gives each result as the row says (a "call"
        result of a nested def's, `has_aux=True`: its return, part by part, `grad_value`)."""
        value = node.value
        if not isinstance(value, cst.Call):
            return None
        func = value.func
        if isinstance(func, cst.Attribute) and self.qualname(func) is None:
            for row in SUMMARIES:
                given = _given(value, row.axis) is not None
                if func.attr.value == row.method and given and self._over_axis(value):
                    receiver = self.varies(func.value, varying)
                    self.made[id(node)] = (row, receiver, self.varies(value, varying), value)
            return None
        made = self.reaching(func, lambda b: self.made.get(id(b)))
        if made is None or len({m[0] for m in made}) != 1:
            return None
        if len(node.targets) != 1 or not isinstance(node.targets[0].target, cst.Tuple):
            return None
        call = any(self.varies(a.value, varying) for a in value.args)
        parts = [self.grad_value(m[3], value, varying) for m in made]
        joined = _joined(*parts) if None not in parts else None  # type: ignore[arg-type]
        return [
            joined
            if kind == "call" and joined is not None
            else any(
                (kind == "receiver" and m[1]) or (kind == "call" and (m[2] or call)) for m in made
            )
            for kind in made[0][0].results
        ]

    def reaching(
        self, node: cst.CSTNode, value: Callable[[cst.CSTNode], T | None]
    ) -> list[T] | None:
        """What `value` gives of each binding reaching the name `node`, when it gives something
        of each (and one reaches it); else None."""
        if not isinstance(node, cst.Name) or self.reach is None:
            return None
        found = [value(b) for b in self.reach.of(node)]
        return found if found and None not in found else None  # type: ignore[return-value]

    def bind_each(
        self,
        target: cst.BaseExpression,
        results: Sequence[Tree],
        varying: set[str],
        binding: cst.Assign | None = None,
    ) -> set[str]:
        """Bind the elements of the tuple `target` to results that differ or not, part by part
        (`(loss, aux), grads = ...`); a name bound to a tuple by `binding` keeps its parts."""
        if isinstance(target, cst.Name) and binding is not None and not self.looping:
            self.parts[(id(binding), target.value)] = tuple(results)
        elements = target.elements if isinstance(target, (cst.Tuple, cst.List)) else []
        if len(elements) != len(results) or any(
            isinstance(e, cst.StarredElement) for e in elements
        ):
            return self.bind(target, any(_flat(r) for r in results), varying)
        for element, part in zip(elements, results):
            inner = element.value
            if isinstance(part, tuple) and isinstance(inner, (cst.Name, cst.Tuple, cst.List)):
                varying = self.bind_each(inner, part, varying, binding)
            else:
                varying = self.bind(inner, _flat(part), varying)
        return varying

    def bind(self, target: cst.BaseExpression, varies: bool, varying: set[str]) -> set[str]:
        """Bind `target` to a value that differs (`varies`) or not."""
        if isinstance(target, (cst.Attribute, cst.Subscript)):  # `x.a = v`, `x[k] = v`
            return self.changed(aliased(target), varying) if varies else varying
        if isinstance(target, (cst.Tuple, cst.List)) and all(
            type(e) is cst.Element for e in target.elements
        ):  # `metrics["loss"], grads = ...`: each element as bound alone
            for element in target.elements:
                varying = self.bind(element.value, varies, varying)
            return varying
        names = set(target_names(target)) if not isinstance(target, cst.StarredElement) else set()
        if "?" in names or not names:
            raise NotVisible(f"the body binds `{code(target)}`, not only plain names", Decline.BODY)
        if varies:
            self.ever |= names
            return varying | names
        return varying - names

    # Expressions --------------------------------------------------------------------------
    def varies(self, node: cst.CSTNode, varying: Varying) -> bool:
        """Return True unless `node` is the same on every device."""
        # `aux[1]` of a name bound to a tuple whose parts are known
        if (whole := self._named_parts(node, varying)) is not None:
            return _flat(whole)
        if isinstance(node, cst.Call):
            if self.qualname(node.func) in REDUCED and self._over_axis(node):
                return False
            if self._per_device(node):
                return True
            if self._tree_mapped_same(node, varying):
                return False
            # a call of a helper (flax's `compute_metrics` doing the `pmean`): it differs when
            # any of the helper's returns does
            if (helper := self.helper_results(node, varying)) is not None:
                return any(helper)
        if isinstance(node, Comprehension):
            return self._comprehension_varies(node, varying)
        if isinstance(node, cst.Name):
            closure = self.closures.get(node.value)
            return node.value in varying or (closure is not None and self.closure_varies(closure))
        if isinstance(node, cst.Attribute):  # `state.params`: the attribute's name is no name
            return node.attr.value not in TRACED and self.varies(node.value, varying)
        if isinstance(node, cst.Arg):  # `f(grads=g)`: the keyword is no name
            return self.varies(node.value, varying)
        return any(self.varies(child, varying) for child in node.children)

    def tree(self, node: cst.BaseExpression, varying: Varying) -> Tree:
        """Whether `node`'s value differs between devices, part by part where it is a tuple the
        body builds, unpacks or indexes, or one a call is read to return (a nested def's
        `return loss, (new_state, logits)`, through `jax.value_and_grad(..., has_aux=True)`;
        flax's `model.apply(..., mutable=["batch_stats"])`); else as `varies`."""
        if isinstance(node, cst.Tuple) and all(type(e) is cst.Element for e in node.elements):
            return tuple(self.tree(e.value, varying) for e in node.elements)
        if (index := _index(node)) is not None:
            part = _part(self.tree(node.value, varying), index)  # type: ignore[attr-defined]
            if part is not None:
                return part
        if isinstance(node, cst.Name) and (named := self._named_parts(node, varying)) is not None:
            return named
        if isinstance(node, cst.Call) and (found := self._call_tree(node, varying)) is not None:
            return found
        return self.varies(node, varying)

    def _named_parts(self, node: cst.CSTNode, varying: Varying) -> Tree | None:
        """The parts of `aux` or `aux[1]`: a name every binding reaching which bound a tuple
        (`parts`), indexed by literal numbers; None where they are not known."""
        if (index := _index(node)) is not None:
            return _part(self._named_parts(node.value, varying), index)  # type: ignore[attr-defined]
        if not isinstance(node, cst.Name) or node.value not in varying:
            return None  # (a name not differing may be a nested def that does)
        parts = self.reaching(node, lambda b: self.parts.get((id(b), node.value)))
        return None if parts is None else _joined(*parts)  # type: ignore[arg-type]

    def _call_tree(self, call: cst.Call, varying: Varying) -> Tree | None:
        """The parts of what `call` returns, where it is read: None where it is not."""
        if (statistics := self._statistics(call, varying)) is not None:
            return statistics
        if (made := self._grad_maker(call.func)) is not None:
            return self.grad_value(made, call, varying, with_grads=True)
        closure = self.closures.get(call.func.value) if isinstance(call.func, cst.Name) else None
        if closure is not None:
            return self.closure_tree(closure, call, varying)
        flags = self.helper_results(call, varying)
        return tuple(flags) if flags is not None and len(flags) > 1 else None

    def _statistics(self, call: cst.Call, varying: Varying) -> Tree | None:
        """flax's `model.apply(variables, x, mutable=["batch_stats"])` (or `state.apply_fn`):
        (the output, the updated batch statistics). Those are the same on every device when
        the variables and the model passed are and every `BatchNorm` of the code base averages
        its statistics over the step's axis (`norm_axes`: each made with `axis_name=` it)."""
        func = call.func
        if not isinstance(func, cst.Attribute) or func.attr.value not in APPLIES:
            return None
        if not all(
            isinstance(v, cst.SimpleString) and v.evaluated_value == STATISTICS
            for v in _listed(_given(call, "mutable"))
        ):
            return None
        given = [a for a in call.args if a.keyword is None]
        if not given or any(a.star for a in call.args):
            return None
        out = self.varies(call, varying)
        same = self.norm_axes == {self.axis} and not (
            self.varies(given[0].value, varying) or self.varies(func.value, varying)
        )
        if same and out:
            self.assumed.add(
                f'the batch statistics `{code(func)}(..., mutable=["{STATISTICS}"])` updates are '
                f"the same on every device: every `BatchNorm` of the module and of the modules "
                f'of its code base it imports averages them over "{self.axis}" (`axis_name`)'
            )
        return (out, out and not same)

    def _grad_maker(self, func: cst.BaseExpression) -> cst.Call | None:
        """`jax.value_and_grad(f, ...)` called where made, or a name every binding reaching
        which is one call making it (`grad_fn = jax.value_and_grad(loss_fn, has_aux=True)`)."""
        if isinstance(func, cst.Call):
            return func if self.qualname(func.func) == "jax.value_and_grad" else None
        made_by = lambda b: self._grad_maker(b.value) if m.matches(b, ONE_CALL) else None  # type: ignore[attr-defined]
        made = self.reaching(func, made_by)
        return made[0] if made is not None and len(made) == 1 else None

    def grad_value(
        self, made: cst.Call, call: cst.Call, varying: Varying, with_grads: bool = False
    ) -> Tree | None:
        """What `call` of what `made` made (`jax.value_and_grad(f, has_aux=True)`, or a row of
        SUMMARIES) returns as its value, `f` a nested def called with `call`'s arguments:
        (loss, aux), part by part, with `has_aux=True`; `with_grads`: (value, grads), the
        gradients differing where any part of the value does. None where `f` is not read."""
        aux = _given(made, "has_aux")
        fn = next((a.value for a in made.args if a.keyword is None), None)
        closure = self.closures.get(fn.value) if isinstance(fn, cst.Name) else None
        if closure is None or any(a.star for a in made.args):
            return None
        if aux is not None and not (isinstance(aux, cst.Name) and aux.value in ("True", "False")):
            return None
        value = self.closure_tree(closure, call, varying)
        if value is None:
            return None
        has_aux = isinstance(aux, cst.Name) and aux.value == "True"
        value = value if has_aux and isinstance(value, tuple) and len(value) == 2 else _flat(value)
        return (value, _flat(value)) if with_grads else value

    def closure_tree(self, fn: cst.FunctionDef, call: cst.Call, varying: Varying) -> Tree | None:
        """What the nested def `fn`, called with `call`'s arguments, returns, part by part: read
        with what it closes over differing where it differs anywhere in the body (`ever`, as
        `closure_varies`); None where it is not read."""
        if fn.name.value in self.inside:
            return None
        defs = {k: v for k, v in self.defs.items() if k not in self.local}
        function = Function(fn, False, self.qualname, defs)
        if (mapped := self._filled(function, call, varying)) is None:
            return None
        start = mapped | (self.ever - {p.name.value for p in params_of(fn.params)})
        key_of = (id(fn), frozenset(start))
        if key_of not in self.closure_trees:
            reader = self._read(function, start, nested=True)
            trees = [reader.tree(value, inner) for value, inner in reader.returns] if reader else []
            self.closure_trees[key_of] = _joined(*trees) if trees else None
        return self.closure_trees[key_of]

    def _comprehension_varies(self, node: Comprehension, varying: Varying) -> bool:
        """`[lax.psum(g, axis) for g in grads]`: the elements are the same on every device when
        each is, its targets differing where what they iterate over does (the number of
        elements is the trace's, the same on every device); a condition that differs, differs."""
        inner = set(varying)
        clause: cst.CompFor | None = node.for_in
        while clause is not None:
            names = set(names_in(clause.target))
            inner = inner | names if self.varies(clause.iter, inner) else inner - names
            if any(self.varies(c.test, inner) for c in clause.ifs):
                return True
            clause = clause.inner_for_in
        if isinstance(node, cst.DictComp):
            return self.varies(node.key, inner) or self.varies(node.value, inner)
        return self.varies(node.elt, inner)

    def _tree_mapped_same(self, call: cst.Call, varying: Varying) -> bool:
        """`jax.tree.map(lambda g: lax.psum(g, axis), grads)`: each leaf is the lambda's value,
        the same on every device even for leaves that differ (each parameter differing as the
        tree it takes the leaves of does: `lambda p, g: p - 0.1 * pmean(g)` over params the
        same on every device and grads that differ); the structure of the trees is the same on
        every device (one trace)."""
        args = [a for a in call.args if a.keyword is None and not a.star]
        fn = args[0].value if args and len(args) == len(call.args) else None
        if self.qualname(call.func) not in TREE_MAPS or not isinstance(fn, cst.Lambda):
            return False
        params = fn.params
        if params.star_arg not in (None, cst.MaybeSentinel.DEFAULT) or params.kwonly_params:
            return False
        if any(p.default is not None for p in (*params.posonly_params, *params.params)):
            return False  # a default is read where the lambda is made
        names = [p.name.value for p in (*params.posonly_params, *params.params)]
        trees = [a.value for a in args[1:]]
        differing = set(names)  # each parameter taken as differing, unless one tree fills it
        if len(trees) == len(names):
            differing = {n for n, t in zip(names, trees, strict=True) if self.varies(t, varying)}
        return not self.varies(fn.body, set(varying) - set(names) | differing)

    def closure_varies(self, node: cst.FunctionDef, inside: frozenset[str] = frozenset()) -> bool:
        """A nested def differs when it reads (at any depth) what differs anywhere in the body,
        uses a per-device collective, or reads a nested def that differs; its parameters are its
        caller's business."""
        if node.name.value in inside:
            return False
        free = set(names_in(node)) - {p.name.value for p in node.params.params}
        if free & self.ever or any(self._per_device(c) for c in nodes_in(node.body, cst.Call)):
            return True
        inside = inside | {node.name.value}
        return any(self.closure_varies(self.closures[n], inside) for n in free & set(self.closures))

    def helper_results(self, call: cst.Call, varying: Varying) -> list[bool] | None:
        """A call of a def of the module, or of another module of the code base
        (`self.imported`: big_vision's `u.mixup(rng, images, labels, **config.mixup)`): per
        result (one unless it returns a tuple), whether it differs between devices, read from
        the def with its parameters differing as what fills them does (`_filled`), with the
        def's own module's names; None when the call is not one that is followed."""
        name = call.func.value if isinstance(call.func, cst.Name) else ""  # "": no name
        if name in self.local:
            return None
        if (local := self.defs.get(name)) is not None:
            function: Function | None = Function(local, False, self.qualname, self.defs)
        else:
            function = self.imported.function(self.qualname(call.func))
        if function is None or function.fn.name.value in self.inside:
            return None
        mapped = self._filled(function, call, varying)
        if mapped is None:
            return None
        cached = (id(function.fn), frozenset(mapped), self.inside)
        if cached not in self.helpers:
            reader = self._read(function, mapped)
            try:
                self.helpers[cached] = None if reader is None else tuple(_results(reader)[1])
            except NotVisible:
                self.helpers[cached] = None
        found = self.helpers[cached]
        return None if found is None else list(found)

    def _read(self, function: Function, start: set[str], nested: bool = False) -> _Reader | None:
        """A reader of `function`'s def, which this one follows (`start`: the names differing as
        it is called; `nested`: a def of the body, seeing the body's defs), told what this one
        was told and sharing what it finds (`assumed`, `helpers`), once run; None where it is
        not read. A default is read where the def is made, at module level: the same on every
        device."""
        reader = _Reader(self.axis, function.qualname, function.defs, set(start))
        reader.inside, reader.imported = self.inside | {function.fn.name.value}, self.imported
        reader.norm_axes, reader.assumed = self.norm_axes, self.assumed
        reader.helpers, reader.closures = self.helpers, dict(self.closures) if nested else {}
        reader.spellings = self.spellings if nested or function.defs is self.defs else frozenset()
        try:
            _run(reader, function.fn, start)
        except NotVisible:
            return None
        return reader

    def _filled(self, function: Function, call: cst.Call, varying: Varying) -> set[str] | None:
        """The parameters of the def `call` fills with something that differs between devices
        (`*args`, `**kwargs` and a `**mapping` passed included), else None when how the call
        fills them is not plainly visible (`_passon.parameter_for`)."""
        params = function.fn.params
        if params.posonly_params:
            return None
        kwargs = [params.star_kwarg.name.value] if params.star_kwarg is not None else []
        by_position = sum(a.keyword is None and not a.star for a in call.args)
        unfilled = [*function.params[by_position:], *(p.name.value for p in params.kwonly_params)]
        mapped: set[str] = set()
        for arg in call.args:
            varies = self.varies(arg.value, varying)
            if arg.star == "**":  # `**config.mixup`: any keyword parameter, or `**kwargs`
                mapped |= set(unfilled + kwargs) if varies else set()
            elif (param := parameter_for(function.fn, call, arg, function.bound)) is None:
                return None
            elif varies:
                mapped.add(param)
        return mapped

    def _per_device(self, call: cst.Call) -> bool:
        return self.qualname(call.func) in PER_DEVICE or self._calls_per_device(call)

    def _over_axis(self, call: cst.Call) -> bool:
        """The collective reduces over the step's axis (a literal name), in one group."""
        if _given(call, "axis_index_groups") is not None:
            return False
        axis = _given(call, "axis_name")
        positional = [a.value for a in call.args if a.keyword is None and not a.star]
        axis = axis if axis is not None else (positional[1] if len(positional) > 1 else None)
        return any(
            (isinstance(s, cst.SimpleString) and s.evaluated_value == self.axis)
            or (isinstance(s, cst.Name) and s.value in self.spellings - self.local)
            or (  # a field set once in `__init__`: `self._axis_name`
                isinstance(s, cst.Attribute)
                and single_name(s.value) not in self.local
                and code(s) in self.spellings
            )
            for s in _listed(axis)
        )

    def _calls_per_device(self, call: cst.Call) -> bool:
        """A call of a module function that uses a per-device collective (at any depth)."""
        if not isinstance(call.func, cst.Name) or (name := call.func.value) not in self.defs:
            return False
        return _once(self.defs, (self.qualname, name), lambda: self._reaches_per_device(name))

    def _reaches_per_device(self, name: str) -> bool:
        """Whether the def `name` or a def it calls (at any depth) uses a per-device collective."""
        seen: set[str] = set()
        pending = [name]
        while pending:
            if (current := pending.pop()) in seen:
                continue
            seen.add(current)
            for inner in nodes_in(self.defs[current], cst.Call):
                if self.qualname(inner.func) in PER_DEVICE:
                    return True
                if isinstance(inner.func, cst.Name) and inner.func.value in self.defs:
                    pending.append(inner.func.value)
        return False


# The answers of `_once` for the module whose defs were asked last (the body and every helper it
# follows ask of each call they hold, again for each layout of the arguments).
_ANSWERS: list[tuple[Defs, dict[Hashable, Any]]] = []


def _once(defs: Defs, question: Hashable, answer: Callable[[], T]) -> T:
    """`answer()` to `question` about the module whose defs are `defs`, answered once."""
    if not _ANSWERS or _ANSWERS[0][0] is not defs:
        _ANSWERS[:] = [(defs, {})]
    known = _ANSWERS[0][1]
    if question not in known:
        known[question] = answer()
    return cast(T, known[question])


def aliased(node: cst.BaseExpression) -> set[str]:
    """The names whose objects `node`'s value may be or hold (`b` of `b`, `out` of
    `out["d"]`, `out.get("d")` and `out.setdefault(...)`, `inner` of `{"l": inner}`): a store
    into that value may change them. Another call's value is a new object (`x.mean(0)`,
    `model.apply(...)`, `jax.random.split(key)`)."""
    match node:
        case cst.Name():
            return {node.value}
        case cst.Attribute() | cst.Subscript():
            return aliased(node.value)
        case cst.Call(func=cst.Attribute(value=owner, attr=attr)) if attr.value in PARTS:
            return aliased(owner)
        case cst.Tuple() | cst.List() | cst.Set() | cst.Dict():
            return set().union(*(aliased(e.value) for e in node.elements))
        case cst.IfExp(body=one, orelse=other) | cst.BooleanOperation(left=one, right=other):
            return aliased(one) | aliased(other)
    return set()


def stored_into(
    fn: cst.FunctionDef, defs: Defs, seen: frozenset[cst.FunctionDef] = frozenset()
) -> set[str]:
    """The names whose objects `fn` may change, that it does not bind itself: stored into
    (`m[k] = v`, `m.a += v`), a method changing them called (`m.update(...)`), or passed to a
    def of `defs` that may change what it is passed (one calling back into a def being read,
    `seen`, may)."""
    seen = seen | {fn}
    stored: set[str] = set()
    for node in nodes_in(fn.body, cst.CSTNode):  # type: ignore[type-abstract]
        for target in assign_targets(node):
            if isinstance(target, (cst.Attribute, cst.Subscript)):
                stored |= aliased(target)
        if not isinstance(node, cst.Call):
            continue
        if isinstance(node.func, cst.Attribute) and node.func.attr.value in MUTATING:
            stored |= aliased(node.func.value)
        if isinstance(node.func, cst.Name) and (helper := defs.get(node.func.value)) is not None:
            into = {p.name.value for p in params_of(helper.params)}
            into = into if helper in seen else stored_into(helper, defs, seen) & into
            stored |= passed_into(node, helper, into)
    # `m = metrics; m[k] = v`: what its own names may hold, by any of its names
    classes = alias_classes(fn, own_only=False)
    stored = stored.union(*(classes.get(n, set()) for n in stored))
    own = set(Flow(fn).stores) - {p.name.value for p in params_of(fn.params)}
    return stored - own


def passed_into(call: cst.Call, fn: cst.FunctionDef, params: set[str]) -> set[str]:
    """The names of what `call`'s arguments pass to the parameters `params` of `fn`: by position
    or keyword; all of them when a star, or an argument `fn` has no parameter of its own for,
    hides which (`_passon.parameter_for`)."""
    if not params:
        return set()
    rest = {
        p.name.value for p in (fn.params.star_arg, fn.params.star_kwarg) if isinstance(p, cst.Param)
    }
    found: set[str] = set()
    for arg in call.args:
        if (name := parameter_for(fn, call, arg)) is None or name in rest:
            return set().union(*(aliased(a.value) for a in call.args))
        if name in params:
            found |= aliased(arg.value)
    return found


def alias_classes(body: cst.FunctionDef, own_only: bool = True) -> dict[str, set[str]]:
    """The names of `body` that may hold the same object, in any order of its statements:
    joined by a binding (`b = out`, `for d in out`, `with out as b`), by storing one into
    another (`out["l"] = inner`), or by a method taking one (`out.append(inner)`). Only the
    body's own names (its parameters, what it binds) are joined: `tx.update(grads, ...)` of
    an optimizer made elsewhere joins nothing. `own_only=False`: every name is joined (a
    nested def's own names with those it closes over)."""
    local = set(Flow(body).stores) | {p.name.value for p in body.params.params}
    joined: list[set[str]] = []
    for node in nodes_in(body.body, cst.CSTNode):  # type: ignore[type-abstract]
        if isinstance(node, (cst.Assign, cst.AnnAssign, cst.AugAssign)) and node.value is not None:
            joined += [aliased(t) | aliased(node.value) for t in assign_targets(node)]
        elif isinstance(node, cst.For):
            joined.append(aliased(node.target) | aliased(node.iter))
        elif isinstance(node, cst.WithItem) and node.asname is not None:
            joined.append(aliased(node.asname.name) | aliased(node.item))
        elif isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute):
            receiver = aliased(node.func.value)
            if node.func.attr.value in MUTATING and (receiver & local or not own_only):
                joined.append(receiver.union(*(aliased(a.value) for a in node.args)))
    classes: dict[str, set[str]] = {}
    for names in joined:
        names = names & local if own_only else names
        if len(names) > 1:
            merged = set(names).union(*(classes.get(n, set()) for n in names))
            classes.update(dict.fromkeys(merged, merged))
    return classes


def _flat(tree: Tree) -> bool:
    """Whether any part of `tree` differs between devices."""
    return any(_flat(t) for t in tree) if isinstance(tree, tuple) else tree


def _joined(*trees: Tree) -> Tree:
    """What differs in one of `trees` (the values of several bindings): part by part where
    they are tuples of one shape."""
    first, *rest = trees
    for other in rest:
        if isinstance(first, tuple) and isinstance(other, tuple) and len(first) == len(other):
            first = tuple(_joined(a, b) for a, b in zip(first, other))
        else:
            first = _flat(first) or _flat(other)
    return first


def _index(node: cst.CSTNode) -> int | None:
    """`k` of `x[k]`, a literal whole number (negative too), else None."""
    if not isinstance(node, cst.Subscript) or len(node.slice) != 1:
        return None
    index = node.slice[0].slice
    value = index.value if isinstance(index, cst.Index) else None
    sign = 1
    if isinstance(value, cst.UnaryOperation) and isinstance(value.operator, cst.Minus):
        sign, value = -1, value.expression
    return sign * int(value.value, 0) if isinstance(value, cst.Integer) else None


def _part(whole: Tree | None, index: int) -> Tree | None:
    """Part `index` of `whole` where it is a tuple that has one, else None."""
    return whole[index] if isinstance(whole, tuple) and -len(whole) <= index < len(whole) else None


def averaged_axes(modules: Iterable[cst.Module]) -> frozenset[str]:
    """The axes flax's batch norms average their statistics over, in `modules` (the module of a
    step and the code base's modules it imports): each `BatchNorm` named there made, or bound
    by `partial`, with `axis_name="..."` (flax imagenet's `partial(nn.BatchNorm, ...,
    axis_name="batch")`). Empty when there is none, when one is named otherwise (no literal
    axis, `axis_index_groups`, a subclass, a value passed on) or when other code makes a
    `batch_stats` variable: then nothing is known of the statistics."""
    axes: set[str] = set()
    for module in modules:
        walk(found := _Nodes(), module)  # not `nodes_in`: `.children` rebuilds every node
        made: dict[int, str | None] = {}  # by id of a `BatchNorm` name: the axis it is given
        for call in (n for n in found.nodes if isinstance(n, cst.Call)):
            name = _called(call.func)
            first = next((a.value for a in call.args if a.keyword is None), None)
            variable = first.evaluated_value if isinstance(first, cst.SimpleString) else None
            if name is not None and name.value == "variable" and variable == STATISTICS:
                return frozenset()  # `self.variable("batch_stats", ...)`
            if name is not None and name.value == "partial" and first is not None:
                name = _called(first)
            if name is None or name.value != "BatchNorm":
                continue
            axis = _given(call, "axis_name")
            literal = axis.evaluated_value if isinstance(axis, cst.SimpleString) else None
            grouped = _given(call, "axis_index_groups") is not None  # per group
            made[id(name)] = literal if isinstance(literal, str) and not grouped else None
        for named in (n for n in found.nodes if isinstance(n, cst.Name) and n.value == "BatchNorm"):
            literal = made.get(id(named))
            if literal is None:
                return frozenset()
            axes.add(literal)
    return frozenset(axes)


NORM_WORDS = ("BatchNorm", STATISTICS)  # a module without either says nothing of the statistics


class _Nodes(cst.CSTVisitor):
    """Every node of a module but those its imports hold (a `BatchNorm` imported is not made)."""

    def __init__(self) -> None:
        self.nodes: list[cst.CSTNode] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        self.nodes.append(node)
        return not isinstance(node, (cst.Import, cst.ImportFrom))


def _listed(node: cst.BaseExpression | None) -> list[cst.BaseExpression | None]:
    """The elements of a tuple or list `node` (`("i", "j")`, `["batch_stats"]`), else `node`."""
    return [e.value for e in node.elements] if isinstance(node, (cst.Tuple, cst.List)) else [node]


def _called(node: cst.BaseExpression) -> cst.Name | None:
    """The last name of `f` or `a.b.f`."""
    name = node.attr if isinstance(node, cst.Attribute) else node
    return name if isinstance(name, cst.Name) else None


def _given(call: cst.Call, keyword: str) -> cst.BaseExpression | None:
    """The value `call` passes as `keyword=`, else None."""
    return next((a.value for a in call.args if a.keyword and a.keyword.value == keyword), None)
