"""Reaching definitions in one function: which bindings of a name may give a read its value.

The program-level analysis asks, of a read of a name, which of the function's bindings (an
assignment, a loop target, ...) may have made the value it reads, on any path. That is a forward
data-flow over the function's statements: an environment maps each name to the set of
bindings that may be its value at that point; a binding replaces the set, paths join by union,
loops run to a fixpoint, `return`/`raise` end a path, `break`/`continue` carry theirs to the
loop's exit or head, a `try` handler starts from any point of its body. `ENTRY` stands for the
value the name had when the function began (a parameter, a global, a closure's).

A read inside a nested def or lambda runs whenever that is called: every binding of the name
may reach it, and ENTRY too; but a lambda `jax.tree.map` is given runs within that call, so what
reaches the call reaches its reads. A comprehension's own targets reach the reads inside it only.
Over-approximate everywhere else: a superset of the bindings that reach never makes the
program-level form taken where it would not be.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator
from functools import cached_property
from typing import Any, TypeVar, get_args

import libcst as cst

from jaxmigrate.toolkit.names import dotted, walk_in_order
from jaxmigrate.toolkit.scope import BindingKind, ScopeModel

from ._layout import TREE_MAPS

N = TypeVar("N")
ENTRY = cst.Name("__entry__")  # the value a name has when the function starts
SCOPES = (cst.FunctionDef, cst.Lambda, cst.ClassDef)  # where a step may be made and called
MARK = "\0mark"  # bound by the statements `Reach` is given as `marks`: they may have run

Bindings = frozenset[cst.CSTNode]
Env = dict[str, Bindings]
Comprehension = cst.ListComp | cst.SetComp | cst.GeneratorExp | cst.DictComp


def _join(*envs: Env | None) -> Env | None:
    live = [e for e in envs if e is not None]
    if not live:
        return None
    names = set().union(*live)
    return {n: frozenset().union(*(e.get(n, frozenset({ENTRY})) for e in live)) for n in names}


class Reach:
    """The bindings reaching each read of a function's body (`block`); `skip`: a nested def
    whose inside is not read (the step's own body)."""

    def __init__(
        self,
        block: cst.BaseSuite,
        skip: cst.CSTNode | None = None,
        marks: frozenset[int] = frozenset(),
    ) -> None:
        self.skip = skip
        self.marks = marks  # ids of statements after which MARK is bound (`ran_before`)
        self._at: dict[int, Bindings] = {}
        self._before: dict[int, Env] = {}  # by id of a statement: what reaches its start
        self._nested: list[cst.Name] = []  # reads inside nested defs and lambdas
        self._all: dict[str, set[cst.CSTNode]] = {}  # every binding of each name
        self._loops: list[tuple[list[Env], list[Env]]] = []  # each one's `break`s, `continue`s
        self._tries: list[list[Env]] = []  # the environments seen in each enclosing `try` body
        self._defs: list[cst.FunctionDef] = []  # the nested defs made in the function
        self._calls: dict[str, dict[int, Env]] = {}  # by name called: what reaches each call
        self._own: dict[str, set[int]] = {}  # the reads of each name in the function's blocks
        self._fields: set[int] = set()  # names no read: `x.attr`'s, `f(keyword=...)`'s
        self._body(statements(block), {})
        refined = self._closures()
        for name in self._nested:
            everything = frozenset(self._all.get(name.value, ())) | {ENTRY}
            self._at[id(name)] = refined.get(id(name), everything)

    def of(self, use: cst.Name) -> Bindings:
        """Return the bindings that may have made the value `use` reads (ENTRY: the function's
        own starting value); empty for a read on no path."""
        return self._at.get(id(use), frozenset())

    def before(self, statement: cst.CSTNode) -> Env:
        """What reaches the start of `statement` (a statement or a small statement of the
        function's own blocks), by name; a name not in it has its starting value (ENTRY)."""
        return self._before.get(id(statement), {})

    # Statements -----------------------------------------------------------------------------
    def _body(self, statements: Iterable[cst.BaseStatement], env: Env | None) -> Env | None:
        for statement in (*statements, None):  # what reaches each, and the end: a `try`'s
            if env is not None:
                for seen in self._tries:
                    seen.append(env)
            env = self._statement(statement, env) if statement is not None else env
        return env

    def _statement(self, node: cst.BaseStatement, env: Env | None) -> Env | None:
        self._before[id(node)] = env if env is not None else {}
        if env is not None and id(node) in self.marks:  # its header runs before its blocks
            env = {**env, MARK: frozenset({node})}
        live: Env = env if env is not None else {}  # dead code: its reads see nothing
        if isinstance(node, cst.SimpleStatementLine):
            for small in node.body:
                self._before[id(small)] = env if env is not None else {}
                if env is None:
                    self._reads(small, {})
                else:
                    env = self._small(small, env)
            return env
        if isinstance(node, cst.If):
            self._reads(node.test, live)
            env = self._walruses(node.test, dict(env)) if env is not None else None
            return _join(self._body(statements(node.body), env), self._body(else_of(node), env))
        if isinstance(node, (cst.For, cst.While)):
            return self._loop(node, env)
        if isinstance(node, cst.With):
            inner = dict(live)
            for item in node.items:  # in order: an item reads what those before it bind
                self._reads(item.item, inner)
                if item.asname is not None:
                    self._bind(item.asname.name, item, inner)
            return self._body(statements(node.body), inner if env is not None else None)
        if isinstance(node, cst.Try):
            return self._try(node, env)
        if isinstance(node, cst.Match):
            return self._match(node, env)
        if isinstance(node, (cst.FunctionDef, cst.ClassDef)):
            self._header(node, live)
            out = dict(live)
            self._bind(node.name, node, out)
            return out if env is not None else None
        # `try*` and what else may come: every name read sees what reaches, every
        # block runs from here or not at all, and the names it binds are not known (each
        # binding of a name in a pattern or a target there is one no other part of the
        # analysis knows: reads see it as such).
        self._reads(node, live)
        return _join(env, *(self._body(statements(b), dict(live)) for b in _blocks(node)))

    def _match(self, node: cst.Match, env: Env | None) -> Env | None:
        """The cases of a `match` as the branches of an `if`: each binds its captures, then its
        guard and body run; no case may match, unless the last is a bare `_` or capture."""
        live: Env = env if env is not None else {}
        self._reads(node.subject, live)
        ends: list[Env | None] = []
        for case in node.cases:
            inner = dict(live)
            for compared in _compared(case.pattern):  # `Color.RED`, `Point(...)`, a key
                self._reads(compared, live)
            for capture in _captures(case.pattern):
                self._bind(capture, case, inner)
            if case.guard is not None:
                self._reads(case.guard, inner)
            ends.append(self._body(statements(case.body), inner if env is not None else None))
        last = node.cases[-1]
        total = isinstance(last.pattern, cst.MatchAs) and last.pattern.pattern is None
        return _join(*ends) if total and last.guard is None else _join(env, *ends)

    def _loop(self, node: cst.For | cst.While, env: Env | None) -> Env | None:
        if isinstance(node, cst.For):
            self._reads(node.iter, env if env is not None else {})
        head = env
        while True:
            exits: list[Env] = []  # the environments at its `break`s
            heads: list[Env] = []  # at its `continue`s
            self._loops.append((exits, heads))
            entered: Env | None = None
            if head is not None:
                entered = dict(head)
                if isinstance(node, cst.For):
                    self._reads(node.target, entered)
                    self._bind(node.target, node, entered)
                else:
                    self._reads(node.test, head)
            end = self._body(statements(node.body), entered)
            self._loops.pop()
            again = _join(head, end, *heads)
            if again == head:
                break
            head = again
        forever = isinstance(node, cst.While) and dotted(node.test) == "True"
        done = self._body(else_of(node), None if forever else head)
        return _join(done, *exits)

    def _try(self, node: cst.Try, env: Env | None) -> Env | None:
        seen: list[Env] = []
        self._tries.append(seen)
        end = self._body(statements(node.body), env)
        self._tries.pop()
        raised = _join(env, *seen)  # a handler starts from any point of the body
        ends = []
        for handler in node.handlers:
            start = dict(raised) if raised is not None else None
            if handler.type is not None:
                self._reads(handler.type, raised or {})
            if handler.name is not None and start is not None:
                self._bind(handler.name.name, handler, start)
            ends.append(self._body(statements(handler.body), start))
        end = self._body(else_of(node), end)
        out = _join(end, *ends)
        if node.finalbody is not None:  # run on the way out; an exception goes on after it
            finally_ = statements(node.finalbody.body)
            after = self._body(finally_, out) if out is not None else None
            self._body(finally_, _join(out, raised))  # its reads: from either (recorded last)
            return after
        return out

    def _small(self, node: cst.BaseSmallStatement, env: Env) -> Env | None:
        self._reads(node, env)
        out = dict(env)
        if id(node) in self.marks:
            out[MARK] = frozenset({node})
        # an assignment binds its targets (`x: int` alone none; another statement has none)
        if not isinstance(node, cst.AnnAssign) or node.value is not None:
            for target in assign_targets(node):
                self._bind(target, node, out)
        if isinstance(node, (cst.Import, cst.ImportFrom)):
            for alias in node.names if isinstance(node.names, Iterable) else ():  # not `*`
                bound = alias.evaluated_alias or alias.evaluated_name.split(".")[0]
                self._bind(cst.Name(bound), node, out)  # `import a.b` binds `a`
        elif isinstance(node, cst.Del):
            for name in target_nodes(node.target):
                out[name.value] = frozenset()
        elif isinstance(node, (cst.Return, cst.Raise)):
            return None
        elif isinstance(node, (cst.Break, cst.Continue)):
            if self._loops:
                exits, heads = self._loops[-1]
                (exits if isinstance(node, cst.Break) else heads).append(out)
            return None
        return self._walruses(node, out)

    def _walruses(self, node: cst.CSTNode, env: Env) -> Env:
        """Bind in `env` the names `node`'s `:=` assign (an `if` test's, a statement's); one
        under an `and`, `or` or `... if ... else` may not be evaluated: joined with what was
        there."""
        scopes = (cst.Lambda, cst.BaseSuite)
        sure = {id(w) for w in nodes_in(node, cst.NamedExpr, scopes + _MAYBE)}
        for walrus in nodes_in(node, cst.NamedExpr, scopes):
            target = walrus.target
            if isinstance(target, cst.Name):
                before = env.get(target.value, frozenset({ENTRY}))
                self._bind(target, walrus, env)
                env[target.value] |= frozenset() if id(walrus) in sure else before
        return env

    def _closures(self) -> dict[int, Bindings]:
        """The reads inside a nested def that runs only where the function calls it: bound once
        (no decorator, or `jax.jit`'s, which traces at the first call), every other read of its
        name a call in the function's own blocks, no generator. What reaches those calls reaches
        the reads in its body (not in a lambda or def nested in it, which may run later):
        uvim's `init` closure, called before the value it reads is replicated, reads it
        unreplicated."""
        refined: dict[int, Bindings] = {}
        inner = {n.value for n in self._nested if id(n) not in self._fields}
        for fn in self._defs:
            name = fn.name.value
            own, calls = self._own.get(name, set()), self._calls.get(name, {})
            if len(self._all.get(name, ())) != 1 or not own or own != set(calls) or name in inner:
                continue
            if not all(_traced_later(d.decorator) for d in fn.decorators) or fn.asynchronous:
                continue  # a decorator may call it anywhere; a coroutine runs when awaited
            if any(True for _ in nodes_in(fn.body, cst.Yield, SCOPES)):
                continue  # a generator runs when iterated
            for read in nodes_in(fn.body, cst.Name, SCOPES):
                refined[id(read)] = frozenset().union(
                    *(env.get(read.value, frozenset({ENTRY})) for env in calls.values())
                )
        return refined

    def _inside(self, body: cst.CSTNode) -> None:
        """Record the names in `body`, a nested def's, lambda's or class's, as read whenever it
        runs (the names of fields and keywords there are no reads)."""
        self._nested.extend(nodes_in(body, cst.Name))
        self._fields |= {id(node.attr) for node in nodes_in(body, cst.Attribute)}
        self._fields |= {id(a.keyword) for a in nodes_in(body, cst.Arg) if a.keyword is not None}

    # Reads ----------------------------------------------------------------------------------
    def _bind(self, target: cst.BaseExpression, binding: cst.CSTNode, env: Env) -> None:
        """Bind in `env` each name `target` binds (`a`, `a, (b, *c)`) to `binding`."""
        for name in target_nodes(target):
            env[name.value] = frozenset({binding})
            self._all.setdefault(name.value, set()).add(binding)

    def _header(self, node: cst.FunctionDef | cst.ClassDef, env: Env) -> None:
        """A def's decorators and defaults (a class's bases) are read where it is made; its
        inside whenever it runs."""
        for decorator in node.decorators:
            self._reads(decorator, env)
        if isinstance(node, cst.ClassDef):
            for part in (*node.bases, *node.keywords):
                self._reads(part, env)
            self._inside(node.body)
            return
        self._defaults(node.params, env, frozenset())
        if node is not self.skip:
            self._inside(node.body)
            self._defs.append(node)

    def _reads(self, node: cst.CSTNode, env: Env, local: frozenset[str] = frozenset()) -> None:
        """Record what reaches each name in `node` (an expression or a small statement), not
        looking into nested blocks; lambdas and comprehensions as their scopes read."""
        if isinstance(node, cst.Name):
            if node.value not in local and id(node) not in self._fields:
                self._at[id(node)] = env.get(node.value, frozenset({ENTRY}))
                self._own.setdefault(node.value, set()).add(id(node))
            return
        if isinstance(node, cst.Attribute):
            self._fields.add(id(node.attr))
        elif isinstance(node, cst.Arg) and node.keyword is not None:
            self._fields.add(id(node.keyword))
        elif isinstance(node, cst.Call):
            if isinstance(node.func, cst.Name) and node.func.value not in local:
                self._calls.setdefault(node.func.value, {})[id(node.func)] = env
            if dotted(node.func) in TREE_MAPS:
                self._mapped(node, env, local)
                return
        if isinstance(node, cst.Lambda):
            self._defaults(node.params, env, local)
            self._inside(node.body)
        elif isinstance(node, Comprehension):
            self._comprehension(node, env, local)
        elif not isinstance(node, cst.BaseSuite):
            for child in node.children:
                self._reads(child, env, local)

    def _mapped(self, call: cst.Call, env: Env, local: frozenset[str]) -> None:
        """`jax.tree.map(lambda v: ..., x)` calls the lambda on each leaf before it returns and
        keeps it not: what reaches the call reaches the reads in the lambda's body (nyu_depth's
        `out = jax.tree_map(lambda x: x[out["mask"] == 1], out)` reads the `out` of before)."""
        self._reads(call.func, env, local)
        for arg in call.args:
            fn = arg.value
            if not isinstance(fn, cst.Lambda) or arg.keyword is not None or arg.star:
                self._reads(arg, env, local)
                continue
            own = frozenset(p.name.value for p in params_of(fn.params))
            self._defaults(fn.params, env, local)
            self._reads(fn.body, env, (local | own))

    def _defaults(self, params: cst.Parameters, env: Env, local: frozenset[str]) -> None:
        """Record what reaches the names of `params`' defaults (read where the def or lambda is
        made)."""
        for param in params_of(params):
            if param.default is not None:
                self._reads(param.default, env, local)

    def _comprehension(self, node: Comprehension, env: Env, local: frozenset[str]) -> None:
        inner, outer = dict(env), env  # the first iterable is read outside
        compfor: cst.CompFor | None = node.for_in
        while compfor is not None:
            self._reads(compfor.iter, outer, local)
            outer = inner
            for name in target_nodes(compfor.target):
                inner[name.value] = frozenset({compfor})  # seen inside the comprehension only
            for condition in compfor.ifs:
                self._reads(condition, inner, local)
            compfor = compfor.inner_for_in
        parts = (node.key, node.value) if isinstance(node, cst.DictComp) else (node.elt,)
        for part in parts:
            self._reads(part, inner, local)


def _captures(pattern: cst.MatchPattern) -> Iterator[cst.Name]:
    """The names a `case` pattern binds (`x`, `[first, *rest]`, `{**others}`, `Point(x=px)`)."""
    yield from (n.name for n in nodes_in(pattern, cst.MatchAs) if isinstance(n.name, cst.Name))
    yield from (n.name for n in nodes_in(pattern, cst.MatchStar) if isinstance(n.name, cst.Name))
    yield from (n.rest for n in nodes_in(pattern, cst.MatchMapping) if n.rest is not None)


# What may leave a part of an expression unevaluated (a comprehension: over nothing)
_MAYBE = (cst.BooleanOperation, cst.IfExp, *get_args(Comprehension))


def _compared(pattern: cst.MatchPattern) -> Iterator[cst.BaseExpression]:
    """The expressions a `case` pattern reads: values compared with, classes, mapping keys."""
    yield from (n.value for n in nodes_in(pattern, cst.MatchValue))
    yield from (n.cls for n in nodes_in(pattern, cst.MatchClass))
    yield from (n.key for n in nodes_in(pattern, cst.MatchMappingElement))


def statements(block: cst.BaseSuite | cst.CSTNode) -> list[cst.BaseStatement]:
    """The statements of a block, `if x: y = 1` on one line too."""
    if isinstance(block, cst.IndentedBlock):
        return list(block.body)
    if isinstance(block, cst.SimpleStatementSuite):
        return [cst.SimpleStatementLine(body=block.body)]
    return []


def else_of(node: cst.If | cst.For | cst.While | cst.Try) -> list[cst.BaseStatement]:
    """Return the statements of `node`'s `else` (an `elif`: that `if`); none without one."""
    orelse = node.orelse
    if orelse is None:
        return []
    return [orelse] if isinstance(orelse, cst.If) else statements(orelse.body)


def _blocks(node: cst.CSTNode) -> Iterator[cst.BaseSuite]:
    for child in node.children:
        if isinstance(child, cst.BaseSuite):
            yield child
        elif not isinstance(child, cst.BaseExpression):
            yield from _blocks(child)


# The walkers the pmap rule shares (its other modules import them from here, the leaf).
def params_of(params: cst.Parameters) -> list[cst.Param]:
    """Every parameter: positional-only, plain, keyword-only, `*args` and `**kwargs`."""
    found = [*params.posonly_params, *params.params, *params.kwonly_params]
    return found + [p for p in (params.star_arg, params.star_kwarg) if isinstance(p, cst.Param)]


def assigned_name(node: cst.CSTNode | None) -> str | None:
    """`x` of `x = value` (one target, a name), else None."""
    if not isinstance(node, cst.Assign) or len(node.targets) != 1:
        return None
    target = node.targets[0].target
    return target.value if isinstance(target, cst.Name) else None


def assign_targets(node: cst.CSTNode) -> list[cst.BaseExpression]:
    """Return the targets of an assignment (`a = b = v`, `a += v`, `a: int = v`); none for
    another node."""
    if isinstance(node, cst.Assign):
        return [t.target for t in node.targets]
    return [node.target] if isinstance(node, (cst.AugAssign, cst.AnnAssign)) else []


def target_nodes(target: cst.BaseExpression) -> list[cst.Name]:
    """The names a target binds (`a`, `a, (b, *c)`), not those a subscript or attribute reads."""
    if isinstance(target, cst.Name):
        return [target]
    if isinstance(target, (cst.Tuple, cst.List)):
        return [n for e in target.elements for n in target_nodes(e.value)]
    if isinstance(target, cst.StarredElement):
        return target_nodes(target.value)
    return []


def nodes_in(
    node: cst.CSTNode, kind: type[N], skip: tuple[type[cst.CSTNode], ...] = ()
) -> Iterator[N]:
    """The nodes of `kind` in `node`, itself included, in text order, not looking into nodes of
    the kinds `skip` (a Name's children, its parentheses, are not listed: `.children` would
    rebuild them)."""
    if isinstance(node, skip):
        return
    if isinstance(node, kind):
        yield node
    if isinstance(node, cst.Name):
        return
    for child in node.children:
        yield from nodes_in(child, kind, skip)


def replaced(node: N, new: dict[int, Any]) -> N:
    """`node` with each node in it whose id `new` holds replaced by that value (a node, or
    `RemovalSentinel.REMOVE`), in one pass."""

    class Replace(cst.CSTTransformer):
        def on_leave(self, original_node: cst.CSTNode, updated_node: cst.CSTNode) -> Any:
            return new.get(id(original_node), updated_node)

    return node.visit(Replace())  # type: ignore[attr-defined,no-any-return]


# One function's names, from the toolkit's scope model -----------------------------------------
NOT_STORES = (BindingKind.PARAM, BindingKind.GLOBAL, BindingKind.NONLOCAL)


class _Tree(cst.CSTVisitor):
    """Each node's parent and the names written, in the order of the text; not inside `skip`."""

    def __init__(self, skip: cst.CSTNode | None) -> None:
        super().__init__()
        self.skip = skip
        self.parent: dict[int, cst.CSTNode] = {}
        self.names: list[cst.Name] = []
        self.stack: list[cst.CSTNode] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        if self.stack:
            self.parent[id(node)] = self.stack[-1]
        if type(node) is cst.Name:
            self.names.append(node)  # type: ignore[arg-type]
        self.stack.append(node)
        return node is not self.skip

    def on_leave(self, original_node: cst.CSTNode) -> None:
        self.stack.pop()


class Flow:
    """One function's (`host`'s) names as the toolkit's scope model binds them: `stores`, the
    nodes binding each name in the function's own scope (not its parameters); `loads`, the
    reads of those names anywhere in it (nested defs and lambdas included, in text order);
    `parent`, each node's; `reach`, the bindings reaching each read. `skip`: a nested def whose
    inside is not the function's (the step's own body). A module (`host`, with its `model`)
    has its own names (the reads of its globals) and parents, no `reach`. `outer`: the flow of
    the function `host` is nested in, where the names it reads freely are bound."""

    def __init__(
        self,
        host: cst.FunctionDef | cst.Module,
        skip: cst.CSTNode | None = None,
        model: ScopeModel | None = None,
        outer: Flow | None = None,
    ) -> None:
        self.host, self.skip, self.outer = host, skip, outer
        self._model = model
        self._marked: dict[frozenset[int], Reach] = {}

    @cached_property
    def _tree(self) -> _Tree:
        tree = _Tree(self.skip)
        walk_in_order(tree, self.host if isinstance(self.host, cst.Module) else self.host.body)
        return tree

    @cached_property
    def parent(self) -> dict[int, cst.CSTNode]:
        return self._tree.parent

    @cached_property
    def _scope(self) -> tuple[ScopeModel, object]:
        host = self.host
        if isinstance(host, cst.Module):
            assert self._model is not None
            return self._model, self._model.module_scope
        model = ScopeModel(cst.Module([host]))
        return model, model.scope_made_by(host)

    @cached_property
    def stores(self) -> dict[str, list[cst.CSTNode]]:
        _, scope = self._scope
        return {
            name: nodes
            for name, bindings in scope.bindings.items()  # type: ignore[attr-defined]
            if (nodes := [b.node for b in bindings if b.assigns and b.kind not in NOT_STORES])
        }

    @cached_property
    def loads(self) -> dict[str, list[cst.Name]]:
        model, scope = self._scope
        found: dict[str, list[cst.Name]] = {}
        for name in self._tree.names:  # not a name of a scope nested in it
            owner = model.scope_of(name).lookup(name.value) if model.is_read(name) else False
            if owner is None or owner is scope or getattr(owner, "kind", "") == "module":
                found.setdefault(name.value, []).append(name)
        return found

    @cached_property
    def reach(self) -> Reach:
        assert isinstance(self.host, cst.FunctionDef)
        return Reach(self.host.body, self.skip)

    @cached_property
    def params(self) -> set[str]:
        """The names of the function's parameters (none for a module)."""
        params = params_of(self.host.params) if isinstance(self.host, cst.FunctionDef) else []
        return {p.name.value for p in params}

    def aliases(self, names: set[str]) -> set[str]:
        """`names` and the names bound in the function to one of them or they to it (`host =
        w`, anywhere in it): the same object, changed in place through either."""
        bound = [b for found in self.stores.values() for b in found if isinstance(b, cst.Assign)]
        values = [(assigned_name(b), b.value) for b in bound]  # `target = value`
        pairs = [{target, v.value} for target, v in values if target and isinstance(v, cst.Name)]
        found = set(names)
        while grown := {n for pair in pairs if pair & found for n in pair} - found:
            found |= grown
        return found

    def free(self, name: str) -> Flow | None:
        """The flow of the enclosing function binding `name` when `host` reads it freely (it
        neither binds it nor takes it as a parameter, nor declares it `global`), else None."""
        own = name in self.stores or name in self.params
        if self.outer is None or own or not isinstance(self.host, cst.FunctionDef):
            return None
        declared = (n.name.value for g in nodes_in(self.host, cst.Global) for n in g.names)
        return None if name in set(declared) or name not in self.outer.stores else self.outer

    def only(self, name: str | None) -> cst.CSTNode | None:
        """The one binding of `name` in the function, else None."""
        stores = self.stores.get(name or "", [])
        return stores[0] if len(stores) == 1 else None

    def value(self, name: str | None) -> cst.BaseExpression | None:
        """The value of `name = value` when that is `name`'s one binding, else None."""
        return only.value if isinstance(only := self.only(name), cst.Assign) else None

    def ancestors(self, node: cst.CSTNode) -> Iterator[cst.CSTNode]:
        """The nodes around `node`, innermost first."""
        parent = self.parent.get(id(node))
        while parent is not None:
            yield parent
            parent = self.parent.get(id(parent))

    def passed(self, node: cst.CSTNode | None) -> tuple[cst.Arg, cst.Call] | None:
        """The argument `node` is and the call it is passed to, else None."""
        arg = self.parent.get(id(node))
        call = self.parent.get(id(arg))
        return (arg, call) if isinstance(arg, cst.Arg) and isinstance(call, cst.Call) else None

    def statement(self, node: cst.CSTNode) -> cst.CSTNode:
        """The statement (or small statement) of the function's own blocks holding `node`."""
        for around in (node, *self.ancestors(node)):
            if isinstance(around, (cst.BaseSmallStatement, cst.BaseCompoundStatement)):
                return around
        return node

    def ran_before(self, node: cst.CSTNode, marks: Iterable[cst.CSTNode]) -> bool:
        """Whether one of `marks` (nodes of the function) may have run before `node` does."""
        ids = frozenset(id(self.statement(m)) for m in marks)
        assert isinstance(self.host, cst.FunctionDef)
        if ids not in self._marked:  # (asked once per binding: the analysis is kept)
            self._marked[ids] = Reach(self.host.body, self.skip, ids)
        return bool(self._marked[ids].before(self.statement(node)).get(MARK, frozenset()) - {ENTRY})


def read_names(node: cst.FunctionDef | cst.Module) -> Counter[str]:
    """How often each name is read in `node` (as the scope model reads: not a name a binding,
    an attribute or a keyword writes)."""
    return Counter(name.value for name in _reads(node)[1])


def free_names(node: cst.FunctionDef | cst.ClassDef | cst.BaseExpression) -> set[str]:
    """The names `node` (a def, a class, an expression) reads and does not bind itself (not
    the parameters of a lambda in it)."""
    model, reads = _reads(node)
    return {name.value for name in reads if model.scope_of(name).lookup(name.value) is None}


def _reads(
    node: cst.Module | cst.BaseCompoundStatement | cst.BaseExpression,
) -> tuple[ScopeModel, list[cst.Name]]:
    """The scope model of `node` (a module, a def, a class, an expression) and the names it
    reads, in text order."""
    if isinstance(node, cst.BaseExpression):
        return _reads(cst.Module([cst.SimpleStatementLine([cst.Expr(node)])]))
    model = ScopeModel(node if isinstance(node, cst.Module) else cst.Module([node]))
    return model, [name for name in nodes_in(node, cst.Name) if model.is_read(name)]


def _traced_later(decorator: cst.BaseExpression) -> bool:
    """`jax.jit`, `jax.jit(...)`, `partial(jax.jit, ...)`: the def runs when called (traced at
    its first call), not when decorated or later elsewhere."""
    if isinstance(decorator, cst.Call):  # what `partial` binds, or what is called
        partial = dotted(decorator.func) in ("functools.partial", "partial") and decorator.args
        decorator = decorator.args[0].value if partial else decorator.func
    return dotted(decorator) == "jax.jit"
