"""Rewrite a legacy `with mesh:` context as `with jax.set_mesh(mesh):`.

## Why
Entering a `jax.sharding.Mesh` as a context manager is deprecated (JAX 0.10 warns), and it no
longer gives `jax.jit` a mesh: `jax.jit(f, in_shardings=P("x"))` under `with mesh:` raises
`RuntimeError: jit requires a non-empty mesh in context` (unless pjit compiled the same function
first, an order-dependent accident). `jax.set_mesh(mesh)` (public from JAX 0.7.1) is the context
manager that does; `jax.shard_map` without `mesh=` and `jax.device_put(x, P(...))` need it too.

## Before
```python
import jax
import numpy as np
from jax.sharding import Mesh, PartitionSpec as P

def step(x):
    mesh = Mesh(np.array(jax.devices()), ("x",))
    with mesh:
        return jax.jit(lambda v: v * 2, in_shardings=P("x"))(x)
```

## After
```python
import jax
import numpy as np
from jax.sharding import Mesh, PartitionSpec as P

def step(x):
    mesh = Mesh(np.array(jax.devices()), ("x",))
    with jax.set_mesh(mesh):
        return jax.jit(lambda v: v * 2, in_shardings=P("x"))(x)
```

## Safety
unsafe: `jax.set_mesh` also sets the abstract mesh, so code under it can behave differently:
PartitionSpec shardings and `jax.shard_map` without `mesh=` start to work, a mesh made by
`jax.make_mesh` without `axis_types=` (Explicit axes on current JAX) turns explicit sharding on
(the message says so), and a legacy `pjit` no longer sees the mesh (it reads only the legacy
context). Every site joins the group `mesh@<line>` of the outermost rewritten `with` around it,
shared with the pjit sites inside, so nested rewrites are applied together or not at all.
`with mesh as m:` becomes `with jax.set_mesh(m := mesh):`: `jax.set_mesh(...)` enters as None,
while a `Mesh` entered as itself.

## Skips
Only the item that is a mesh changes (`with mesh, nn.logical_axis_rules(rules):` keeps the rest).
An item is taken for a `jax.sharding.Mesh` when it is a `Mesh(...)` or `jax.make_mesh(...)` call;
a name every binding of which is such a call, or a parameter annotated `Mesh`; or, in a module
that imports JAX, a name or attribute (`mesh`, `device_mesh`, `self._mesh`,
`partitioner.mesh`) whose last part ends in `mesh` and that nothing binds to a non-mesh (the
message says the type was assumed from the name; `jax.set_mesh` raises `ValueError` at once for
anything that is not a Mesh). Left alone, with a reason:
- a call of an unknown function named like a mesh (`with get_mesh():`): it may return a context
  manager of its own; other unknown context managers (`with mesh_context(...)`, `with open(...)`)
  are not mesh-like and are not reported;
- a name bound to a Mesh on some paths only, or also to a non-mesh (`mesh = None`);
- `as` with a target that is not a plain name;
- a `with` inside a function decorated with jit/pjit/pmap (`jax.set_mesh` raises under a trace);
- a `with` whose body still calls a legacy `pjit` (the pjit pass skipped it): pjit reads only the
  legacy context, so it would lose its mesh.
`with jax.set_mesh(...)` and `async with` are never touched.

## Verification
by execution, where the verifier can run the code around the `with` before and after on a
simulated mesh. The original often cannot run on current JAX (jit with PartitionSpecs under
`with mesh:` raises `RuntimeError`); its reference is then the same program with
`NamedSharding(mesh, spec)` shardings (cookbook case 10).
"""

from __future__ import annotations

import ast
import re
from typing import ClassVar

import libcst as cst

from jaxmigrate.model import Safety
from jaxmigrate.toolkit.emit import code
from jaxmigrate.toolkit.facts import AstFacts
from jaxmigrate.toolkit.meshes import (
    MAKE_MESH,
    MESH_TYPES,
    Kind,
    MeshFinder,
    MeshItem,
    NameReads,
    ends_in_mesh,
    mesh_group,
)
from jaxmigrate.toolkit.names import dotted
from jaxmigrate.toolkit.passes import Pass

PJIT = "jax.experimental.pjit.pjit"
INTERNAL_PJIT = "jax._src.pjit.pjit"  # reads the legacy mesh too, and no pass rewrites it


class WithMesh(Pass):
    """Rewrite a legacy `with mesh:` context as `with jax.set_mesh(mesh):`."""

    NAME: ClassVar[str] = "with-mesh"
    CODE: ClassVar[str] = "JM201"
    SAFETY: ClassVar[Safety] = Safety.UNSAFE
    MIN_JAX: ClassVar[tuple[int, int]] = (0, 8)  # `jax.set_mesh` is public from JAX 0.7.1
    REFERENCE: ClassVar[str | None] = "pjit-in-shardings"
    NODE_TYPES: ClassVar[tuple[type[cst.CSTNode], ...]] = (cst.With,)
    TRIGGER: ClassVar[re.Pattern[str]] = re.compile(
        r"^[ \t]*(?:async[ \t]+)?with\b[^:]*?mesh", re.IGNORECASE | re.MULTILINE
    )

    @classmethod
    def applies_to(cls, source: str) -> bool:
        """A `with` naming a mesh, or any `with` in a file that mentions the `Mesh` type."""
        if "mesh" not in source.lower():  # both tests below need it; `in` is much faster
            return False
        if cls.TRIGGER.search(source) is not None:
            return True
        return _MESH_TYPE.search(source) is not None and _ANY_WITH.search(source) is not None

    @classmethod
    def may_apply_to(cls, facts: AstFacts) -> bool:
        """Only a `with` with an item `MeshFinder` may call a mesh matters (see `_AstMeshes`)."""
        return _AstMeshes(facts).any_mesh_item()

    def visit_Module(self, node: cst.Module) -> None:
        self._module = node
        self._meshes: MeshFinder | None = None

    @property
    def meshes(self) -> MeshFinder:
        """The module's mesh analysis, built for the first `with` that could hold a mesh."""
        if self._meshes is None:
            self._meshes = MeshFinder(self._module, self.resolver)
        return self._meshes

    def leave_With(self, original_node: cst.With, updated_node: cst.With) -> cst.With:
        if not any(self._could_be_mesh(item.item) for item in original_node.items):
            return updated_node
        found = self.meshes.items(original_node)
        for verdict in found:
            if verdict.kind in (Kind.KEPT, Kind.UNSURE):
                self.skip(verdict.item, verdict.why)
        legacy = [v for v in found if v.kind is Kind.LEGACY]
        if not legacy:
            return updated_node
        if self.state.target_jax >= self.MIN_JAX and self._calls_pjit(original_node.body):
            for verdict in legacy:
                reason = "the body still calls a legacy `pjit`, which would lose its mesh"
                self.skip(verdict.item, reason)
            return updated_node
        root = self.meshes.root(original_node) or original_node
        group = mesh_group(self.where(root)[0])
        items = list(updated_node.items)
        for verdict in legacy:
            index = next(i for i, it in enumerate(original_node.items) if it is verdict.item)
            if self.site(verdict.item, _message(verdict), group=group):
                items[index] = self._set_mesh(items[index])
        return updated_node.with_changes(items=items)

    def _set_mesh(self, item: cst.WithItem) -> cst.WithItem:
        value = item.item
        if item.asname is not None:
            assert isinstance(item.asname.name, cst.Name)
            value = cst.NamedExpr(target=item.asname.name, value=value)
        call = cst.Call(func=self.jax_attr("set_mesh"), args=[cst.Arg(value=value)])
        return item.with_changes(item=call, asname=None)

    def _could_be_mesh(self, node: cst.BaseExpression) -> bool:
        """Cheap test before `MeshFinder`: `_could_be_mesh`, or a call of a mesh maker under
        any alias (`from jax import make_mesh as grid`), which `MeshFinder` calls a mesh too."""
        if _could_be_mesh(node):
            return True
        if not isinstance(node, cst.Call):
            return False
        return self.qualname(node.func) in MESH_TYPES | {MAKE_MESH}

    def _calls_pjit(self, body: cst.BaseSuite) -> bool:
        """Return True if the body reads a pjit that takes its mesh from `with mesh:`: the
        legacy one (left alone under a with this pass cannot rewrite) or JAX's internal one."""
        finder = _FindQualname(self, (PJIT, INTERNAL_PJIT))
        body.visit(finder)
        return finder.found


_MESH_CONTEXTS = {"set_mesh", "use_mesh", "use_abstract_mesh", "get_abstract_mesh"}


def _could_be_mesh(node: cst.BaseExpression) -> bool:
    """Cheap test: a name or attribute, or a call of something named like a mesh maker
    (`Mesh(...)`, `make_mesh(...)`, `get_mesh()`), not of the modern mesh contexts."""
    if isinstance(node, (cst.Name, cst.Attribute)):
        return True
    if isinstance(node, cst.Call):
        name = dotted(node.func)
        last = (name or "").rsplit(".", 1)[-1]
        return last.lower().endswith("mesh") and last not in _MESH_CONTEXTS
    return False


class _AstMeshes:
    """An over-approximation, on Python's own syntax tree, of the `with` items that
    `MeshFinder` gives a verdict on: a call of something named like a mesh maker (not a modern
    mesh context), an attribute ending in `mesh`, and a name ending in `mesh` or bound anywhere
    in the module from a mesh maker (a call, an annotation). A maker is any name or attribute
    ending in `mesh`, or a name imported or assigned from one (`from jax import make_mesh as
    mm`). The prefilter drops the pass only when no item qualifies, so a file the pass (or the
    pjit pass, which groups its sites with these) would act on is never dropped.
    """

    def __init__(self, facts: AstFacts) -> None:
        self.items: list[ast.expr] = []
        self.makers: set[str] = set()
        self.bound: list[tuple[str, ast.expr]] = []  # (name, the maker call or annotation)
        assigned: list[tuple[str, ast.expr]] = []
        for node in facts.nodes(ast.With):
            for item in node.items:
                self.items.append(item.context_expr)
                if isinstance(item.optional_vars, ast.Name):
                    self.bound.append((item.optional_vars.id, item.context_expr))
        if not self.items:
            return
        imports: list[ast.Import | ast.ImportFrom] = [
            *facts.nodes(ast.Import),
            *facts.nodes(ast.ImportFrom),
        ]
        for imp in imports:
            for alias in imp.names:
                if alias.asname and ends_in_mesh(alias.name):
                    self.makers.add(alias.asname)
        for assign in facts.nodes(ast.Assign):
            for target in assign.targets:
                if isinstance(target, ast.Name):
                    assigned.append((target.id, assign.value))
        for ann in facts.nodes(ast.AnnAssign):
            if isinstance(ann.target, ast.Name):
                self.bound.append((ann.target.id, ann.annotation))
                if ann.value is not None:
                    assigned.append((ann.target.id, ann.value))
        for arg in facts.nodes(ast.arg):
            if arg.annotation is not None:
                self.bound.append((arg.arg, arg.annotation))
        while True:  # aliases of aliases: `M = Mesh; DeviceGrid = M`
            more = {name for name, value in assigned if self.is_maker(value)} - self.makers
            if not more:
                break
            self.makers |= more
        self.bound.extend(assigned)

    def is_maker(self, node: ast.expr) -> bool:
        if isinstance(node, ast.Attribute):
            return ends_in_mesh(node.attr)
        return isinstance(node, ast.Name) and (ends_in_mesh(node.id) or node.id in self.makers)

    def makes_mesh(self, node: ast.expr) -> bool:
        """A maker, called, or named as an annotation."""
        return self.is_maker(node.func if isinstance(node, ast.Call) else node)

    def any_mesh_item(self) -> bool:
        if not self.items:
            return False
        meshes = {name for name, value in self.bound if self.makes_mesh(value)}
        return any(self._could_be_mesh(node, meshes) for node in self.items)

    def _could_be_mesh(self, node: ast.expr, meshes: set[str]) -> bool:
        if isinstance(node, ast.Call):
            func = node.func
            last = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            return self.is_maker(func) and last not in _MESH_CONTEXTS
        if isinstance(node, ast.Attribute):
            return ends_in_mesh(node.attr)
        if isinstance(node, ast.Name):
            return ends_in_mesh(node.id) or node.id in meshes
        return False


_MESH_TYPE = re.compile(r"\bMesh\b|\bmake_mesh\b")  # or an alias of either
_ANY_WITH = re.compile(r"^[ \t]*(?:async[ \t]+)?with\b", re.MULTILINE)


class _FindQualname(NameReads):
    def __init__(self, owner: Pass, qualnames: tuple[str, ...]) -> None:
        super().__init__(owner.resolver)
        self.owner = owner
        self.qualnames = qualnames
        self.found = False

    def read(self, node: cst.Name | cst.Attribute) -> None:
        self.found |= self.owner.qualname(node) in self.qualnames


def _message(verdict: MeshItem) -> str:
    text = code(verdict.item.item)
    message = (
        f"`with {text}:` is deprecated and gives `jax.jit` no mesh; "
        f"`jax.set_mesh(...)` does ({verdict.why})"
    )
    return f"{message}; {verdict.note}" if verdict.note else message
