"""What the passes for JAX's removed `device_put_replicated` and `device_put_sharded` share.

Both rewrite `jax.device_put_X(first, devices)` as `jax.device_put(stacked, sharding)`, where
`stacked` stacks `first` along a new leading axis and `sharding` splits that axis over `devices`
(`cstutil.make_leading_axis_sharding`). They differ in how they stack, and in what else makes a
call unsafe to rewrite: a subclass sets the class constants and implements `stacked` (and may
extend `why_not`).
"""

from __future__ import annotations

from typing import ClassVar

import libcst as cst

from jaxmigrate.toolkit.cstutil import (
    AncestorTracking,
    make_leading_axis_sharding,
)
from jaxmigrate.toolkit.emit import (
    Call,
    Item,
    has_magic_comma,
    is_read,
    items_of,
    with_lambda_calls,
)
from jaxmigrate.toolkit.names import dotted
from jaxmigrate.toolkit.passes import Pass


class RemovedDevicePut(AncestorTracking, Pass):
    """Rewrite a call of a removed `jax.device_put_*` helper as `jax.device_put`."""

    LEGACY: ClassVar[str]  # the removed function's qualified name
    PARAMS: ClassVar[tuple[str, str]]  # its two parameters, in order
    MESSAGE: ClassVar[str]  # the site message

    def visit_Import(self, node: cst.Import) -> bool:
        return False

    def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
        return False

    def visit_Name(self, node: cst.Name) -> None:
        self._check_use(node)

    def visit_Attribute(self, node: cst.Attribute) -> None:
        self._check_use(node)

    def _check_use(self, node: cst.Name | cst.Attribute) -> None:
        parent = self.ancestors[-1] if self.ancestors else None
        if not is_read(node, parent) or self.qualname(node) != self.LEGACY:
            return
        if not (isinstance(parent, cst.Call) and parent.func is node):
            short = self.LEGACY.rpartition(".")[2]
            self.skip(
                node,
                f"`jax.{short}` used but not called: it no longer exists (JAX >= 0.10), so this "
                "line fails; rewrite it by hand",
            )

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if self.qualname(original_node.func) != self.LEGACY:
            return updated_node
        reason = self.why_not(original_node)
        if reason is not None:
            self.skip(original_node, reason)
            return updated_node
        if not self.site(original_node, self.MESSAGE):
            return updated_node
        base = dotted(original_node.func) or ""
        self.drop_import_if_unused(base if "." not in base else base.rpartition(".")[0])
        first, devices = items_of(updated_node)
        values = (
            self.stacked(first.arg.value, devices.arg.value, original_node),
            make_leading_axis_sharding(self, self.resolver, devices.arg.value),
        )
        # Through the one emitter, in the file's style: the arguments are new, so the old line
        # breaks say nothing about them (the comments around them stay with them).
        call = Call(
            self.jax_attr("device_put"),
            [_positional(item, value) for item, value in zip((first, devices), values)],
            Call.of(updated_node).opening,
            magic=has_magic_comma(original_node),
        )
        laid = with_lambda_calls(call).laid_out(self.room(original_node), self.state.style)
        return laid.with_changes(lpar=updated_node.lpar, rpar=updated_node.rpar)

    def why_not(self, call: cst.Call) -> str | None:
        """Return why this call is left alone, or None to rewrite it."""
        args = call.args
        if any(a.star for a in args):
            return "`*args` / `**kwargs`: which parameters they fill is not known"
        names = tuple(
            self.PARAMS[i] if a.keyword is None else a.keyword.value for i, a in enumerate(args)
        )
        if names != self.PARAMS:
            expected = ", ".join(self.PARAMS)
            return f"arguments {', '.join(names) or '(none)'}: expected ({expected}) in order"
        return None

    def stacked(
        self, first: cst.BaseExpression, devices: cst.BaseExpression, call: cst.Call
    ) -> cst.BaseExpression:
        """Return the expression stacking `first` along a new leading axis, one per device
        (`call` is the original call)."""
        raise NotImplementedError


def _positional(item: Item, value: cst.BaseExpression) -> Item:
    arg = item.arg.with_changes(value=value, keyword=None, equal=cst.MaybeSentinel.DEFAULT)
    nested = Call.of(value) if isinstance(value, cst.Call) else None
    return Item(arg, nested, item.above, item.after)
