"""The checks of the jit-callback-per-shard rule: whether one callback's operand, result shape and
sharding are ones the rewrite understands, and the `in_shardings=` that `jax.jit` gives the
module's functions (as a decorator, or at module level)."""

from __future__ import annotations

from collections.abc import Sequence

import libcst as cst

from jaxmigrate.toolkit.names import dotted
from jaxmigrate.toolkit.passes import Pass

JIT = "jax.jit"
PARTIAL = "functools.partial"
NAMED = frozenset({"jax.sharding.NamedSharding", "jax.NamedSharding"})
SHAPE = "jax.ShapeDtypeStruct"


class LeftAlone(Exception):
    """A callback this pass leaves alone; the message is the reason."""


class SiteChecks(Pass):
    """The pass's checks; the functions around the callback and the module are the pass's."""

    _tree: cst.Module | None
    _functions: list[tuple[cst.FunctionDef, cst.BaseExpression | None]]
    _jitted: dict[str, cst.BaseExpression] | None

    # Checking one site --------------------------------------------------------------------
    def _check(self, call: cst.Call) -> tuple[str, cst.BaseExpression, cst.BaseExpression]:
        """Return the operand's name, the mesh and the operand's spec; raise LeftAlone if unsure."""
        function, shardings = self._functions[-1]
        assert shardings is not None
        args = [a for a in call.args if a.keyword is None]
        if any(a.star for a in call.args) or len(args) != 3:
            raise LeftAlone("not one positional operand: which rows go where is not known")
        if any(a.keyword and a.keyword.value not in ("vmap_method",) for a in call.args):
            raise LeftAlone("keyword arguments besides `vmap_method=`")
        operand = args[2].value
        if not isinstance(operand, cst.Name):
            raise LeftAlone("the operand is not a parameter of the jitted function")
        params = [p.name.value for p in function.params.params]
        if operand.value not in params or function.params.posonly_params:
            raise LeftAlone(f"`{operand.value}` is not a plain parameter of the jitted function")
        self._check_shape(args[1].value, operand.value)
        sharding = _at(shardings, params.index(operand.value))
        mesh, spec = self._named_sharding(sharding)
        rebound = [
            b
            for name in (operand.value, (dotted(mesh) or "").split(".")[0])
            for b in self.resolver.bindings(name)
            if b.scope.node is function and name != operand.value
        ]
        if (
            rebound
            or len([b for b in self.resolver.bindings(operand.value) if b.scope.node is function])
            != 1
        ):
            raise LeftAlone("the jitted function rebinds the operand or the mesh's name")
        return operand.value, mesh, spec

    def _check_shape(self, shape: cst.BaseExpression, operand: str) -> None:
        ok = (
            isinstance(shape, cst.Call)
            and self.qualname(shape.func) == SHAPE
            and len(shape.args) == 2
            and not any(a.keyword or a.star for a in shape.args)
            and dotted(shape.args[0].value) == f"{operand}.shape"
            and dotted(shape.args[1].value) is not None
        )
        if not ok:
            raise LeftAlone(
                f"the result shape is not `jax.ShapeDtypeStruct({operand}.shape, dtype)`"
            )

    def _named_sharding(
        self, sharding: cst.BaseExpression | None
    ) -> tuple[cst.BaseExpression, cst.BaseExpression]:
        if (
            not isinstance(sharding, cst.Call)
            or self.qualname(sharding.func) not in NAMED
            or len(sharding.args) != 2
            or any(a.keyword or a.star for a in sharding.args)
        ):
            raise LeftAlone("the operand's sharding is not a literal `NamedSharding(mesh, spec)`")
        mesh, spec = (a.value for a in sharding.args)
        if not isinstance(mesh, (cst.Name, cst.Attribute)) or dotted(mesh) is None:
            raise LeftAlone("the mesh is not a plain name")
        if not isinstance(spec, cst.Call) or not spec.args:
            raise LeftAlone("the operand's spec does not split its leading axis")
        first = spec.args[0].value
        if spec.args[0].keyword or not isinstance(first, (cst.SimpleString, cst.Tuple)):
            raise LeftAlone("the operand's spec does not split its leading axis")
        if any(a.keyword or not _is_none(a.value) for a in spec.args[1:]):
            raise LeftAlone(
                "the operand's spec splits an axis besides its leading one: each shard would"
                " hold part of every row"
            )
        return mesh.deep_clone(), spec.deep_clone()

    def _in_shardings(self, node: cst.FunctionDef) -> cst.BaseExpression | None:
        """Return the `in_shardings=` a `jax.jit` decorator gives this function, if any."""
        for deco in node.decorators:
            call = deco.decorator
            if (
                isinstance(call, cst.Call)
                and self.qualname(call.func) == PARTIAL
                and call.args
                and self.qualname(call.args[0].value) == JIT
            ):
                return keyword(call, "in_shardings")
        if self._jitted is None:
            self._jitted = self._module_jits()
        return self._jitted.get(node.name.value)

    def _module_jits(self) -> dict[str, cst.BaseExpression]:
        """Return `{name: S}` for each module-level `g = jax.jit(name, in_shardings=S)`."""
        assert self._tree is not None
        found: dict[str, cst.BaseExpression] = {}
        for statement in self._tree.body:
            if not isinstance(statement, cst.SimpleStatementLine):
                continue
            for small in statement.body:
                value = small.value if isinstance(small, cst.Assign) else None
                if (
                    isinstance(value, cst.Call)
                    and self.qualname(value.func) == JIT
                    and value.args
                    and isinstance(value.args[0].value, cst.Name)
                ):
                    shardings = keyword(value, "in_shardings")
                    if shardings is not None:
                        found[value.args[0].value.value] = shardings
        return found


def keyword(call: cst.Call, name: str) -> cst.BaseExpression | None:
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == name:
            return arg.value
    return None


def _is_none(value: cst.BaseExpression) -> bool:
    return isinstance(value, cst.Name) and value.value == "None"


def _at(shardings: cst.BaseExpression, index: int) -> cst.BaseExpression | None:
    """Return the sharding of parameter `index`: a tuple's element, or the one sharding."""
    if isinstance(shardings, (cst.Tuple, cst.List)):
        elements: Sequence[cst.BaseElement] = shardings.elements
        return elements[index].value if index < len(elements) else None
    return shardings
