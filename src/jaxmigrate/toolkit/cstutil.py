"""Small CST helpers for passes: reusable expressions, emitting names.

Where names are bound, and what they mean, is the scope model's (`scope.ScopeModel`, a pass's
`self.resolver`); laying code out, `with_keyword`, `fresh_name` and `is_read` are in
`jaxmigrate.toolkit.emit`. `is_reusable` says whether an expression can be written twice in the output
without changing what the program does. `ref_to` spells an object the way the module already
imports it, or imports it under its customary name.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import libcst as cst

from jaxmigrate.toolkit.names import dotted, walk
from jaxmigrate.toolkit.passes import Pass
from jaxmigrate.toolkit.scope import ScopeModel


def names_in(node: cst.CSTNode) -> set[str]:
    """Return every identifier written anywhere inside `node`."""

    class _Names(cst.CSTVisitor):
        def __init__(self) -> None:
            self.found: set[str] = set()

        def visit_Name(self, name: cst.Name) -> None:
            self.found.add(name.value)

    collector = _Names()
    walk(collector, node)
    return collector.found


def is_reusable(node: cst.BaseExpression, pure_call: Callable[[cst.Call], bool]) -> bool:
    """Return True if evaluating `node` twice gives equal values and no side effect.

    Names, attribute reads, literals, subscripts and arithmetic of those, tuples and lists of
    those, and calls `pure_call` accepts (with reusable arguments) qualify.
    """
    if isinstance(node, (cst.Name, cst.Integer, cst.Float, cst.SimpleString)):
        return True
    if isinstance(node, cst.ConcatenatedString):
        return True
    if isinstance(node, cst.Attribute):
        return dotted(node) is not None
    if isinstance(node, cst.UnaryOperation):
        return is_reusable(node.expression, pure_call)
    if isinstance(node, cst.BinaryOperation):
        return is_reusable(node.left, pure_call) and is_reusable(node.right, pure_call)
    if isinstance(node, (cst.Tuple, cst.List)):
        return all(
            isinstance(e, cst.Element) and is_reusable(e.value, pure_call) for e in node.elements
        )
    if isinstance(node, cst.Subscript):
        return is_reusable(node.value, pure_call) and all(
            _reusable_slice(e.slice, pure_call) for e in node.slice
        )
    if isinstance(node, cst.Call):
        return pure_call(node) and all(
            not a.star and is_reusable(a.value, pure_call) for a in node.args
        )
    return False


def _reusable_slice(part: cst.BaseSlice, pure_call: Callable[[cst.Call], bool]) -> bool:
    if isinstance(part, cst.Index):
        return part.star is None and is_reusable(part.value, pure_call)
    if isinstance(part, cst.Slice):
        bounds = (part.lower, part.upper, part.step)
        return all(b is None or is_reusable(b, pure_call) for b in bounds)
    return False


def ref_to(
    p: Pass,
    bindings: ScopeModel,
    qualnames: Sequence[str],
    *,
    local: str,
    module: str,
    obj: str | None = None,
) -> cst.Name | None:
    """Return a Name meaning `qualnames[0]` anywhere in the module, importing it if needed.

    Uses the module-level name already bound to one of `qualnames` (`np` for `numpy`) unless a
    nested scope rebinds it; else imports it as `local` (`from module import obj as local`, or
    `import module as local`) when `local` is used nowhere in the module. Returns None when
    neither is possible: the caller spells the object out in full.
    """
    for qualname in qualnames:
        name = p.resolver.module_binding(qualname)
        if name is not None and not bindings.bound_below_module(name):
            return cst.Name(name)
    if not p.resolver.is_free(local) or bindings.star_import:
        return None
    default = obj if obj is not None else module
    asname = None if local == default else local
    p.need_import(module, obj, asname=asname)
    return cst.Name(local)


def parenthesized(node: cst.BaseExpression) -> cst.BaseExpression:
    """Return `node`, in parentheses unless it is an atom that binds tighter than any operator."""
    atoms = (
        cst.Name,
        cst.Attribute,
        cst.Call,
        cst.Subscript,
        cst.Set,
        cst.Dict,
        cst.List,
        cst.SimpleString,
        cst.Integer,
    )
    if isinstance(node, atoms) or node.lpar:
        return node
    return node.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])


def jax_ref(
    p: Pass, bindings: ScopeModel, path: str, *, local: str, also: Sequence[str] = ()
) -> cst.BaseExpression:
    """Return an expression for `jax.<path>`: the module's own name for it, a new
    `from jax.<module> import <obj> [as local]`, or else `jax.<path>` spelled out."""
    module, _, obj = f"jax.{path}".rpartition(".")
    name = ref_to(p, bindings, (f"jax.{path}", *also), local=local, module=module, obj=obj)
    return name if name is not None else p.jax_attr(path)


def numpy_ref(p: Pass, bindings: ScopeModel) -> cst.BaseExpression:
    """Return an expression for the `numpy` module (`np` where possible), importing it if needed."""
    name = ref_to(p, bindings, ("numpy",), local="np", module="numpy")
    return name if name is not None else p.module_ref("numpy")


def jnp_ref(p: Pass, bindings: ScopeModel) -> cst.BaseExpression:
    """Return an expression for `jax.numpy` (`jnp` where possible), importing it if needed."""
    name = ref_to(p, bindings, ("jax.numpy",), local="jnp", module="jax.numpy")
    return name if name is not None else p.jax_attr("numpy")


def make_leading_axis_sharding(
    p: Pass, bindings: ScopeModel, devices: cst.BaseExpression, axis: str = "x"
) -> cst.Call:
    """Return `NamedSharding(Mesh(np.array(devices), ("x",)), P("x"))` spelled for the module:
    the leading array axis split over `devices`, in their order, on an Auto 1-D mesh."""
    name = p.state.style.string(axis)
    mesh = cst.Call(
        jax_ref(p, bindings, "sharding.Mesh", local="Mesh"),
        [
            cst.Arg(
                cst.Call(
                    cst.Attribute(numpy_ref(p, bindings), cst.Name("array")), [cst.Arg(devices)]
                )
            ),
            cst.Arg(cst.Tuple([cst.Element(name, comma=cst.Comma())])),
        ],
    )
    spec = cst.Call(
        jax_ref(p, bindings, "sharding.PartitionSpec", local="P", also=("jax.P",)),
        [cst.Arg(name)],
    )
    named = jax_ref(
        p, bindings, "sharding.NamedSharding", local="NamedSharding", also=("jax.NamedSharding",)
    )
    return cst.Call(named, [cst.Arg(mesh), cst.Arg(spec)])


class AncestorTracking(cst.CSTTransformer):
    """Transformer mixin: while `visit_X(node)` runs, `self.ancestors` holds the nodes around
    `node`, outermost first (its parent last). Put it before `Pass` in the bases."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.ancestors: list[cst.CSTNode] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        if not super().on_visit(node):
            return False
        self.ancestors.append(node)
        return True

    def on_leave(self, original_node: cst.CSTNodeT, updated_node: cst.CSTNodeT) -> Any:
        if self.ancestors and self.ancestors[-1] is original_node:
            self.ancestors.pop()
        return super().on_leave(original_node, updated_node)
