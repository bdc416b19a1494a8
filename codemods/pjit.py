"""Rewrite `jax.experimental.pjit.pjit` as `jax.jit`.

## Why
`jax.experimental.pjit.pjit` was merged into `jax.jit` (JAX 0.4.x) and is deprecated (JAX 0.10
warns); its `in_axis_resources=`/`out_axis_resources=` keywords were removed (`TypeError`), and
`jax.jit` takes everything after the function by keyword only. pjit is not a pure alias, though:
it reads the legacy `with mesh:` context, under which a `None` leaf of its shardings means
*replicated* (jit: unspecified) and bare `PartitionSpec`s resolve (jit needs `jax.set_mesh`).

## Before
```python
import jax
import numpy as np
from jax.experimental.pjit import pjit
from jax.sharding import Mesh, PartitionSpec as P

def run(fn, x, y):
    mesh = Mesh(np.array(jax.devices()), ("x",))
    with mesh:
        f = pjit(fn, in_axis_resources=(P("x"), None), out_axis_resources=P("x"))
        return f(x, y)
```

## After
```python
import jax
import numpy as np
from jax.sharding import Mesh, PartitionSpec as P

def run(fn, x, y):
    mesh = Mesh(np.array(jax.devices()), ("x",))
    with jax.set_mesh(mesh):
        f = jax.jit(fn, in_shardings=(P("x"), P()), out_shardings=P("x"))
        return f(x, y)
```

## Safety
safe: the call is renamed, `in_axis_resources`/`out_axis_resources` become
`in_shardings`/`out_shardings`, positional shardings (and `static_argnums`) become keywords,
everything else is kept, and the pjit import goes when nothing else uses it.
- Under a legacy `with mesh:` that the with-mesh pass rewrites, literal `None` leaves (in tuples,
  lists, dicts) become `P()`, spelt as the call or module already spells PartitionSpec, and the
  site joins the group `mesh@<line>` of the outermost such `with`, so pjit and `with` rewrites
  are applied together or not at all. A pjit in a function defined inside the `with` joins the
  group too.
- With no legacy mesh in sight (a pjit built at module level and called under `with mesh:`
  elsewhere), the site is unsafe when its shardings hold PartitionSpecs (jit needs
  `jax.set_mesh(mesh)` where it is called; `None` leaves become `P()`, since such a pjit only ran
  under a mesh), computed expressions (`in_shardings=specs`: kept, and `None` leaves inside them
  cannot be translated), or only `None` leaves (kept: pjit left them unspecified without a mesh
  and replicated them under one; values agree, layouts may not).
- Inside `with jax.set_mesh(...)` pjit already saw no legacy mesh: `None` stays `None`.

## Skips
- `*args`/`**kwargs` unpacked into pjit, the function passed by keyword, a keyword `jax.jit`
  lacks (`abstracted_axes=`), more than four positional arguments (their meaning changed
  between pjit versions), an argument given twice, `partial(pjit, ...)` binding positional
  arguments, `pjit(...)` without a function;
- `pjit` used as a value rather than called (`f = pjit if a else b`);
- a pjit under a `with mesh:` that stays legacy: the with-mesh rewrite is suppressed or cannot be
  made (traced function, `as` target), the target JAX lacks `jax.set_mesh`, or the `with` also
  holds a pjit that is skipped (a pjit left under `jax.set_mesh` would lose its mesh, so the
  whole `with` stays as it is);
- a pjit under `jax.set_mesh` nested in a legacy `with mesh:`.
Look-alikes are never touched: t5x's `partitioner.partition(..., in_axis_resources=...)`,
levanter's `named_jit`, a function of the user's own called `pjit`, other libraries' `pjit`.

## Verification
not needed for the rename. Where `None` leaves or the mesh context change, the grouped
with-mesh site is verified by execution; a program using `in_axis_resources=` cannot run on
current JAX, so its reference is the same program with `NamedSharding`s (cookbook case 10).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import libcst as cst
from jaxmigrate.codemods.with_mesh import WithMesh

from jaxmigrate.model import Safety
from jaxmigrate.toolkit.emit import code, with_keyword
from jaxmigrate.toolkit.meshes import (
    Kind,
    MeshFinder,
    NameReads,
    mesh_group,
)
from jaxmigrate.toolkit.names import dotted
from jaxmigrate.toolkit.passes import Pass

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
class _Leaves:
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
class _Decision:
    """What to do with one pjit reference: rewrite it (`args` planned) or skip it (`reason`)."""

    node: cst.CSTNode
    args: Sequence[cst.Arg] = ()
    keywords: list[str | None] = field(default_factory=list)
    leaves: _Leaves = field(default_factory=_Leaves)
    reason: str = ""
    mesh: cst.With | None = None  # the legacy `with mesh:` it is grouped with
    modern: bool = False  # inside `with jax.set_mesh(...)`
    enclosing: tuple[cst.With, ...] = ()


class Pjit(Pass):
    """Rewrite `jax.experimental.pjit.pjit` as `jax.jit`."""

    NAME: ClassVar[str] = "pjit"
    CODE: ClassVar[str] = "JM103"
    SAFETY: ClassVar[Safety] = Safety.SAFE
    # `jax.jit(in_shardings=...)`: JAX 0.4.2; `None` leaves in them (kept): JAX 0.4.13
    MIN_JAX: ClassVar[tuple[int, int]] = (0, 5)
    REFERENCE: ClassVar[str | None] = "pjit-in-shardings"
    QUALNAMES: ClassVar[tuple[str, ...]] = (PJIT,)
    TRIGGER: ClassVar[re.Pattern[str]] = re.compile(r"pjit\b")

    @classmethod
    def applies_to(cls, source: str) -> bool:
        """The legacy `pjit` can only be reached through a path naming `jax.experimental`."""
        return "experimental" in source and cls.TRIGGER.search(source) is not None

    def visit_Module(self, node: cst.Module) -> None:
        self.meshes = MeshFinder(node, self.resolver)
        survey = _Survey(self, self.meshes)
        node.visit(survey)
        self.decisions = survey.finish()
        for decision in self.decisions.values():
            if decision.reason:
                self.skip(decision.node, decision.reason)

    # Rewriting ----------------------------------------------------------------------------
    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        decision = self.decisions.get(id(original_node.func))
        if decision is not None and not decision.reason:
            return self._apply(decision, original_node.func, updated_node, first=0)
        if original_node.args:
            decision = self.decisions.get(id(original_node.args[0].value))
            if decision is not None and not decision.reason:
                return self._apply(decision, original_node.args[0].value, updated_node, first=1)
        return updated_node

    def leave_Decorator(
        self, original_node: cst.Decorator, updated_node: cst.Decorator
    ) -> cst.Decorator:
        decision = self.decisions.get(id(original_node.decorator))
        if decision is None or decision.reason or not self._site(decision):
            return updated_node
        self._drop_import(original_node.decorator)
        return updated_node.with_changes(decorator=self.jax_attr("jit"))

    def _apply(
        self, decision: _Decision, ref: cst.BaseExpression, call: cst.Call, first: int
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

    def _site(self, decision: _Decision) -> bool:
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

    def _translates(self, decision: _Decision) -> bool:
        """Return True if `None` leaves mean replicated: the call runs under a legacy mesh."""
        if decision.mesh is not None:
            return True
        return not decision.modern and decision.leaves.needs_mesh

    def _spec_maker(self, leaves: _Leaves) -> Callable[[], cst.BaseExpression]:
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


class _Survey(NameReads):
    """Decide every pjit reference of a module before anything is rewritten.

    A `with mesh:` holding a pjit that is skipped stays legacy (the with-mesh pass leaves it), so
    every other pjit grouped with it must be skipped too; that needs the whole module first.
    """

    def __init__(self, owner: Pjit, meshes: MeshFinder) -> None:
        super().__init__(owner.resolver)
        self.owner = owner
        self.meshes = meshes
        self.stack: list[cst.With | None] = []  # None: a function body starts
        self.decisions: dict[int, _Decision] = {}

    def finish(self) -> dict[int, _Decision]:
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

    def _decide(self, key: cst.CSTNode, decision: _Decision) -> None:
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
            self._decide(node.decorator, _Decision(node.decorator))

    def read(self, node: cst.Name | cst.Attribute) -> None:
        if id(node) not in self.decisions and self._is_pjit(node):
            reason = "`pjit` used as a value, not called: the shardings it gets are not visible"
            self._decide(node, _Decision(node, reason=reason))

    def _plan(self, call: cst.Call, args: Sequence[cst.Arg], positional: bool) -> _Decision:
        decision = _Decision(call, args=args)
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

    def _scan(self, node: cst.BaseExpression, leaves: _Leaves) -> None:
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
