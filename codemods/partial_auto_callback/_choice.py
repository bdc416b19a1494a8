"""The choice of the partial-auto-callback rule: which callbacks a shard_map's body reaches, under
which manual axes, and whether to nest them, widen the shard_map or gate them."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import libcst as cst
from libcst.codemod import CodemodContext

from jaxmigrate.toolkit.meshes import mesh_axes_in_view, string_elements
from jaxmigrate.toolkit.names import dotted
from jaxmigrate.toolkit.scope import Scope

from ._emission import Emission
from ._survey import (
    CALLBACKS,
    DEBUG,
    PURE,
    SHORT,
    SPEC_TYPES,
    CallbackSite,
    Edit,
    Function,
    LeftAlone,
    Read,
    Region,
    Survey,
)


# Reaching callbacks from a region ---------------------------------------------------------------
@dataclass
class Reach:
    """The units a region's body reaches, with the manual axes each runs under."""

    manual: dict[int, frozenset[str] | None] = field(default_factory=dict)
    units: list[Function] = field(default_factory=list)
    conflict: Function | None = None
    nested: bool = False


class Choice(Emission):
    """The pass's planning: for each region, the edits of its callbacks or a reason to skip."""

    def __init__(self, context: CodemodContext) -> None:
        super().__init__(context)
        self.survey: Survey | None = None

    # Planning one region -------------------------------------------------------------------
    def _plan(self, region: Region) -> None:
        if not region.has_body:
            return
        try:
            axes, manual = self._axes(region)
        except LeftAlone as why:
            if self._reach_any_callback(region):
                self.skip(region.call, str(why))
            return
        if manual is None or len(manual) == len(axes):
            return
        if not self._entries(region):
            self.skip(
                region.call,
                "the shard_map's body is not a function of this file the pass can follow (a "
                "parameter, an attribute, a method, an import): its callbacks cannot be seen",
            )
            return
        reach = self._reach(region, axes, manual)
        sites = self._sites(reach, axes)
        if not sites and not any(u.opaque for u in reach.units):
            return
        try:
            plan, message = self._choose(region, reach, sites, axes, manual)
        except LeftAlone as why:
            self.skip(region.call, str(why))
            return
        if self.site(region.call, message):
            self.edits.update(plan)

    def _axes(self, region: Region) -> tuple[list[cst.SimpleString], frozenset[str] | None]:
        """Return the mesh's axis names and the manual ones (None: every axis)."""
        if region.splat:
            raise LeftAlone("`**kwargs` passed to `jax.shard_map`: its mesh and axes are not known")
        names = region.keywords.get("axis_names")
        if names is None:
            return [], None
        mesh = region.keywords.get("mesh")
        if mesh is None:
            raise LeftAlone(
                "no `mesh=`: the axes of the context mesh are not known here; pass `mesh=` or "
                "nest the callback by hand"
            )
        axes = mesh_axes_in_view(mesh, self.resolver, region.scope)
        if axes is None:
            raise LeftAlone(
                "the mesh's axis names are not known in this file (build it with "
                "`Mesh(..., (...))` or `jax.make_mesh` and pass that name as `mesh=`)"
            )
        values = [str(a.evaluated_value) for a in axes]
        manual = self._manual(names, mesh, values)
        if manual is None:
            raise LeftAlone("`axis_names=` is computed: which axes are automatic is not known")
        if not manual <= set(values):
            raise LeftAlone(
                f"`axis_names=` names axes the mesh lacks: {sorted(manual - set(values))}"
            )
        return axes, manual

    def _manual(
        self, node: cst.BaseExpression, mesh: cst.BaseExpression, axes: list[str]
    ) -> frozenset[str] | None:
        """Return the axes `axis_names=` makes manual (all of them for an empty set)."""
        if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Subtract):
            left, right = node.left, self._literal(node.right)
            if (
                isinstance(left, cst.Call)
                and self._builtin(left, ("frozenset", "set"))
                and len(left.args) == 1
                and dotted(left.args[0].value) is not None
                and dotted(left.args[0].value) == f"{dotted(mesh)}.axis_names"
                and right is not None
            ):
                return frozenset(axes) - right
            return None
        names = self._literal(node)
        return None if names is None else (names or frozenset(axes))

    def _literal(self, node: cst.BaseExpression) -> frozenset[str] | None:
        if isinstance(node, cst.Call) and self._builtin(node, ("frozenset", "set", "tuple")):
            if not node.args:
                return frozenset()
            if len(node.args) != 1 or node.args[0].keyword or node.args[0].star:
                return None
            node = node.args[0].value
        if isinstance(node, cst.SimpleString):
            return frozenset({str(node.evaluated_value)})
        if not isinstance(node, (cst.Set, cst.Tuple, cst.List)):
            return None
        strings = string_elements(node.elements)
        return None if strings is None else frozenset(str(s.evaluated_value) for s in strings)

    def _builtin(self, call: cst.Call, names: Sequence[str]) -> bool:
        assert self.survey is not None
        name = dotted(call.func)
        return name in names and not self.resolver.bound(name or "")

    # Reach ---------------------------------------------------------------------------------
    def _entries(self, region: Region) -> list[Function]:
        """Return the units a region's body expression reaches first."""
        assert self.survey is not None
        if region.body_def is not None:
            return [region.body_def]
        found = list(region.lambdas)
        for read in region.reads:
            target = self.survey.lookup(read.name.value, read.scope)
            if isinstance(target, Function) and target.region is None:
                found.append(target)
        return found

    def _reach_any_callback(self, region: Region) -> bool:
        reach = self._reach(region, [], None)
        calls = (c for u in reach.units for c in u.callbacks)
        return any(u.opaque for u in reach.units) or any(
            self.qualname(c.func) in CALLBACKS for c in calls
        )

    def _reach(
        self, region: Region, axes: Sequence[cst.SimpleString], manual: frozenset[str] | None
    ) -> Reach:
        assert self.survey is not None
        reach = Reach()
        todo: list[tuple[Function, frozenset[str] | None]] = [
            (u, manual) for u in self._entries(region)
        ]
        while todo:
            unit, here = todo.pop()
            if id(unit) in reach.manual:
                if reach.manual[id(unit)] != here:
                    reach.conflict = unit
                continue
            reach.manual[id(unit)] = here
            reach.units.append(unit)
            todo += [(u, here) for u in unit.lambdas]
            for read in unit.reads:
                target = self.survey.lookup(read.name.value, read.scope)
                if isinstance(target, Function) and target.region is None:
                    todo.append((target, here))
            for inner in unit.regions:
                reach.nested = True
                deeper = self._nested_manual(inner, axes, here)
                todo += [(u, deeper) for u in self._entries(inner)]
        return reach

    def _nested_manual(
        self, inner: Region, axes: Sequence[cst.SimpleString], outer: frozenset[str] | None
    ) -> frozenset[str] | None:
        names = [str(a.evaluated_value) for a in axes]
        if outer is None or inner.splat:
            return None
        value = inner.keywords.get("axis_names")
        if value is None:
            return frozenset(names)
        mesh = inner.keywords.get("mesh")
        extra = self._manual(value, mesh, names) if mesh is not None else self._literal(value)
        if extra is None:
            return None
        return outer | (extra or frozenset(names))

    def _sites(self, reach: Reach, axes: Sequence[cst.SimpleString]) -> list[CallbackSite]:
        sites = []
        for unit in reach.units:
            manual = reach.manual[id(unit)]
            for call in unit.callbacks:
                if manual is not None and len(manual) == len(axes):
                    continue
                kind = self.qualname(call.func) or PURE
                auto = tuple(
                    a for a in axes if manual is not None and a.evaluated_value not in manual
                )
                if kind not in DEBUG or len(auto) > 1:
                    sites.append(CallbackSite(call, unit, kind, auto))
        return sites

    def _exclusive(self, region: Region, reach: Reach) -> set[int]:
        """Return the ids of the reached units used by nothing but this region's body."""
        assert self.survey is not None
        inside = {id(u) for u in reach.units}
        readers: dict[int, list[Function | Region | None]] = {}
        for unit in reach.units:
            if unit.region is not None or unit is region.body_def:
                readers[id(unit)] = [region]
                continue
            found: list[Function | Region | None] = []
            if isinstance(unit.node, cst.Lambda):
                found.append(unit.parent)
            for read in self._reads_of(unit):
                found.append(read.reader)
            readers[id(unit)] = found
        regions = {id(region)} | {id(r) for u in reach.units for r in u.regions}
        changed = True
        while changed:
            changed = False
            for unit in reach.units:
                if id(unit) in inside and not all(
                    (isinstance(r, Region) and id(r) in regions)
                    or (isinstance(r, Function) and id(r) in inside)
                    for r in readers[id(unit)]
                ):
                    inside.discard(id(unit))
                    changed = True
        return inside

    def _reads_of(self, unit: Function) -> Iterable[Read]:
        assert self.survey is not None
        names = [unit.node.name.value] if isinstance(unit.node, cst.FunctionDef) else []
        if isinstance(unit.node, cst.Lambda):
            names = [
                n
                for n, bs in self.resolver.bound_names()
                if any(b.plain and b.value is unit.node for b in bs)
            ]
        for name in names:
            for read in self.survey.reads.get(name, []):
                if self.survey.lookup(name, read.scope) is unit:
                    yield read

    def _jitted(self, region: Region) -> bool:
        assert self.survey is not None
        if region.jitted or (region.unit is not None and region.unit.jitted):
            return True
        for read in self.survey.jit_args:
            target = self.survey.lookup(read.name.value, read.scope)
            if target is region or (target is not None and target is region.unit):
                return True
        return False

    # Choosing the rewrite ------------------------------------------------------------------
    def _choose(
        self,
        region: Region,
        reach: Reach,
        sites: list[CallbackSite],
        axes: list[cst.SimpleString],
        manual: frozenset[str],
    ) -> tuple[dict[int, Edit], str]:
        if reach.conflict is not None:
            raise LeftAlone(f"{reach.conflict.label} is reached under different manual axes")
        for unit in reach.units:
            if unit.opaque:
                raise LeftAlone(f"a callback is passed around as a value in {unit.label}")
        for s in sites:
            if s.kind == PURE and any(a.star for a in s.call.args):
                raise LeftAlone(f"`{SHORT[s.kind]}` called with `*args`/`**kwargs`")
            positional = [a for a in s.call.args if a.keyword is None]
            if s.kind in CALLBACKS and len(positional) < 2:
                raise LeftAlone(f"`{SHORT[s.kind]}` without its function and result shape")
        if any(not s.auto for s in sites):
            raise LeftAlone("a nested shard_map's `axis_names=` is computed")
        auto = [a for a in axes if a.evaluated_value not in manual]
        where = (
            f"in a shard_map manual over {_names(a for a in axes if a.evaluated_value in manual)}"
            f" of a mesh with automatic {_names(auto)}"
        )
        exclusive = self._exclusive(region, reach)
        widen_why = self._why_not_widen(region, reach, auto)
        gated = [s for s in sites if s.kind != PURE]
        if gated:
            kind = f"`{SHORT[gated[0].kind]}`"
            if widen_why:
                raise LeftAlone(
                    f"{kind} {where}: it cannot be nested (it would run on every automatic "
                    "device; an ordered io_callback aborts) and the shard_map cannot be widened: "
                    f"{widen_why}"
                )
            shared = [s.unit.label for s in gated if id(s.unit) not in exclusive]
            if shared:
                raise LeftAlone(
                    f"{kind} {where}, in {shared[0]}, which is also used outside this "
                    "shard_map: gating it there would change that use"
                )
            plan = {id(s.call): self._gate(s) for s in gated}
            plan[id(region.call)] = self._widen(region)
            return plan, (
                f"{kind} {where}: the shard_map is made manual over every axis and the "
                f"callback runs on the first device along {_names(auto)} only, once per manual "
                "shard as before"
            )
        nest_why = self._why_not_nest(region, sites, exclusive)
        if not nest_why:
            plan = {id(s.call): self._nest(s) for s in sites}
            return plan, (
                f"`pure_callback` {where}: nested in a `jax.shard_map` over the automatic axes "
                "(no `mesh=`: the context mesh)"
            )
        if not widen_why:
            return {id(region.call): self._widen(region)}, (
                f"`pure_callback` {where}: the shard_map is made manual over every axis (its "
                f"specs never name {_names(auto)}; not nested: {nest_why})"
            )
        raise LeftAlone(
            f"`pure_callback` {where}: it cannot be nested ({nest_why}) and the shard_map cannot "
            f"be widened ({widen_why})"
        )

    def _why_not_nest(self, region: Region, sites: list[CallbackSite], exclusive: set[int]) -> str:
        shared = [s.unit.label for s in sites if id(s.unit) not in exclusive]
        if shared:
            return f"{shared[0]} is also used outside this shard_map"
        if not self._jitted(region):
            return (
                "the shard_map is not seen under `jax.jit`, and a nested shard_map runs only there"
            )
        return ""

    def _why_not_widen(self, region: Region, reach: Reach, auto: list[cst.SimpleString]) -> str:
        names = {str(a.evaluated_value) for a in auto}
        for key in ("in_specs", "out_specs"):
            value = region.keywords.get(key)
            if value is None:
                return f"no `{key}=`"
            strings = self._spec_strings(value, region.scope)
            if strings is None:
                return f"`{key}=` is not a literal PartitionSpec structure"
            if strings & names:
                return f"`{key}=` names {_names(a for a in auto if a.evaluated_value in strings)}"
        if reach.nested:
            return "its body holds another shard_map"
        for unit in reach.units:
            if unit.strings & names:
                return f"{unit.label} mentions {_names(a for a in auto if a.evaluated_value in unit.strings)}"
        return ""

    def _spec_strings(
        self, node: cst.BaseExpression, scope: Scope | None, follow: bool = True
    ) -> set[str] | None:
        """Return the axis names a literal spec structure mentions; None if it is not literal."""
        assert self.survey is not None
        if isinstance(node, cst.Name):
            if node.value == "None":
                return set()
            binding = None
            if follow and scope is not None:
                binding = self.resolver.assignment_seen_from(node.value, scope)
            if binding is None or binding.value is None:
                return None
            return self._spec_strings(binding.value, scope, follow=False)
        if isinstance(node, (cst.Tuple, cst.List)):
            return self._union(e.value for e in node.elements if isinstance(e, cst.Element))
        if isinstance(node, cst.Dict):
            return self._union(e.value for e in node.elements if isinstance(e, cst.DictElement))
        if isinstance(node, cst.Call) and self.qualname(node.func) in SPEC_TYPES:
            out: set[str] = set()
            for arg in node.args:
                if arg.star or arg.keyword:
                    return None
                inner = arg.value
                parts = inner.elements if isinstance(inner, cst.Tuple) else [cst.Element(inner)]
                for part in parts:
                    v = part.value
                    if isinstance(v, cst.SimpleString):
                        out.add(str(v.evaluated_value))
                    elif not (isinstance(v, cst.Name) and v.value == "None"):
                        return None
            return out
        return None

    def _union(self, nodes: Iterable[cst.BaseExpression]) -> set[str] | None:
        out: set[str] = set()
        for node in nodes:
            found = self._spec_strings(node, None, follow=False)
            if found is None:
                return None
            out |= found
        return out


def _names(axes: Iterable[cst.SimpleString]) -> str:
    return ", ".join(repr(str(a.evaluated_value)) for a in axes)
