"""Finding every `jax.pmap`: the uses of the module, read and classified, and the ones the
program-level form can take."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from functools import cache, cached_property
from itertools import pairwise, takewhile
from typing import Any

import libcst as cst
from libcst.codemod import CodemodContext

from jaxmigrate.toolkit.cstutil import names_in
from jaxmigrate.toolkit.emit import code
from jaxmigrate.toolkit.passes import Callers, Pass
from jaxmigrate.toolkit.scope import BindingKind, ScopeModel

from ._body import NORM_WORDS, averaged_axes, body_outputs
from ._callee import argument_for, follow_passed, laid_out_in_caller
from ._dead import Unread, left_unread
from ._declines import DECORATORS, NESTED, NOT_NAMED, Decline, NotVisible
from ._flow import (
    _Site,
    analyze,
    analyze_calls,
    analyze_decorated,
    forms_of,
    keywords_in_place,
    lambda_def,
    sibling_calls,
    unnamed_step,
)
from ._forms import HOST_COPIES, Forms, bound_arguments, is_device_count, positional, single_name
from ._imported import Function, Imported, Qualname
from ._inputs import assigned_call
from ._layout import MEAN_OF_COPIES, SPLIT_EDIT, Layout
from ._outer import (
    OuterGroup,
    OuterStep,
    follow_step,
    mesh_in_scope,
    mesh_region,
    setup_function,
)
from ._passon import checked as passed_on_checked
from ._passon import defined, elsewhere, where_in
from ._program import Program, Setup
from ._reach import ENTRY, SCOPES, Flow, assigned_name, free_names, nodes_in, params_of, statements
from ._readat import short as _short
from ._shortcut import shortcuts_in
from ._specs import Options, mapped_name, options_of, read_options
from ._stored import (
    NO_SETUP,
    Stored,
    arguments_as_called,
    attribute_stores,
    decorated_method,
    first_parameter,
    returned_into_self,
    stored_copy,
    stored_on_self,
    stored_reads,
    stored_target,
)
from ._summary import NOT_DECLARABLE, Declarable, ModuleFacts, is_mean

PMAP = "jax.pmap"
PARTIAL = "functools.partial"
HELPER = "shard_map_per_device"
# The jax namespaces and functions making new jax arrays
JAX_ARRAYS = ("jax.numpy.", "jax.random.", "jax.lax.", "jax.nn.", "jax.scipy.", "jax.device_put")
# Copies to the host: numpy arrays, whatever they read (`jnp.asarray` copies to a device)
TO_HOST = HOST_COPIES - {"jax.numpy.asarray"}
OPAQUE = "_opaque_step"  # the name of the body read for a function that is no def of the module
HELPER_DOC = "Run `f` as `jax.pmap` does, in `jax.jit`: one call per device, on its slice."


def declared_copies(module: cst.Module, declared: Sequence[str]) -> dict[int, Declarable]:
    """By id of each def of `module` an entry of `[tool.jaxmigrate] pmap-replicated` can name (a
    function, or a method of a class: `Evaluator.run`), its name there and the parameters the
    entries `declared` (`"Evaluator.run(params)"`) say its callers pass as equal copies, one per
    local device."""
    wanted: dict[str, set[str]] = {}
    for entry in declared:
        name, _, rest = entry.partition("(")
        params = {p.strip() for p in rest.rstrip(")").split(",")}
        wanted.setdefault(name.strip(), set()).update(params)
    found: dict[int, Declarable] = {}
    for statement in module.body:
        defs = [("", statement)] if isinstance(statement, cst.FunctionDef) else []
        if isinstance(statement, cst.ClassDef):
            owner = statement.name.value + "."
            defs = [(owner, d) for d in statement.body.body if isinstance(d, cst.FunctionDef)]
        for owner, fn in defs:
            spelling = owner + fn.name.value
            names = {p.name.value for p in params_of(fn.params)} & wanted.get(spelling, set())
            found[id(fn)] = Declarable(spelling, frozenset(names))
    return found


# How a name the pmapped function is bound by reads in a message
_BOUND = {BindingKind.ASSIGN: "assigned", BindingKind.DEF: "a def in a function or class"}


def _unless_closed(where: str) -> str:
    """What a decline because code outside the code base may call (`where`, from `elsewhere`)
    adds: the setting that says no code there does."""
    if "outside the code base" not in where:
        return ""
    return "; `[tool.jaxmigrate] closed-code-base = true` says no code there does"


def _unread_node(unread: Unread) -> cst.CSTNode:
    """The node a deletion's site is at: the def, or the pmap call `name = jax.pmap(...)` binds."""
    statement = unread.statement
    return statement if isinstance(statement, cst.FunctionDef) else statement.body[0].value  # type: ignore[attr-defined]


def _set_once_in_init(stores: list[tuple[cst.CSTNode, tuple[cst.CSTNode, ...]]]) -> str | None:
    """The string a field is set to when its one store in the module is `self.x = "..."`, a
    statement of a class's `__init__` itself (not under an `if` or a loop), `self` its first
    parameter: big_vision's `self._axis_name = "batch"`; else None."""
    if len(stores) != 1 or len(stores[0][1]) < 7:
        return None
    field, (klass, _, fn, _, _, assign, target) = stores[0][0], stores[0][1][-7:]
    match klass, fn, assign, field:
        case (
            cst.ClassDef(),
            cst.FunctionDef(cst.Name("__init__"), cst.Parameters([cst.Param(cst.Name(me)), *_])),
            cst.Assign([one], cst.SimpleString(evaluated_value=str() as literal)),
            cst.Attribute(owner),
        ) if one is target and one.target is field and code(owner) == me == "self":
            return literal
    return None


class _Constants(dict[str, str]):
    """The module's string constants by spelling, and those of the code base's other modules
    (`constants.PMAP_AXIS_NAME`), each looked up when first asked (`in`, `[]`)."""

    def __init__(self, names: ScopeModel, imported: Imported | None) -> None:
        super().__init__()
        self.names, self.imported = names, imported

    def __missing__(self, spelled: str) -> str:
        found = self.imported.constant(self.names, spelled) if self.imported else None
        if found is None:
            raise KeyError(spelled)
        self[spelled] = found
        return found

    def __contains__(self, spelled: object) -> bool:
        if dict.__contains__(self, spelled) or not isinstance(spelled, str):
            return dict.__contains__(self, spelled)
        try:
            self[spelled]
        except KeyError:
            return False
        return True


# Finding every pmap ---------------------------------------------------------------------------
class Survey(cst.CSTVisitor):
    """One walk over a module: each `jax.pmap` reference with its ancestors, and the strings.

    Which names are bound, and how, is the scope model's (`defs`, `rebound`)."""

    def __init__(self, names: ScopeModel, imported: Imported | None = None) -> None:
        super().__init__()
        self.names = names
        self.imported = imported  # the code base's modules it imports: their strings
        self.refs: list[tuple[cst.BaseExpression, tuple[cst.CSTNode, ...]]] = []
        self.strings: set[str] = set()
        self.fields: dict[str, list[tuple[cst.CSTNode, tuple[cst.CSTNode, ...]]]] = {}
        self.stored: list[tuple[cst.CSTNode, tuple[cst.CSTNode, ...]]] = []  # all, in text order
        self._stack: list[cst.CSTNode] = []
        self._paths = names.paths_to((PMAP,))  # the nodes leading to a use, when known

    def on_visit(self, node: cst.CSTNode) -> bool:
        # Exact types, not isinstance: libcst's node classes are concrete and never subclassed,
        # and isinstance against them (ABCs) is what this walk over every node spent most on.
        kind = type(node)
        if kind is cst.Attribute or kind is cst.Name:
            on_path = self._paths is None or id(node) in self._paths
            is_ref = on_path and (kind is cst.Attribute or self.names.is_read(node))  # type: ignore[arg-type]
            if is_ref and self.names.qualified_name(node) == PMAP:  # type: ignore[arg-type]
                self.refs.append((node, tuple(self._stack)))  # type: ignore[arg-type]
        elif kind is cst.SimpleString:
            self.strings.add(str(node.evaluated_value))  # type: ignore[attr-defined]
        elif kind is cst.AssignTarget or kind is cst.AnnAssign or kind is cst.AugAssign:
            target = node.target  # type: ignore[attr-defined]
            for field in nodes_in(target, cst.Attribute) if kind is cst.AssignTarget else (target,):
                if type(field) is cst.Attribute:  # `self.x = ...`: where each field is stored
                    stored = self.fields.setdefault(field.attr.value, [])
                    stored.append((field, (*self._stack, node)))
                    self.stored.append(stored[-1])
        self._stack.append(node)
        return True

    def on_leave(self, original_node: cst.CSTNode) -> None:
        self._stack.pop()

    def defs(self, name: str) -> list[cst.FunctionDef]:
        """Return every `def name` of the module, in any scope but a class body: a method is
        never what a bare name outside its class names (`Logger.train_step` beside the module's
        `train_step`)."""
        bindings = self.names.bindings(name)
        found = [b.node for b in bindings if b.kind is BindingKind.DEF and b.scope.kind != "class"]
        return [d for d in found if isinstance(d, cst.FunctionDef)]

    @cached_property
    def constants(self) -> dict[str, str]:
        """The names bound once in the module, at module level, to a string literal; those
        of the code base's modules it imports, as it spells them, when asked
        (`Imported.constant`)."""
        found = _Constants(self.names, self.imported)
        found |= {
            name: value.evaluated_value
            for name, value in self.bound_once.items()
            if isinstance(value, cst.SimpleString) and isinstance(value.evaluated_value, str)
        }
        for attr, stores in self.fields.items():
            # No `setattr(self, "x", ...)`: `attr` is no string
            if attr not in self.strings and (literal := _set_once_in_init(stores)) is not None:
                found[f"self.{attr}"] = literal
        return found

    @cached_property
    def bound_once(self) -> dict[str, cst.BaseExpression]:
        """The names bound once in the module, at module level, by a plain assignment: their
        values."""
        return {
            name: value
            for name, bindings in self.names.bound_names()
            if len(bindings) == 1 and (value := bindings[0].value) is not None
            if bindings[0].plain and bindings[0].scope.kind == "module"
        }

    def only_def(self, name: str, by: cst.CSTNode | None = None) -> cst.FunctionDef | None:
        """Return the one `def name` of the module (`defs`) when nothing else binds `name`
        (`rebound`, `by` not counting), else None."""
        defs = self.defs(name)
        return defs[0] if len(defs) == 1 and not self.rebound(name, by) else None

    def rebound(self, name: str, by: cst.CSTNode | None = None) -> bool:
        """Return True if anything but a `def` binds `name` anywhere in the module; `by`, the
        value of `name = jax.pmap(name, ...)`, is the def's own step and does not count."""
        return any(
            b.kind is not BindingKind.DEF and (by is None or b.value is not by)
            for b in self.names.bindings(name)
        )


# Per-device keys (`jax.random.split(key, n)`) for a step stored on `self`: the lambda taking
# each device's key would go where the step is made, which other methods' calls do not see.
_KEYS = "it gets per-device keys: a step stored on `self` cannot take its own key"


@dataclass
class PmapUse:
    """One pmap site: where it is reported, its pmaps (outer first) and what it maps."""

    node: cst.CSTNode  # the pmap call or decorator, or the reference left alone
    pmaps: list[cst.Call | cst.Decorator]
    ref: cst.BaseExpression
    ancestors: tuple[cst.CSTNode, ...]
    mapped: cst.CSTNode | None = None  # the def or lambda it maps, when visible
    skip: str = ""
    fallback: str = ""  # why the program-level form was not taken, when it was looked for
    # The key asking for the faithful form instead of a program-level form that failed
    # verification (`FileState.fallbacks`), when that is why the program-level form is not taken.
    failed_program: str | None = None
    # `t = jax.pmap if c else jax.vmap`, called in its function only as `t(f, axis_name="a")`:
    # the axis name those calls give (the value becomes the faithful helper, partially applied)
    value_axis: cst.SimpleString | None = None

    @property
    def statement(self) -> cst.CSTNode:
        """Return the top-level statement holding the site."""
        return self.ancestors[1] if len(self.ancestors) > 1 else self.node

    @property
    def around(self) -> cst.CSTNode | None:
        """The innermost def, lambda or class the site is in (None: at module level)."""
        return next((a for a in reversed(self.ancestors) if isinstance(a, SCOPES)), None)

    @property
    def scope(self) -> int | None:
        """Return (the id of) the function its result is bound in; None for the module."""
        scopes = [a for a in self.ancestors if isinstance(a, (cst.FunctionDef, cst.Lambda))]
        return next((id(a) for a in reversed(scopes) if a is not self.mapped), None)


def called_here(
    ref: cst.BaseExpression, ancestors: tuple[cst.CSTNode, ...]
) -> cst.SimpleString | None:
    """Return the axis name of `t = jax.pmap if c else g` whose every use in its function is a
    call `t(f, axis_name="a")` (one literal `a` for all); None when the value goes elsewhere."""
    choice = ancestors[-1]
    assign = ancestors[-2] if len(ancestors) > 1 else None
    host = next((a for a in reversed(ancestors) if isinstance(a, cst.FunctionDef)), None)
    if not isinstance(choice, cst.IfExp) or ref not in (choice.body, choice.orelse):
        return None
    if not isinstance(assign, cst.Assign) or assign.value is not choice or host is None:
        return None
    name = assigned_name(assign)
    flow = Flow(host)
    if name is None or flow.only(name) is None:
        return None
    axes = [_axis_called(flow, use) for use in flow.loads.get(name, [])]
    literal = {a.evaluated_value if a is not None else None for a in axes}
    return axes[0] if axes and len(literal) == 1 and None not in literal else None


def _axis_called(flow: Flow, use: cst.Name) -> cst.SimpleString | None:
    """The literal `a` of a call `use(f, axis_name="a")`, else None."""
    call = flow.parent.get(id(use))
    if not isinstance(call, cst.Call) or call.func is not use or len(call.args) != 2:
        return None
    fun, axis = call.args
    if fun.keyword is not None or fun.star or axis.keyword is None:
        return None
    named = axis.keyword.value == "axis_name"
    return axis.value if named and isinstance(axis.value, cst.SimpleString) else None


def main_block(module: cst.Module, around: Sequence[cst.CSTNode]) -> cst.If | None:
    """The `if __name__ == "__main__":` statement of `module` among `around` (ancestors, the
    module first), with no `else` and an indented body, else None."""
    block = around[1] if len(around) > 1 and around[0] is module else None
    match block:
        case cst.If(
            cst.Comparison(left, [cst.ComparisonTarget(cst.Equal(), right)]),
            cst.IndentedBlock(),
            None,
        ) if block in module.body:
            sides = {code(left), code(right).replace("'", '"')}
            return block if sides == {"__name__", '"__main__"'} else None
    return None


def _globals_unread(module: cst.Module, program: Program, flow: Flow) -> None:
    """A `__main__` block's names (or a script's: `program.host`) are the module's globals: no
    def or class of the module may read one the step is passed or returns, nor a def of the
    block the rewrite edits (a generator now yielding flat batches): raise NotVisible if one
    may. The names it would drop as no longer read (`n = jax.local_device_count()`) stay when such a def reads them."""
    changed = {n for call in program.calls for a in call.args for n in names_in(a.value)}
    bound = [a for c in program.calls if isinstance(a := flow.parent.get(id(c)), cst.Assign)]
    changed |= {n for a in bound for t in a.targets for n in names_in(t.target)}
    edited = set(program.nodes)
    changed |= {
        d.name.value
        for d in program.host.body.body
        if isinstance(d, cst.FunctionDef) and any(id(n) in edited for n in nodes_in(d, object))
    }
    for statement in module.body:
        if isinstance(statement, (cst.FunctionDef, cst.ClassDef)):
            free = free_names(statement)
            program.helpers -= free
            if hit := changed & free:
                why = (
                    f"`{statement.name.value}` reads `{min(hit)}`, a global of the `__main__` "
                    "block whose value the rewrite changes (passed to the step, a result, or a "
                    "def it edits)"
                )
                raise NotVisible(why, Decline.CLOSURE)


def _outside_why(host: cst.CSTNode) -> str:
    """Why the calls of a step made outside any def (in a class body, a lambda, a block at
    module level other than `if __name__ == "__main__":`) are not followed."""
    if isinstance(host, cst.ClassDef):
        where = "a class body"
    elif isinstance(host, cst.BaseCompoundStatement):
        header = next(line for line in code(host).splitlines() if line.strip()[:1] not in "#")
        where = f"`{header.strip()}` at module level"
    else:
        where = "a lambda"
    return f"the step is made in {where}: its calls are not followed"


def fun_arg(call: cst.Call) -> cst.Arg | None:
    """The function a pmap call maps: its first argument when positional, else None."""
    first = call.args[0] if call.args else None
    return first if first is not None and first.keyword is None and not first.star else None


def docstring_of(node: cst.FunctionDef) -> str:
    """The def's docstring on one line (its words joined by single spaces), "" without one."""
    return " ".join((node.get_docstring() or "").split())  # wrapped or not


# Where a method passes a step stored on `self` to another method of its class (`_passes`):
# each call `self.method(...)`, the method, and the parameter the step binds there
_Passes = list[tuple[cst.Call, cst.FunctionDef, str]]


@dataclass
class _StoredStep:
    """A step stored on `self` (`_stored.stored_target`), before the method calling it is read."""

    site: PmapUse
    klass: cst.ClassDef
    readers: list[tuple[cst.FunctionDef, list[cst.Attribute]]]  # each method reading it, how
    bound: int  # the arguments a stored `partial` of it binds
    body: cst.FunctionDef
    options: Options
    made: str = ""  # for a factory's step, what messages say first: "the step is returned by"

    @property
    def method(self) -> cst.FunctionDef:
        """The method reading the step: the first of its readers."""
        return self.readers[0][0]


# By name of a method another calls, its reads `self.method` there (`Finding._calls_of`)
_Calls = dict[str, list[cst.Attribute]]

# How a parameter of a method passed to a step there is laid out where the method calling it
# passes it (`Finding._given`): `Program.given` of the method's programs
_Given = Callable[[Program, str, int], Layout]


def _factory(module: cst.Module, site: PmapUse) -> cst.FunctionDef | None:
    """The def of the module whose last statement, `return jax.pmap(...)`, returns the step made
    at `site`; None for any other site."""
    factory = site.around
    if not isinstance(factory, cst.FunctionDef) or factory not in module.body:
        return None
    return factory if _returned(factory) is site.node and len(site.pmaps) == 1 else None


def _returned(fn: cst.FunctionDef) -> cst.BaseExpression | None:
    """What `fn`'s last statement returns, `return value` (None for anything else)."""
    match statements(fn.body)[-1]:
        case cst.SimpleStatementLine([cst.Return(value), *_]):
            return value
    return None


def _bound_value(binding: cst.CSTNode) -> cst.BaseExpression | None:
    """What a binding binds its names from (`flow.stores`' nodes): `x = v`'s `v`, a `for`
    loop's iterable, a `with` item's context (`with nullcontext(v) as x`: what `x` may be made
    of); None for anything else (a def, a class, an import)."""
    if isinstance(binding, (cst.Assign, cst.AnnAssign, cst.AugAssign, cst.NamedExpr)):
        return binding.value
    if isinstance(binding, cst.WithItem):
        return binding.item
    return binding.iter if isinstance(binding, (cst.For, cst.CompFor)) else None


def _without_self(method: cst.FunctionDef) -> cst.FunctionDef:
    """`method` as `self.method(...)` calls it: without its first parameter."""
    params = method.params
    first = "posonly_params" if params.posonly_params else "params"  # where `self` is
    return method.with_changes(params=params.with_changes(**{first: getattr(params, first)[1:]}))


class Finding(Pass):
    """The pmap pass's first part: its state, and the sites found in the module."""

    def __init__(self, context: CodemodContext) -> None:
        super().__init__(context)
        self.survey: Survey  # the module's walk, made first thing in `visit_Module`
        self.sites: dict[int, PmapUse] = {}  # by id of the (outer) pmap call or decorator
        self.applied: list[PmapUse] = []
        self.applied_keys: list[str] = []
        self.reuse_helper = False
        # The helpers converting values at a boundary not followed (a batch drawn per device, a
        # replicated value's copies), once a program asks: name, how it spells jax, numpy, jnp
        self.converters: dict[str, tuple[str, str, str, str]] = {}  # by the helper's base name
        self.norm_axes: frozenset[str] | None = None  # `averaged_axes`, read when first asked
        self.factories: dict[int, Program] = {}  # by id of a factory's def: the program it makes
        self.lifted = False  # a program-level group was rewritten here: dead locals are looked for
        # By id of an original node: what the rewrite of a site made of it, kept when the
        # function holding it is rewritten from its original nodes (`_program.rewrite_host`)
        self.produced: dict[int, cst.CSTNode] = {}
        self.programs: dict[int, list[tuple[PmapUse, Program]]] = {}  # by id of their function
        # `if __name__ == "__main__":` blocks making steps, each read as a def of its body (by
        # id of the `if`): the program's host, its names the module's globals
        self.main_blocks: dict[int, cst.FunctionDef] = {}
        self.outer: list[OuterGroup] = []  # the steps made outside the functions calling them
        self.stored: dict[int, Stored] = {}  # by id of the method calling a step on `self`
        self.stores: list[tuple[cst.ClassDef, cst.FunctionDef, cst.Assign]] | None = None
        # By id of a pmap decorator: why the factory returning its step, or the class whose method
        # it decorates, blocks it (`_stored_step`)
        self.factory_used: dict[int, NotVisible] = {}
        # By id of a site storing its step on `self`: why it was not taken as stored (read
        # other than called, a generator's mesh), said where nothing more specific blocks it
        self.stored_why: dict[int, NotVisible] = {}
        # By id of a `return jax.pmap(...)` ending a factory called once, `step = factory(...)`:
        # the function that call is in, and the assignment (`_factory_callers`); the step is
        # read with the steps that function makes
        self.factory_hosts: dict[int, tuple[cst.FunctionDef, cst.Assign]] = {}
        self.kept_pmaps = False  # a `jax.pmap` of the module is left alone (skipped)
        self.outer_calls: dict[int, Program] = {}  # `step = jax.pmap(...)` at module level, taken
        self.outer_defs: dict[int, tuple[OuterStep, Program]] = {}  # pmap-decorated defs, taken
        self.host_programs: dict[int, list[Program]] = {}  # by id of a function calling them
        self.host_setups: dict[int, Setup] = {}  # by id of the function setting the mesh
        self.callee_programs: dict[int, list[Program]] = {}  # by id of a def a step is passed to
        # By id of such a def, by axis: the names of the mesh and sharding made at its entry
        self.callee_meshes: dict[int, dict[str, tuple[str, str]]] = {}
        # Module-level code a group's edits leave unread (`_find_unread`), by the name it binds;
        # the names whose group was rewritten: their statements go at the module's end
        self.unread: dict[str, Unread] = {}
        self.dropped: set[str] = set()

    @property
    def module(self) -> cst.Module:
        """The module being visited (its scope model's): the one every method reads."""
        return self.resolver.module

    @cached_property
    def imported(self) -> Imported:
        """The code base's other modules (`FileState.modules`), parsed when first asked."""
        return Imported(self.state.modules)

    def _find_programs(self, module: cst.Module) -> None:
        """Take the sites whose whole data flow is visible to the program-level form."""
        flow = self.module_flow
        outer: list[OuterStep] = []
        made_in: dict[int, list[PmapUse]] = {}  # the steps each function makes
        self.factory_hosts = self._factory_callers(flow)
        live = self._not_failed([s for s in self.sites.values() if s.value_axis is None])
        pending = [f for s in live if (f := self._stored_step(flow, s)) is not None]
        stored, handled = self._stored_groups(flow, pending)
        for site in (s for s in live if id(s.node) not in handled):  # the others: as before
            try:
                if self._is_outer(flow, site):
                    step = self._outer_step(site)
                    step = follow_step(step, flow, module, self.qualname, self._facts())
                    for program in step.programs:  # what its callers read of what it returns
                        passed_on_checked(program, flow, self.state.outside, self.survey.strings)
                    outer.append(step)
                    continue
                # Outside any def: the site's `__main__` block, else the module
                host = self._host(site) or main_block(module, site.ancestors) or module
                made_in.setdefault(id(host), []).append(site)
            except NotVisible as why:
                site.fallback = str(why)
        for sites in made_in.values():
            self._take_steps(flow, sites)
        self._beside_kept(flow, outer)
        self._group_outer(flow, outer)
        if self._take_groups(stored):  # the stored steps' groups: none when their mesh clashes
            self.stored.clear()
        else:
            self.outer += stored
        self._module_alone()

    def _find_unread(self, module: cst.Module) -> None:
        """Find the module-level defs and `name = jax.pmap(...)` steps whose every read a
        program group deletes (`_dead.left_unread`: a mean over devices of its step's equal
        copies, `sync_batch_stats(state)`, and what only such code reads), bound once, named in
        no string and used by no other module of the code base. Their pmaps are no longer sites
        of their own: each is recorded with the group and deleted with it."""
        groups: list[list[tuple[Any, Program]]] = [*self.programs.values()]  # (site, program)s
        groups += [[(s.site, p) for s in g.steps for p in s.programs] for g in self.outer]
        gone: dict[int, str] = {}
        for group in groups:
            key = self.program_group(group[0][0].node)
            for program in (q for _, p in group for q in (p, *p.callees)):
                for k, node in program.nodes.items():
                    if program.reasons.get(k) == MEAN_OF_COPIES and isinstance(node, cst.Call):
                        gone |= {id(n): key for n in nodes_in(node.func, cst.Name)}
        if not gone:
            return
        steps = {id(site.node) for group in groups for site, _ in group}

        def may_go(name: str, statement: cst.CSTNode) -> bool:
            if name.startswith("__") or len(self.resolver.bindings(name)) != 1:
                return False
            if self._used_elsewhere(name):
                return False
            inner = [k for k, s in self.sites.items() if any(a is statement for a in s.ancestors)]
            if isinstance(statement, cst.FunctionDef):
                return not (statement.decorators or inner or id(statement) in self.programs)
            value = statement.body[0].value  # type: ignore[attr-defined]
            return inner == [id(value)] and id(value) not in steps

        found = left_unread(module, self.module_flow, gone, may_go)
        # `# jaxmigrate: skip` on one of a group's deletions keeps all of them: no code the
        # group leaves in place then reads a name it deleted
        skipped = {
            u.group
            for u in found.values()
            if self.state.suppressed(self.where(_unread_node(u))[0], self.CODE)
        }
        self.unread = {name: u for name, u in found.items() if u.group not in skipped}
        for unread in self.unread.values():
            if isinstance(unread.statement, cst.SimpleStatementLine):
                del self.sites[id(_unread_node(unread))]

    def _used_elsewhere(self, name: str) -> str:
        """Where another file of the code base, or a string of the module, may call or read the
        module's def or class `name` (`elsewhere`; a public name of a text alone may be); ""
        when nowhere."""
        outside, strings = self.state.outside, self.survey.strings
        return elsewhere(name, outside, strings) or elsewhere(name, outside, strings, "read")

    @cached_property
    def module_flow(self) -> Flow:
        """The module's flow (its names' reads), made when first asked."""
        return Flow(self.module, model=self.resolver)

    def _record_unread(self, group: str) -> list[bool]:
        """Record the deletion of the module-level code `group` leaves unread (`_find_unread`)."""
        enabled = []
        for name, unread in ((n, u) for n, u in self.unread.items() if u.group == group):
            readers = sorted({f"`{r}`" for r in unread.readers if r})
            deleted = "its calls, means over devices of a step's equal copies, deleted"
            parts = [deleted] if "" in unread.readers else []
            parts += [f"read only by {' and '.join(readers)}, deleted too"] if readers else []
            why = ", ".join(parts) + "; nothing else in the code base uses it"
            node = _unread_node(unread)
            text = f"`jax.pmap` -> deleted with `{name}` (program-level): {why}"
            text = f"a def deleted, `{name}`: {why}" if isinstance(node, cst.FunctionDef) else text
            details = {"deleted": name}  # takes its group's verdict (`verify.session.with_deleted`)
            enabled.append(self.site(node, text, group=group, fallback=group, details=details))
        return enabled

    def _drop_unread(self, group: str) -> None:
        """Delete the module-level code `group`, rewritten, leaves unread (at the module's end)."""
        for name, unread in ((n, u) for n, u in self.unread.items() if u.group == group):
            self.dropped.add(name)
            for read in names_in(unread.statement):
                self.drop_import_if_unused(read)

    def _reads_of(self, flow: Flow, factory: cst.Name | cst.Attribute) -> int:
        """How many times the module reads the factory's name: as a name, or, a method
        (`self.factory`), as the attribute of anything; a method another class of the module
        defines too (a subclass's override) counts as read again."""
        if isinstance(factory, cst.Name):
            return len(flow.loads.get(factory.value, []))
        name = factory.attr.value
        return self._attributes_named[name] + self._defs_named[name] - 1

    @cached_property
    def _defs_named(self) -> Counter[str]:
        """How many defs of the module, in any scope, have each name."""
        return Counter(d.name.value for d in nodes_in(self.module, cst.FunctionDef))

    @cached_property
    def _attributes_named(self) -> Counter[str]:
        """How many attributes of the module have each name (`self.step`: `step`)."""
        return Counter(a.attr.value for a in nodes_in(self.module, cst.Attribute))

    def _other_defs(self, klass: cst.ClassDef, name: str) -> str:
        """What else of the module is a def `name` besides `klass`'s method: the subclasses
        overriding it (`self.name(...)` may run theirs), or another def so named; "" when
        nothing."""
        if self._defs_named[name] == 1:
            return ""
        subclasses = [
            f"`{k.name.value}.{name}`"
            for k in nodes_in(self.module, cst.ClassDef)
            if any(single_name(b.value) == klass.name.value for b in k.bases)
            if any(isinstance(d, cst.FunctionDef) and d.name.value == name for d in k.body.body)
        ]
        if subclasses:
            return f"overridden by {' and '.join(subclasses)}"
        return f"one of several defs named `{name}` in this module"

    def _stored_step(self, flow: Flow, site: PmapUse) -> _StoredStep | None:
        """A step stored on `self` (`self.step = jax.pmap(...)`, or a factory's decorated def,
        `self.step = get_eval_fn(...)`) and called in one other method of the class, which
        sets its mesh (`_stored_groups`); None when the step is not stored so, or when what
        makes it blocks the form (an option of its decorator: the site's reason)."""
        try:
            return self._stored(flow, site)
        except NotVisible as why:
            self.stored_why[id(site.node)] = why
            return None

    def _stored(self, flow: Flow, site: PmapUse) -> _StoredStep | None:
        if self.stores is None:
            self.stores = attribute_stores(self.module, self.survey.stored)
        found = stored_target(self.module, site.node, self.stores, self.qualname)
        if found is None or len(site.pmaps) != 1:
            return None
        klass, maker, assign, bound = found
        decorated = isinstance(site.node, cst.Decorator) and isinstance(assign.value, cst.Call)
        factory = assign.value.func if decorated else None  # type: ignore[attr-defined]
        in_class = maker is site.mapped  # a pmap-decorated method: `_method_used`, once called
        made = ""
        if bound is not None and not in_class:  # `partial(step, a)`: the def's one use, static
            assert isinstance(site.mapped, cst.FunctionDef) and isinstance(site.node, cst.Decorator)
            factory, name = None, site.mapped.name.value
            statics = self._decorator_options(site.node, site.mapped).statics
            once = len(flow.loads.get(name, [])) == 1 and set(range(bound)) <= set(statics)
            if not once or elsewhere(name, self.state.outside, self.survey.strings):
                return None
        if isinstance(factory, (cst.Name, cst.Attribute)):  # its one use is storing the step
            name = factory.value if isinstance(factory, cst.Name) else factory.attr.value
            if where := elsewhere(name, self.state.outside, self.survey.strings):
                why = f"the step is returned by `{name}`, which is also called {where}"
                why += _unless_closed(where)
                self.factory_used[id(site.node)] = NotVisible(why, Decline.NOT_CALLED_ONLY)
            if where or self._reads_of(flow, factory) != 1:
                return None
            made = f"the step is returned by `{name}`, and "
        readers = stored_reads(self.module, klass, maker, assign)
        if isinstance(site.node, cst.Call):  # `jax.pmap(f, **options)`: the site's own reason
            options = options_of(site.node, self.qualname, self._unnamed(), self.survey.constants)
        if in_class and (used := self._method_used(klass, maker)) is not None:
            self.factory_used[id(site.node)] = used
            return None
        if isinstance(site.node, cst.Decorator):
            body, options = self._decorated(site)
        elif isinstance(site.mapped, cst.Lambda):  # `self._count_p = jax.pmap(lambda m: ...)`
            body = lambda_def(site.mapped)
        else:
            assert isinstance(site.node, cst.Call)
            # `f = other` too (`only_def`): which one is mapped is not known
            mapped = self.survey.only_def(self._mapped_def_name(site.node), site.node)
            if mapped is None or self._def_scope(mapped) not in (None, maker):
                return None
            body = mapped
        around = [s.ancestors for s in self.sites.values()]
        if any(id(m) in self.programs or any(m in a for a in around) for m, _ in readers):
            return None
        return _StoredStep(site, klass, readers, bound or 0, body, options, made)

    def _method_used(self, klass: cst.ClassDef, method: cst.FunctionDef) -> NotVisible | None:
        """Why a pmap-decorated method is not read as a step stored on `self`: pmap does not
        take `self` as static (an object must be), a def of the module overrides it, or another
        module may name its class (a subclass there, or code calling it, is not read); else
        None."""
        name, owner = method.name.value, klass.name.value
        if 0 not in self._decorator_options(method.decorators[0], method).statics:
            first = first_parameter(method)
            return NotVisible(f"`{first}` is not a static argument of its pmap", Decline.OPTION)
        if which := self._other_defs(klass, name):
            why = f"`{owner}.{name}` is {which}: which definition runs is not followed"
            return NotVisible(why, Decline.NOT_CALLED_ONLY)
        if where := self._used_elsewhere(owner):
            why = f"its class `{owner}` is used {where}: its calls there are not followed"
            return NotVisible(why + _unless_closed(where), Decline.NOT_CALLED_ONLY)
        return None

    def _stored_groups(
        self, flow: Flow, pending: list[_StoredStep]
    ) -> tuple[list[OuterGroup], set[int]]:
        """The groups of the stored steps (`_class_group`): a class's, when one of its steps is
        read in several methods or passed from one to another; else one per method calling
        them. Also return the ids of the sites handled: taken, or saying why not."""
        by_class: dict[int, list[_StoredStep]] = {}
        for found in pending:
            by_class.setdefault(id(found.klass), []).append(found)
        groups: list[OuterGroup] = []
        handled: set[int] = set()
        for shared in by_class.values():
            try:
                passes = {id(f): self._passes(f) for f in shared}  # read once, used twice
                whole = any(len(f.readers) > 1 or passes[id(f)] for f in shared)
                parts: dict[int, list[_StoredStep]] = {}
                for found in shared:
                    parts.setdefault(0 if whole else id(found.method), []).append(found)
                for part in parts.values():
                    group = self._class_group(flow, part, passes)
                    groups += [group] if group is not None else []  # else said, or not yet
                    handled |= {id(f.site.node) for f in part if group or f.site.fallback}
            except NotVisible as why:  # what blocks them all, before any is read
                for found in shared:
                    found.site.fallback = str(why)
                handled |= {id(found.site.node) for found in shared}
        return groups, handled

    @staticmethod
    def _one_axis(steps: list[OuterStep], caller: str = "") -> None:
        """Raise NotVisible (a mesh decline) when `steps` are over different axes: one mesh
        cannot serve them; `caller` names the function calling them all, if any."""
        if len({code(step.options.axis) for step in steps}) > 1:
            who = f"`{caller}` calls steps" if caller else "steps"
            raise NotVisible(f"{who} over different axes: one mesh cannot serve them", Decline.MESH)

    def _meshed(
        self, setup: cst.FunctionDef, flow: Flow, steps: list[OuterStep], around: frozenset[int]
    ) -> OuterGroup:
        """Return the group of `steps` whose mesh `setup` (read in `flow`) sets, before its
        first statement calling one; a mesh of pmap's already bound there is reused. Raise
        NotVisible when no one place in `setup` serves them all."""
        before, end = mesh_region(setup, flow, steps)
        scopes: list[cst.BaseSuite | cst.Module] = [setup.body, self.module]
        mesh = mesh_in_scope(scopes, before, flow, steps[0].options.axis, self.qualname)
        return OuterGroup(steps, setup, before, end, mesh or "mesh", mesh is None, around=around)

    def _passes(self, found: _StoredStep) -> _Passes:
        """Where the one method reading the step passes it to another method of its class, as
        an argument of `self.method(...)` (big_vision's retrieval evaluator: `self._embed(...,
        self._embed_images_p, ...)`): each call, the method, and the parameter the step binds
        there; none when a read is anything else or the step is not read so. Raise NotVisible
        when another class of the module (a subclass) defines that method too: which one runs
        is not known here."""
        if len(found.readers) != 1 or found.bound:
            return []
        reader, reads = found.readers[0]
        me = first_parameter(reader)
        methods = {m.name.value: m for m in found.klass.body.body if isinstance(m, cst.FunctionDef)}
        args = {id(a.value): c for c in nodes_in(reader, cst.Call) for a in c.args}
        passes = []
        for read in reads:
            func = call.func if (call := args.get(id(read))) is not None else None
            if call is None or not isinstance(func, cst.Attribute) or single_name(func.value) != me:
                return []
            method = methods.get(func.attr.value)
            if method is None or method is reader or not method.params.params:
                return []
            bound = bound_arguments(_without_self(method), call) or {}
            if (param := next((p for p, v in bound.items() if v is read), None)) is None:
                return []
            name = method.name.value
            if which := self._other_defs(found.klass, name):
                raise NotVisible(
                    f"`{me}.{name}(...)`, which the steps stored on `{me}` are passed to, is "
                    f"{which}: which definition runs there is not followed",
                    Decline.NOT_CALLED_ONLY,
                )
            passes.append((call, method, param))
        return passes

    def _class_group(
        self, flow: Flow, shared: list[_StoredStep], passes: dict[int, _Passes]
    ) -> OuterGroup | None:
        """The group of the steps stored on `self` in one class (`shared`): one method (`setup`)
        calls each other method calling a step, once, as `self.method(...)`, and is the only
        code reading it (big_vision's discriminative classifier: `evaluate` calls
        `self._embed_texts(params, ...)`), or calls them all itself. Each method is read on a
        copy of its own (`_stored.stored_copy`; in `setup`'s, `self.method` is the method's
        name), the mesh is set in `setup`, and a parameter of another method passed to a step
        is laid out where `setup` passes it (as the argument of a step there: `_callee`'s
        `given`). None when that is not so: each site says why as its fallback, or, without a
        reason, finds its own; raise NotVisible for what blocks them all before they are read.
        `passes`: each step's `_passes`, by id."""
        methods = [m for found in shared for m, _ in found.readers]
        methods += [m for found in shared for _, m, _ in passes[id(found)]]
        methods = list({id(m): m for m in methods}.values())  # each once, in order
        # In `setup`: `self.method`, the function of each call of each other method
        setups = ((m, c) for m in methods if (c := self._calls_of(m, methods)) is not None)
        setup, calls = next(setups, (None, {}))
        if setup is None and any(passes.values()):  # passed to a method: that is followed
            where = " and ".join(f"`{shared[0].klass.name.value}.{m.name.value}`" for m in methods)
            raise NotVisible(
                f"the steps stored on `self` are read in {where}, {NO_SETUP}", Decline.SETUP
            )
        if setup is None:
            return None
        if (blocked := self._passed_everywhere(setup, passes)) is not None:
            raise blocked
        others = [m for m in methods if m is not setup]
        copies: dict[int, Stored] = {}
        names: dict[tuple[int, int], str] = {}  # by (step, method): the step's name there
        given_params: dict[str, set[str]] = {}  # by method: its parameters laid out in `setup`
        reading: _StoredStep | None = None  # the step whose programs are read: what blocks
        try:
            for method in methods:
                read = [(f, r) for f in shared for m, r in f.readers if m is method]
                named = calls if method is setup else None
                kept = stored_copy(self.module, method, [(r, f.bound) for f, r in read], named)
                copies[id(method)] = kept
                for (found, _), name in zip(read, kept.steps, strict=False):
                    names[(id(found), id(method))] = name
            setup_copy = copies[id(setup)]
            made, origins = list(nodes_in(setup_copy.copy, cst.Call)), setup_copy.origins
            # By id of a call in `setup`: the call in the copy; the calls of each other method
            in_setup = {id(origins[id(c)]): c for c in made if id(c) in origins}
            called = {n: [c for c in made if single_name(c.func) == n] for n in calls}
            steps: list[OuterStep] = []
            # By (method's copy, name): the programs of the steps called there by that name
            passed: dict[tuple[int, str], list[tuple[str, Program]]] = {}
            for found in shared:
                reading = found
                decorated = isinstance(found.site.node, cst.Decorator)
                first = names[(id(found), id(found.method))]  # as messages name it
                step = OuterStep(found.site, first, found.body, found.options, decorated)
                # Where each program of the step is read: the method, the step's name there,
                # and the call of that method in `setup` laying out its parameters (None: in
                # `setup` itself); a step `setup` passes to a method, there, by the parameter
                hosts: list[tuple[cst.FunctionDef, str, cst.Call | None]] = []
                for method, _ in found.readers:
                    name = names[(id(found), id(method))]
                    if method is not setup:
                        hosts += [(method, name, c) for c in called[method.name.value]]
                    elif passes[id(found)]:
                        hosts += [(m, p, in_setup[id(c)]) for c, m, p in passes[id(found)]]
                    else:
                        hosts.append((method, name, None))
                for method, name, at in hosts:
                    kept = copies[id(method)]
                    given: _Given | None = None
                    callers: list[Program] = []  # following the arguments `given` lays out
                    if at is not None:  # a method's arguments not visible: the group's reason
                        params, reading = given_params.setdefault(method.name.value, set()), None
                        given = self._given(
                            setup_copy, method, found.options, at, tuple(calls), params, callers
                        )
                        reading = found
                    followed = tuple(calls) if method is setup else ()  # their feeds: below
                    # the other steps read there: a result fed to one is checked there
                    siblings = tuple(n for n in kept.steps if n != name and n not in calls)
                    try:
                        program = self._in_copy(
                            found, kept, name, given=given, methods=followed, siblings=siblings
                        )
                    except NotVisible as why:
                        if name == first:
                            raise
                        text = f"`{first}`, passed to `{method.name.value}` as `{name}`: {why.why}"
                        raise NotVisible(text, why.code) from None
                    if program.squeezed:
                        raise NotVisible(_KEYS, Decline.KEYS_OUTSIDE)
                    passed_on_checked(program, flow, self.state.outside, self.survey.strings)
                    # A decorated def takes keyword arguments by position: in one method, if
                    # they are in place; calls in several methods are not read alike
                    if program.keywords and decorated and len(methods) > 1:
                        odd = f"`{first}`, a decorated def, is called with keyword arguments"
                        raise NotVisible(odd, Decline.CALLS_DIFFER)
                    if decorated:
                        keywords_in_place(program, found.body, name)
                    program.callees += callers
                    step.programs.append(program)
                    passed.setdefault((id(kept.copy), name), []).append((first, program))
                head = step.programs[0]
                for program in step.programs[1:]:
                    if program.batches != head.batches or program.params != head.params:
                        odd = f"`{first}` is passed other layouts in one method than in another"
                        raise NotVisible(odd, Decline.CALLS_DIFFER)
                steps.append(step)
            reading = None  # what blocks below is the group's
            self._passed_alike(passed)
            self._one_axis(steps)
            inner = Flow(setup_copy.copy)
            by_name = {m.name.value: m for m in others}
            self._passed_as_before(inner, setup_copy, steps, given_params, by_name)
            around = frozenset(id(a) for m in methods for a in (m, *flow.ancestors(m)))
            group = self._meshed(setup_copy.copy, inner, steps, around)
        except NotVisible as why:
            if why.why:
                self._not_taken(shared, methods, copies, calls, reading, why)
            return None
        self.stored |= copies  # by id of each method
        return group

    @staticmethod
    def _not_taken(
        shared: list[_StoredStep],
        methods: list[cst.FunctionDef],
        copies: dict[int, Stored],
        calls: _Calls,
        blocking: _StoredStep | None,
        why: NotVisible,
    ) -> None:
        """Say at each site of `shared` why the steps' group, read in `methods`, is not taken:
        `why`, naming each step and method as the code reads it (`copies`, `calls`); when it
        is about one step, `blocking`, the others keep the per-device form with that one."""
        text = why.why
        for kept in copies.values():  # the steps' names in the copies, as the code reads
            for name, (attr, _) in kept.steps.items():
                text = text if name == attr.attr.value else text.replace(name, code(attr))
        for name, reads in calls.items():  # a method `setup` calls, as it calls it
            text = text.replace(f"`{name}(", f"`{code(reads[0])}(")
        text = arguments_as_called(text, blocking.bound if blocking else 0)
        klass = shared[0].klass.name.value
        where = lambda ms: " and ".join(f"`{klass}.{m.name.value}`" for m in ms)
        for found in shared:
            step = code(found.readers[0][1][0])
            said = f"the step stored in `{step}` is called in {where(m for m, _ in found.readers)}"
            if blocking is None and len(shared) > 1:  # the group's
                said = f"the steps stored on `self` are called in {where(methods)}"
            elif blocking is None or blocking is found:
                said = found.made + said
            else:
                other = code(blocking.readers[0][1][0])
                said += f" with the one stored in `{other}`, which keeps the per-device form"
            found.site.fallback = str(NotVisible(f"{said}: {text}", why.code))

    @staticmethod
    def _passed_everywhere(setup: cst.FunctionDef, passes: dict[int, _Passes]) -> NotVisible | None:
        """Each call of a method a step is passed to, in `setup`, passes one of the steps for
        that parameter: one passing anything else (a function of its own) would run the
        method's edits, made for a step, on it (PL204)."""
        reads: set[int] = set()  # the steps' reads passed, by id
        receivers: dict[str, tuple[cst.FunctionDef, set[str]]] = {}  # by method name
        for call, method, param in (x for found in passes.values() for x in found):
            reads.add(id((bound_arguments(_without_self(method), call) or {}).get(param)))
            receivers.setdefault(method.name.value, (method, set()))[1].add(param)
        for name, (method, params) in receivers.items():
            for call in nodes_in(setup, cst.Call):
                if not isinstance(call.func, cst.Attribute) or call.func.attr.value != name:
                    continue
                args = bound_arguments(_without_self(method), call) or {}
                for param in sorted(params):
                    if (value := args.get(param)) is None or id(value) not in reads:
                        what = f"`{code(value)}`" if value is not None else "nothing"
                        why = (
                            f"`{name}` is passed steps stored on `self` as `{param}`, and {what} "
                            "at another call: its edits, made for a step, would run on that too"
                        )
                        return NotVisible(why, Decline.CALLS_DIFFER)
        return None

    @staticmethod
    def _passed_alike(passed: dict[tuple[int, str], list[tuple[str, Program]]]) -> None:
        """The steps passed to one method through one parameter are one call in the code there:
        each step's program must make the same edits, for the same reasons, and lay out its
        arguments and results alike; else raise (PL204)."""
        for programs in passed.values():
            (one, head), *rest = programs
            layout = lambda p: (p.batches, p.outputs, p.varying, p.reasons)
            for other, program in rest:
                if other != one and layout(program) != layout(head):
                    why = f"`{one}` and `{other}` are passed to one parameter, laid out differently"
                    raise NotVisible(why, Decline.CALLS_DIFFER)

    def _calls_of(self, setup: cst.FunctionDef, methods: list[cst.FunctionDef]) -> _Calls | None:
        """By name of each other method of `methods`, its reads `self.method` in `setup`, when
        `setup` calls each of them so, `self.method(...)` (once or more: each call lays out the
        method's parameters its steps read), and nothing else reads that method (in the module,
        or, by name, in the code base), nor names it in `setup`; else None."""
        me = first_parameter(setup)
        funcs = {id(c.func) for c in nodes_in(setup, cst.Call)}
        attrs = list(nodes_in(setup, cst.Attribute))
        named = {id(a.attr) for a in attrs}
        # A method's name read in `setup` other than as an attribute would be another
        bare = {n.value for n in nodes_in(setup, cst.Name) if id(n) not in named}
        outside = private = self.state.outside
        if outside is not None:
            # A module another one reads as a value (`mock.patch.object(module, ...)`) has each
            # of its functions used; a private method is reached through its class
            private = Callers(
                outside.everywhere, {k: v for k, v in outside.uses.items() if k != "*"}
            )
        others = [m.name.value for m in methods if m is not setup]
        calls = {name: [a for a in attrs if a.attr.value == name] for name in others}
        for name, mine in calls.items():
            once = self._defs_named[name] == 1
            if not mine or self._attributes_named[name] != len(mine) or name in bare or not once:
                return None  # also read elsewhere, or a subclass's override is called too
            if any(single_name(a.value) != me or id(a) not in funcs for a in mine):
                return None
            if elsewhere(name, private if name.startswith("_") else outside, self.survey.strings):
                return None
        return calls

    def _in_copy(self, found: _StoredStep, kept: Stored, name: str, **follow: Any) -> Program:
        """Return the program of `found`'s step called as `name` in `kept`'s copy of its method,
        read with the method's facts (`_copy_facts`); `follow`: `analyze_calls`' `given`, and
        the steps (`siblings`) or methods (`methods`) whose calls there are followed too."""
        facts, options = self._copy_facts(kept), found.options
        return analyze_calls(kept.copy, name, options, found.body, self.qualname, facts, **follow)

    def _copy_facts(self, kept: Stored) -> ModuleFacts:
        """Return the `_facts` of the method `kept` copies, for its copy: the parameters
        declared of the method (`pmap-replicated`, or seen) are the copy's."""
        facts = self._facts(kept.method)
        declared = facts.replicated.get(id(kept.method), NOT_DECLARABLE)
        return replace(facts, replicated={id(kept.copy): declared})

    def _given(
        self,
        setup: Stored,
        method: cst.FunctionDef,
        options: Options,
        call: cst.Call,
        methods: tuple[str, ...],
        params: set[str],
        callers: list[Program],
    ) -> _Given:
        """How a parameter of `method`, passed to the step (`options`), is laid out: as
        `setup`'s argument for it at `call` (in `setup`'s copy), followed in `setup` as an
        argument of the step is (`_callee.laid_out_in_caller`). Each parameter laid out is
        added to `params`, each program following an argument in `setup` to `callers`;
        `methods`: the methods `setup` calls, what they take is checked there."""
        if (args := bound_arguments(_without_self(method), call)) is None:
            # `self.method(**options)`
            why = f"the arguments of `{method.name.value}` are not visible"
            raise NotVisible(why, Decline.CALLS_DIFFER)
        facts = self._copy_facts(setup)
        declared = facts.replicated[id(setup.copy)]
        flow = Flow(setup.copy)
        forms = forms_of(flow, self.qualname, facts)
        siblings = tuple(n for n in setup.steps if n not in methods)  # their results: replicated

        def given(program: Program, param: str, position: int) -> Layout:
            """The layout of `param` (the step's argument at `position` in `program`) where
            `setup` passes it; raise NotVisible for why it cannot be known there."""
            params.add(param)
            value = argument_for(args, param, method.name.value, setup.method.name.value)
            caller = Program(setup.copy, None, options.fun, options.axis, options.donate, [], None)
            caller.declared, caller.spelling = declared.copies, declared.spelling
            sibling_calls(caller, flow, siblings, forms.defs, methods)
            callers.append(caller)
            site = _Site(caller, flow, forms, [])
            return laid_out_in_caller(site, call, program, value, position, "_step")

        return given

    @staticmethod
    def _passed_as_before(
        flow: Flow,
        setup: Stored,
        steps: list[OuterStep],
        given: dict[str, set[str]],
        methods: dict[str, cst.FunctionDef],
    ) -> None:
        """Each value `setup` passes to another method that no step there takes (`given`: the
        parameters laid out in `setup`) reaches it as it did: no edit of the programs in
        `setup` makes it (a replication deleted, a parameter made one value), else that method
        would read another layout than pmap's: raise."""
        programs = [p for s in steps for p in s.programs if p.host is setup.copy]
        programs += [c for s in steps for p in s.programs for c in p.callees]
        edited = {key for p in programs for key in p.edits}
        uncopied = {n for p in programs for n in p.uncopied}
        for call in nodes_in(setup.copy, cst.Call):
            name = single_name(call.func) or ""
            if (method := methods.get(name)) is None:
                continue
            args = bound_arguments(_without_self(method), call)
            assert args is not None  # else `_given` or `_passed_everywhere` declined first
            laid_out = given.get(name, ())  # a step's argument in `setup`: checked there
            for value in (v for param, v in args.items() if param not in laid_out):
                for use in nodes_in(value, cst.Name):
                    reaching = flow.reach.of(use) or {ENTRY}
                    made = {id(getattr(b, "value", None)) for b in reaching if b is not ENTRY}
                    if made & edited or (ENTRY in reaching and use.value in uncopied):
                        why = (
                            f"`{code(value)}` is passed to `{name}`, which reads it other than "
                            "as a step's argument, as the rewrite changes it"
                        )
                        raise NotVisible(why, Decline.CALLS_DIFFER)

    def _take_groups(self, groups: list[OuterGroup]) -> str:
        """Take the sites of `groups`' steps out of `self.sites`, unless the mesh they set would
        clash with another pmap of the module (a `jax.pmap` or `shard_map` over any other mesh
        fails when called under it): one kept per device, or steps over other axes. Then each
        says so, as its fallback. Return that clash, "" when there is none."""
        sites = [step.site for group in groups for step in group.steps]
        taken = {id(site.node) for site in sites}
        axes = {code(g.steps[0].options.axis) for g in self.outer}
        axes |= {code(p.axis) for programs in self.programs.values() for _, p in programs}
        if self.kept_pmaps or any(key not in taken for key in self.sites):
            line = "a pmap of the module stays per-device"
        elif len(axes) > 1:
            line = f"the steps of the module are over different axes, {' and '.join(sorted(axes))}"
        else:
            for site in sites:
                del self.sites[id(site.node)]
            return ""
        why = f"{line}: its mesh would clash with the one `jax.set_mesh` sets (JAX raises)"
        clash = str(NotVisible(why, Decline.MESH))
        for site in sites:
            site.fallback = clash
        return clash

    def _host(self, site: PmapUse) -> cst.CSTNode | None:
        """Return the function a step is made in (None: at module level); for a decorated def,
        the function it is written in; for a step a factory returns, the function calling the
        factory (`factory_hosts`)."""
        if id(site.node) in self.factory_hosts:
            return self.factory_hosts[id(site.node)][0]
        if site.around is not site.mapped:
            return site.around
        scopes = (a for a in reversed(site.ancestors) if isinstance(a, SCOPES))
        outer = next((a for a in scopes if a is not site.mapped), None)
        return outer if isinstance(outer, cst.FunctionDef) else None

    def _factory_callers(self, flow: Flow) -> dict[int, tuple[cst.FunctionDef, cst.Assign]]:
        """By id of each `return jax.pmap(...)` ending a def of the module whose one use, and no
        other module's, is `step = factory(...)`, a statement of a function: that function and
        the assignment. The factory's other uses are declined where its step is followed
        (`_program`)."""
        found: dict[int, tuple[cst.FunctionDef, cst.Assign]] = {}
        for site in self.sites.values():
            if (factory := _factory(self.module, site)) is None:
                continue
            name = factory.name.value
            if elsewhere(name, self.state.outside, self.survey.strings):
                continue  # PL101, where the step is followed
            uses = [u for u in flow.loads.get(name, []) if flow.parent.get(id(u)) is not factory]
            # not called, called twice, or not as `step = factory(...)`
            if (bound := assigned_call(flow, uses[0]) if len(uses) == 1 else None) is None:
                continue
            line = flow.parent.get(id(bound[0]))
            host = next((a for a in flow.ancestors(uses[0]) if isinstance(a, SCOPES)), None)
            alone = isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1
            if alone and isinstance(host, cst.FunctionDef):
                found[id(site.node)] = (host, bound[0])
        return found

    def _step_name(self, site: PmapUse) -> str | None:
        """The name the step is called by where it is followed: bound where it is made, or
        where the factory returning it is called (`update_fn_repl = make_update_fn(...)`)."""
        if id(site.node) in self.factory_hosts:
            return single_name(self.factory_hosts[id(site.node)][1].targets[0].target)
        return self._bound_to(site)

    def _not_failed(self, sites: list[PmapUse]) -> list[PmapUse]:
        """`sites` but those made where the first step of a group that failed verification is
        made (in the function, or outside functions: `_host`): each of those falls back to the
        faithful form with that group, as they were one group, saying so."""
        groups = ((site, self.program_group(site.node)) for site in self.sites.values())
        failed = {id(self._host(site)): g for site, g in groups if g in self.state.fallbacks}
        for site in (s for s in sites if id(self._host(s)) in failed):
            site.failed_program = group = failed[id(self._host(site))]
            why = f"program-level form failed verification ({self.state.fallbacks[group]})"
            site.fallback = str(NotVisible(why, Decline.VERIFICATION))
        return [site for site in sites if site.failed_program is None]

    def program_group(self, node: cst.CSTNode) -> str:
        """Return the group of the program-level form of the step made at `node`: also the key
        that asks for the faithful form instead (stable across runs: the original position)."""
        line, col = self.where(node)
        return f"{self.CODE}:program:{line}:{col}"

    def _take_steps(self, flow: Flow, sites: list[PmapUse]) -> None:
        """Take the steps one function makes, together: results fed from one to another are
        replicated on both sides. A step that is not taken is left out and the others are
        followed again without it (a result fed to it is then read other than as taken)."""
        active = sites
        while active:
            names = {id(s): self._step_name(s) or "" for s in active}
            taken: list[tuple[PmapUse, Program]] = []
            for site in active:
                siblings = tuple(n for k, n in names.items() if n and k != id(site))
                try:
                    taken.append((site, self._program(site, flow, siblings)))
                except NotVisible as why:
                    site.fallback = str(why)
            if len(taken) == len(active):
                break
            active = [site for site, _ in taken]
        if not active:
            return
        host = taken[0][1].host
        blocks = {id(flow.parent.get(id(p.statement))) for _, p in taken}
        if len(blocks) > 1:
            steps = " and ".join(f"`{names[id(site)]}`" for site, _ in taken)
            apart = (
                f"`{host.name.value}` makes {steps} in different blocks: no one place for the mesh"
            )
            for site, _ in taken:
                site.fallback = str(NotVisible(apart, Decline.MESH))
            return
        lines = list(getattr(flow.parent.get(id(taken[0][1].statement)), "body", ()))
        taken.sort(key=lambda t: lines.index(t[1].statement))
        for site, _ in taken:
            del self.sites[id(site.node)]
        self.programs[id(host)] = taken

    def _beside_kept(self, flow: Flow, outer: list[OuterStep]) -> None:
        """A function whose steps are taken, fed the results of a step of the module that keeps
        the per-device form, read back from device 0 (`unreplicate(params)`): committed to one
        device, they would reach the taken steps' mesh (JAX raises). The function's steps keep
        the per-device form too: when it calls a factory of the module returning such a step,
        or a function of the module passes it a value made of such a step's results. `outer`:
        the steps made outside the functions calling them, followed there."""
        for factory in [f for s in self.sites.values() if (f := _factory(self.module, s))]:
            for use in flow.loads.get(factory.name.value, []):
                host = next((a for a in flow.ancestors(use) if isinstance(a, SCOPES)), None)
                if isinstance(host, cst.FunctionDef) and id(host) in self.programs:
                    why = (
                        f"`{host.name.value}` also calls a step `{factory.name.value}` returns, "
                        "which keeps the per-device form: its results would reach this step on "
                        "one device"
                    )
                    self._apart(host, why)
        apart = True
        while apart:  # a function put apart keeps its steps: module-level steps are kept then
            apart = False
            for taken in list(self.programs.values()):
                host, axis = taken[0][1].host, code(taken[0][1].axis)
                steps = {n for site, _ in taken if (n := self._step_name(site))}
                if why := self._fed_kept(flow, host, steps, self._kept_steps(outer, axis)):
                    self._apart(host, why)
                    apart = True

    def _kept_steps(self, outer: list[OuterStep], axis: str) -> dict[str, str]:
        """The names of the module's steps that keep the per-device form beside a step over
        `axis` taken (those declined, and those made outside the functions calling them,
        `outer`, unless they can still be taken: `_take_groups`, no other pmap of the module
        left per-device, one axis), and of the functions making them (what they return may be
        read back from one device), each with what it is."""
        axes = {axis} | {code(p.axis) for group in self.programs.values() for _, p in group}
        axes |= {code(step.options.axis) for step in outer if step.options.named}
        if self.kept_pmaps or len(outer) < len(self.sites):
            axes.add("")  # a pmap kept per-device: so are those of the module
        taken = {id(step.site) for step in outer} if len(axes) == 1 else set()
        kept = [s for s in self.sites.values() if id(s) not in taken]
        hosts = [h.name.value for s in kept if isinstance(h := self._host(s), cst.FunctionDef)]
        found = dict.fromkeys(hosts, "which makes a step kept per-device")
        names = [name for site in kept if (name := self._step_name(site))]
        return found | dict.fromkeys(names, "which keeps the per-device form")

    def _fed_kept(
        self, flow: Flow, host: cst.FunctionDef, steps: set[str], kept: dict[str, str]
    ) -> str:
        """Why `host`'s steps (named `steps` there) cannot be taken: a function of the module
        calls `host`, or `host` calls one of them, with a value made of the results of a step
        named in `kept` ("" when none)."""
        own = Flow(host)
        uses = [(u, flow) for u in flow.loads.get(host.name.value, [])]
        uses += [(u, own) for name in steps for u in own.loads.get(name, [])]
        for use, where in uses:
            call = where.parent.get(id(use))
            scopes = (a for a in where.ancestors(use) if isinstance(a, SCOPES))
            caller = host if where is own else next(scopes, None)
            if not isinstance(caller, cst.FunctionDef) or getattr(call, "func", None) is not use:
                continue
            assert isinstance(call, cst.Call)
            within = own if where is own else Flow(caller)
            for arg in call.args:
                made = self._made_from(arg.value, within, True, set())
                reads = (r for r, _ in made if isinstance(r, cst.Name) and r.value in kept)
                # a call of a step, `step(...)`: not the step passed on
                calls = (
                    r.value for r in reads if getattr(within.parent.get(id(r)), "func", 0) is r
                )
                if step := next(calls, ""):
                    return (
                        f"`{caller.name.value}` passes `{_short(arg.value)}` to `{use.value}`, "
                        f"made of the results of `{step}`, {kept[step]}: read back on one "
                        "device, they would reach this step's mesh (JAX raises)"
                    )
        return ""

    def _apart(self, host: cst.FunctionDef, why: str) -> None:
        """Put the steps of `host`'s group back as sites of their own, per device, saying `why`
        (a mesh decline)."""
        for site, _ in self.programs.pop(id(host)):
            self.sites[id(site.node)] = site
            site.fallback = str(NotVisible(why, Decline.MESH))

    def _module_alone(self) -> None:
        """The module's own program is taken only if no other site or program of the module is
        left: its statements are rewritten from the original, other edits in them would be
        lost. Else its steps are faithful, saying so."""
        if (host := self.main_blocks.get(id(self.module))) is None or id(host) not in self.programs:
            return
        if not (self.sites or self.outer or self.stored or set(self.programs) - {id(host)}):
            return
        why = (
            "the module's statements make and call the step, and the module has other pmaps: "
            "no one rewrite of its statements for them all"
        )
        self._apart(host, why)

    def _is_outer(self, flow: Flow, site: PmapUse) -> bool:
        """A pmap decorator on a def of the module, or `step = jax.pmap(...)` at module level,
        but for a step made at module level and read only there, outside any def, class or
        lambda (a script's or a notebook's loop): its program is the module's statements',
        read as the body of one function."""
        if isinstance(site.node, cst.Decorator):
            if site.mapped not in self.module.body or len(site.pmaps) != 1:
                return site.mapped in self.module.body
        elif main_block(self.module, site.ancestors) or any(
            isinstance(a, SCOPES) for a in site.ancestors
        ):
            return False
        uses = flow.loads.get(name, []) if (name := self._bound_to(site)) else []
        return not uses or any(isinstance(a, SCOPES) for use in uses for a in flow.ancestors(use))

    def _outer_step(self, site: PmapUse) -> OuterStep:
        """Read a step made outside the functions calling it; raise NotVisible for why not."""
        if len(site.pmaps) != 1:
            raise NotVisible(NESTED, Decline.NESTED)
        if isinstance(site.node, cst.Decorator):
            body, options = self._decorated(site)
            return self._outer_named(OuterStep(site, body.name.value, body, options, True))
        statement = site.ancestors[1] if len(site.ancestors) > 2 else None
        if isinstance(statement, cst.BaseCompoundStatement):  # `if __name__ == ...:`
            raise NotVisible(_outside_why(statement), Decline.MADE_OUTSIDE)
        lines = statement.body if isinstance(statement, cst.SimpleStatementLine) else ()
        assign = lines[0] if len(lines) == 1 and isinstance(lines[0], cst.Assign) else None
        target = assigned_name(assign)  # `step = jax.pmap(...)` alone on its line
        if assign is None or assign.value is not site.node or target is None:
            raise NotVisible(NOT_NAMED, Decline.NOT_NAMED)
        assert isinstance(site.node, cst.Call)
        options = options_of(site.node, self.qualname, self._unnamed(), self.survey.constants)
        lam = site.mapped  # a notebook's cell: a mean kept below
        if isinstance(lam, cst.Lambda) and not is_mean(site.node, self.qualname):
            return self._outer_named(OuterStep(site, target, lambda_def(lam), options, False))
        defs = self.survey.defs(options.name)
        if len(defs) != 1 or defs[0] not in self.module.body or self.survey.rebound(options.name):
            why = self._not_a_def(site.node, options.name or "")
            if len(defs) == 1 and self.survey.rebound(options.name):
                why = f"the pmapped def `{options.name}` is bound again (`{options.name} = ...`)"
            if is_mean(site.node, self.qualname):
                why = (
                    f"`{target}` is a mean over devices (a lambda), kept for its callers; "
                    "where it is called on a step's results that are equal copies, the call "
                    "is the value itself and goes"
                )
            raise NotVisible(why, Decline.NOT_A_DEF)
        return self._outer_named(OuterStep(site, target, defs[0], options, False))

    def _outer_named(self, step: OuterStep) -> OuterStep:
        """`step`, when its name is bound once in the module and named in no string."""
        if len(self.resolver.bindings(step.name)) != 1:
            why = f"`{step.name}` is bound more than once in the module"
            raise NotVisible(why, Decline.REBOUND)
        if step.name in self.survey.strings:
            why = f"`{step.name}` is named in a string (`__all__`?): it may be used elsewhere"
            raise NotVisible(why, Decline.NOT_CALLED_ONLY)
        return step

    def _unnamed(self) -> cst.SimpleString:
        """The name an unnamed mapped axis gets: one no string of the module is."""
        names = ("batch", "device", *(f"device_{k}" for k in range(99)))
        return cst.SimpleString(f'"{next(n for n in names if n not in self.survey.strings)}"')

    def _group_outer(self, flow: Flow, steps: list[OuterStep]) -> None:
        """Group the steps by the function setting their mesh (one for them all when one
        function calls every function calling them); check each group can be taken."""
        if not steps:
            return
        together = OuterStep(steps[0].site, "the steps", steps[0].body, steps[0].options, False)
        together.programs = [p for step in steps for p in step.programs]
        groups: dict[int, tuple[cst.FunctionDef, list[OuterStep]]] = {}  # by id of the setup
        named = {code(s.options.axis): s.options.axis for s in steps if s.options.named}
        for step in (s for s in steps if not s.options.named and len(named) == 1):
            step.options.axis = next(iter(named.values()))  # any name serves an unnamed axis
            for program in step.programs:
                program.axis = step.options.axis
        try:
            self._one_axis(steps)
            setup = setup_function(together, flow, self.module, self.survey.strings)
            groups[id(setup)] = (setup, steps)
        except NotVisible:
            for step in steps:
                try:
                    setup = setup_function(step, flow, self.module, self.survey.strings)
                except NotVisible as why:
                    step.site.fallback = str(why)
                    continue
                groups.setdefault(id(setup), (setup, []))[1].append(step)
        for setup, group in groups.values():
            try:
                self.outer.append(self._outer_group(flow, setup, group))
            except NotVisible as why:
                for step in group:
                    step.site.fallback = str(why)
        if self._take_groups(self.outer):
            self.outer = []

    def _outer_group(
        self, flow: Flow, setup: cst.FunctionDef, group: list[OuterStep]
    ) -> OuterGroup:
        """The group of the steps `group`, made outside the functions calling them, whose mesh
        `setup` sets; raise NotVisible when they are over different axes, a function calling
        them makes or holds another pmap, or a batch split for one is a jax array."""
        self._one_axis(group, setup.name.value)
        for host in (p.host for step in group for p in step.programs):
            if id(host) in self.programs:
                why = f"`{host.name.value}` also makes a pmapped step of its own"
                raise NotVisible(why, Decline.MESH)
            if any(host in s.ancestors for s in self.sites.values()):
                raise NotVisible(f"`{host.name.value}` holds another pmap site", Decline.MESH)
        for program in (q for step in group for p in step.programs for q in (p, *p.callees)):
            self._no_jax_batch(program)
        hosts = [setup, *(p.host for step in group for p in step.programs)]
        around = frozenset(id(a) for host in hosts for a in flow.ancestors(host))
        return self._meshed(setup, flow, group, around)

    def _no_jax_batch(self, program: Program) -> None:
        """Raise PL601 when a batch split for the step is a jax array: made by a jax operation
        (`jnp.asarray(x).reshape(n, -1, 4)`), or from a name the function binds to one (`x =
        jnp.asarray(...)`, wherever it is bound). Under the mesh `jax.set_mesh` sets,
        `jax.make_array_from_process_local_data` takes this process's part of a batch as host
        data only: given a jax array, made inside the region or before it, it raises on a
        multi-process job (JAX 0.10 and 0.12), and one process cannot show it. A step made where
        it is called names its mesh (`mesh=`), sets none, and takes either."""
        flow = Flow(program.host)
        splits = [n for k, n in program.nodes.items() if program.reasons[k].startswith(SPLIT_EDIT)]
        made = (m for split in splits for m in self._made_from(split, flow, False, set()))
        for ref, name in (m for m in made if (self.qualname(m[0]) or "").startswith(JAX_ARRAYS)):
            call = flow.parent.get(id(ref))
            by = call if isinstance(call, cst.Call) and call.func is ref else ref
            source = f"`{name}`, bound to `{_short(by)}`" if name else f"`{_short(by)}`"
            why = (
                f"the batch split for `{program.host.name.value}`'s step is a jax array, made "
                f"from {source}: under the mesh `jax.set_mesh` sets, "
                "`jax.make_array_from_process_local_data` takes this process's part as host "
                "data only, and raises on a multi-process job"
            )
            raise NotVisible(why, Decline.MESH)

    def _made_from(
        self, node: cst.CSTNode, flow: Flow, reaching: bool, seen: set[int], name: str = ""
    ) -> Iterator[tuple[cst.Attribute | cst.Name, str]]:
        """The names and dotted names making `node`'s value (`_refs`), each with the name bound
        to it ("" for `node`'s own), outermost first: followed through the bindings of the names
        read in `flow`'s function (those reaching the read when `reaching`, else every one of
        the name, wherever it is bound), each once (`seen`)."""
        for ref in self._refs(node):
            yield ref, name
            if isinstance(ref, cst.Name):
                bindings = flow.reach.of(ref) if reaching else flow.stores.get(ref.value, [])
                for binding in (b for b in bindings if id(b) not in seen):
                    seen.add(id(binding))
                    if (value := _bound_value(binding)) is not None:
                        yield from self._made_from(value, flow, reaching, seen, ref.value)

    def _refs(self, node: cst.CSTNode) -> Iterator[cst.Attribute | cst.Name]:
        """The names and dotted names `node` reads, outermost first, not inside a copy to the
        host, nor an attribute's name (`x.reshape`'s `reshape`) or a keyword's."""
        if isinstance(node, cst.Call) and (self.qualname(node.func) or "") in TO_HOST:
            return
        if isinstance(node, (cst.Attribute, cst.Name)):
            yield node
        if isinstance(node, cst.Name):
            return
        for child in node.children:
            named = isinstance(node, cst.Attribute) and child is node.attr
            if not named and not (isinstance(node, cst.Arg) and child is node.keyword):
                yield from self._refs(child)

    def _program(self, site: PmapUse, flow: Flow, siblings: tuple[str, ...] = ()) -> Program:
        """Return the program of the function making the step (its `host`); raise NotVisible
        for why not. A step `return jax.pmap(body, ...)` ending a def of the module (vision_
        transformer's `make_update_fn`) called once, `step = factory(...)` in a function that
        calls `step`, is that function's program, the step made where the factory returns it
        (`Program.factory`), read with the steps that function makes (`siblings`,
        `_take_steps`); any other use of the factory is declined (PL101)."""
        if len(site.pmaps) != 1:
            raise NotVisible(NESTED, Decline.NESTED)
        if isinstance(site.node, cst.Decorator):
            return self._decorated_program(site, flow, siblings)
        assert isinstance(site.node, cst.Call)
        host = site.around or self._main_host(site.ancestors)
        if not isinstance(host, cst.FunctionDef) or host is site.mapped:
            raise NotVisible(_outside_why(host), Decline.MADE_OUTSIDE)
        skip: cst.CSTNode | None = None  # the body, when it is written in the function
        if isinstance(site.mapped, cst.Lambda):  # `jax.pmap(lambda x: ...)`
            body, skip = lambda_def(site.mapped), site.mapped
        else:
            name = self._mapped_def_name(site.node)
            body = self.survey.only_def(name, site.node) or self._opaque_body(
                site, host, self._not_a_def(site.node, name)
            )
            skip = None if body in self.module.body or body.name.value == OPAQUE else body
            if skip is not None and self._def_scope(body) is not host:
                why = f"the pmapped function `{name}` is a def nested in another function"
                raise NotVisible(why, Decline.NOT_A_DEF)
        statement = site.ancestors[-3] if len(site.ancestors) > 3 else None
        if not isinstance(statement, cst.SimpleStatementLine):
            around = site.ancestors[-2] if len(site.ancestors) > 1 else None
            if isinstance(around, cst.Call) and around.func is site.node:
                why = f"the step is called where it is made, `{_short(around)}`"
                if body in self.module.body:  # pmap caches a step of the same def
                    why += (
                        f": made there as `jax.jit(jax.shard_map(...))`, it would be compiled "
                        f"again at every call of `{host.name.value}`, where pmap compiles it once"
                    )
                raise NotVisible(why, Decline.CALLED_WHERE_MADE)
            raise unnamed_step(around, host.name.value, flow.parent)
        assign, factory = statement.body[0], None
        if isinstance(assign, cst.Return) and assign.value is site.node:  # a factory's step
            if (found := self.factory_hosts.get(id(site.node))) is None:
                name = host.name.value
                called = elsewhere(name, self.state.outside, self.survey.strings)
                why = f"the step is returned by `{name}`, " + (
                    f"which is called {called}: those calls are not followed"
                    + _unless_closed(called)
                    if called
                    else f"followed only where `step = {name}(...)`, its one call, is a "
                    "statement of a function calling `step`"
                )
                raise NotVisible(why, Decline.NOT_NAMED)
            factory, (host, made) = (host, statement), found  # read where the factory is called
            statement, skip = flow.parent.get(id(made)), None
            assert isinstance(statement, cst.SimpleStatementLine)
        elif body in self.module.body and (again := self._called_again(host)):
            why = (
                f"the step is made in `{host.name.value}`, which {again}: made there as "
                "`jax.jit(jax.shard_map(...))`, it would be compiled again at each call, where "
                f"pmap compiles a step of `{body.name.value}` once"
            )
            raise NotVisible(why, Decline.MADE_PER_CALL)
        match assign, self._def_scope(host):  # `self.step = jax.pmap(...)`: say what blocks
            case cst.Assign([cst.AssignTarget(cst.Attribute()), *_]), cst.ClassDef() as klass:
                constants = self.survey.constants
                options = options_of(site.node, self.qualname, self._unnamed(), constants)
                blocking = stored_on_self(
                    klass, host, assign, options, body, self.qualname, self.declared
                )
                stored = self.stored_why.get(id(site.node))
                raise stored if stored and blocking.code is Decline.NOT_NAMED else blocking
        facts = self._facts(host)
        details = (host, statement, site.node, body, self.qualname, siblings, facts, skip)
        unnamed = self._unnamed()
        try:
            program = analyze(*details, unnamed, made=made.value if factory else None)
        except NotVisible as why:  # passed to a def of the module: followed there (`_callee`)
            if factory or why.code not in (Decline.NOT_CALLED_ONLY, Decline.CALLED_NESTED):
                raise
            program = follow_passed(why, *details, unnamed, self._called_once)
        if factory is not None:  # the step made where the factory returns it
            program.factory = factory
            if self._visit_only is not None:  # the function calling the step holds no pmap
                self._visit_only |= {id(a) for a in (host, *flow.ancestors(host))}
        return self._checked(program, flow, statement)

    def _opaque_body(self, site: PmapUse, host: cst.FunctionDef, why: str) -> cst.FunctionDef:
        """The body of `step = jax.pmap(f)`, `f` no def of the module (`model.apply`, a partial
        of it, an import) and the axis unnamed: the body cannot name the axis, so it holds no
        collective over it and runs on each device's slice alone, as every device's block of
        the program-level form; read as `def _(x0, ...): return f(x0, ...)`, whose results
        differ between devices when an argument does. Raise NotVisible(`why`) otherwise."""
        assert isinstance(site.node, cst.Call)
        fun = fun_arg(site.node)
        args = enumerate(site.node.args)  # an axis name, by position or keyword
        named = any((a.keyword.value if a.keyword else i) in (1, "axis_name") for i, a in args)
        target = self._bound_to(site)  # `step = <call>`
        if fun is None or named or target is None or isinstance(fun.value, cst.Lambda):
            raise NotVisible(why, Decline.NOT_A_DEF)
        counts = {
            len([a for a in call.args if a.keyword is None])
            for call in nodes_in(host.body, cst.Call)
            if single_name(call.func) == target
        }
        if len(counts) > 1:  # no one arity for the body read from its calls
            passed = " and ".join(str(c) for c in sorted(counts))
            why += f", and its calls pass {passed} arguments: no one body stands for it"
        if len(counts) != 1:
            raise NotVisible(why, Decline.NOT_A_DEF)
        params = [cst.Param(cst.Name(f"x{i}")) for i in range(counts.pop())]
        result = cst.Call(cst.Name(OPAQUE), [cst.Arg(p.name) for p in params])
        block = cst.IndentedBlock([cst.SimpleStatementLine([cst.Return(result)])])
        return cst.FunctionDef(cst.Name(OPAQUE), cst.Parameters(params), block)

    def _called_again(self, host: cst.FunctionDef) -> str | None:
        """How the module calls the function `host` more than once ("`main` calls 2 times",
        "`fit` calls in a loop"), by name, or, a method, as `self.<name>(...)` in its class;
        None when it calls it at most once, outside loops (a public function's other callers
        are not seen). Read from the module's flow: no walk of the module."""
        flow, name = self.module_flow, host.name.value
        klass = self._def_scope(host)
        reads: list[cst.Attribute] | list[cst.Name] = []
        if isinstance(klass, cst.ClassDef):
            reads = [a for a in nodes_in(klass, cst.Attribute) if a.attr.value == name]
        elif klass is None:
            reads = flow.loads.get(name, [])
        calls, looped = list[str](), list[str]()
        for read in reads:
            call = flow.parent.get(id(read))
            if not isinstance(call, cst.Call) or call.func is not read:
                continue
            around = [call, *flow.ancestors(call)]
            fn = next((a for a in around if isinstance(a, cst.FunctionDef)), None)
            caller = f"`{fn.name.value}`" if fn is not None else "the module"
            calls.append(caller)
            inside = takewhile(lambda p: type(p[1]) is not cst.FunctionDef, pairwise(around))
            loops = ((i, o) for i, o in inside if isinstance(o, (cst.For, cst.While)))
            if any(i in (o.body, getattr(o, "test", None)) for i, o in loops):
                looped.append(caller)
        if looped:
            return f"{looped[0]} calls in a loop"
        if len(calls) < 2:
            return None
        callers = " and ".join(sorted(set(calls)))
        return f"{callers} call{'s' if len(set(calls)) == 1 else ''} {len(calls)} times"

    def _called_once(self, callee: cst.FunctionDef, call: cst.Call) -> bool:
        """`callee` is a def of the module read only as the function of `call`, and holds no
        pmap site nor calls a step made at module level: the step passed there is followed
        there (`_callee.follow_passed`)."""
        uses = self.module_flow.loads.get(callee.name.value, [])
        holds = any(callee in around for _, around in self.survey.refs)
        outer = {self._bound_to(s) for s in self.sites.values() if s.scope is None}  # module's
        holds = holds or bool(outer & set(names_in(callee)))  # its calls: another program
        return uses == [call.func] and not holds and callee.name.value not in self.survey.strings

    def _main_host(self, around: Sequence[cst.CSTNode]) -> cst.FunctionDef:
        """The `if __name__ == "__main__":` block at module level `around` (a node's ancestors,
        the module first) is in, read as a def of its body (one per block); else the module's
        statements read so."""
        block = main_block(self.module, around)
        key = id(block if block is not None else self.module)
        if key not in self.main_blocks:
            body = block.body if block is not None else cst.IndentedBlock(body=self.module.body)
            self.main_blocks[key] = cst.FunctionDef(cst.Name("__main__"), cst.Parameters(), body)
        return self.main_blocks[key]

    def _def_scope(self, node: cst.FunctionDef) -> cst.CSTNode | None:
        """The def or class `node` is in, from the scope model (None: at module level, or a
        def the module does not hold, `__main__`'s block read as a def)."""
        made = self.resolver.scope_made_by(node)
        outer = made.parent.node if made is not None and made.parent is not None else None
        return None if isinstance(outer, cst.Module) else outer

    def _decorated_program(self, site: PmapUse, flow: Flow, siblings: tuple[str, ...]) -> Program:
        """The program of a def a pmap decorator makes a step of, in the function calling it."""
        body = site.mapped
        assert isinstance(body, cst.FunctionDef) and isinstance(site.node, cst.Decorator)
        host = self._def_scope(body) or self._main_host(site.ancestors)
        if not isinstance(host, cst.FunctionDef):
            why = _outside_why(host)
            if isinstance(host, cst.ClassDef):
                # the value blocking it in the method calling it, if any
                if (found := decorated_method(self.module, site.node)) is not None:
                    options = self._decorator_options(site.node, body)
                    blocking = stored_on_self(
                        *found, options, body, self.qualname, self.declared, bound=1
                    )
                    if blocking.code is not Decline.NOT_NAMED:
                        raise blocking
                    if (used := self.factory_used.get(id(site.node))) is not None:
                        owner = f"the step is a method of `{found[0].name.value}`"
                        raise NotVisible(f"{owner}, and {used.why}", used.code)
                    # AlgoPerf's workloads: called by a base class's method (`found[1]` is `body`)
                    if (base := self._base_blocking(*found, options)) is not None:
                        raise base
                method = f"`{host.name.value}.{body.name.value}`"
                if any(code(b.value) != "object" for b in host.bases):
                    why += f" ({method}, called as `self.{body.name.value}(...)`, maybe in a base class)"
                else:  # called, if at all, on an instance (jax's `A().my_func_pmap(x)`)
                    why += f" ({method}: no method of its class calls it, and it has no base class)"
            raise NotVisible(why, Decline.MADE_OUTSIDE)
        options = self._decorator_options(site.node, body)
        facts = self._facts(host)
        try:
            program = analyze_decorated(host, body, options, self.qualname, siblings, facts)
        except NotVisible as why:  # `return step` from a factory stored on self: what blocks
            deeper = why.code is Decline.NOT_CALLED_ONLY and returned_into_self(
                self.module, host, options, body, self.qualname, self.declared
            )
            raise deeper or self.factory_used.get(id(site.node)) or why from None
        return self._checked(program, flow, body)

    def _base_blocking(
        self, klass: cst.ClassDef, method: cst.FunctionDef, assign: cst.Assign, options: Options
    ) -> NotVisible | None:
        """What blocks a step a pmap decorator makes of `method` where a base class of `klass` in
        another module of the code base calls it (`self._eval_model(...)` in AlgoPerf's
        `BaseCifarWorkload._eval_model_on_split`), read with that module's names (the step's
        own, where that module does not know one): only to name it. None when nothing there
        blocks: the calls in another module are not rewritten from here (PL104 stands)."""
        for base in klass.bases:
            if (found := self.imported.klass(self.qualname(base.value))) is None:
                continue
            cls, spelled = found

            def names(node: cst.BaseExpression, spelled: Qualname = spelled) -> str | None:
                return spelled(node) or self.qualname(node)

            blocking = stored_on_self(cls, method, assign, options, method, names, bound=1)
            if blocking.code is not Decline.NOT_NAMED:
                where = f"the step is a method of `{klass.name.value}`, called by its base class"
                return NotVisible(f"{where} `{cls.name.value}`: {blocking.why}", blocking.code)
        return None

    def _checked(self, program: Program, flow: Flow, made: cst.CSTNode) -> Program:
        """`program`, made at `made` in its host, once no def of the module reads a global it
        changes; a mesh of pmap's already bound before `made` is reused."""
        host = program.host
        if any(host is block for block in self.main_blocks.values()):  # names: the globals
            _globals_unread(self.module, program, flow)
        passed_on_checked(program, flow, self.state.outside, self.survey.strings)
        scopes: list[cst.BaseSuite | cst.Module] = [host.body, self.module]
        if (mesh := mesh_in_scope(scopes, made, flow, program.axis, self.qualname)) is not None:
            program.mesh, program.make_mesh = mesh, False
        return program

    def _decorated(self, site: PmapUse) -> tuple[cst.FunctionDef, Options]:
        """The def a pmap decorator makes a step of, and the decorator's options; raise
        NotVisible when the def has other decorators."""
        body = site.mapped
        assert isinstance(body, cst.FunctionDef) and isinstance(site.node, cst.Decorator)
        if len(body.decorators) != 1:
            raise NotVisible(DECORATORS, Decline.DECORATORS)
        return body, self._decorator_options(site.node, body)

    def _decorator_options(self, decorator: cst.Decorator, body: cst.FunctionDef) -> Options:
        """Read the options of the pmap decorator on `body`."""
        deco = decorator.decorator
        args = deco.args[1:] if isinstance(deco, cst.Call) else ()
        unnamed, constants = self._unnamed(), self.survey.constants
        name = cst.Name(body.name.value)
        return read_options(args, self.qualname, fun=name, unnamed=unnamed, constants=constants)

    @cached_property
    def declared(self) -> dict[int, Declarable]:
        """By id of a def: its parameters `[tool.jaxmigrate] pmap-replicated` declares
        (`declared_copies`), and those seen (`_copies_seen`); read when first asked."""
        declared = declared_copies(self.module, self.state.pmap_replicated)
        self._copies_seen(declared)
        return declared

    def _copies_seen(self, declared: dict[int, Declarable]) -> None:
        """Add to `declared` the parameters of the module's functions that every call of them
        in the code base passes a replication (`flax.jax_utils.replicate(params)`, `x` bound to
        one on every path): what `pmap-replicated` would declare, seen (a script's evaluation
        function its `main` calls with `replicate(params)`, a notebook's cells calling
        `get_accuracy(params_repl)`). Only where no other module, and no string, may name the
        function."""
        flow = self.module_flow
        defs = {d.name.value: d for d in self.module.body if isinstance(d, cst.FunctionDef)}
        flow_of = cache(lambda fn: Flow(fn, model=self.resolver))  # each function calling them

        def replication(call: cst.Call, value: cst.BaseExpression | None) -> str | None:
            around = list(flow.ancestors(call))
            host = next((a for a in around if isinstance(a, cst.FunctionDef)), None)
            host = host or self._main_host(around[::-1])  # at module level: its statements'
            if value is None:
                return "no value"
            inner = flow_of(host)
            counts = lambda node: is_device_count(node, inner, self.qualname)
            return _replication(inner, Forms(self.qualname, counts, defs), value, self.imported)

        for name, fn in defs.items():
            entry = declared[id(fn)]  # `declared_copies` has each def of the module's body
            if entry.copies or fn.decorators or self.survey.rebound(name):
                continue  # declared, or called through a decorator's wrapper
            if elsewhere(name, self.state.outside, self.survey.strings):
                continue
            uses = [u for u in flow.loads.get(name, []) if not defined(flow, u)]
            parents = [flow.parent.get(id(u)) for u in uses]
            calls = [c for c, u in zip(parents, uses) if isinstance(c, cst.Call) and c.func is u]
            passed = [(c, args) for c in calls if (args := bound_arguments(fn, c)) is not None]
            if not calls or len(calls) != len(uses) or len(passed) != len(calls):
                continue  # read other than called, or called with arguments not visible
            unseen: dict[str, str] = {}  # the first call passing another value, by parameter
            for param in (p.name.value for p in fn.params.params):
                whys = ((c, replication(c, args.get(param))) for c, args in passed)
                if other := next(((c, why) for c, why in whys if why is not None), None):
                    unseen[param] = f"its call `{_short(other[0])}` passes {other[1]}"
            copies = {p.name.value for p in fn.params.params} - set(unseen)
            where = "its call" if len(calls) == 1 else f"each of its {len(calls)} calls"
            seen = f"{where} in the code base passes a replication" if copies else ""
            declared[id(fn)] = replace(entry, copies=frozenset(copies), seen=seen, unseen=unseen)

    def _facts(self, host: cst.FunctionDef | None = None) -> ModuleFacts:
        """The defs of the module that nothing else binds (by name), and those of `host` (the
        function making the step, whose body may be one of them), which hide the module's; its
        names bound once at module level (`Survey.bound_once`) and to strings."""
        found = {
            d.name.value: d
            for d in self.module.body
            if isinstance(d, cst.FunctionDef) and not self.survey.rebound(d.name.value)
        }
        nested = statements(host.body) if host is not None else ()
        found |= {d.name.value: d for d in nested if isinstance(d, cst.FunctionDef)}
        if self.norm_axes is None:
            lines = self.state.original_lines
            own = [self.module] if any(w in line for line in lines for w in NORM_WORDS) else []
            self.norm_axes = averaged_axes([*own, *self.imported.modules(NORM_WORDS)])
        known = (self.survey.bound_once, self.survey.constants, self.imported, self.declared)
        return ModuleFacts(found, *known, self._elsewhere, self.norm_axes)

    def _elsewhere(self, name: str, within: Sequence[cst.FunctionDef]) -> str:
        """Where code other than the defs `within` may use the module's def `name`: another
        function of the module, another module (`elsewhere`); "" when nowhere."""
        flow = self.module_flow
        for use in flow.loads.get(name, []):
            if not any(a in within for a in flow.ancestors(use)) and not defined(flow, use):
                return where_in(flow, use)
        return elsewhere(name, self.state.outside, self.survey.strings)

    def _not_a_def(self, pmap: cst.CSTNode, name: str) -> str:
        """Why the function `pmap` maps is not a def this form reads."""
        fun = fun_arg(pmap) if isinstance(pmap, cst.Call) else None
        value = fun.value if fun is not None else None
        if isinstance(value, cst.Call):
            value = value.args[0].value if value.args else value  # `partial(f, ...)`: f
        if isinstance(value, cst.Lambda):
            return "the pmapped function is a lambda: its calls are followed only for defs"
        if isinstance(value, cst.Attribute):
            return f"the pmapped function `{code(value)}` is an attribute: its body is not visible"
        bindings = self.resolver.bindings(name) if name else []
        if isinstance(value, cst.Name) and (seen := self.resolver.scope_of(value).lookup(name)):
            bindings = seen.bindings[name]  # those the pmap's reference sees, not every scope's
        kinds = {b.kind for b in bindings}
        if kinds == {BindingKind.PARAM}:
            return f"the pmapped function `{name}` is a parameter: the def it is is not visible"
        if kinds == {BindingKind.IMPORT}:
            return f"the pmapped function `{name}` is imported: its body is not read (yet)"
        if len(self.survey.defs(name) if name else []) > 1:
            return f"the pmapped function `{name}` is defined more than once"
        if value is None:
            return "the pmapped function is not a def of this module"
        if len(bindings) == 1 and bindings[0].value is not None:  # `predict = make(...)`
            made = f"`{name} = {_short(bindings[0].value)}`"
            return f"the pmapped function is a value, {made}: its body is not visible"
        bound = " or ".join(sorted(_BOUND.get(k, k.value) for k in kinds)) or "not bound here"
        return f"the pmapped function `{code(value)}` is {bound}, not a def of this module"

    def _mapped_def_name(self, pmap: cst.Call) -> str:
        """Return the name of the def `jax.pmap(f)` or `jax.pmap(partial(f, k=...))` maps."""
        fun = fun_arg(pmap)
        try:
            return mapped_name(fun.value, self.qualname)[0] if fun is not None else ""
        except NotVisible:
            return ""

    def _classify(
        self, ref: cst.BaseExpression, ancestors: tuple[cst.CSTNode, ...]
    ) -> PmapUse | None:
        """Return the site a reference to `jax.pmap` belongs to; None if another covers it."""
        parent = ancestors[-1]
        if isinstance(parent, cst.Call) and parent.func is ref:
            # the `jax.pmap(g)` of `jax.pmap(jax.pmap(g))`: the outer one has it
            inner = len(ancestors) > 2 and self._maps(ancestors[-3], ancestors[-2], PMAP)
            return None if inner else self._call_site(parent, ref, ancestors)
        if isinstance(parent, cst.Decorator):
            return PmapUse(parent, [parent], ref, ancestors, mapped=ancestors[-2])
        if self._maps(ancestors[-2], parent, PARTIAL):
            if isinstance(ancestors[-3], cst.Decorator):
                return PmapUse(ancestors[-3], [ancestors[-3]], ref, ancestors, mapped=ancestors[-4])
            why = "`functools.partial(jax.pmap, ...)` kept as a value: its calls are not visible"
            if (name := assigned_name(ancestors[-3])) in shortcuts_in(self.resolver):
                why = (
                    f"`functools.partial(jax.pmap, ...)` kept: `{name}`, a shortcut for it, is "
                    "read as the `jax.pmap(...)` it makes where it is called in the code base"
                )
            return PmapUse(ref, [], ref, ancestors, skip=why)
        if isinstance(parent, cst.Assign) and parent.value is ref:
            return None  # an alias: the calls through it are sites of their own
        if (axis := called_here(ref, ancestors)) is not None:
            return PmapUse(ref, [], ref, ancestors, value_axis=axis)
        why = "`jax.pmap` passed around as a value: the calls made with it are not visible"
        return PmapUse(ref, [], ref, ancestors, skip=why)

    def _maps(self, node: cst.CSTNode, first: cst.CSTNode, function: str) -> bool:
        """Whether `node` calls `function` (`jax.pmap`, `functools.partial`) with `first` its
        first argument, positional: the function it maps."""
        return (
            isinstance(node, cst.Call)
            and fun_arg(node) is first
            and self.qualname(node.func) == function
        )

    def _call_site(
        self, call: cst.Call, ref: cst.BaseExpression, ancestors: tuple[cst.CSTNode, ...]
    ) -> PmapUse:
        """The site of the pmap `call` (read through `ref`, under `ancestors`): the nested
        pmaps it maps too, and the lambda or def it maps when visible."""
        pmaps: list[cst.Call | cst.Decorator] = [call]
        fun = fun_arg(call)
        while fun is not None and isinstance(fun.value, cst.Call):
            if self.qualname(fun.value.func) != PMAP:
                break
            pmaps.append(fun.value)
            fun = fun_arg(fun.value)
        site = PmapUse(call, pmaps, ref, ancestors, self._visible(fun))
        if len(pmaps) > 2:
            site.skip = "three or more levels of nested pmap"
        return site

    def _visible(self, fun: cst.Arg | None) -> cst.CSTNode | None:
        """Return the lambda, or the one def of this module, that `fun` is."""
        value = fun.value if fun is not None else None
        if not isinstance(value, cst.Name):
            return value if isinstance(value, cst.Lambda) else None
        return self.survey.only_def(value.value)

    def _stack_decorators(self, sites: list[PmapUse]) -> list[PmapUse]:
        """Merge two stacked pmap decorators of one def into one site, a nested pmap."""
        by_def: dict[int, list[PmapUse]] = {}
        for site in sites:
            if isinstance(site.node, cst.Decorator) and isinstance(site.mapped, cst.FunctionDef):
                by_def.setdefault(id(site.mapped), []).append(site)
        for group in (g for g in by_def.values() if len(g) > 1):
            upper, lower = group[0], group[-1]
            assert isinstance(upper.mapped, cst.FunctionDef)
            decorators: list[cst.CSTNode] = list(upper.mapped.decorators)
            upper_at, lower_at = decorators.index(upper.node), decorators.index(lower.node)
            if between := decorators[upper_at + 1 : lower_at]:  # not adjacent, or a third
                name, count = f"`{upper.mapped.name.value}`", len(group)
                others = ", ".join(f"`@{code(d.decorator)}`" for d in between)  # type: ignore[attr-defined]
                why = f"{others} between {name}'s two pmap decorators: only adjacent ones nest"
                if count > 2:
                    why = f"three or more levels of nested pmap ({name}'s {count} decorators)"
                for site in group:
                    site.skip = why
                continue
            upper.pmaps.append(lower.node)  # type: ignore[arg-type]
            sites.remove(lower)
        return sites

    def _mark_nested(self, sites: list[PmapUse]) -> None:
        """Skip pmaps nested across functions or statements: one mesh needs both in view."""
        why = (
            "nested pmap in two statements: only nesting within one expression or def is rewritten"
        )
        for site in sites:
            outer = [s for s in sites if s.mapped in site.ancestors]
            innermost = site.pmaps[-1] if site.pmaps else None
            fun = fun_arg(innermost) if isinstance(innermost, cst.Call) else None
            if fun is not None and isinstance(fun.value, cst.Name):
                scopes = {None, *(id(a) for a in site.ancestors)}
                made = [s for s in sites if self._bound_to(s) == fun.value.value]
                outer += [s for s in made if s.scope in scopes]
            for other in (s for s in outer if s is not site):
                other.skip, site.skip = other.skip or why, site.skip or why

    def _bound_to(self, site: PmapUse) -> str | None:
        """Return the name a site's result is bound to (`f = jax.pmap(g)`, `@jax.pmap def f`)."""
        if isinstance(site.node, cst.Decorator) and isinstance(site.mapped, cst.FunctionDef):
            return site.mapped.name.value
        parent = site.ancestors[-2] if len(site.ancestors) > 1 else None  # [-1] is the call
        return assigned_name(parent)

    def _check_helper_name(self, module: cst.Module, sites: list[PmapUse]) -> None:
        """Reuse the helper of an earlier run; skip everything if the name means another thing."""
        defs = self.survey.defs(HELPER)
        rebound = self.survey.rebound(HELPER)
        ours = [d for d in defs if d in module.body and docstring_of(d) == HELPER_DOC]
        self.reuse_helper = len(defs) == len(ours) == 1 and not rebound
        if (defs or rebound) and not self.reuse_helper:
            for site in sites:
                site.skip = site.skip or f"the name `{HELPER}` is already used in this module"


def _replication(
    flow: Flow, forms: Forms, value: cst.BaseExpression, imported: Imported | None = None
) -> str | None:
    """None when `value`, an argument, is a replication (`replicate(params)`), or a name every
    binding reaching it binds to one, or to a result a pmapped step kept faithful returns as
    equal copies when it is fed its own (`kept_copies`); else what it may be instead."""
    if forms.replicated_source(value) is not None:
        return None
    if not isinstance(value, cst.Name):
        return f"`{_short(value)}`"
    for binding in flow.reach.of(value) or {ENTRY}:
        if not isinstance(binding, cst.Assign):
            return f"`{value.value}` from outside the function or bound otherwise"
        if assigned_name(binding) != value.value:
            if imported is not None and kept_copies(flow, forms, binding, value.value, imported):
                continue
            return f"`{value.value}` bound by `{_short(binding.value)}`"
        if not _binds_replication(forms, binding, value.value):
            return f"`{value.value}` = `{_short(binding.value)}`"
    return None


def _binds_replication(forms: Forms, binding: cst.CSTNode, name: str) -> bool:
    """`name = replicate(x)` (any replication of the table)."""
    if not isinstance(binding, cst.Assign) or assigned_name(binding) != name:
        return False
    return forms.replicated_source(binding.value) is not None


def kept_copies(
    flow: Flow, forms: Forms, binding: cst.Assign, name: str, imported: Imported
) -> bool:
    """`a, b, ... = step(x, y, ...)`, `step` bound once to a call of a factory of the code base
    (vision_transformer's notebook: `update_fn_repl = train.make_update_fn(...)`, returning
    `jax.pmap(update_fn, axis_name="batch")`) and kept per device: True when the body returns
    `name`'s result the same on every device, given which of its arguments are: a replication,
    or a result of this call the body keeps equal, is; anything else differs (the largest such
    set, found by dropping a result fed back that the body makes differ until none is)."""
    target, call = binding.targets[0].target, binding.value
    if not isinstance(target, cst.Tuple) or not isinstance(call, cst.Call):
        return False
    names = [single_name(e.value) if type(e) is cst.Element else None for e in target.elements]
    if name not in names or not isinstance(call.func, cst.Name):
        return False
    if (step := _made_step(flow, forms, call.func, imported)) is None:
        return False
    body, axis, function = step
    if (args := positional(call, len(body.params.params))) is None:
        return False
    fed: dict[int, int] = {}  # argument position -> the result of this call it may be
    mapped: list[bool] = []
    for i, arg in enumerate(args):
        if not isinstance(arg, cst.Name) or arg.value not in names:
            mapped.append(_replication(flow, forms, arg) is not None)
            continue
        reaching = flow.reach.of(arg) or {ENTRY}  # this call (fed back), else replications
        if any(b is binding for b in reaching):
            fed[i] = names.index(arg.value)
        others = [b for b in reaching if b is not binding]
        mapped.append(not all(_binds_replication(forms, b, arg.value) for b in others))
    while True:
        try:
            arity, varying = body_outputs(
                body, mapped, axis, function.qualname, function.defs, imported=imported
            )
        except NotVisible:
            return False
        if arity != len(names):
            return False
        if not (dropped := [i for i, out in fed.items() if varying[out] and not mapped[i]]):
            return not varying[names.index(name)]
        for i in dropped:
            mapped[i] = True


def _made_step(
    flow: Flow, forms: Forms, func: cst.Name, imported: Imported
) -> tuple[cst.FunctionDef, str, Function] | None:
    """The body and axis of the step `func` names: bound once, to a call of a def of another
    module of the code base whose last statement returns `jax.pmap(f, axis_name="...")` of a
    def `f` of its own (read by `options_of`; `in_axes`, static arguments decline)."""
    bindings = list(flow.reach.of(func) or ())
    made = bindings[0].value if len(bindings) == 1 and isinstance(bindings[0], cst.Assign) else None
    function = imported.function(forms.qualname(made.func)) if isinstance(made, cst.Call) else None
    value = _returned(function.fn) if function is not None else None
    if function is None or not isinstance(value, cst.Call) or function.qualname(value.func) != PMAP:
        return None
    try:
        options = options_of(value, function.qualname)
    except NotVisible:
        return None
    plain = options.named and not options.bound and options.in_axes is None
    if not plain or options.statics or not isinstance(options.fun, cst.Name):
        return None  # the body is read with every argument mapped, as passed
    lines = statements(function.fn.body)
    nested = [d for d in lines if isinstance(d, cst.FunctionDef) and d.name.value == options.name]
    if len(nested) != 1 or nested[0].decorators:
        return None
    return nested[0], options.literal, function
