"""The scope model of one module: every scope, every binding, every name reference.

libcst's `ScopeProvider` / `QualifiedNameProvider` run a full scope analysis and cost about a
second on a large file. Passes ask a few questions only ("does this expression mean `jax.pmap`?",
"is `mesh` assigned once, and to what?", "may I emit `np` here?"), so `ScopeModel` is built by one
fast read-only walk (`names.walk`) per module version, cached in `ModuleCache`, and answers them
all. It follows Python's rules:

- scopes: module, class, function, lambda, comprehension. A function, lambda or comprehension
  sees the enclosing function and module scopes but not class bodies; decorators, defaults,
  annotations, bases and a comprehension's first iterable are evaluated in the enclosing scope;
- a name bound anywhere in a scope is local to all of it; `x: int` (no value) makes `x` local
  but assigns nothing; a walrus binds in the nearest scope that is not a comprehension;
- a name with conflicting bindings in the scope that owns it resolves to nothing (as do
  `global`/`nonlocal` names, relative imports and anything but an import or a plain alias), so a
  pass leaves the site alone.

The same walk marks the paths to watched qualified names (`paths_to`), which passes use to visit
only the nodes that lead to a use of a legacy name.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass, field
from enum import Enum

import libcst as cst

from jaxmigrate.toolkit.names import dotted, walk


class BindingKind(Enum):
    """How a binding binds its name."""

    IMPORT = "import"  # `import a.b` (binds `a`), `import a.b as c`, `from m import x [as y]`
    ASSIGN = "assign"  # `x = value` (also each name of `x = y = value`)
    ANNOTATED = "annotated"  # `x: T` or `x: T = value`
    AUGMENTED = "augmented"  # `x += value`
    WALRUS = "walrus"  # `(x := value)`
    TARGET = "target"  # a name inside an unpacking target (`a, *b = ...`)
    FOR = "for"  # `for x in ...`
    COMPREHENSION = "comprehension"  # `[... for x in ...]`
    WITH = "with"  # `with ... as x`
    EXCEPT = "except"  # `except E as x`
    MATCH = "match"  # `case [x, *rest] | {**rest} | P(x=x) | _ as x`
    PARAM = "param"  # a parameter of a def or lambda
    DEF = "def"  # `def x`
    CLASS = "class"  # `class x`
    GLOBAL = "global"  # `global x`: reads and writes go to the module
    NONLOCAL = "nonlocal"  # `nonlocal x`
    DEL = "del"  # `del x`


@dataclass(eq=False)
class Binding:
    """One binding of one name.

    `node` is the statement or node that binds (the Assign, the FunctionDef, the ImportFrom...),
    `target` the Name bound when there is one, `value` the expression assigned (`x = value`,
    `x: T = value`, `x := value`), `qualname` what an absolute import binds.
    """

    name: str
    kind: BindingKind
    scope: Scope
    node: cst.CSTNode
    target: cst.Name | None = None
    value: cst.BaseExpression | None = None
    qualname: str | None = None

    @property
    def assigns(self) -> bool:
        """False for `x: int` without a value, which makes `x` local and assigns nothing."""
        return not (self.kind is BindingKind.ANNOTATED and self.value is None)

    @property
    def plain(self) -> bool:
        """True for `name = value` with a single target: the name is exactly that value."""
        return (
            self.kind is BindingKind.ASSIGN
            and isinstance(self.node, cst.Assign)
            and len(self.node.targets) == 1
        )


@dataclass(eq=False)
class Scope:
    """One Python scope (kind: module, class, function, lambda, comprehension) and its bindings,
    each name's in the order the walk met them. `node` is the Module, ClassDef, FunctionDef,
    Lambda or comprehension that makes it."""

    kind: str
    parent: Scope | None
    node: cst.CSTNode
    bindings: dict[str, list[Binding]] = field(default_factory=dict)

    def lookup(self, name: str) -> Scope | None:
        """Return the scope whose binding of `name` a reference in this scope sees (class bodies
        are skipped, except the scope the reference is in), or None (a builtin, or unbound)."""
        scope: Scope | None = self
        first = True
        while scope is not None:
            if (first or scope.kind != "class") and name in scope.bindings:
                return scope
            first = False
            scope = scope.parent
        return None

    def assigning(self, name: str) -> list[Binding]:
        """Return this scope's bindings of `name` that may give it a value (not `x: int`)."""
        return [b for b in self.bindings.get(name, ()) if b.assigns]


_Comprehension = cst.ListComp | cst.SetComp | cst.GeneratorExp | cst.DictComp


def _name_ids(node: cst.CSTNode) -> Iterator[int]:
    """Yield the ids of the Name nodes in an import statement (module paths, aliases)."""
    if isinstance(node, cst.Name):
        yield id(node)
    for child in node.children:
        yield from _name_ids(child)


def _import_module_name(node: cst.BaseExpression) -> str:
    name = dotted(node)
    assert name is not None
    return name


class _Builder(cst.CSTVisitor):
    """The one walk: scopes, bindings, references and the paths to watched names."""

    def __init__(
        self,
        module: cst.Module,
        watch: Collection[str] = (),
        watch_types: tuple[type[cst.CSTNode], ...] = (),
    ) -> None:
        self.module_scope = Scope("module", None, module)
        self.stack: list[Scope] = [self.module_scope]
        self.scopes: dict[int, Scope] = {id(module): self.module_scope}
        self.scope_of: dict[int, Scope] = {}
        self.by_name: dict[str, list[Binding]] = {}
        self.names: set[str] = set()
        self.reads: set[str] = set()  # names read as variables
        self.not_reads: set[int] = set()  # Name nodes that are no variable read
        self.star_import = False
        self.declared: set[str] = set()
        self._first_for: set[int] = set()
        # Where watched names are referenced: the ids of every node on the path to each use.
        self.watch = tuple(watch)
        self.path: list[int] = []
        self.roots: dict[str, set[str]] = {}
        self.marks: dict[str, set[int]] = {w: set() for w in self.watch}
        self.watch_types = watch_types
        self.type_marks: dict[type[cst.CSTNode], set[int]] = {t: set() for t in watch_types}
        self.complete = True

    def on_visit(self, node: cst.CSTNode) -> bool:
        self.path.append(id(node))
        if self.watch_types and isinstance(node, self.watch_types):
            for t in self.watch_types:
                if isinstance(node, t):
                    self.type_marks[t].update(self.path)
        return super().on_visit(node)

    def on_leave(self, original_node: cst.CSTNode) -> None:
        super().on_leave(original_node)
        self.path.pop()

    # Watched names -------------------------------------------------------------------------
    def _mark(self, qualified: str) -> None:
        for w in self.watch:
            if qualified == w or qualified.startswith(w + "."):
                self.marks[w].update(self.path)

    def _mark_chain(self, chain: str) -> None:
        root, _, rest = chain.partition(".")
        for base in self.roots.get(root, ()):
            self._mark(f"{base}.{rest}" if rest else base)

    def _root(self, local: str, qualified: str) -> None:
        if not self.watch:
            return
        related = any(w.startswith(qualified + ".") or qualified.startswith(w) for w in self.watch)
        if qualified == "jax" or related:
            if local in self.names and qualified not in self.roots.get(local, ()):
                self.complete = False  # used before this import: marks may have missed uses
            self.roots.setdefault(local, set()).add(qualified)
            self._mark(qualified)

    # Recording -----------------------------------------------------------------------------
    @property
    def scope(self) -> Scope:
        return self.stack[-1]

    def _bind(
        self,
        name: str,
        kind: BindingKind,
        node: cst.CSTNode,
        *,
        target: cst.Name | None = None,
        value: cst.BaseExpression | None = None,
        qualname: str | None = None,
        scope: Scope | None = None,
    ) -> None:
        scope = scope or self.scope
        binding = Binding(name, kind, scope, node, target, value, qualname)
        scope.bindings.setdefault(name, []).append(binding)
        self.by_name.setdefault(name, []).append(binding)
        if target is not None:
            self.not_reads.add(id(target))
            self.scope_of.setdefault(id(target), self.scope)

    def _bind_target(
        self,
        target: cst.BaseExpression,
        kind: BindingKind,
        node: cst.CSTNode,
        scope: Scope | None = None,
    ) -> None:
        if isinstance(target, cst.Name):
            self._bind(target.value, kind, node, target=target, scope=scope)
        elif isinstance(target, (cst.Tuple, cst.List)):
            for el in target.elements:
                self._bind_target(el.value, kind, node, scope)
        elif isinstance(target, cst.StarredElement):
            self._bind_target(target.value, kind, node, scope)

    def _push(self, kind: str, node: cst.CSTNode) -> None:
        scope = Scope(kind, self.scope, node)
        self.scopes[id(node)] = scope
        self.stack.append(scope)

    # Scopes --------------------------------------------------------------------------------
    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        self._bind(node.name.value, BindingKind.DEF, node, target=node.name)
        for deco in node.decorators:
            walk(self, deco)
        self._visit_param_defaults(node.params)
        if node.returns is not None:
            walk(self, node.returns)
        self._scoped("function", node, node.params)
        return False

    def visit_Lambda(self, node: cst.Lambda) -> bool:
        self._visit_param_defaults(node.params)
        self._scoped("lambda", node, node.params)
        return False

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        self._bind(node.name.value, BindingKind.CLASS, node, target=node.name)
        for deco in node.decorators:
            walk(self, deco)
        for arg in (*node.bases, *node.keywords):
            walk(self, arg)
        self._scoped("class", node, None)
        return False

    def _scoped(
        self,
        kind: str,
        node: cst.FunctionDef | cst.Lambda | cst.ClassDef,
        params: cst.Parameters | None,
    ) -> None:
        self._push(kind, node)
        if params is not None:
            self._bind_params(params)
        walk(self, node.body)
        self.stack.pop()

    def _visit_param_defaults(self, params: cst.Parameters) -> None:
        # Defaults and annotations are read in the enclosing scope; the Parameters and Param
        # nodes stay on the path so a legacy name used there is reachable by a pruned pass.
        self.path.append(id(params))
        for p in (*params.posonly_params, *params.params, *params.kwonly_params):
            self.path.append(id(p))
            if p.default is not None:
                walk(self, p.default)
            if p.annotation is not None:
                walk(self, p.annotation)
            self.path.pop()
        for star in (params.star_arg, params.star_kwarg):
            if isinstance(star, cst.Param) and star.annotation is not None:
                self.path.append(id(star))
                walk(self, star.annotation)
                self.path.pop()
        self.path.pop()

    def _bind_params(self, params: cst.Parameters) -> None:
        for p in (*params.posonly_params, *params.params, *params.kwonly_params):
            self._bind(p.name.value, BindingKind.PARAM, p, target=p.name)
        for star in (params.star_arg, params.star_kwarg):
            if isinstance(star, cst.Param):
                self._bind(star.name.value, BindingKind.PARAM, star, target=star.name)

    def _enter_comprehension(self, node: _Comprehension) -> bool:
        self._first_for.add(id(node.for_in))
        self._push("comprehension", node)
        return True

    def _leave_comprehension(self, original_node: _Comprehension) -> None:
        self.stack.pop()

    visit_ListComp = visit_SetComp = visit_GeneratorExp = visit_DictComp = _enter_comprehension
    leave_ListComp = leave_SetComp = leave_GeneratorExp = leave_DictComp = _leave_comprehension

    def visit_CompFor(self, node: cst.CompFor) -> bool:
        if id(node) in self._first_for:
            # The first iterable is evaluated in the scope around the comprehension.
            inner = self.stack.pop()
            walk(self, node.iter)
            self.stack.append(inner)
            self._bind_target(node.target, BindingKind.COMPREHENSION, node)
            walk(self, node.target)
            for part in node.ifs:
                walk(self, part)
            if node.inner_for_in is not None:
                walk(self, node.inner_for_in)
            return False
        self._bind_target(node.target, BindingKind.COMPREHENSION, node)
        return True

    # Bindings -----------------------------------------------------------------------------
    def visit_Import(self, node: cst.Import) -> None:
        self.not_reads.update(_name_ids(node))
        for alias in node.names:
            full = _import_module_name(alias.name)
            if alias.asname is not None:
                target = alias.asname.name
                if isinstance(target, cst.Name):
                    self._bind(target.value, BindingKind.IMPORT, node, target=target, qualname=full)
                    self._root(target.value, full)
            else:
                top = full.split(".")[0]
                self._bind(top, BindingKind.IMPORT, node, qualname=top)
                self._root(top, top)
                self._mark(full)

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        self.not_reads.update(_name_ids(node))
        if node.relative or node.module is None:
            base = None
        else:
            base = _import_module_name(node.module)
        if isinstance(node.names, cst.ImportStar):
            self.star_import = True
            return
        for alias in node.names:
            name = alias.name.value
            assert isinstance(name, str)
            local, target = name, alias.name if isinstance(alias.name, cst.Name) else None
            if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
                local, target = alias.asname.name.value, alias.asname.name
            qualname = f"{base}.{name}" if base else None
            self._bind(local, BindingKind.IMPORT, node, target=target, qualname=qualname)
            if base:
                self._root(local, f"{base}.{name}")

    def visit_Assign(self, node: cst.Assign) -> None:
        single = len(node.targets) == 1
        for t in node.targets:
            if isinstance(t.target, cst.Name):
                self._bind(
                    t.target.value, BindingKind.ASSIGN, node, target=t.target, value=node.value
                )
                value = dotted(node.value)
                if single and value is not None:
                    root, _, rest = value.partition(".")
                    for base in list(self.roots.get(root, ())):
                        self._root(t.target.value, f"{base}.{rest}" if rest else base)
            else:
                self._bind_target(t.target, BindingKind.TARGET, node)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        if isinstance(node.target, cst.Name):
            self._bind(
                node.target.value, BindingKind.ANNOTATED, node, target=node.target, value=node.value
            )

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        self._bind_target(node.target, BindingKind.AUGMENTED, node)
        if isinstance(node.target, cst.Name):
            self.not_reads.discard(id(node.target))  # `x += 1` reads `x` too

    def visit_NamedExpr(self, node: cst.NamedExpr) -> None:
        # A walrus in a comprehension binds in the scope around it (PEP 572).
        scope = next(s for s in reversed(self.stack) if s.kind != "comprehension")
        if isinstance(node.target, cst.Name):
            self._bind(
                node.target.value,
                BindingKind.WALRUS,
                node,
                target=node.target,
                value=node.value,
                scope=scope,
            )

    def visit_For(self, node: cst.For) -> None:
        self._bind_target(node.target, BindingKind.FOR, node)

    def visit_WithItem(self, node: cst.WithItem) -> None:
        if node.asname is not None:
            self._bind_target(node.asname.name, BindingKind.WITH, node)

    def visit_ExceptHandler(self, node: cst.ExceptHandler) -> None:
        if node.name is not None:
            self._bind_target(node.name.name, BindingKind.EXCEPT, node)

    def visit_Global(self, node: cst.Global) -> None:
        for item in node.names:
            self._bind(item.name.value, BindingKind.GLOBAL, node, target=item.name)
            self.declared.add(item.name.value)

    def visit_Nonlocal(self, node: cst.Nonlocal) -> None:
        for item in node.names:
            self._bind(item.name.value, BindingKind.NONLOCAL, node, target=item.name)
            self.declared.add(item.name.value)

    def visit_Del(self, node: cst.Del) -> None:
        self._bind_target(node.target, BindingKind.DEL, node)

    def visit_MatchAs(self, node: cst.MatchAs) -> None:
        if node.name is not None:
            self._bind(node.name.value, BindingKind.MATCH, node, target=node.name)

    def visit_MatchStar(self, node: cst.MatchStar) -> None:
        if node.name is not None:
            self._bind(node.name.value, BindingKind.MATCH, node, target=node.name)

    def visit_MatchMapping(self, node: cst.MatchMapping) -> None:
        if node.rest is not None:
            self._bind(node.rest.value, BindingKind.MATCH, node, target=node.rest)

    def visit_MatchKeywordElement(self, node: cst.MatchKeywordElement) -> None:
        self.not_reads.add(id(node.key))  # `P(x=...)` names an attribute

    # References ---------------------------------------------------------------------------
    def visit_Name(self, node: cst.Name) -> None:
        self.scope_of[id(node)] = self.scope
        self.names.add(node.value)
        if id(node) not in self.not_reads:
            self.reads.add(node.value)
        if node.value in self.roots:
            self._mark_chain(node.value)

    def visit_Arg(self, node: cst.Arg) -> None:
        if node.keyword is not None:
            self.not_reads.add(id(node.keyword))

    def visit_Attribute(self, node: cst.Attribute) -> None:
        self.not_reads.add(id(node.attr))
        if self.roots:
            chain = dotted(node)
            if chain is not None and chain.partition(".")[0] in self.roots:
                self._mark_chain(chain)


class ScopeModel:
    """Scopes, bindings and references of one module; what its names mean.

    Build it with `ScopeModel(module)` (or get it from `ModuleCache.names`); ask it about the
    original nodes of that module.
    """

    def __init__(
        self,
        module: cst.Module,
        watch: Collection[str] = (),
        watch_types: tuple[type[cst.CSTNode], ...] = (),
    ) -> None:
        builder = _Builder(module, watch, watch_types)
        walk(builder, module)
        self.module_scope: Scope = builder.module_scope
        self.star_import: bool = builder.star_import
        self.all_names: frozenset[str] = frozenset(builder.names)
        self._scopes = builder.scopes
        self._scope_of = builder.scope_of
        self._by_name = builder.by_name
        self._declared = frozenset(builder.declared)
        self._not_reads = builder.not_reads
        self._reads = frozenset(builder.reads)
        self._inner_bound = frozenset(
            name
            for name, bs in builder.by_name.items()
            if any(b.scope.kind != "module" for b in bs)
        )
        self._marks = builder.marks
        self._type_marks = builder.type_marks
        self._complete = builder.complete
        self._module = module
        self._early_nodes: frozenset[int] | None = None

    @property
    def module(self) -> cst.Module:
        """The module this model describes."""
        return self._module

    # Scopes and references ------------------------------------------------------------------
    def scope_of(self, node: cst.Name) -> Scope:
        """Return the scope a Name of the module (a reference or a bound name) is in."""
        return self._scope_of.get(id(node), self.module_scope)

    def scope_made_by(self, node: cst.CSTNode) -> Scope | None:
        """Return the scope a Module, ClassDef, FunctionDef, Lambda or comprehension makes."""
        return self._scopes.get(id(node))

    def is_read(self, node: cst.Name) -> bool:
        """Return True if `node` reads a variable: not an attribute's or keyword's name, not a
        name an import, definition, parameter, assignment, `global`, `del` or pattern binds
        (`x += 1` reads `x`). A Name the module does not hold counts as a read."""
        return id(node) not in self._not_reads

    def lookup(self, name: str, scope: Scope) -> Scope | None:
        """Return the scope owning the binding of `name` that a reference in `scope` sees."""
        return scope.lookup(name)

    # Bindings ------------------------------------------------------------------------------
    def bindings(self, name: str) -> Sequence[Binding]:
        """Return every binding of `name` in every scope, in the order of the walk."""
        return self._by_name.get(name, ())

    def bound_names(self) -> Iterator[tuple[str, Sequence[Binding]]]:
        """Yield every bound name with its bindings."""
        yield from self._by_name.items()

    def bound(self, name: str) -> bool:
        """Return True if anything in the module may bind `name` (a star import may)."""
        return name in self._by_name or self.star_import

    def declared(self, name: str) -> bool:
        """Return True if a `global` or `nonlocal` statement names `name`."""
        return name in self._declared

    def bound_below_module(self, name: str) -> bool:
        """Return True if a function, class, lambda or comprehension binds `name` (may shadow
        the module's)."""
        return name in self._inner_bound

    def assignment_seen_from(self, name: str, scope: Scope) -> Binding | None:
        """Return the plain `name = value` a read of `name` in `scope` sees.

        None unless that assignment is the only binding giving `name` a value in the scope that
        owns it (and no `global` / `nonlocal` or star import could change that).
        """
        if self.star_import or name in self._declared:
            return None
        owner = scope.lookup(name)
        if owner is None:
            return None
        here = owner.assigning(name)
        return here[0] if len(here) == 1 and here[0].plain else None

    def values(self, name: str) -> list[cst.BaseExpression]:
        """Return every value assigned to `name` by a plain `name = value`, in any scope."""
        return [b.value for b in self.bindings(name) if b.plain and b.value is not None]

    # Qualified names -------------------------------------------------------------------------
    def qualified_name(self, node: cst.BaseExpression) -> str | None:
        """Return the dotted name `node` refers to (`jax.pmap`), or None if unknown."""
        if isinstance(node, cst.Name):
            return self._resolve(node.value, self.scope_of(node), 0)
        if isinstance(node, cst.Attribute):
            base = self.qualified_name(node.value)
            return None if base is None else f"{base}.{node.attr.value}"
        return None

    def _resolve(self, name: str, scope: Scope, depth: int) -> str | None:
        owner = scope.lookup(name)
        if owner is None or depth > 20:
            return None
        found: set[str | None] = set()
        for binding in owner.assigning(name):
            found.add(self._meaning(binding, owner, depth))
        if len(found) != 1:
            return None
        return found.pop()

    def _meaning(self, binding: Binding, owner: Scope, depth: int) -> str | None:
        if binding.kind is BindingKind.IMPORT:
            return binding.qualname
        target = dotted(binding.value) if binding.plain and binding.value is not None else None
        if target is None:
            return None
        head, _, rest = target.partition(".")
        if head == binding.name and binding.scope is owner:
            return None
        base = self._resolve(head, binding.scope, depth + 1)
        return None if base is None else ".".join(filter(None, (base, rest)))

    # Names for new code ----------------------------------------------------------------------
    def module_alias(self, module: str) -> str | None:
        """Return a module-level name bound to exactly `module` (`import jax as jx` -> `jx`).

        Only a name no function or class rebinds: new code may be put in any scope.
        """
        for local in self.module_scope.bindings:
            if local in self._inner_bound:
                continue
            bindings = self.module_scope.assigning(local)
            if bindings and all(
                b.kind is BindingKind.IMPORT and b.qualname == module for b in bindings
            ):
                return local
        return None

    def module_binding(self, qualname: str) -> str | None:
        """Return a module-level local name bound to exactly `qualname`, however imported
        (and that no function or class rebinds), bound before the module runs any code.

        New code may run as soon as the module runs code (`y = step(x)` at module level, a
        decorator, a class body, a notebook's cell), so a name bound only after that (an import
        in a notebook's later cell) would not be bound yet: it is not returned.
        """
        early = self._early()
        for local in self.module_scope.bindings:
            if local in self._inner_bound:
                continue
            if not all(id(b.node) in early for b in self.module_scope.bindings[local]):
                continue
            if self._resolve(local, self.module_scope, 0) == qualname:
                return local
        return None

    def _early(self) -> frozenset[int]:
        """Return the nodes of the module-level statements before the first that runs code and
        uses a watched (legacy) name: new code goes where those names are used, so code that
        uses none (`jax.config.update(...)` before a script's other imports) runs no new code.
        When the watched names' uses are not all known, the first statement that runs code."""
        if self._early_nodes is None:
            legacy: frozenset[int] | None = None
            if self._complete and (self._marks or self._type_marks):
                legacy = frozenset().union(*self._marks.values(), *self._type_marks.values())
            nodes: set[int] = set()
            for statement in self._module.body:
                if _runs_code(statement) and (legacy is None or id(statement) in legacy):
                    break
                nodes.update(_statement_nodes(statement))
            self._early_nodes = frozenset(nodes)
        return self._early_nodes

    def module_bindings(self) -> Iterator[str]:
        """Yield every name bound at module level."""
        yield from self.module_scope.bindings

    def is_free(self, name: str) -> bool:
        """Return True if no code mentions `name` and no module-level code binds it: a new
        helper may use it."""
        return name not in self.all_names and name not in self.module_scope.bindings

    def is_unused(self, name: str) -> bool:
        """Return True if no scope binds `name` and no code reads it: importing it at the top of
        the module changes the meaning of nothing already there."""
        return (
            name not in self.module_scope.bindings
            and name not in self._inner_bound
            and name not in self._reads
        )

    # Pruning ---------------------------------------------------------------------------------
    def paths_to(
        self, qualnames: Collection[str], types: tuple[type[cst.CSTNode], ...] = ()
    ) -> frozenset[int] | None:
        """Return the ids of every node on a path from the module to a use of `qualnames`
        or to a node of one of `types`.

        None when that cannot be known (a watched import comes after a use of its name, or
        these were not watched when the module was analysed): visit everything then.
        """
        if qualnames and not self._complete:
            return None
        if any(q not in self._marks for q in qualnames):
            return None
        if any(t not in self._type_marks for t in types):
            return None
        marks = [self._marks[q] for q in qualnames] + [self._type_marks[t] for t in types]
        return frozenset().union(*marks)


def _inert_value(node: cst.BaseExpression) -> bool:
    """Return True for a value that runs no code: a name, a dotted name, a literal."""
    if isinstance(node, (cst.Name, cst.SimpleString, cst.ConcatenatedString, cst.Integer)):
        return True
    if isinstance(node, (cst.Float, cst.Imaginary, cst.Ellipsis)):
        return True
    if isinstance(node, cst.Attribute):
        return dotted(node) is not None
    if isinstance(node, (cst.Tuple, cst.List, cst.Set)):
        return all(isinstance(e, cst.Element) and _inert_value(e.value) for e in node.elements)
    return False


def _inert(statement: cst.BaseSmallStatement) -> bool:
    """Return True for a small statement that runs no code of the program when executed."""
    if isinstance(statement, (cst.Import, cst.ImportFrom, cst.Pass)):
        return True
    if isinstance(statement, cst.Expr):  # a docstring
        return isinstance(statement.value, (cst.SimpleString, cst.ConcatenatedString))
    if isinstance(statement, (cst.Assign, cst.AnnAssign)):
        return statement.value is None or _inert_value(statement.value)
    return False


def _runs_code(statement: cst.BaseStatement) -> bool:
    """Return True if a module-level statement may run code of the program (a call, a
    decorator, a class body); imports, plain aliases, literals and undecorated defs do not."""
    if isinstance(statement, cst.SimpleStatementLine):
        return not all(_inert(s) for s in statement.body)
    if isinstance(statement, cst.FunctionDef):
        return bool(statement.decorators)
    if isinstance(statement, (cst.If, cst.Try)):  # `try: import x` / `except ImportError:`
        blocks: list[cst.BaseSuite] = [statement.body]
        if isinstance(statement, cst.If):
            if not _inert_value(statement.test):
                return True
            if isinstance(statement.orelse, cst.If) and _runs_code(statement.orelse):
                return True
            if isinstance(statement.orelse, cst.Else):
                blocks.append(statement.orelse.body)
        else:
            blocks += [h.body for h in statement.handlers]
            blocks += [b.body for b in (statement.orelse, statement.finalbody) if b is not None]
        return any(_runs_code(s) for b in blocks for s in _suite(b))
    return True


def _suite(block: cst.BaseSuite) -> Sequence[cst.BaseStatement]:
    if isinstance(block, cst.IndentedBlock):
        return block.body
    assert isinstance(block, cst.SimpleStatementSuite)
    return [cst.SimpleStatementLine(body=block.body)]


def _statement_nodes(statement: cst.BaseStatement) -> Iterator[int]:
    """Yield the ids of the small statements (imports, assignments) inside a module-level
    statement that `_runs_code` found inert."""
    if isinstance(statement, cst.SimpleStatementLine):
        yield from (id(s) for s in statement.body)
    elif isinstance(statement, cst.FunctionDef):
        yield id(statement)
    elif isinstance(statement, (cst.If, cst.Try)):
        blocks: list[cst.BaseSuite] = [statement.body]
        if isinstance(statement, cst.If):
            if isinstance(statement.orelse, cst.If):
                yield from _statement_nodes(statement.orelse)
            elif isinstance(statement.orelse, cst.Else):
                blocks.append(statement.orelse.body)
        else:
            blocks += [h.body for h in statement.handlers]
            blocks += [b.body for b in (statement.orelse, statement.finalbody) if b is not None]
        for block in blocks:
            if isinstance(block, cst.IndentedBlock):
                for inner in block.body:
                    yield from _statement_nodes(inner)
            else:
                assert isinstance(block, cst.SimpleStatementSuite)
                yield from (id(s) for s in block.body)
