"""Small CST helpers for passes: where names are bound, reusable expressions, emitting names.

(Laying code out, `with_keyword`, `fresh_name` and `is_read` are in `jaxmigrate.emit`.)

`Bindings` records every place a name is bound in a module and in which scope, so a pass can ask
"is `mesh` assigned exactly once, and to what?" or "may I emit `np` here without it meaning
something else?". `is_reusable` says whether an expression can be written twice in the output
without changing what the program does. `ref_to` spells an object the way the module already
imports it, or imports it under its customary name.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import libcst as cst

from jaxmigrate.names import dotted
from jaxmigrate.passes import Pass


@dataclass(frozen=True)
class Binding:
    """One binding of a name: the scope node it lives in and, for `name = value`, the value."""

    scope: cst.CSTNode
    value: cst.BaseExpression | None = None


class Bindings(cst.CSTVisitor):
    """Every binding of every name in a module, with its scope; build with `Bindings.of(module)`."""

    def __init__(self, module: cst.Module) -> None:
        super().__init__()
        self.by_name: dict[str, list[Binding]] = {}
        self.declared: set[str] = set()  # named in a `global` or `nonlocal` statement
        self.star_import = False
        self._stack: list[cst.CSTNode] = [module]

    @classmethod
    def of(cls, module: cst.Module) -> Bindings:
        """Return the bindings of `module`."""
        index = cls(module)
        module.visit(index)
        return index

    def bound(self, name: str) -> bool:
        """Return True if anything in the module may bind `name`."""
        return name in self.by_name or self.star_import

    def bound_below_module(self, name: str) -> bool:
        """Return True if a function, class or comprehension binds `name` (may shadow it)."""
        return any(not isinstance(b.scope, cst.Module) for b in self.by_name.get(name, ()))

    def assignment_seen_from(self, name: str, scopes: Sequence[cst.CSTNode]) -> Binding | None:
        """Return the plain `name = value` a read of `name` inside `scopes` sees.

        `scopes` are the module, classes, functions, lambdas and comprehensions around the read,
        outermost first. None unless that assignment is the only binding of `name` in the scope
        that owns it (and no `global` / `nonlocal` or star import could change that).
        """
        found = self.by_name.get(name, [])
        if self.star_import or name in self.declared:
            return None
        for depth, scope in enumerate(reversed(scopes)):
            if isinstance(scope, cst.ClassDef) and depth > 0:
                continue  # a class body's names are not visible in its methods
            here = [b for b in found if b.scope is scope]
            if here:
                return here[0] if len(here) == 1 and here[0].value is not None else None
        return None

    def values(self, name: str) -> list[cst.BaseExpression]:
        """Return every value assigned to `name` by a plain `name = value`, in any scope."""
        return [b.value for b in self.by_name.get(name, []) if b.value is not None]

    # Recording ----------------------------------------------------------------------------
    def _bind(self, name: str, value: cst.BaseExpression | None = None) -> None:
        self.by_name.setdefault(name, []).append(Binding(self._stack[-1], value))

    def _bind_target(self, target: cst.BaseExpression) -> None:
        if isinstance(target, cst.Name):
            self._bind(target.value)
        elif isinstance(target, (cst.Tuple, cst.List)):
            for element in target.elements:
                self._bind_target(element.value)
        elif isinstance(target, cst.StarredElement):
            self._bind_target(target.value)

    def _scoped(self, node: cst.CSTNode, params: cst.Parameters | None, *body: cst.CSTNode) -> None:
        self._stack.append(node)
        if params is not None:
            for p in (*params.posonly_params, *params.params, *params.kwonly_params):
                self._bind(p.name.value)
            for star in (params.star_arg, params.star_kwarg):
                if isinstance(star, cst.Param):
                    self._bind(star.name.value)
        for part in body:
            part.visit(self)
        self._stack.pop()

    # Scopes -------------------------------------------------------------------------------
    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        self._bind(node.name.value)
        for deco in node.decorators:
            deco.visit(self)
        node.params.visit(self)
        self._scoped(node, node.params, node.body)
        return False

    def visit_Lambda(self, node: cst.Lambda) -> bool:
        node.params.visit(self)
        self._scoped(node, node.params, node.body)
        return False

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        self._bind(node.name.value)
        for part in (*node.decorators, *node.bases, *node.keywords):
            part.visit(self)
        self._scoped(node, None, node.body)
        return False

    def visit_Param(self, node: cst.Param) -> bool:
        for part in (node.default, node.annotation):
            if part is not None:
                part.visit(self)
        return False

    def _comprehension(self, node: cst.BaseComp | cst.DictComp) -> bool:
        if isinstance(node, cst.DictComp):
            self._scoped(node, None, node.for_in, node.key, node.value)
        elif isinstance(node, (cst.ListComp, cst.SetComp, cst.GeneratorExp)):
            self._scoped(node, None, node.for_in, node.elt)
        return False

    def visit_ListComp(self, node: cst.ListComp) -> bool:
        return self._comprehension(node)

    def visit_SetComp(self, node: cst.SetComp) -> bool:
        return self._comprehension(node)

    def visit_GeneratorExp(self, node: cst.GeneratorExp) -> bool:
        return self._comprehension(node)

    def visit_DictComp(self, node: cst.DictComp) -> bool:
        return self._comprehension(node)

    # Bindings -----------------------------------------------------------------------------
    def visit_Import(self, node: cst.Import) -> None:
        for alias in node.names:
            if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
                self._bind(alias.asname.name.value)
            else:
                full = dotted(alias.name)
                if full is not None:
                    self._bind(full.split(".")[0])

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        if isinstance(node.names, cst.ImportStar):
            self.star_import = True
            return
        for alias in node.names:
            if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
                self._bind(alias.asname.name.value)
            elif isinstance(alias.name, cst.Name):
                self._bind(alias.name.value)

    def visit_Assign(self, node: cst.Assign) -> None:
        if len(node.targets) == 1 and isinstance(node.targets[0].target, cst.Name):
            self._bind(node.targets[0].target.value, node.value)
            return
        for t in node.targets:
            self._bind_target(t.target)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        self._bind_target(node.target)

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        self._bind_target(node.target)

    def visit_NamedExpr(self, node: cst.NamedExpr) -> None:
        self._bind_target(node.target)

    def visit_For(self, node: cst.For) -> None:
        self._bind_target(node.target)

    def visit_CompFor(self, node: cst.CompFor) -> None:
        self._bind_target(node.target)

    def visit_WithItem(self, node: cst.WithItem) -> None:
        if node.asname is not None:
            self._bind_target(node.asname.name)

    def visit_ExceptHandler(self, node: cst.ExceptHandler) -> None:
        if node.name is not None:
            self._bind_target(node.name.name)

    def visit_Global(self, node: cst.Global) -> None:
        for item in node.names:
            self._bind(item.name.value)
            self.declared.add(item.name.value)

    def visit_Nonlocal(self, node: cst.Nonlocal) -> None:
        for item in node.names:
            self._bind(item.name.value)
            self.declared.add(item.name.value)

    def visit_Del(self, node: cst.Del) -> None:
        self._bind_target(node.target)

    def visit_MatchAs(self, node: cst.MatchAs) -> None:
        if node.name is not None:
            self._bind(node.name.value)

    def visit_MatchStar(self, node: cst.MatchStar) -> None:
        if node.name is not None:
            self._bind(node.name.value)

    def visit_MatchMapping(self, node: cst.MatchMapping) -> None:
        if node.rest is not None:
            self._bind(node.rest.value)


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
    bindings: Bindings,
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
    p: Pass, bindings: Bindings, path: str, *, local: str, also: Sequence[str] = ()
) -> cst.BaseExpression:
    """Return an expression for `jax.<path>`: the module's own name for it, a new
    `from jax.<module> import <obj> [as local]`, or else `jax.<path>` spelled out."""
    module, _, obj = f"jax.{path}".rpartition(".")
    name = ref_to(p, bindings, (f"jax.{path}", *also), local=local, module=module, obj=obj)
    return name if name is not None else p.jax_attr(path)


def numpy_ref(p: Pass, bindings: Bindings) -> cst.BaseExpression:
    """Return an expression for the `numpy` module (`np` where possible), importing it if needed."""
    name = ref_to(p, bindings, ("numpy",), local="np", module="numpy")
    return name if name is not None else p.module_ref("numpy")


def jnp_ref(p: Pass, bindings: Bindings) -> cst.BaseExpression:
    """Return an expression for `jax.numpy` (`jnp` where possible), importing it if needed."""
    name = ref_to(p, bindings, ("jax.numpy",), local="jnp", module="jax.numpy")
    return name if name is not None else p.jax_attr("numpy")


def make_leading_axis_sharding(
    p: Pass, bindings: Bindings, devices: cst.BaseExpression, axis: str = "x"
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


SCOPE_NODES = (
    cst.Module,
    cst.ClassDef,
    cst.FunctionDef,
    cst.Lambda,
    cst.ListComp,
    cst.SetComp,
    cst.GeneratorExp,
    cst.DictComp,
)


def enclosing_scopes(ancestors: Sequence[cst.CSTNode]) -> list[cst.CSTNode]:
    """Return the scopes a name read below `ancestors` is looked up in, outermost first (a
    decorator belongs to the scope around the function or class it decorates)."""
    scopes: list[cst.CSTNode] = []
    for i, node in enumerate(ancestors):
        decorating = i + 1 < len(ancestors) and isinstance(ancestors[i + 1], cst.Decorator)
        if isinstance(node, SCOPE_NODES) and not decorating:
            scopes.append(node)
    return scopes
