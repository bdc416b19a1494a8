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
- any legacy `with` of a module whose code reads the legacy mesh context (in the module, its
  top-level package or folder, or the code base's packages it imports by name:
  `thread_resources` from `jax.interpreters.pxla`, `jax._src.mesh` or `jax.experimental.maps`,
  or t5x's `partitioning`, whose `global_mesh_defined()` reads it): `jax.set_mesh` leaves it
  empty (`physical_mesh.empty` is True under it on JAX 0.10.2), so t5x's
  `with_sharding_constraint` would silently do nothing. `jax.sharding.get_abstract_mesh()` is
  what `jax.set_mesh` sets (its `.empty`, axis names and shape, inside `jax.jit` too), but the
  reads cannot be moved for the user: a read may also run under a `with` left alone, or in
  code this run does not see. The reason names the first read (`trainer/partitioning.py:7`).
`with jax.set_mesh(...)` and `async with` are never touched.

## Verification
by execution, where the verifier can run the code around the `with` before and after on a
simulated mesh. The original often cannot run on current JAX (jit with PartitionSpecs under
`with mesh:` raises `RuntimeError`); its reference is then the same program with
`NamedSharding(mesh, spec)` shardings (cookbook case 10). The jitted code is the same on both
sides, so beyond the values its lowering's sharding constraints and collectives, and the
outputs' shardings, must be the same too (a constraint that became a no-op fails the site).
"""

from __future__ import annotations

import re
from typing import ClassVar

import libcst as cst

from jaxmigrate.model import Safety
from jaxmigrate.toolkit.emit import Call, Room, code
from jaxmigrate.toolkit.facts import AstFacts
from jaxmigrate.toolkit.meshes import (
    LEGACY_MESH_READ,
    MAKE_MESH,
    MESH_TYPES,
    Kind,
    MeshFinder,
    MeshItem,
    mesh_group,
)
from jaxmigrate.toolkit.passes import Pass

from ._with_mesh_survey import (
    ANY_WITH,
    MESH_TYPE,
    AstMeshes,
    FindQualname,
    could_be_mesh,
)

PJIT = "jax.experimental.pjit.pjit"
INTERNAL_PJIT = "jax._src.pjit.pjit"  # reads the legacy mesh too, and no pass rewrites it


class WithMesh(Pass):
    """Rewrite a legacy `with mesh:` context as `with jax.set_mesh(mesh):`."""

    NAME: ClassVar[str] = "with-mesh"
    CODE: ClassVar[str] = "JM201"
    SAFETY: ClassVar[Safety] = Safety.UNSAFE
    MIN_JAX: ClassVar[tuple[int, int]] = (0, 8)  # `jax.set_mesh` is public from JAX 0.7.1
    REFERENCE: ClassVar[str | None] = "pjit-in-shardings"
    READS_MESH: ClassVar[bool] = True
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
        if "Mesh" not in source and "make_mesh" not in source:  # what MESH_TYPE needs
            return False
        return MESH_TYPE.search(source) is not None and ANY_WITH.search(source) is not None

    @classmethod
    def may_apply_to(cls, facts: AstFacts) -> bool:
        """Only a `with` with an item `MeshFinder` may call a mesh matters (see `AstMeshes`)."""
        return AstMeshes(facts).any_mesh_item()

    def visit_Module(self, node: cst.Module) -> None:
        self._module = node
        self._meshes: MeshFinder | None = None
        self._reads: str | None = None

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
        reads = self._legacy_reads()
        if reads:
            for verdict in legacy:
                self.skip(verdict.item, _reads_reason(verdict, reads))
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
        return self._fitted(original_node, updated_node.with_changes(items=items))

    def _fitted(self, original: cst.With, new: cst.With) -> cst.With:
        """`new` (its items rewritten) with its last item's call laid out over several lines
        when the longer header no longer fits the file's width where the original's did (black's
        split of `with a, b(args):`); a comment ending the header stays on the first line, after
        that call's `(`."""
        body, last = original.body, new.items[-1].item
        if not isinstance(body, cst.IndentedBlock) or isinstance(new.lpar, cst.LeftParen):
            return new
        if not isinstance(last, cst.Call) or not last.args:
            return new
        header = code(new.with_changes(body=cst.IndentedBlock(body=[]))).split("\n", 1)[0]
        line = self.line_of(original)
        indent = line[: len(line) - len(line.lstrip())]
        was = line.split("#", 1)[0] if body.header.comment is not None else line
        width = self.state.style.width
        if not was.rstrip().endswith(":") or len(was.rstrip()) > width:
            return new  # a header over several lines, or one the file let run over
        if len(indent + header.rstrip()) <= width:
            return new
        start = len(indent + header.rstrip()) - len(code(last)) - 1  # `b(...)` then `:`
        laid = Call.of(last).laid_out(Room(indent, start, 2), self.state.style)
        opening = laid.whitespace_before_args
        if not isinstance(opening, cst.ParenthesizedWhitespace):
            return new
        if body.header.comment is not None:
            first = cst.TrailingWhitespace(cst.SimpleWhitespace("  "), body.header.comment)
            laid = laid.with_changes(whitespace_before_args=opening.with_changes(first_line=first))
            new = new.with_changes(body=new.body.with_changes(header=cst.TrailingWhitespace()))
        return new.with_changes(items=[*new.items[:-1], new.items[-1].with_changes(item=laid)])

    def _legacy_reads(self) -> str:
        """Return where the module, else its code base, reads the legacy mesh context ('')."""
        if self._reads is None:
            found = re.search(LEGACY_MESH_READ, "".join(self.state.original_lines), re.MULTILINE)
            reads = self.state.mesh_reads
            if found is not None:
                line = "".join(self.state.original_lines).count("\n", 0, found.start()) + 1
                self._reads = f"line {line}"
            elif reads:
                more = f" and {len(reads) - 1} more" if len(reads) > 1 else ""
                self._reads = f"{reads[0]}{more}"
            else:
                self._reads = ""
        return self._reads

    def _set_mesh(self, item: cst.WithItem) -> cst.WithItem:
        value = item.item
        if item.asname is not None:
            assert isinstance(item.asname.name, cst.Name)
            value = cst.NamedExpr(target=item.asname.name, value=value)
        call = cst.Call(func=self.jax_attr("set_mesh"), args=[cst.Arg(value=value)])
        return item.with_changes(item=call, asname=None)

    def _could_be_mesh(self, node: cst.BaseExpression) -> bool:
        """Cheap test before `MeshFinder`: `could_be_mesh`, or a call of a mesh maker under
        any alias (`from jax import make_mesh as grid`), which `MeshFinder` calls a mesh too."""
        if could_be_mesh(node):
            return True
        if not isinstance(node, cst.Call):
            return False
        return self.qualname(node.func) in MESH_TYPES | {MAKE_MESH}

    def _calls_pjit(self, body: cst.BaseSuite) -> bool:
        """Return True if the body reads a pjit that takes its mesh from `with mesh:`: the
        legacy one (left alone under a with this pass cannot rewrite) or JAX's internal one."""
        finder = FindQualname(self, (PJIT, INTERNAL_PJIT))
        body.visit(finder)
        return finder.found


def _reads_reason(verdict: MeshItem, where: str) -> str:
    return (
        f"the code reads the legacy mesh context `with {code(verdict.item.item)}:` sets "
        f"(`thread_resources` or t5x's partitioning, {where}), which `jax.set_mesh` leaves "
        "empty: a sharding constraint behind such a read would silently do nothing; move the "
        "reads (to `jax.sharding.get_abstract_mesh()`) and the `with`s together, by hand"
    )


def _message(verdict: MeshItem) -> str:
    text = code(verdict.item.item)
    message = (
        f"`with {text}:` is deprecated and gives `jax.jit` no mesh; "
        f"`jax.set_mesh(...)` does ({verdict.why})"
    )
    return f"{message}; {verdict.note}" if verdict.note else message
