"""Small CST helpers for passes: reusable expressions, emitting names.

Where names are bound, and what they mean, is the scope model's (`scope.ScopeModel`, a pass's
`self.resolver`). `is_reusable` says whether an expression can be written twice in the output
without changing what the program does. `ref_to` spells an object the way the module already
imports it, or imports it under its customary name.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import libcst as cst

from jaxmigrate.names import dotted
from jaxmigrate.passes import Pass
from jaxmigrate.scope import ScopeModel


def names_in(node: cst.CSTNode) -> set[str]:
    """Return every identifier written anywhere inside `node`."""

    class _Names(cst.CSTVisitor):
        def __init__(self) -> None:
            self.found: set[str] = set()

        def visit_Name(self, name: cst.Name) -> None:
            self.found.add(name.value)

    collector = _Names()
    node.visit(collector)
    return collector.found


def is_reusable(node: cst.BaseExpression, pure_call: Callable[[cst.Call], bool]) -> bool:
    """Return True if evaluating `node` twice gives equal values and no side effect.

    Names, attribute reads, literals, subscripts and arithmetic of those, tuples and lists of
    those, and calls `pure_call` accepts (with reusable arguments) qualify.
    """
    if isinstance(node, (cst.Name, cst.Integer, cst.Float, cst.SimpleString)):
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


def with_keyword(arg: cst.Arg, keyword: str) -> cst.Arg:
    """Return `arg` passed as `keyword=value`, keeping its value, comma and comments."""
    equal = arg.equal
    if not isinstance(equal, cst.AssignEqual):
        equal = cst.AssignEqual(
            whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")
        )
    return arg.with_changes(keyword=cst.Name(keyword), equal=equal)


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
    name = cst.SimpleString(f'"{axis}"')
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


def fresh_name(candidates: Sequence[str], taken: set[str]) -> str:
    """Return the first of `candidates` not in `taken` (or the last one with underscores)."""
    for name in candidates:
        if name not in taken:
            return name
    name = candidates[-1]
    while name in taken:
        name += "_"
    return name


def one_arg_per_line(call: cst.Call, indent: str) -> cst.Call:
    """Return `call` with each argument on its own line under `indent`, and a trailing comma."""

    def newline(whitespace: str) -> cst.ParenthesizedWhitespace:
        return cst.ParenthesizedWhitespace(
            first_line=cst.TrailingWhitespace(),
            empty_lines=[],
            indent=False,
            last_line=cst.SimpleWhitespace(whitespace),
        )

    inner = indent + "    "
    last = len(call.args) - 1
    args = [
        a.with_changes(
            comma=cst.Comma(whitespace_after=newline(inner if i < last else indent)),
            whitespace_after_arg=cst.SimpleWhitespace(""),
        )
        for i, a in enumerate(call.args)
    ]
    return call.with_changes(whitespace_before_args=newline(inner), args=args)


def fit_call(old: cst.Call, new: cst.Call, line: str, width: int = 100) -> cst.Call:
    """Return `new`, laid out one argument per line if `old` sat on one `line` and `new`
    would push that line past `width` columns."""
    render = cst.Module([]).code_for_node
    old_code, new_code = render(old), render(new)
    if "\n" in old_code or "\n" in new_code or len(line) - len(old_code) + len(new_code) <= width:
        return new
    return one_arg_per_line(new, line[: len(line) - len(line.lstrip())])


def is_read(node: cst.Name | cst.Attribute, parent: cst.CSTNode | None) -> bool:
    """Return True if `node`, a child of `parent`, reads a variable: not an attribute name, a
    keyword, a parameter, a definition's name, a `global` name or an assignment target."""
    if isinstance(parent, cst.Attribute):
        return node is parent.value
    if isinstance(parent, cst.Arg):
        return node is not parent.keyword
    if isinstance(parent, cst.Param):
        return node is not parent.name
    return not isinstance(
        parent,
        (
            cst.FunctionDef,
            cst.ClassDef,
            cst.NameItem,
            cst.AssignTarget,
            cst.ImportAlias,
            cst.AsName,
        ),
    )


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
