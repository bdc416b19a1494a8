"""A step's result read where the step is called, in any expression: `step(x)[0]`,
`unreplicate(step(x))`, `jax.tree.map(lambda v: v[0], step(x))`, a helper of the module that
reads device 0 (its summary), `return a, step(x)[0]`. The call is a value whose layout the
analysis knows (the body's results); only what reads it matters: device 0's copy of a result
the same on every device is the result itself, anything else reads the device axis."""

from __future__ import annotations

import re
from collections.abc import Callable
from itertools import islice

import libcst as cst

from jaxmigrate.toolkit.emit import code

from ._declines import Decline, NotVisible
from ._forms import Forms
from ._layout import TREE_MAPS, Qualname
from ._reach import Flow

PLACE = "__step_result__"  # the call, as a name the readback forms read
DEPTH = 4  # `step(x)[0]`: 1 up; `f(step(x))`: 2 (its `Arg`); `jax.device_get(step(x))[0]`: 3


def read_at_once(
    flow: Flow, forms: Forms, call: cst.Call
) -> tuple[cst.BaseExpression, tuple[int, ...]] | None:
    """Return the expression reading device 0's copy of `call`'s result around it, and where the
    value left once the readback is deleted sits in it (children indices); else None."""
    for node in islice(flow.ancestors(call), DEPTH):
        if not isinstance(node, cst.BaseExpression):
            continue
        marked = node.deep_replace(call, cst.Name(PLACE))
        assert isinstance(marked, cst.BaseExpression)
        read = forms.readback_value(marked, PLACE)
        path = _path(marked, read[1]) if read is not None else None
        if path is not None:
            return node, path
    return None


def at(node: cst.CSTNode, path: tuple[int, ...]) -> cst.BaseExpression:
    """Return the node at `path` (children indices) under `node`."""
    for index in path:
        node = node.children[index]
    assert isinstance(node, cst.BaseExpression)
    return node


def not_read_back(flow: Flow, call: cst.Call, step: str) -> NotVisible:
    """Why a call of `step` that is not `out = step(...)` is not taken: bound otherwise (PL206),
    or its result read with its device axis (PL401), naming what reads it."""
    around = flow.parent.get(id(call))
    if isinstance(around, (cst.Assign, cst.AnnAssign, cst.AugAssign)):
        why = f"`{step}` is called other than as `out = {step}(...)`"
        return NotVisible(why, Decline.RESULTS_UNNAMED)
    readers = (a for a in flow.ancestors(call) if isinstance(a, (cst.Call, cst.BaseSmallStatement)))
    reader = next(readers, None)  # AlgoPerf: `state.copy({"k": step(x)})`
    where = "by `return`" if isinstance(reader, cst.Return) else "in an expression"
    if isinstance(reader, cst.Call):
        where = f"in `{short(reader.func)}(...)`"
    why = (
        f"the result of `{step}(...)` is read {where} with its device axis, not as device 0's "
        "copy (`[0]`, `unreplicate`)"
    )
    return NotVisible(why, Decline.RESULT_READ)


def readers(
    flow: Flow,
    uses: list[cst.CSTNode],
    qualname: Qualname,
    known: Callable[[cst.CSTNode, cst.Call], str | None] = lambda _, __: None,
) -> str:
    """Name what reads each of `uses` (a value stacked for a step), the innermost call or
    statement around it: calls it is passed to, not followed (another module's function, a
    method of an object: big_vision's `evaluator.run(params_repl)`) or `known` to read it
    otherwise (its text then says how), then expressions of the function the table does not
    read (`jax.tree.map(lambda v: v.mean(), params_repl)`, `jnp.sum(params)`: JAX and NumPy
    read the device axis as any other)."""
    passed: dict[str, dict[str, None]] = {}  # how it is read there -> the calls
    read: dict[str, None] = {}
    for use in uses:
        node, reader = use, flow.parent.get(id(use))
        while reader is not None and not isinstance(reader, (cst.Call, cst.BaseSmallStatement)):
            node, reader = reader, flow.parent.get(id(reader))
        called = (qualname(reader.func) or "") if isinstance(reader, cst.Call) else ""
        library = called in TREE_MAPS or called.split(".")[0] in ("jax", "numpy")  # reads it all
        if isinstance(reader, cst.Call) and isinstance(node, cst.Arg) and not library:
            how = known(use, reader) or "what layout is needed there is not followed"
            passed.setdefault(how, {})[f"`{short(reader.func)}(...)`"] = None
            continue
        read[f"`{short(reader)}`" if reader is not None else "an expression"] = None
    parts = [f"passed to {', '.join(calls)}: {how}" for how, calls in passed.items()]
    parts += [f"read in {', '.join(read)}"] if read else []
    return "; ".join(parts)


def _path(node: cst.CSTNode, target: cst.CSTNode) -> tuple[int, ...] | None:
    """Return the children indices leading from `node` to `target`, None if not under it."""
    if node is target:
        return ()
    for index, child in enumerate(node.children):
        below = _path(child, target)
        if below is not None:
            return (index, *below)
    return None


def short(node: cst.CSTNode) -> str:
    """The code of `node` on one line, cut to a length a message can hold: a line break just
    inside brackets goes (`f(\n    x,\n)` reads `f(x,)`), any other becomes one space."""
    text = _BROKEN_CLOSE.sub(r"\1", _BROKEN_OPEN.sub(r"\1", code(node)))
    text = " ".join(text.split())
    return text if len(text) <= 48 else text[:45] + "..."


_BROKEN_OPEN = re.compile(r"([(\[{])[ \t]*\n\s*")
_BROKEN_CLOSE = re.compile(r"\s*\n\s*([)\]}])")
