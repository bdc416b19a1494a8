"""Summaries of the code base's own helpers: a def whose return value is one row of the
transfer table applied to one of its parameters.

`def replicate(tree, n): return jax.tree.map(lambda a: np.broadcast_to(a, (n, *a.shape)), tree)`
is the `broadcast_to` row of `tree`, given that `n` is the number of local devices; a call
`replicate(params, jax.local_device_count())` is then read as that row of `params`, and
rewritten as the row's template at the call site. The summary is read from the helper's body
with the same table (`match`, `lifted`), once per helper and analysis.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import libcst as cst

from ._layout import Match, Qualname, Transfer, lifted, match

DEVICE_COUNTS = frozenset({"jax.local_device_count", "jax.device_count"})
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


def summarize(fn: cst.FunctionDef, qualname: Qualname) -> Summary | None:
    """Return what `fn` returns of its parameters, read with the transfer table; None unless
    its body is `n = jax.local_device_count()` lines, then `return <row of a parameter>`."""
    params = fn.params
    plain = params.params
    if params.kwonly_params or params.posonly_params or params.star_kwarg is not None:
        return None
    if isinstance(params.star_arg, cst.Param) or fn.decorators or not plain:
        return None
    if any(p.default is not None for p in plain) or not isinstance(fn.body, cst.IndentedBlock):
        return None
    lines = list(fn.body.body)
    if lines and _is_docstring(lines[0]):
        lines = lines[1:]
    counted: set[str] = set()
    for line in lines[:-1]:  # only `n = jax.local_device_count()`
        small = line.body if isinstance(line, cst.SimpleStatementLine) else ()
        assign = small[0] if len(small) == 1 else None
        if not isinstance(assign, cst.Assign) or len(assign.targets) != 1:
            return None
        target = assign.targets[0].target
        if not isinstance(target, cst.Name) or not _counts_devices(assign.value, qualname):
            return None
        counted.add(target.value)
    last = lines[-1].body if lines and isinstance(lines[-1], cst.SimpleStatementLine) else ()
    if len(last) != 1 or not isinstance(last[0], cst.Return) or last[0].value is None:
        return None
    names = [p.name.value for p in plain]
    if counted & set(names):
        return None

    def counts(node: cst.BaseExpression) -> bool:
        if isinstance(node, cst.Name):
            return node.value in counted or node.value in names
        return _counts_devices(node, qualname)

    value = last[0].value
    found = match(value, qualname, counts) or lifted(value, qualname, counts)
    if found is None or found.row.template is None:
        return None
    source = found.source
    if not isinstance(source, cst.Name) or source.value not in names:
        return None
    if set(re.findall(r"\{(\w+)\}", found.row.template)) - {found.row.source} - CONTEXT:
        return None  # a hole of the rewrite the call site cannot fill
    by_count = [
        names.index(h.value)
        for k in found.row.counts
        if isinstance(h := found.holes[k], cst.Name) and h.value in names
    ]
    rest = set(range(len(names))) - {names.index(source.value), *by_count}
    if rest:
        return None  # a parameter the row does not read: the helper is more than the row
    return Summary(found.row, names.index(source.value), tuple(by_count), found.lifted)


class Summaries:
    """The summaries of the module's helpers, each read once (`defs`: the helpers by name)."""

    def __init__(self, defs: Mapping[str, cst.FunctionDef], qualname: Qualname) -> None:
        self.defs, self.qualname = defs, qualname
        self.known: dict[str, Summary | None] = {}

    def of(self, name: str) -> Summary | None:
        """Return the summary of helper `name`, None when it is not a row of a parameter."""
        if name not in self.known:
            fn = self.defs.get(name)
            self.known[name] = summarize(fn, self.qualname) if fn is not None else None
        return self.known[name]

    def read(
        self,
        node: cst.BaseExpression,
        table: tuple[Transfer, ...],
        counts: Callable[[cst.BaseExpression], bool],
    ) -> Match | None:
        """Return `node`, a call of a helper, read as its summary's row of the argument, when
        that row is in `table` and the call passes the number of local devices where the
        helper needs it; else None."""
        if not isinstance(node, cst.Call) or not isinstance(node.func, cst.Name):
            return None
        found = self.of(node.func.value)
        if found is None or found.row not in table:
            return None
        args = node.args
        if any(a.keyword is not None or a.star for a in args):
            return None
        if len(args) != len(self.defs[node.func.value].params.params):
            return None
        if not all(counts(args[i].value) for i in found.counts):
            return None
        source = args[found.source].value
        return Match(found.row, {found.row.source: source, "value": node}, found.lifted)


def _counts_devices(node: cst.BaseExpression, qualname: Qualname) -> bool:
    return isinstance(node, cst.Call) and not node.args and qualname(node.func) in DEVICE_COUNTS


def _is_docstring(line: cst.BaseStatement) -> bool:
    small = line.body if isinstance(line, cst.SimpleStatementLine) else ()
    return (
        len(small) == 1
        and isinstance(small[0], cst.Expr)
        and isinstance(small[0].value, cst.SimpleString)
    )
