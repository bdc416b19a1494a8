"""The survey of the with-mesh rule: cheap tests of which `with` items could hold a mesh, on the
libcst tree (before `MeshFinder`) and on Python's own tree (for the prefilter), and the search for
a pjit that reads the legacy mesh."""

from __future__ import annotations

import ast
import re

import libcst as cst

from jaxmigrate.toolkit.facts import AstFacts
from jaxmigrate.toolkit.meshes import NameReads, ends_in_mesh
from jaxmigrate.toolkit.names import dotted
from jaxmigrate.toolkit.passes import Pass

MESH_CONTEXTS = {"set_mesh", "use_mesh", "use_abstract_mesh", "get_abstract_mesh"}


def could_be_mesh(node: cst.BaseExpression) -> bool:
    """Cheap test: a name or attribute, or a call of something named like a mesh maker
    (`Mesh(...)`, `make_mesh(...)`, `get_mesh()`), not of the modern mesh contexts."""
    if isinstance(node, (cst.Name, cst.Attribute)):
        return True
    if isinstance(node, cst.Call):
        name = dotted(node.func)
        last = (name or "").rsplit(".", 1)[-1]
        return last.lower().endswith("mesh") and last not in MESH_CONTEXTS
    return False


class AstMeshes:
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
            return self.is_maker(func) and last not in MESH_CONTEXTS
        if isinstance(node, ast.Attribute):
            return ends_in_mesh(node.attr)
        if isinstance(node, ast.Name):
            return ends_in_mesh(node.id) or node.id in meshes
        return False


MESH_TYPE = re.compile(r"\bMesh\b|\bmake_mesh\b")  # or an alias of either
ANY_WITH = re.compile(r"^[ \t]*(?:async[ \t]+)?with\b", re.MULTILINE)


class FindQualname(NameReads):
    def __init__(self, owner: Pass, qualnames: tuple[str, ...]) -> None:
        super().__init__(owner.resolver)
        self.owner = owner
        self.qualnames = qualnames
        self.found = False

    def read(self, node: cst.Name | cst.Attribute) -> None:
        self.found |= self.owner.qualname(node) in self.qualnames
