"""A step stored on an object (`self.step = jax.pmap(...)` in a method, a factory's decorated
def, `self.eval_fn = _get_eval_fn(...)`, or a `partial` of a module-level decorated def binding
its static arguments, `self.predict_fn = partial(_run_predict_fn, predict_fn)`).

Taken when one other method of the class calls it and nothing else reads it (`stored_target`,
`stored_reads`): that method is read as a function calling steps made outside it, on one copy
where each stored step's `self.step` is a fresh name (`stored_copy`, `Stored`: every step stored
on `self` that the method calls, under one mesh); the copy, rewritten as such a function is
(the mesh set there, `jax.set_mesh`), reads `self.step` again (`named_back`), and each pmap
becomes `jax.jit(jax.shard_map(...))` where it is made. A stored `partial` is read as the step
called with placeholders for the arguments it binds (static ones only, so none is laid out),
dropped again by `named_back`, which lays the statement out anew. Otherwise, which value
blocks it is still worth saying: the methods calling `self.step(...)` are followed the same way for the diagnosis
only (`stored_on_self`, `returned_into_self`); the first reason found there is the site's, with
its code (big_vision's evaluators: `params`, a parameter of `run`, passed by the trainers).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import libcst as cst
import libcst.matchers as m

from jaxmigrate.toolkit.cstutil import names_in
from jaxmigrate.toolkit.emit import Style, code

from ._declines import Decline, NotVisible
from ._flow import analyze_calls, unnamed_step
from ._forms import Qualname, single_name
from ._program import fitted, laid_out, numbered
from ._reach import nodes_in, replaced
from ._specs import Options
from ._summary import NOT_DECLARABLE, Declarable, ModuleFacts

# Why steps stored on `self` read in several methods are not taken when none of them is the
# only code calling the others (`_survey._class_group`)
NO_SETUP = (
    "and no one of them is the only code calling the others: where to set its mesh is not visible"
)


def stored_on_self(
    klass: cst.ClassDef,
    maker: cst.FunctionDef,
    assign: cst.Assign,
    options: Options,
    body: cst.FunctionDef,
    qualname: Qualname,
    declared: Mapping[int, Declarable] | None = None,
    bound: int = 0,
) -> NotVisible:
    """Why the step `assign` stores on `self` in `maker`, a method of `klass`, is not taken: the
    first value blocking it in a method calling it, else that it is stored in an attribute.
    `bound`: the arguments the store binds (1 for a pmap-decorated method, `decorated_method`:
    `self`)."""
    stored = unnamed_step(assign, maker.name.value)
    target = assign.targets[0].target if len(assign.targets) == 1 else None
    if not isinstance(target, cst.Attribute) or _self(maker) != code(target.value):
        return stored
    attr, name = target.attr.value, f"_stored_{target.attr.value}"
    callers = []  # the methods reading the step, each followed alone
    for method in (d for d in klass.body.body if isinstance(d, cst.FunctionDef)):
        me = _self(method)
        if me is None or method is maker:
            continue
        # `self.<attr>`, outside nested defs and classes (their `self` is another)
        found = nodes_in(method.body, cst.Attribute, (cst.FunctionDef, cst.ClassDef))
        reads = [a for a in found if single_name(a.value) == me and a.attr.value == attr]
        if not reads:
            continue  # does not read `self.<attr>`
        callers.append(f"`{klass.name.value}.{method.name.value}`")
        try:
            # a method: `self.step(x)` read as `step(self, x)`, `self` static
            first = [cst.Arg(cst.Name(me))] if bound else None
            renamed = replaced(method, _renamed(method, reads, name, first))
            facts = ModuleFacts(
                replicated={id(renamed): (declared or {}).get(id(method), NOT_DECLARABLE)}
            )
            analyze_calls(renamed, name, options, body, qualname, facts)
        except NotVisible as why:
            text = why.why.replace(f"`{name}`", f"`self.{attr}`").replace(name, f"self.{attr}")
            if bound:  # counted as `self.step(...)` passes them: `self` is not one
                text = arguments_as_called(
                    text.replace(f"self.{attr}({me}, ", f"self.{attr}("), bound
                )
            where = f"{klass.name.value}.{method.name.value}"
            text = f"the step stored in `self.{attr}` is called in `{where}`: {text}"
            return NotVisible(text, why.code)
    if len(callers) > 1:  # each is taken alone: what blocks is that they are several
        several = (
            f"the step stored in `self.{attr}` is called in {' and '.join(callers)}, {NO_SETUP}"
        )
        return NotVisible(several, Decline.SETUP)
    return stored


def arguments_as_called(text: str, bound: int) -> str:
    """`text`, about a step called with the `bound` arguments a stored `partial` binds (or
    `self`, for a method) passed first, its arguments counted as `self.step(...)` passes them."""
    count = lambda n: f"argument {int(n.group(1)) - bound} of the step"
    return re.sub(r"argument (\d+) of the step", count, text)


def first_parameter(fn: cst.FunctionDef) -> str | None:
    """The name of a def's first positional parameter (`self` of a method, positional-only or
    not), None without one."""
    params = (*fn.params.posonly_params, *fn.params.params)
    return params[0].name.value if params else None


def _self(method: cst.FunctionDef) -> str | None:
    """The name of a method's first parameter (`self`), None without one or for a static one."""
    static = any(code(d.decorator) == "staticmethod" for d in method.decorators)
    return None if static else first_parameter(method)


def returned_into_self(
    module: cst.Module,
    factory: cst.FunctionDef,
    options: Options,
    body: cst.FunctionDef,
    qualname: Qualname,
    declared: Mapping[int, Declarable] | None = None,
) -> NotVisible | None:
    """Why a step that `factory`, a def of the module, makes and returns (`return _eval_fn`) is
    not taken, when a method stores what it returns on `self` (big_vision's cached
    `get_eval_fn`, `self.eval_fn = get_eval_fn(...)`): the value blocking it where it is called
    (`params`, a parameter of `run`); None when no method of the module does that, or nothing
    there blocks it (it is used other than called in `factory` then)."""
    name = factory.name.value
    step = m.Return(m.Name(body.name.value, lpar=[]))
    returns = m.SimpleStatementLine([m.ZeroOrMore(), step, m.ZeroOrMore()])
    if not any(m.matches(s, returns) for s in factory.body.body):
        return None  # the factory does not return the step itself
    for klass in (c for c in module.body if isinstance(c, cst.ClassDef)):
        for method in (d for d in klass.body.body if isinstance(d, cst.FunctionDef)):
            for line in method.body.body:  # none on the `def` line (small statements there)
                small = line.body if isinstance(line, cst.SimpleStatementLine) else ()
                assign = small[0] if len(small) == 1 else None
                value = assign.value if isinstance(assign, cst.Assign) else None
                called = (name, f"{_self(method)}.{name}")  # a def, or a method (fewshot_lsr)
                if not (isinstance(value, cst.Call) and code(value.func) in called):
                    continue
                assert isinstance(assign, cst.Assign)
                why = stored_on_self(klass, method, assign, options, body, qualname, declared)
                if why.code is Decline.NOT_NAMED:
                    return None
                text = f"the step is returned by `{name}`, and {why.why}"
                return NotVisible(text, why.code)
    return None


# `self.x = value` in a method of a class of the module: the class, the method, the statement
Store = tuple[cst.ClassDef, cst.FunctionDef, cst.Assign]


@dataclass
class Stored:
    """The steps stored on `self` and taken that one method of their class calls (`method`),
    read, and rewritten, as `copy`, where each `self.<attr>` read of a step is a fresh name."""

    method: cst.FunctionDef
    copy: cst.FunctionDef
    # By fresh name: `self.<attr>` as the method reads it, and how many arguments a stored
    # `partial` binds (`self.step = partial(step, a)`: passed first in `copy`)
    steps: dict[str, tuple[cst.Attribute, int]]
    origins: dict[int, cst.CSTNode]  # by id of a node of `copy`: the node of `method` it copies


def attribute_stores(
    module: cst.Module, fields: Sequence[tuple[cst.CSTNode, tuple[cst.CSTNode, ...]]]
) -> list[Store]:
    """Every `self.x = value` (one target, an attribute) in a method of a class of the module,
    outside the method's nested defs and classes, with its class and method, in text order:
    read from `fields`, the attributes stored and the nodes around each, in text order
    (`_survey.Survey.stored`, gathered by the walk finding the pmaps: walking every method
    again took a fifth of a dry run of JAX's own tests)."""
    found = []
    for field, around in fields:
        if len(around) < 5 or around[1] not in module.body:
            continue
        klass, maker, assign = around[1], around[3], around[-2]
        if type(klass) is not cst.ClassDef or type(maker) is not cst.FunctionDef:
            continue
        if maker not in klass.body.body or type(assign) is not cst.Assign:
            continue
        if any(type(a) in (cst.FunctionDef, cst.ClassDef) for a in around[4:]):
            continue  # in a def or class nested in the method
        if len(assign.targets) == 1 and assign.targets[0].target is field:
            found.append((klass, maker, assign))
    return found


def stored_target(
    module: cst.Module, node: cst.CSTNode, stores: list[Store], qualname: Qualname
) -> tuple | None:
    """`(class, maker, assign, bound)` when the step made at `node` is stored on `self` by a
    method of a class of the module: `self.step = jax.pmap(...)` (a call), or `self.step =
    factory(...)`, the one use of a def of the module whose last statement returns the
    pmap-decorated def `node` (big_vision's `get_eval_fn`), `bound` None; or `self.step =
    partial(step, a, ...)`, `step` the module's def `node` decorates (big_vision's mean
    evaluator), `bound` the number of arguments bound; or a pmap-decorated method
    (`decorated_method`), `bound` 1: `self`; else None."""
    if (method := decorated_method(module, node)) is not None:
        return (*method, 1)
    for klass, maker, assign in stores:  # `attribute_stores(module)`
        if assign.value is node or _returns_def(module, assign.value, node, klass, maker):
            return klass, maker, assign, None
        if (bound := _partial_of(module, assign.value, node, qualname)) is not None:
            return klass, maker, assign, bound
    return None


def decorated_method(module: cst.Module, node: cst.CSTNode) -> Store | None:
    """`(class, method, assign)` when `node` decorates a method of a class of the module (a
    trainer's `@partial(jax.pmap, static_broadcasted_argnums=(0,)) def train_step(self, ...)`):
    the method is a step stored on `self` under its own name, bound to `self` as a `partial`
    binding one argument is; `assign` reads the def as the store `self.train_step = ...`."""
    for klass in (c for c in module.body if isinstance(c, cst.ClassDef)):
        for method in (d for d in klass.body.body if isinstance(d, cst.FunctionDef)):
            if node in method.decorators and (me := _self(method)) is not None:
                name = method.name.value
                store = cst.AssignTarget(cst.Attribute(cst.Name(me), cst.Name(name)))
                return klass, method, cst.Assign([store], cst.Name(name))
    return None


def _partial_of(
    module: cst.Module, value: cst.BaseExpression, node: cst.CSTNode, qualname: Qualname
) -> int | None:
    """`functools.partial(step, a, ...)`, `step` the def of the module `node` decorates, binding
    arguments by position only: how many; else None."""
    if not isinstance(value, cst.Call) or qualname(value.func) != "functools.partial":
        return None
    made = [d for d in module.body if isinstance(d, cst.FunctionDef) and node in d.decorators]
    if not made or not value.args or any(a.keyword or a.star for a in value.args):
        return None
    return len(value.args) - 1 if single_name(value.args[0].value) == made[0].name.value else None


def _returns_def(
    module: cst.Module,
    value: cst.BaseExpression,
    node: cst.CSTNode,
    klass: cst.ClassDef,
    maker: cst.FunctionDef,
) -> bool:
    """`factory(...)`, `factory` a def of the module, or `self.factory(...)`, a method of
    `klass` called in its method `maker` (big_vision's few-shot evaluator's
    `get_representation_fn`), ending in `return d`, `d` the def decorated by `node` (a def of
    the factory's own block)."""
    func = value.func if isinstance(value, cst.Call) else None
    defs: Sequence[cst.CSTNode]
    if isinstance(func, cst.Name):
        name, defs = func.value, module.body
    elif isinstance(func, cst.Attribute) and single_name(func.value) == _self(maker):
        name, defs = func.attr.value, klass.body.body
    else:
        return False
    factories = [d for d in defs if isinstance(d, cst.FunctionDef) and d.name.value == name]
    lines = factories[0].body.body if factories else ()  # a def on its `def` line: no def in it
    made = [d.name.value for d in lines if isinstance(d, cst.FunctionDef) and node in d.decorators]
    return bool(made) and m.matches(lines[-1], m.SimpleStatementLine([m.Return(m.Name(made[0]))]))


def stored_reads(
    module: cst.Module, klass: cst.ClassDef, maker: cst.FunctionDef, assign: cst.Assign
) -> list[tuple[cst.FunctionDef, list[cst.Attribute]]]:
    """The methods of `klass` reading the step `assign` stores on `self` in `maker`, each with
    its reads `self.<attr>`; raise NotVisible when `maker`, or code outside them, reads it."""
    target = assign.targets[0].target
    assert isinstance(target, cst.Attribute)
    attr = target.attr.value
    if _self(maker) != code(target.value):
        raise unnamed_step(assign, maker.name.value)
    readers: list[tuple[cst.FunctionDef, list[cst.Attribute]]] = []
    for method in (d for d in klass.body.body if isinstance(d, cst.FunctionDef)):
        me = _self(method)
        found = [
            a for a in nodes_in(method, cst.Attribute) if a.attr.value == attr and a is not target
        ]
        mine = [a for a in found if single_name(a.value) == me and me is not None]
        if method is maker and found:
            why = f"`self.{attr}` is read in `{maker.name.value}`, where it is stored"
            raise NotVisible(why, Decline.NOT_CALLED_ONLY)
        if len(mine) != len(found):
            where = f"{klass.name.value}.{method.name.value}"
            why = f"`.{attr}` is read in `{where}` on another object than `self`"
            raise NotVisible(why, Decline.NOT_CALLED_ONLY)
        if found:
            readers.append((method, mine))
    known = {id(target), *(id(read) for _, reads in readers for read in reads)}
    found = [a for a in nodes_in(module, cst.Attribute) if a.attr.value == attr]
    others = [a for a in found if id(a) not in known]
    if others:
        stores = {id(t.target) for t in nodes_in(module, cst.AssignTarget)}
        how = "stored again" if id(others[0]) in stores else "read"
        why = (
            f"`{code(others[0])}` is {how} {_read_in(module, others[0])}, not in a method of "
            f"`{klass.name.value}`: what code outside it does with the step is not followed"
        )
        raise NotVisible(why, Decline.NOT_CALLED_ONLY)
    if not readers:
        raise NotVisible(f"`self.{attr}` is not called in `{klass.name.value}`", Decline.NOT_CALLED)
    return readers


def _read_in(module: cst.Module, read: cst.CSTNode) -> str:
    """Where `read` is: "in `Class.method`", "in `function`", or "at the module's top level"."""
    for fn in nodes_in(module, cst.FunctionDef):
        if any(r is read for r in nodes_in(fn, cst.Attribute)):
            owner = next((k for k in nodes_in(module, cst.ClassDef) if fn in k.body.body), None)
            return f"in `{owner.name.value}.{fn.name.value}`" if owner else f"in `{fn.name.value}`"
    return "at the module's top level"


def stored_copy(
    module: cst.Module,
    method: cst.FunctionDef,
    steps: Sequence[tuple[list[cst.Attribute], int]],
    named: Mapping[str, list[cst.Attribute]] | None = None,
) -> Stored:
    """`method` read with each read of a stored step (`steps`: its reads `self.<attr>` and how
    many arguments a stored `partial` of it binds) as a fresh name: `self.step(x)` of a
    `partial` is `_step(_step_bound_0, x)`, the step as the `partial` calls it; raise
    NotVisible when such a step is used other than called. `named`: other reads, each read as
    the name given (`self._embed_texts` as `_embed_texts`, a method calling steps too)."""
    taken = set(names_in(module)) | set(named or ())
    names: dict[str, tuple[cst.Attribute, int]] = {}  # the steps' first, in order
    swaps: dict[int, cst.CSTNode] = {}
    for reads, bound in steps:
        attr = reads[0].attr.value
        name = numbered(f"_{attr}", lambda n: n not in taken and n not in names)
        names[name] = (reads[0], bound)
        placeholders = [cst.Arg(cst.Name(f"{name}_bound_{k}")) for k in range(bound)]
        swaps.update(_renamed(method, reads, name, placeholders if bound else None))
    for name, reads in (named or {}).items():
        names[name] = (reads[0], 0)
        swaps.update(_renamed(method, reads, name, None))
    copy = replaced(method, swaps)
    origins: dict[int, cst.CSTNode] = {}
    pairs: list[tuple[cst.CSTNode, cst.CSTNode]] = [(copy, method)]
    while pairs:  # the same tree but where a read became the name (a leaf): walked together
        new, old = pairs.pop()
        origins[id(new)] = old
        called = single_name(new.func) if isinstance(new, cst.Call) else None
        bound = names.get(called or "", (None, 0))[1]
        if bound:
            assert isinstance(old, cst.Call) and isinstance(new, cst.Call)
            pairs += [(new.func, old.func), *zip(new.args[bound:], old.args, strict=True)]
        elif type(new) is type(old) and not isinstance(new, cst.Name):
            pairs += zip(new.children, old.children, strict=False)
    return Stored(method, copy, names, origins)


def _renamed(
    method: cst.FunctionDef, reads: list[cst.Attribute], name: str, first: list[cst.Arg] | None
) -> dict[int, cst.CSTNode]:
    """What `reads`, reads `self.<attr>` in `method`, become, by id: each the name `name`; or,
    with arguments `first` to pass before the call's, each call of one `name(*first, ...)`
    (raise NotVisible when a read is used other than called)."""
    if first is None:
        return {id(read): cst.Name(name) for read in reads}
    calls = {id(c.func): c for c in nodes_in(method, cst.Call)}
    if any(id(read) not in calls for read in reads):
        why = f"`self.{reads[0].attr.value}` is used other than called"
        raise NotVisible(why, Decline.NOT_CALLED_ONLY)
    return {
        id(c): c.with_changes(func=cst.Name(name), args=[*first, *c.args])
        for c in (calls[id(read)] for read in reads)
    }


def named_back(
    stored: Stored, rewritten: cst.FunctionDef, indent: str, style: Style
) -> cst.FunctionDef:
    """`rewritten`, the copy as the rewrite made it (its body indented by `indent`), with
    `self.<attr>` read again where the copy read the fresh name; a call passing the arguments a
    `partial` binds passes them no more, its statement laid out again."""

    def bound_by(call: cst.Call) -> int:
        return stored.steps.get(single_name(call.func) or "", (None, 0))[1]

    class Back(cst.CSTTransformer):
        depth = 0  # the blocks around, inside the method's own
        renamed = 0  # the step names read as `self.<attr>` again so far
        before = 0  # `renamed` when the statement being left began

        def visit_IndentedBlock(self, node: cst.IndentedBlock) -> None:
            self.depth += 1

        def leave_IndentedBlock(
            self, original_node: cst.IndentedBlock, updated_node: cst.IndentedBlock
        ) -> Any:
            self.depth -= 1
            return updated_node

        def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> Any:
            found = stored.steps.get(updated_node.value)
            self.renamed += found is not None
            return found[0] if found is not None else updated_node

        def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
            self.before = self.renamed

        def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> Any:
            return updated_node.with_changes(args=updated_node.args[bound_by(original_node) :])

        def leave_SimpleStatementLine(
            self, original_node: cst.SimpleStatementLine, updated_node: cst.SimpleStatementLine
        ) -> Any:
            at = indent + style.indent * (self.depth - 1)
            if any(bound_by(c) for c in nodes_in(original_node, cst.Call)):
                return laid_out(updated_node, at, style)
            # `self._count_p` read again where the copy read `count_p`: the line may not fit;
            # a comprehension broken with the longer fresh names may fit on fewer lines
            lines = code(updated_node.with_changes(leading_lines=[])).splitlines()
            comprehension = m.SimpleStatementLine(
                [m.Assign(value=m.ListComp() | m.SetComp() | m.DictComp())]
            )
            if self.renamed > self.before and (
                len(lines) == 1 or m.matches(updated_node, comprehension)
            ):
                return fitted(updated_node, at, style)
            return updated_node

    out = rewritten.visit(Back())
    assert isinstance(out, cst.FunctionDef)
    return out
