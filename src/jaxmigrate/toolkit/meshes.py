"""Which `with` items enter a legacy `jax.sharding.Mesh`: shared by the pjit and with-mesh passes.

The with-mesh pass rewrites `with mesh:` as `with jax.set_mesh(mesh):`, and the pjit pass ties a
pjit call lexically inside such a `with` to that rewrite (`group=mesh_group(line)`), so both must
agree on which items are meshes. `MeshFinder` decides once per module, after a scope walk that
sees every binding of a name (a name bound anywhere in a function is local to all of it).

An item is a legacy mesh when it is a `Mesh(...)` / `jax.make_mesh(...)` call, a name every
binding of which is such a call (or a parameter annotated `Mesh`), or, in a module importing JAX,
a name or attribute whose last part ends in `mesh` and that nothing binds to a non-mesh.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

import libcst as cst

from jaxmigrate.toolkit.names import dotted, walk
from jaxmigrate.toolkit.scope import Binding, BindingKind, Scope, ScopeModel

MESH_TYPES = frozenset(
    {"jax.sharding.Mesh", "jax.experimental.maps.Mesh", "jax.interpreters.pxla.Mesh"}
)
MAKE_MESH = "jax.make_mesh"
MESH_MAKERS = MESH_TYPES | {MAKE_MESH}
SET_MESH = frozenset({"jax.set_mesh", "jax.sharding.set_mesh", "jax.sharding.use_mesh"})
TRACING = frozenset({"jax.jit", "jax.experimental.pjit.pjit", "jax.pmap"})
PARTIAL = "functools.partial"
# Calls into these make something other than a `jax.sharding.Mesh` (JAX's own non-mesh calls,
# and libraries whose meshes are device meshes or geometry).
# Reads of the mesh that `with mesh:` sets and `jax.set_mesh` does not (JAX 0.10.2:
# `thread_resources.env.physical_mesh.empty` is False under `with mesh:`, True under
# `jax.set_mesh`), under any import path (`pxla.`, `jax._src.mesh.`, `maps.`), and the libraries
# known to read it for the code that calls them (t5x's `with_sharding_constraint`).
LEGACY_MESH_READ = (
    r"\bthread_resources\b|\bt5x\.partitioning\b"
    r"|^[ \t]*from[ \t]+t5x[ \t]+import[^\n]*\bpartitioning\b"
)
OTHER_MESHES = frozenset({"jax", "numpy", "torch", "tensorflow", "trimesh", "open3d", "pyvista"})


def mesh_group(line: int) -> str:
    """Return the group tying a `with mesh:` at original `line` to the pjit sites inside it."""
    return f"mesh@{line}"


class Kind(Enum):
    """What a mesh-like `with` item is."""

    LEGACY = "legacy"  # a `jax.sharding.Mesh` entered directly: the with-mesh pass rewrites it
    MODERN = "modern"  # already `jax.set_mesh(...)`
    KEPT = "kept"  # a Mesh, but the with-mesh pass cannot rewrite this item
    UNSURE = "unsure"  # looks like a mesh but may not be one: left alone


@dataclass(frozen=True)
class MeshItem:
    """The verdict on one `with` item: for LEGACY how it is known, else why it is left alone."""

    item: cst.WithItem
    kind: Kind
    why: str
    note: str = ""


def ends_in_mesh(name: str) -> bool:
    return name.lower().endswith("mesh")


def _has_keyword(call: cst.Call, keyword: str) -> bool:
    return any(a.keyword is not None and a.keyword.value == keyword for a in call.args)


class _Collector(cst.CSTVisitor):
    """Which bindings make meshes (read from the scope model), and every `with` with its
    context (a walk of its own: these facts are this analysis's, not the model's)."""

    def __init__(self, names: ScopeModel) -> None:
        super().__init__()
        self.resolver = names
        self.withs: list[tuple[cst.With, bool, tuple[cst.With, ...]]] = []
        self._open: list[cst.With] = []
        self.imports_jax = False
        self._traced = 0
        # Per (scope, name): one entry per binding recognised: the mesh-making call, or None
        # for a value that is surely not a mesh. Unrecognised bindings are not recorded.
        self.made: dict[tuple[Scope, str], list[cst.Call | None]] = {}
        for _, bindings in names.bound_names():
            for binding in bindings:
                self._record(binding)

    def mesh_call(self, node: cst.BaseExpression) -> cst.Call | None:
        """Return `node` if it is a call that makes a `jax.sharding.Mesh`."""
        if isinstance(node, cst.Call):
            qualname = self.resolver.qualified_name(node.func)
            if qualname in MESH_TYPES or qualname == MAKE_MESH:
                return node
        return None

    def note(self, call: cst.Call) -> str:
        """Return a caution for the site message when `call` makes a mesh with Explicit axes."""
        if self.resolver.qualified_name(call.func) != MAKE_MESH or _has_keyword(call, "axis_types"):
            return ""
        return (
            "`jax.make_mesh` without `axis_types=` makes Explicit axes, and under `jax.set_mesh`"
            " explicit sharding is on: pass `axis_types=(AxisType.Auto,) * n` to keep the legacy"
            " behaviour"
        )

    def _is_not_mesh(self, node: cst.BaseExpression) -> bool:
        if isinstance(node, cst.Call):
            qualname = self.resolver.qualified_name(node.func) or ""
            return qualname.split(".")[0] in OTHER_MESHES
        literals = (cst.BaseNumber, cst.BaseString, cst.Tuple, cst.List, cst.Dict, cst.Set)
        if isinstance(node, cst.Name):
            return node.value in ("None", "True", "False")
        return isinstance(node, literals)

    def _record(self, binding: Binding) -> None:
        """Note whether `binding` makes a mesh, surely does not, or cannot be told."""
        node, call = binding.node, None
        if binding.kind is BindingKind.WITH and isinstance(node, cst.WithItem):
            if node.asname is not None and isinstance(node.asname.name, cst.Name):
                call = self.mesh_call(node.item)
        elif binding.kind is BindingKind.PARAM and isinstance(node, cst.Param):
            if node.star not in ("*", "**") and node.annotation is not None:
                call = self._annotated_mesh(node.annotation)
        elif binding.kind in (BindingKind.ASSIGN, BindingKind.ANNOTATED):
            if binding.value is None:
                return
            call = self.mesh_call(binding.value)
            annotation = node.annotation if isinstance(node, cst.AnnAssign) else None
            if call is None and annotation is not None:
                call = self._annotated_mesh(annotation)
            if call is None and not self._is_not_mesh(binding.value):
                return
        if call is not None or binding.kind in (BindingKind.ASSIGN, BindingKind.ANNOTATED):
            self.made.setdefault((binding.scope, binding.name), []).append(call)

    def _annotated_mesh(self, annotation: cst.Annotation) -> cst.Call | None:
        if self.resolver.qualified_name(annotation.annotation) in MESH_TYPES:
            return cst.Call(func=annotation.annotation)
        return None

    def _is_tracing(self, decorator: cst.BaseExpression) -> bool:
        if isinstance(decorator, cst.Call):
            if self.resolver.qualified_name(decorator.func) == PARTIAL and decorator.args:
                decorator = decorator.args[0].value
            else:
                decorator = decorator.func
        return self.resolver.qualified_name(decorator) in TRACING

    # Imports, functions and withs ---------------------------------------------------------
    def visit_Import(self, node: cst.Import) -> bool:
        for alias in node.names:
            self.imports_jax |= (dotted(alias.name) or "").split(".")[0] == "jax"
        return False

    def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
        if not node.relative and node.module is not None:
            self.imports_jax |= (dotted(node.module) or "").split(".")[0] == "jax"
        return False

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        traced = any(self._is_tracing(d.decorator) for d in node.decorators)
        self._traced += traced
        walk(self, node.body)
        self._traced -= traced
        return False

    def visit_With(self, node: cst.With) -> None:
        if node.asynchronous is None:
            self.withs.append((node, self._traced > 0, tuple(self._open)))
        self._open.append(node)

    def leave_With(self, original_node: cst.With) -> None:
        self._open.pop()


class MeshFinder:
    """The mesh-like items of every `with` statement of one module."""

    def __init__(self, module: cst.Module, names: ScopeModel) -> None:
        collector = _Collector(names)
        walk(collector, module)
        self._collector = collector
        self._items: dict[int, tuple[MeshItem, ...]] = {}
        self._outer: dict[int, tuple[cst.With, ...]] = {}
        for node, traced, outer in collector.withs:
            self._outer[id(node)] = outer
            verdicts = (self._classify(item, traced) for item in node.items)
            found = tuple(v for v in verdicts if v is not None)
            if found:
                self._items[id(node)] = found

    def items(self, node: cst.With) -> tuple[MeshItem, ...]:
        """Return the verdicts on the mesh-like items of `node` (an original node), in order."""
        return self._items.get(id(node), ())

    def is_legacy(self, node: cst.With) -> bool:
        """Return True if the with-mesh pass rewrites an item of `node`."""
        return any(v.kind is Kind.LEGACY for v in self.items(node))

    def root(self, node: cst.With) -> cst.With | None:
        """Return the outermost `with` around `node` (or `node`) that the with-mesh pass rewrites.

        Its line names the group of every with-mesh and pjit site inside it: a `with` whose body
        still holds a pjit stays legacy, so nested rewrites must be applied all or none.
        """
        for candidate in (*self._outer.get(id(node), ()), node):
            if self.is_legacy(candidate):
                return candidate
        return None

    def assigned(self, node: cst.Name) -> cst.BaseExpression | None:
        """Return `value` if the only binding `node` (an original node) sees is `name = value`."""
        resolver = self._collector.resolver
        owner = resolver.lookup(node.value, resolver.scope_of(node))
        here = [] if owner is None else owner.assigning(node.value)
        if len(here) != 1 or here[0].kind is not BindingKind.ASSIGN:
            return None
        return here[0].value

    def _classify(self, item: cst.WithItem, traced: bool) -> MeshItem | None:
        verdict = self._expression(item)
        if verdict is None or verdict.kind is not Kind.LEGACY:
            return verdict
        if traced:
            why = (
                "inside a function traced by jit/pjit/pmap: `jax.set_mesh` cannot run under a trace"
            )
            return MeshItem(item, Kind.KEPT, why)
        if item.asname is not None and not isinstance(item.asname.name, cst.Name):
            why = "`as` binds a non-name target, and `jax.set_mesh(...)` enters as None"
            return MeshItem(item, Kind.KEPT, why)
        return verdict

    def _expression(self, item: cst.WithItem) -> MeshItem | None:
        node = item.item
        resolver = self._collector.resolver
        if isinstance(node, cst.Call):
            qualname = resolver.qualified_name(node.func)
            if qualname in SET_MESH:
                return MeshItem(item, Kind.MODERN, "already `jax.set_mesh`")
            if self._collector.mesh_call(node) is not None:
                return MeshItem(
                    item, Kind.LEGACY, "constructed in the `with`", self._collector.note(node)
                )
            callee = dotted(node.func)
            if callee is not None and ends_in_mesh(callee) and self._collector.imports_jax:
                why = f"`{callee}(...)` is a call of an unknown function: it may not return a Mesh"
                return MeshItem(item, Kind.UNSURE, why)
            return None
        if isinstance(node, cst.Name):
            return self._name(item, node)
        if isinstance(node, cst.Attribute):
            text = dotted(node)
            qualname = resolver.qualified_name(node) or ""
            if text is None or qualname.startswith("jax") or not ends_in_mesh(node.attr.value):
                return None
            if self._collector.imports_jax:
                return MeshItem(item, Kind.LEGACY, f"`{text}` is assumed a Mesh from its name")
        return None

    def _name(self, item: cst.WithItem, node: cst.Name) -> MeshItem | None:
        name = node.value
        resolver = self._collector.resolver
        qualname = resolver.qualified_name(node)
        if qualname is not None and qualname.startswith("jax"):
            return None
        owner = resolver.lookup(name, resolver.scope_of(node))
        made = [] if owner is None else self._collector.made.get((owner, name), [])
        bound = 0 if owner is None else len(owner.assigning(name))
        calls = [c for c in made if c is not None]
        if made and len(calls) == bound == len(made):
            notes = {self._collector.note(c) for c in calls} - {""}
            return MeshItem(item, Kind.LEGACY, f"`{name}` is bound to a Mesh", " ".join(notes))
        if None in made and (calls or ends_in_mesh(name)):
            why = f"`{name}` is also bound to something that is not a Mesh"
            return MeshItem(item, Kind.UNSURE, why)
        if not ends_in_mesh(name):
            if calls:
                why = f"`{name}` is bound to a Mesh on some paths only"
                return MeshItem(item, Kind.UNSURE, why)
            return None
        if not self._collector.imports_jax:
            return None
        return MeshItem(item, Kind.LEGACY, f"`{name}` is assumed a Mesh from its name")


class NameReads(cst.CSTVisitor):
    """Calls `read` for every Name that reads a variable (`ScopeModel.is_read`) and for every
    Attribute, outside imports.

    The pjit pass (which pjit references it leaves) and the with-mesh pass (whether a `with`
    still holds a pjit) must agree on this, so both use it. Visit original nodes of the module
    `names` describes.
    """

    def __init__(self, names: ScopeModel) -> None:
        super().__init__()
        self.names = names

    def read(self, node: cst.Name | cst.Attribute) -> None:
        """Handle one read; subclasses override."""

    def visit_Attribute(self, node: cst.Attribute) -> None:
        self.read(node)

    def visit_Name(self, node: cst.Name) -> None:
        if self.names.is_read(node):
            self.read(node)

    def visit_Import(self, node: cst.Import) -> bool:
        return False

    def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
        return False


def string_elements(elements: Sequence[cst.BaseElement]) -> list[cst.SimpleString] | None:
    """Return the elements of a tuple or list display if every one is a string literal."""
    out = []
    for e in elements:
        if not isinstance(e, cst.Element) or not isinstance(e.value, cst.SimpleString):
            return None
        out.append(e.value)
    return out


def mesh_axes_in_view(
    node: cst.BaseExpression, names: ScopeModel, scope: Scope | None = None, follow: bool = True
) -> list[cst.SimpleString] | None:
    """Return the axis-name literals of the mesh `node` is: a mesh-making call, or a name whose
    one assignment seen from `scope` (by default, the name's own) is such a call; else None."""
    if isinstance(node, cst.Name) and follow:
        seen_from = names.scope_of(node) if scope is None else scope
        binding = names.assignment_seen_from(node.value, seen_from)
        if binding is None or binding.value is None:
            return None
        return mesh_axes_in_view(binding.value, names, scope, follow=False)
    if not isinstance(node, cst.Call) or names.qualified_name(node.func) not in MESH_MAKERS:
        return None
    return literal_axis_names(node)


def literal_axis_names(call: cst.Call) -> list[cst.SimpleString] | None:
    """Return the axis names written in a mesh-making call (`axis_names=` or its second
    positional argument), or None when they are not a literal tuple or list of strings.

    The caller checks that `call` makes a mesh (its callee resolves to one of `MESH_MAKERS`).
    """
    found = [a for a in call.args if a.keyword is not None and a.keyword.value == "axis_names"]
    if not found and len(call.args) > 1 and not any(a.keyword or a.star for a in call.args[:2]):
        found = [call.args[1]]
    if len(found) != 1 or not isinstance(found[0].value, (cst.Tuple, cst.List)):
        return None
    return string_elements(found[0].value.elements)
