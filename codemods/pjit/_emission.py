"""The emission of the pjit rule: each decided reference becomes `jax.jit`, its keywords renamed and
its `None` shardings made `P()` where a legacy mesh made them mean replicated."""

from __future__ import annotations

from collections.abc import Callable

import libcst as cst

from jaxmigrate.model import Safety
from jaxmigrate.toolkit.emit import code, with_keyword
from jaxmigrate.toolkit.meshes import MeshFinder, mesh_group
from jaxmigrate.toolkit.names import dotted
from jaxmigrate.toolkit.passes import Pass

from ..with_mesh import WithMesh
from ._survey import RENAMED, SHARDINGS, Decision, Leaves


class Emission(Pass):
    """The pass's rewriting, from the decisions its survey made (set by `visit_Module`)."""

    meshes: MeshFinder
    decisions: dict[int, Decision]

    # Rewriting ----------------------------------------------------------------------------
    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        decision = self.decisions.get(id(original_node.func))
        if decision is not None and not decision.reason:
            new = self._apply(decision, original_node.func, updated_node, first=0)
            return self._fit(original_node, updated_node, new)
        if original_node.args:
            decision = self.decisions.get(id(original_node.args[0].value))
            if decision is not None and not decision.reason:
                ref = original_node.args[0].value
                new = self._apply(decision, ref, updated_node, first=1)
                return self._fit(original_node, updated_node, new)
        return updated_node

    def _fit(self, original: cst.Call, updated: cst.Call, new: cst.Call) -> cst.Call:
        """Return `new` laid out as a formatter would when the rewrite (`jax.jit`, `P()` for
        `None`) pushed a call that fitted its line past the file's width; a line that was long
        already is left as long as the user had it. A call over several lines keeps its lines,
        those aligned with its opening parenthesis moved with it (`pjit(` -> `jax.jit(`)."""
        if new is updated:
            return new
        room = self.room(original)
        if (
            "\n" not in code(original)
            and room.column + len(code(original)) + room.tail > self.state.style.width
        ):
            return new
        return self.fit(original, new)

    def leave_Decorator(
        self, original_node: cst.Decorator, updated_node: cst.Decorator
    ) -> cst.Decorator:
        decision = self.decisions.get(id(original_node.decorator))
        if decision is None or decision.reason or not self._site(decision):
            return updated_node
        self._drop_import(original_node.decorator)
        return updated_node.with_changes(decorator=self.jax_attr("jit"))

    def _apply(
        self, decision: Decision, ref: cst.BaseExpression, call: cst.Call, first: int
    ) -> cst.Call:
        if not self._site(decision):
            return call
        self._drop_import(ref)
        translate = self._translates(decision)
        spec = self._spec_maker(decision.leaves)
        args = list(call.args)
        for i, (keyword, original) in enumerate(zip(decision.keywords, decision.args)):
            arg = args[first + i]
            if keyword is None:
                continue
            if original.keyword is None or original.keyword.value != keyword:
                arg = with_keyword(arg, keyword)
            if translate and keyword in SHARDINGS:
                arg = arg.with_changes(value=_translate(original.value, arg.value, spec))
            args[first + i] = arg
        jit = self.jax_attr("jit")
        if first == 0:
            return call.with_changes(func=jit, args=args)
        args[0] = args[0].with_changes(value=jit)
        return call.with_changes(args=args)

    def _site(self, decision: Decision) -> bool:
        notes = ["`pjit` is a deprecated alias of `jax.jit`"]
        for arg in decision.args:
            if arg.keyword is not None and arg.keyword.value in RENAMED:
                notes.append(f"`{arg.keyword.value}=` -> `{RENAMED[arg.keyword.value]}=`")
        if any(a.keyword is None for a in decision.args[1:]):
            notes.append("positional arguments passed by keyword")
        leaves = decision.leaves
        if leaves.nones and self._translates(decision):
            notes.append("`None` leaves -> `P()` (pjit replicated them under its mesh)")
        elif leaves.nones:
            notes.append("`None` leaves kept: pjit replicated them only under a legacy mesh")
        computed = dict.fromkeys(code(e) for e in leaves.opaque)
        if computed:
            shown = ", ".join(f"`{c}`" for c in computed)
            notes.append(
                f"computed shardings {shown} kept: `None` leaves in them are not translated"
            )
        group = safety = None
        root = self.meshes.root(decision.enclosing[-1]) if decision.enclosing else None
        if root is not None:
            group = mesh_group(self.where(root)[0])
        if (
            decision.mesh is None
            and not decision.modern
            and (leaves.needs_mesh or leaves.opaque or leaves.nones)
        ):
            safety = Safety.UNSAFE
            if leaves.needs_mesh or leaves.opaque:
                notes.append("PartitionSpec shardings need `jax.set_mesh(mesh)` at the call site")
            else:
                notes.append("no legacy mesh is visible here")
        requires = (WithMesh.CODE,) if group is not None else ()
        return self.site(
            decision.node, "; ".join(notes), group=group, safety=safety, requires=requires
        )

    def _translates(self, decision: Decision) -> bool:
        """Return True if `None` leaves mean replicated: the call runs under a legacy mesh."""
        if decision.mesh is not None:
            return True
        return not decision.modern and decision.leaves.needs_mesh

    def _spec_maker(self, leaves: Leaves) -> Callable[[], cst.BaseExpression]:
        if leaves.specs:
            func = leaves.specs[0].func
            return lambda: func.deep_clone()
        local = self.resolver.module_binding("jax.sharding.PartitionSpec")
        if local is not None:
            return lambda: cst.Name(local)
        return lambda: self.jax_attr("sharding.PartitionSpec")

    def _drop_import(self, ref: cst.BaseExpression) -> None:
        if isinstance(ref, cst.Name):
            self.drop_import_if_unused(ref.value)
        elif isinstance(ref, cst.Attribute):
            base = dotted(ref.value)
            if base is None:
                return
            self.drop_import_if_unused(base)
            if "." in base:  # `import jax.experimental.pjit` may have been what bound `jax`
                self.need_import(base.split(".")[0])


def _translate(
    original: cst.BaseExpression,
    updated: cst.BaseExpression,
    spec: Callable[[], cst.BaseExpression],
) -> cst.BaseExpression:
    """Return `updated` with each literal `None` leaf (found in `original`) replaced by `P()`."""
    if isinstance(original, cst.Name) and original.value == "None":
        return cst.Call(func=spec(), lpar=updated.lpar, rpar=updated.rpar)
    if isinstance(original, (cst.Tuple, cst.List)) and isinstance(updated, type(original)):
        elements = [
            new.with_changes(value=_translate(old.value, new.value, spec))
            if isinstance(old, cst.Element) and isinstance(new, cst.Element)
            else new
            for old, new in zip(original.elements, updated.elements)
        ]
        return updated.with_changes(elements=elements)
    if isinstance(original, cst.Dict) and isinstance(updated, cst.Dict):
        items = [
            new.with_changes(value=_translate(old.value, new.value, spec))
            if isinstance(old, cst.DictElement) and isinstance(new, cst.DictElement)
            else new
            for old, new in zip(original.elements, updated.elements)
        ]
        return updated.with_changes(elements=items)
    return updated
