"""The survey of the pjit rule: every pjit reference of a module decided before anything is
rewritten, with what its literal shardings hold."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import libcst as cst

from jaxmigrate.toolkit.emit import code
from jaxmigrate.toolkit.meshes import Kind, MeshFinder, NameReads
from jaxmigrate.toolkit.passes import Pass

from ..with_mesh import WithMesh

PJIT = "jax.experimental.pjit.pjit"
PARTIAL = "functools.partial"
SPEC_TYPES = frozenset(
    {
        "jax.P",
        "jax.sharding.PartitionSpec",
        "jax.experimental.PartitionSpec",
        "jax.experimental.pjit.PartitionSpec",
        "jax.interpreters.pxla.PartitionSpec",
    }
)
SHARDING_TYPES = frozenset(
    {
        "jax.NamedSharding",
        "jax.sharding.NamedSharding",
        "jax.sharding.SingleDeviceSharding",
        "jax.sharding.PositionalSharding",
        "jax.sharding.GSPMDSharding",
        "jax.sharding.PmapSharding",
    }
)
POSITIONAL = ("fun", "in_shardings", "out_shardings", "static_argnums")
RENAMED = {"in_axis_resources": "in_shardings", "out_axis_resources": "out_shardings"}
SHARDINGS = frozenset({"in_shardings", "out_shardings"})
JIT_KEYWORDS = SHARDINGS | {
    "static_argnums",
    "static_argnames",
    "donate_argnums",
    "donate_argnames",
    "keep_unused",
    "device",
    "backend",
    "inline",
    "compiler_options",
}


@dataclass
class Leaves:
    """What the literal in/out shardings of one call hold."""

    specs: list[cst.Call] = field(default_factory=list)
    spec_names: int = 0  # names assigned a PartitionSpec elsewhere
    nones: int = 0
    opaque: list[cst.BaseExpression] = field(default_factory=list)

    @property
    def needs_mesh(self) -> bool:
        """Return True if a PartitionSpec leaf makes the call need a context mesh."""
        return bool(self.specs or self.spec_names)


@dataclass
class Decision:
    """What to do with one pjit reference: rewrite it (`args` planned) or skip it (`reason`)."""

    node: cst.CSTNode
    args: Sequence[cst.Arg] = ()
    keywords: list[str | None] = field(default_factory=list)
    leaves: Leaves = field(default_factory=Leaves)
    reason: str = ""
    mesh: cst.With | None = None  # the legacy `with mesh:` it is grouped with
    modern: bool = False  # inside `with jax.set_mesh(...)`
    enclosing: tuple[cst.With, ...] = ()


class Survey(NameReads):
    """Decide every pjit reference of a module before anything is rewritten.

    A `with mesh:` holding a pjit that is skipped stays legacy (the with-mesh pass leaves it), so
    every other pjit grouped with it must be skipped too; that needs the whole module first.
    """

    def __init__(self, owner: Pass, meshes: MeshFinder) -> None:
        super().__init__(owner.resolver)
        self.owner = owner
        self.meshes = meshes
        self.stack: list[cst.With | None] = []  # None: a function body starts
        self.decisions: dict[int, Decision] = {}

    def finish(self) -> dict[int, Decision]:
        """Return the decisions, skipping those under a `with mesh:` that stays legacy."""
        while True:
            blocked = {
                id(w)
                for d in self.decisions.values()
                if d.reason or self._suppressed(d.node)
                for w in d.enclosing
            }
            changed = False
            for d in self.decisions.values():
                if d.reason:
                    continue
                withs = [d.mesh] if d.mesh is not None else list(d.enclosing)
                for node in withs:
                    if not self.meshes.is_legacy(node) and not self._kept(node):
                        continue
                    why = "it also holds a pjit left as is" if id(node) in blocked else ""
                    why = why or self._mesh_stays(node)
                    if why:
                        line = self.owner.where(node)[0]
                        d.reason = (
                            f"the `with` at line {line} stays legacy ({why}), "
                            "so `jax.jit` would not see its mesh"
                        )
                        changed = True
                        break
            if not changed:
                return self.decisions

    def _kept(self, node: cst.With) -> bool:
        return any(v.kind is Kind.KEPT for v in self.meshes.items(node))

    def _suppressed(self, node: cst.CSTNode) -> bool:
        return self.owner.state.suppressed(self.owner.where(node)[0], self.owner.CODE)

    def _mesh_stays(self, node: cst.With) -> str:
        """Return why the with-mesh pass leaves this `with` as it is, or ""."""
        for verdict in self.meshes.items(node):
            if verdict.kind is Kind.KEPT:
                return verdict.why
            line = self.owner.where(verdict.item)[0]
            if verdict.kind is Kind.LEGACY and self.owner.state.suppressed(line, WithMesh.CODE):
                return "its rewrite is suppressed"
        if self.owner.state.target_jax < WithMesh.MIN_JAX:
            return "the target JAX lacks `jax.set_mesh`"
        return ""

    def _is_pjit(self, node: cst.BaseExpression) -> bool:
        return self.owner.qualname(node) == PJIT

    # Contexts -----------------------------------------------------------------------------
    def visit_With(self, node: cst.With) -> None:
        self.stack.append(node)

    def leave_With(self, original_node: cst.With) -> None:
        self.stack.pop()

    def visit_FunctionDef_body(self, node: cst.FunctionDef) -> None:
        self.stack.append(None)

    def leave_FunctionDef_body(self, node: cst.FunctionDef) -> None:
        self.stack.pop()

    def visit_Lambda_body(self, node: cst.Lambda) -> None:
        self.stack.append(None)

    def leave_Lambda_body(self, node: cst.Lambda) -> None:
        self.stack.pop()

    def _decide(self, key: cst.CSTNode, decision: Decision) -> None:
        decision.enclosing = tuple(w for w in self.stack if w is not None)
        for node in reversed(self.stack):
            if node is None:
                break
            kinds = {v.kind for v in self.meshes.items(node)}
            if kinds & {Kind.LEGACY, Kind.KEPT}:
                decision.mesh = node
                if decision.modern and not decision.reason:
                    decision.reason = (
                        "inside both `jax.set_mesh` and a legacy `with mesh:` further out: "
                        "which mesh jit would see changes"
                    )
                break
            decision.modern |= Kind.MODERN in kinds
            if Kind.UNSURE in kinds:
                break
        self.decisions[id(key)] = decision

    # References ---------------------------------------------------------------------------
    def visit_Call(self, node: cst.Call) -> None:
        if self._is_pjit(node.func):
            self._decide(node.func, self._plan(node, node.args, positional=True))
            return
        first = node.args[0] if node.args else None
        if (
            first is not None
            and self.owner.qualname(node.func) == PARTIAL
            and first.keyword is None
            and not first.star
            and self._is_pjit(first.value)
        ):
            self._decide(first.value, self._plan(node, node.args[1:], positional=False))

    def visit_Decorator(self, node: cst.Decorator) -> None:
        if not isinstance(node.decorator, cst.Call) and self._is_pjit(node.decorator):
            self._decide(node.decorator, Decision(node.decorator))

    def read(self, node: cst.Name | cst.Attribute) -> None:
        if id(node) not in self.decisions and self._is_pjit(node):
            reason = "`pjit` used as a value, not called: the shardings it gets are not visible"
            self._decide(node, Decision(node, reason=reason))

    def _plan(self, call: cst.Call, args: Sequence[cst.Arg], positional: bool) -> Decision:
        decision = Decision(call, args=args)
        if positional and (not args or args[0].keyword is not None or args[0].star):
            decision.reason = "no function is passed first: `jax.jit` takes it positionally"
            return decision
        for i, arg in enumerate(args):
            if arg.star:
                shown = arg.star + code(arg.value)
                decision.reason = f"`{shown}` unpacked into pjit: its arguments are not visible"
                return decision
            if arg.keyword is None:
                if not positional:
                    decision.reason = "`partial(pjit, ...)` binds positional arguments"
                    return decision
                if i >= len(POSITIONAL):
                    decision.reason = (
                        "more than four positional arguments: their meaning changed between "
                        "pjit versions"
                    )
                    return decision
                decision.keywords.append(None if i == 0 else POSITIONAL[i])
                continue
            keyword = RENAMED.get(arg.keyword.value, arg.keyword.value)
            if keyword not in JIT_KEYWORDS:
                decision.reason = f"`{arg.keyword.value}=` has no `jax.jit` equivalent"
                return decision
            decision.keywords.append(keyword)
        named = [k for k in decision.keywords if k is not None]
        if len(set(named)) != len(named):
            decision.reason = "the same argument is given twice"
            return decision
        for arg, planned in zip(args, decision.keywords):
            if planned in SHARDINGS:
                self._scan(arg.value, decision.leaves)
        return decision

    def _scan(self, node: cst.BaseExpression, leaves: Leaves) -> None:
        if isinstance(node, cst.Name) and node.value == "None":
            leaves.nones += 1
        elif isinstance(node, (cst.Tuple, cst.List)):
            for element in node.elements:
                if isinstance(element, cst.Element):
                    self._scan(element.value, leaves)
                else:
                    leaves.opaque.append(element.value)
        elif isinstance(node, cst.Dict):
            for item in node.elements:
                if isinstance(item, cst.DictElement):
                    self._scan(item.value, leaves)
                else:
                    leaves.opaque.append(item.value)
        elif isinstance(node, cst.Call) and self._made_by(node, SPEC_TYPES):
            leaves.specs.append(node)
        elif isinstance(node, cst.Name) and self._made_by(self.meshes.assigned(node), SPEC_TYPES):
            leaves.spec_names += 1
        elif isinstance(node, cst.Name):
            if not self._made_by(self.meshes.assigned(node), SHARDING_TYPES):
                leaves.opaque.append(node)
        elif not self._made_by(node, SHARDING_TYPES):
            leaves.opaque.append(node)

    def _made_by(self, node: cst.BaseExpression | None, types: frozenset[str]) -> bool:
        return isinstance(node, cst.Call) and self.owner.qualname(node.func) in types
