"""The emission of the partial-auto-callback rule: the edits that nest a callback in a shard_map
over the automatic axes, gate it to one device, or widen the shard_map."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import libcst as cst
from libcst.codemod import CodemodContext

from jaxmigrate.toolkit.cstutil import is_reusable, jax_ref, jnp_ref
from jaxmigrate.toolkit.emit import Call, Item, code, comments_in, fresh_name, joined, new_item
from jaxmigrate.toolkit.passes import Pass

from ._survey import (
    IO,
    OPTIONS,
    SHAPE_MAKERS,
    CallbackSite,
    Edit,
    LeftAlone,
    Region,
)


class Emission(Pass):
    """The pass's edits; each returns a function of the updated call."""

    def __init__(self, context: CodemodContext) -> None:
        super().__init__(context)
        self.edits: dict[int, Edit] = {}  # by id of the original call

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        edit = self.edits.get(id(original_node))
        return updated_node if edit is None else edit(updated_node)

    # Emitting ------------------------------------------------------------------------------
    @staticmethod
    def _widen(region: Region) -> Edit:
        """Drop `axis_names=`: every mesh axis manual."""

        def edit(updated: cst.Call) -> cst.Call:
            args = list(updated.args)
            at = next(
                i for i, a in enumerate(args) if a.keyword and a.keyword.value == "axis_names"
            )
            dropped = args.pop(at)
            if args and at == len(args):
                args[-1] = args[-1].with_changes(comma=dropped.comma)
            return updated.with_changes(args=args)

        return edit

    def _gate(self, site: CallbackSite) -> Edit:
        """Run the callback on the first device along the automatic axes; share its result."""
        if site.kind == IO:
            if len(site.call.args) < 2 or site.call.args[1].keyword is not None:
                raise LeftAlone("`io_callback` without a positional result shape")
            if not is_reusable(site.call.args[1].value, lambda c: self._is_shape(c) is not None):
                raise LeftAlone("the `io_callback`'s result shapes are computed by a call")
        axes = _axescode(site.auto)

        def edit(updated: cst.Call) -> cst.BaseExpression:
            lax = self._lax()
            shapes = updated.args[1].value if site.kind == IO else cst.Name("None")
            has_result = not _is_none(shapes)
            one = self._is_shape(shapes) if isinstance(shapes, cst.Call) else None
            zeros = f"{code(jnp_ref(self, self.resolver))}.zeros" if has_result else ""
            empty = "None"
            if one:
                empty = f"{zeros}({', '.join(map(code, one))})"
            elif has_result:
                tree_map = code(self.jax_attr("tree.map"))
                empty = f"{tree_map}(lambda s: {zeros}(s.shape, s.dtype), {code(shapes)})"
            branches = [
                Item(cst.Arg(cst.parse_expression(f"{lax}.axis_index({axes}) == 0"))),
                _in_lambda(updated, []),
                Item(cst.Arg(cst.parse_expression(f"lambda: {empty}"))),
            ]
            cond = Call(cst.parse_expression(f"{lax}.cond"), branches)
            if has_result:  # the result is shared along the automatic axes
                cond_item = Item(cst.Arg(cond.flat()), cond)
                axes_item = Item(cst.Arg(cst.parse_expression(axes)))
                cond = Call(cst.parse_expression(f"{lax}.psum"), [cond_item, axes_item])
            return cond.laid_out(self.room(site.call), self.state.style)

        return edit

    def _is_shape(self, call: cst.Call) -> list[cst.BaseExpression] | None:
        """Return `[shape, dtype]` of `jax.ShapeDtypeStruct(shape, dtype)`; [] for another shape
        maker; None for any other call."""
        if self.qualname(call.func) not in SHAPE_MAKERS:
            return None
        args = [a.value for a in call.args if a.keyword is None and not a.star]
        return args if len(args) == len(call.args) == 2 else []

    def _nest(self, site: CallbackSite) -> Edit:
        """Run the callback in a shard_map over the automatic axes, its operands as parameters."""
        operands = self._operands(site)
        names = "{" + ", ".join(a.value for a in site.auto) + "}"

        def edit(updated: cst.Call) -> cst.BaseExpression:
            spec = jax_ref(
                self, self.resolver, "sharding.PartitionSpec", local="P", also=("jax.P",)
            )
            args = [
                a.with_changes(value=cst.Name(operands[i])) if i in operands else a
                for i, a in enumerate(updated.args)
            ]
            params = [cst.Param(cst.Name(name)) for name in operands.values()]
            in_specs = f"{code(spec)}()" if operands else "()"
            keywords = [
                new_item("in_specs", cst.parse_expression(in_specs)),
                new_item("out_specs", cst.Call(spec.deep_clone())),
                new_item("axis_names", cst.parse_expression(names)),
                new_item("check_vma", cst.Name("False")),
            ]
            nested = Call(
                self.jax_attr("shard_map"),
                [_in_lambda(updated.with_changes(args=args), params), *keywords],
            )
            values = [cst.Arg(updated.args[i].value) for i in operands]
            room = self.room(site.call)
            applied = code(cst.Call(cst.Name("f"), values))[1:]
            laid = nested.laid_out(replace(room, tail=room.tail + len(applied)), self.state.style)
            return cst.Call(laid, joined(values))

        return edit

    def _operands(self, site: CallbackSite) -> dict[int, str]:
        """Return the lambda parameter for each operand argument of the callback, by position:
        a name passed as an operand keeps its name, anything else gets a fresh one."""
        taken = set(self.resolver.all_names)
        skipped = OPTIONS[site.kind] | {"callback", "result_shape_dtypes"}
        operands: dict[int, str] = {}
        for i, arg in enumerate(site.call.args):
            if (arg.keyword is None and i < 2) or (arg.keyword and arg.keyword.value in skipped):
                continue
            if isinstance(arg.value, cst.Name) and arg.value.value not in operands.values():
                operands[i] = arg.value.value
            else:
                operands[i] = fresh_name(["operand", *(f"operand{k}" for k in range(1, 9))], taken)
            taken.add(operands[i])
        return operands

    def _lax(self) -> str:
        local = self.resolver.module_binding("jax.lax")
        if local is not None and not self.resolver.bound_below_module(local):
            return local
        return code(self.jax_attr("lax"))


def _in_lambda(call: cst.Call, params: list[cst.Param]) -> Item:
    """Return `lambda params: call` as an argument whose call is laid out in turn (kept as
    written when it holds a comment or unpacks arguments)."""
    head = code(cst.Lambda(cst.Parameters(params), cst.Name("x")))[:-1]
    wrap = lambda c: cst.Lambda(cst.Parameters(params), c)
    value = wrap(call)
    if comments_in(call) or any(a.star for a in call.args):
        return Item(cst.Arg(value))
    return Item(cst.Arg(value), Call.of(call), wrap=wrap, head=len(head))


def _axescode(axes: Sequence[cst.SimpleString]) -> str:
    if len(axes) == 1:
        return axes[0].value
    return "(" + ", ".join(a.value for a in axes) + ")"


def _is_none(node: cst.BaseExpression) -> bool:
    return isinstance(node, cst.Name) and node.value == "None"
