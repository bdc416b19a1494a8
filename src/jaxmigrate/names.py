"""Resolve names to the JAX objects they mean, by meaning and not by spelling.

libcst's `QualifiedNameProvider` runs a full scope analysis and costs about a second on a large
file. Passes only ever ask "does this expression mean `jax.pmap`?", so this module does one cheap
walk that records, per scope, how each name is bound (an import, an alias of something imported,
or anything else), and answers that question lazily. It follows Python's rules where they matter
for correctness: function scopes see enclosing function and module scopes but not class bodies; a
name bound anywhere in a function is local to all of it; a name with conflicting bindings in the
scope that owns it resolves to nothing, so a pass leaves the site alone.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass, field

import libcst as cst

_UNKNOWN = object()

# Fields that only ever hold punctuation and whitespace: the walk below never enters them.
_TRIVIA = frozenset(
    {
        "lpar",
        "rpar",
        "leading_lines",
        "lines_after_decorators",
        "comma",
        "semicolon",
        "header",
        "footer",
        "trailing_whitespace",
        "newline",
        "equal",
        "colon",
        "operator",
        "lbracket",
        "rbracket",
        "lbrace",
        "rbrace",
        "dot",
        "relative",
        "asynchronous",
        "star_tok",
    }
)
_FIELDS: dict[type, tuple[str, ...]] = {}


def child_fields(kind: type) -> tuple[str, ...]:
    found = _FIELDS.get(kind)
    if found is None:
        found = tuple(
            f.name
            for f in dataclasses.fields(kind)
            if f.name not in _TRIVIA and not f.name.startswith("whitespace")
        )
        _FIELDS[kind] = found
    return found


_IS_NODE: dict[type, bool] = {}


def is_node(kind: type) -> bool:
    """`issubclass(kind, cst.CSTNode)`, remembered: CSTNode is an ABC, and `isinstance` against
    an ABC costs several times a plain class check, for every field of every node walked."""
    found = _IS_NODE.get(kind)
    if found is None:
        found = _IS_NODE[kind] = issubclass(kind, cst.CSTNode)
    return found


def walk(visitor: cst.CSTVisitor, node: cst.CSTNode) -> None:
    """Visit `node` and its non-trivia children with `visitor`'s on_visit/on_leave.

    About four times faster than `node.visit(visitor)`, which rebuilds every node it passes;
    for read-only visitors that need no attribute hooks and no whitespace or punctuation.
    """
    if visitor.on_visit(node):
        for name in child_fields(type(node)):
            value = getattr(node, name)
            kind = type(value)
            if kind is tuple or kind is list:
                for child in value:
                    if is_node(type(child)):
                        walk(visitor, child)
            elif is_node(kind):
                walk(visitor, value)
    visitor.on_leave(node)


@dataclass(eq=False)
class Scope:
    """One Python scope and the bindings made in it."""

    kind: str
    parent: Scope | None
    bindings: dict[str, list[object]] = field(default_factory=dict)

    def bind(self, name: str, value: object) -> None:
        self.bindings.setdefault(name, []).append(value)

    def lookup_scope(self, name: str) -> Scope | None:
        """Return the scope whose binding of `name` a reference in this scope sees."""
        scope: Scope | None = self
        first = True
        while scope is not None:
            if (first or scope.kind != "class") and name in scope.bindings:
                return scope
            first = False
            scope = scope.parent
        return None


@dataclass(frozen=True)
class _Import:
    qualname: str


@dataclass(frozen=True)
class _Alias:
    value: cst.BaseExpression
    scope: Scope


def dotted(node: cst.BaseExpression) -> str | None:
    """Return `a.b.c` for a Name/Attribute chain, else None."""
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        base = dotted(node.value)
        return None if base is None else f"{base}.{node.attr.value}"
    return None


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


class _ScopeBuilder(cst.CSTVisitor):
    def __init__(
        self, watch: Collection[str] = (), watch_types: tuple[type[cst.CSTNode], ...] = ()
    ) -> None:
        self.module_scope = Scope("module", None)
        self.stack: list[Scope] = [self.module_scope]
        self.scope_of: dict[int, Scope] = {}
        self.names: set[str] = set()
        self.inner_bound: set[str] = set()  # names bound in a function, class or comprehension
        self.reads: set[str] = set()  # names read as variables (not `x.name`, `f(name=)`, imports)
        self._not_reads: set[int] = set()
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

    @property
    def scope(self) -> Scope:
        return self.stack[-1]

    def _push(self, kind: str) -> None:
        self.stack.append(Scope(kind, self.scope))

    def _pop(self) -> None:
        self.inner_bound.update(self.stack.pop().bindings)

    # Scopes -------------------------------------------------------------------------------
    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        self.scope.bind(node.name.value, _UNKNOWN)
        for deco in node.decorators:
            walk(self, deco)
        self._visit_param_defaults(node.params)
        if node.returns is not None:
            walk(self, node.returns)
        self._push("function")
        self._bind_params(node.params)
        walk(self, node.body)
        self._pop()
        return False

    def visit_Lambda(self, node: cst.Lambda) -> bool:
        self._visit_param_defaults(node.params)
        self._push("function")
        self._bind_params(node.params)
        walk(self, node.body)
        self._pop()
        return False

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        self.scope.bind(node.name.value, _UNKNOWN)
        for deco in node.decorators:
            walk(self, deco)
        for arg in (*node.bases, *node.keywords):
            walk(self, arg)
        self._push("class")
        walk(self, node.body)
        self._pop()
        return False

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
            self.scope.bind(p.name.value, _UNKNOWN)
        for star in (params.star_arg, params.star_kwarg):
            if isinstance(star, cst.Param):
                self.scope.bind(star.name.value, _UNKNOWN)

    # Bindings -----------------------------------------------------------------------------
    def visit_Import(self, node: cst.Import) -> None:
        self._not_reads.update(_name_ids(node))
        for alias in node.names:
            full = _import_module_name(alias.name)
            if alias.asname is not None:
                target = alias.asname.name
                if isinstance(target, cst.Name):
                    self.scope.bind(target.value, _Import(full))
                    self._root(target.value, full)
            else:
                top = full.split(".")[0]
                self.scope.bind(top, _Import(top))
                self._root(top, top)
                self._mark(full)

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        self._not_reads.update(_name_ids(node))
        if node.relative or node.module is None:
            base = None
        else:
            base = _import_module_name(node.module)
        if isinstance(node.names, cst.ImportStar):
            return
        for alias in node.names:
            name = alias.name.value
            assert isinstance(name, str)
            local = name
            if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
                local = alias.asname.name.value
            self.scope.bind(local, _Import(f"{base}.{name}") if base else _UNKNOWN)
            if base:
                self._root(local, f"{base}.{name}")

    def visit_Assign(self, node: cst.Assign) -> None:
        single = len(node.targets) == 1
        for t in node.targets:
            value = dotted(node.value)
            if single and isinstance(t.target, cst.Name) and value is not None:
                self.scope.bind(t.target.value, _Alias(node.value, self.scope))
                root, _, rest = value.partition(".")
                for base in list(self.roots.get(root, ())):
                    self._root(t.target.value, f"{base}.{rest}" if rest else base)
            else:
                self._bind_target(t.target)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        if node.value is not None:
            self._bind_target(node.target)

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        self._bind_target(node.target)

    def visit_NamedExpr(self, node: cst.NamedExpr) -> None:
        self._bind_target(node.target)

    def visit_For(self, node: cst.For) -> None:
        self._bind_target(node.target)

    def visit_CompFor(self, node: cst.CompFor) -> None:
        self._bind_target(node.target)

    def visit_WithItem(self, node: cst.WithItem) -> None:
        if node.asname is not None:
            self._bind_target(node.asname.name)

    def visit_ExceptHandler(self, node: cst.ExceptHandler) -> None:
        if node.name is not None:
            self._bind_target(node.name.name)

    def visit_Global(self, node: cst.Global) -> None:
        for item in node.names:
            self.scope.bind(item.name.value, _UNKNOWN)

    def visit_Nonlocal(self, node: cst.Nonlocal) -> None:
        for item in node.names:
            self.scope.bind(item.name.value, _UNKNOWN)

    def visit_Del(self, node: cst.Del) -> None:
        self._bind_target(node.target)

    def visit_MatchAs(self, node: cst.MatchAs) -> None:
        if node.name is not None:
            self.scope.bind(node.name.value, _UNKNOWN)

    def visit_MatchStar(self, node: cst.MatchStar) -> None:
        if node.name is not None:
            self.scope.bind(node.name.value, _UNKNOWN)

    def visit_MatchMapping(self, node: cst.MatchMapping) -> None:
        if node.rest is not None:
            self.scope.bind(node.rest.value, _UNKNOWN)

    def _bind_target(self, target: cst.BaseExpression) -> None:
        if isinstance(target, cst.Name):
            self.scope.bind(target.value, _UNKNOWN)
        elif isinstance(target, (cst.Tuple, cst.List)):
            for el in target.elements:
                self._bind_target(el.value)
        elif isinstance(target, cst.StarredElement):
            self._bind_target(target.value)

    # References ---------------------------------------------------------------------------
    def visit_Name(self, node: cst.Name) -> None:
        self.scope_of[id(node)] = self.scope
        self.names.add(node.value)
        if id(node) not in self._not_reads:
            self.reads.add(node.value)
        if node.value in self.roots:
            self._mark_chain(node.value)

    def visit_Arg(self, node: cst.Arg) -> None:
        if node.keyword is not None:
            self._not_reads.add(id(node.keyword))

    def visit_Attribute(self, node: cst.Attribute) -> None:
        self._not_reads.add(id(node.attr))
        if self.roots:
            chain = dotted(node)
            if chain is not None and chain.partition(".")[0] in self.roots:
                self._mark_chain(chain)


class Names:
    """Answers "what does this expression mean?" for one module."""

    def __init__(
        self,
        module: cst.Module,
        watch: Collection[str] = (),
        watch_types: tuple[type[cst.CSTNode], ...] = (),
    ) -> None:
        builder = _ScopeBuilder(watch, watch_types)
        walk(builder, module)
        self._module_scope = builder.module_scope
        self._scope_of = builder.scope_of
        self.all_names: frozenset[str] = frozenset(builder.names)
        self._inner_bound = frozenset(builder.inner_bound)
        self._reads = frozenset(builder.reads)
        self._marks = builder.marks
        self._type_marks = builder.type_marks
        self._complete = builder.complete

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

    def qualified_name(self, node: cst.BaseExpression) -> str | None:
        """Return the dotted name `node` refers to (`jax.pmap`), or None if unknown."""
        if isinstance(node, cst.Name):
            scope = self._scope_of.get(id(node), self._module_scope)
            return self._resolve(node.value, scope, 0)
        if isinstance(node, cst.Attribute):
            base = self.qualified_name(node.value)
            return None if base is None else f"{base}.{node.attr.value}"
        return None

    def is_one_of(self, node: cst.BaseExpression, qualnames: Sequence[str] | set[str]) -> bool:
        """Return True if `node` refers to one of `qualnames`."""
        return self.qualified_name(node) in qualnames

    def _resolve(self, name: str, scope: Scope, depth: int) -> str | None:
        owner = scope.lookup_scope(name)
        if owner is None or depth > 20:
            return None
        found: set[str | None] = set()
        for binding in owner.bindings[name]:
            if isinstance(binding, _Import):
                found.add(binding.qualname)
            elif isinstance(binding, _Alias):
                target = dotted(binding.value)
                assert target is not None
                head, _, rest = target.partition(".")
                if head == name and binding.scope is owner:
                    found.add(None)
                    continue
                base = self._resolve(head, binding.scope, depth + 1)
                found.add(None if base is None else ".".join(filter(None, (base, rest))))
            else:
                found.add(None)
        if len(found) != 1:
            return None
        return found.pop()

    def module_alias(self, module: str) -> str | None:
        """Return a module-level name bound to exactly `module` (`import jax as jx` -> `jx`).

        Only a name no function or class rebinds: new code may be put in any scope.
        """
        for local, bindings in self._module_scope.bindings.items():
            if local in self._inner_bound:
                continue
            if bindings and all(b == _Import(module) for b in bindings):
                return local
        return None

    def module_binding(self, qualname: str) -> str | None:
        """Return a module-level local name bound to exactly `qualname`, however imported
        (and that no function or class rebinds)."""
        for local in self._module_scope.bindings:
            if local in self._inner_bound:
                continue
            if self._resolve(local, self._module_scope, 0) == qualname:
                return local
        return None

    def is_free(self, name: str) -> bool:
        """Return True if no scope binds or reads `name`: a new helper may use it."""
        return name not in self.all_names and name not in self._module_scope.bindings

    def is_unused(self, name: str) -> bool:
        """Return True if no scope binds `name` and no code reads it: importing it at the top of
        the module changes the meaning of nothing already there."""
        return (
            name not in self._module_scope.bindings
            and name not in self._inner_bound
            and name not in self._reads
        )

    def module_bindings(self) -> Iterator[str]:
        """Yield every name bound at module level."""
        yield from self._module_scope.bindings
