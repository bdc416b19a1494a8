"""The data flow around one pmapped step: `analyze` follows every argument and result of its
calls in the function that makes it, and records the edits of the program-level form."""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import NamedTuple

import libcst as cst

from jaxmigrate.toolkit.cstutil import names_in
from jaxmigrate.toolkit.emit import code
from jaxmigrate.toolkit.imports import is_docstring as _is_docstring

from ._body import MUTATING, Defs, body_outputs, full_reduction, scalar_outputs
from ._declines import DECORATORS, NOT_NAMED, Decline, NotVisible
from ._forms import (
    REPLICATIONS,
    Forms,
    Qualname,
    base_of,
    bound_arguments,
    field_top,
    flattens,
    is_device_count,
    positional,
    readback_around,
    root_name,
    single_name,
    target_names,
)
from ._imported import Function, only_waits_on, waits
from ._inputs import iterated_batches
from ._layout import (
    DONATED_COPY,
    GLOBAL_BATCH,
    HOST_ARRAY,
    KEEPING,
    LOCAL_PART,
    SPLIT_EDIT,
    Layout,
    Match,
    fill,
    holes_of,
    match,
    row_named,
)
from ._passon import (
    DONATED_LATER,
    aliased,
    donated,
    donated_after,
    parameter_for,
    passed_on,
    passed_to,
    sequence_bound,
    surely_replicated,
    surely_stacked,
)
from ._program import COPY, Program
from ._reach import ENTRY, SCOPES, Flow, assigned_name, free_names, nodes_in, params_of, replaced
from ._reach import statements as _statements
from ._readat import at as _at
from ._readat import not_read_back, read_at_once, readers
from ._readat import short as _short
from ._specs import PARTIAL, TAIL_BUILTINS, Options, options_of, tail_fits, unbound
from ._summary import NO_FACTS, NOT_DECLARABLE, ModuleFacts, name_reads

GET_METRICS = (row_named("get_metrics"),)
MEANS = (row_named("cross_device_mean"),)
ENTRY_ONLY = frozenset({ENTRY})
# Two expressions: a node and what it becomes (a readback deleted, a split's flat source), or
# a value and the part of the devices it is stacked over
_Pair = tuple[cst.BaseExpression, cst.BaseExpression]


@dataclass
class _StepCall:
    """One `out = step(args)` statement."""

    assign: cst.CSTNode  # the `out = step(...)` assignment, or the `step(...)[0]` around it
    call: cst.Call
    targets: list[str]  # the names results are bound to, by output position
    values: list[cst.BaseExpression]  # the values passed, by parameter of the step
    readback: cst.BaseExpression | None = None  # `step(...)[0]`, the call read back at once
    read: tuple[int, ...] = ()  # where the value left is in `readback` (`_at`)
    unpack: cst.Assign | None = None  # `a, b = out` next, `out` read nowhere else: binds a, b

    def binds(self, binding: cst.CSTNode) -> bool:
        """Return True for the binding of this call's results."""
        return binding is self.assign or binding is self.unpack


def analyze(
    host: cst.FunctionDef,
    statement: cst.SimpleStatementLine,
    pmap: cst.Call,
    body: cst.FunctionDef,
    qualname: Qualname,
    siblings: tuple[str, ...] = (),
    facts: ModuleFacts = NO_FACTS,
    local: cst.CSTNode | None = None,
    unnamed: cst.BaseExpression | None = None,
    made: cst.BaseExpression | None = None,
) -> Program:
    """Return the program of a step made by `statement` in `host`; raise NotVisible for why not.
    `local`: the def of `host` itself, or the lambda, that `body` is (its inside is the body's,
    not the host's flow). `made`: `factory(...)`, when `statement` is `step = factory(...)` and
    a def of the module returns `pmap` (`_survey._program`, at the function calling the factory).

    `siblings` are the other steps the function makes: results fed from one to another are
    replicated on both sides (each side checks its own: a result differing between devices is
    read only flattened, an argument fed a result is not a batch). `facts`: the module's
    functions by name, which the body may call, its names bound to calls and strings."""
    assign = statement.body[0]
    value = pmap if made is None else made
    if len(statement.body) != 1 or not isinstance(assign, cst.Assign) or assign.value is not value:
        raise NotVisible(NOT_NAMED, Decline.NOT_NAMED)
    step = single_name(assign.targets[0].target) if len(assign.targets) == 1 else None
    if step is None:
        raise unnamed_step(assign, host.name.value)
    options = options_of(pmap, qualname, unnamed, facts.constants)
    flow = Flow(host, skip=local)
    assert id(statement) in flow.parent  # `host` is the def around the site, not the body
    _check_own_name(host, step)
    own = local if isinstance(local, cst.FunctionDef) and local.name.value == step else None
    if [s for s in flow.stores.get(step, []) if s is not own] != [assign]:
        raise _rebound(step, host)
    program = analyze_calls(
        host, step, options, body, qualname, facts, None, siblings, flow=flow, maker=assign, own=own
    )
    program.statement = statement
    if local is not None:
        _check_closure(program, body, flow)
    return program


def _check_own_name(host: cst.FunctionDef, step: str) -> None:
    """Raise NotVisible if `host` declares `step` `global` or `nonlocal`: the step is then a
    name of the module (or of the enclosing def), which other functions may call with stacked
    values."""
    kind: type[cst.Global | cst.Nonlocal]
    for word, kind in (("global", cst.Global), ("nonlocal", cst.Nonlocal)):
        for statement in nodes_in(host.body, kind, SCOPES):
            if step in {item.name.value for item in statement.names}:
                why = f"`{step}` is declared `{word}` in `{host.name.value}`"
                why += ": its uses elsewhere are not followed"
                raise NotVisible(why, Decline.USED_OUTSIDE)


def _rebound(step: str, host: cst.FunctionDef) -> NotVisible:
    """Return why a step bound more than once in `host` is not followed."""
    return NotVisible(f"`{step}` is bound more than once in `{host.name.value}`", Decline.REBOUND)


def analyze_decorated(
    host: cst.FunctionDef,
    body: cst.FunctionDef,
    options: Options,
    qualname: Qualname,
    siblings: tuple[str, ...] = (),
    facts: ModuleFacts = NO_FACTS,
) -> Program:
    """Return the program of a step a pmap decorator makes of `body`, a def in `host` that
    calls it; raise NotVisible for why not."""
    if len(body.decorators) != 1:
        raise NotVisible(DECORATORS, Decline.DECORATORS)
    step = body.name.value
    flow = Flow(host, skip=body)
    _check_own_name(host, step)
    if flow.only(step) is None:
        raise _rebound(step, host)
    program = analyze_calls(
        host, step, options, body, qualname, facts, siblings=siblings, flow=flow, maker=body
    )
    program.statement = body
    if program.squeezed:
        why = f"`{step}` gets per-device keys: a decorator cannot take its own key"
        raise NotVisible(why, Decline.KEYS_OUTSIDE)
    keywords_in_place(program, body, step)
    program.keywords_bound = True  # the def takes the keyword arguments by position itself
    _check_closure(program, body, flow)
    return program


def keywords_in_place(program: Program, body: cst.FunctionDef, step: str) -> None:
    """A decorated step's calls pass their keyword arguments by position: they must fill the
    same parameters (none left out before one passed by keyword)."""
    names = [p.name.value for p in body.params.params]
    if program.keywords and names[: len(program.params)] != program.params:
        raise _call_differs(step, "passes by keyword a parameter after one it leaves out")


def _call_differs(step: str, how: str) -> NotVisible:
    """Why the calls of `step` are not followed: a call of it `how`, unlike the others or the
    body's parameters."""
    return NotVisible(f"a call of `{step}` {how}", Decline.CALLS_DIFFER)


def _check_closure(program: Program, body: cst.FunctionDef, flow: Flow) -> None:
    """A body nested in the function reads the function's names when traced: none of them may
    be a value the rewrite lays out anew (an argument or a result of the step)."""
    args = [arg.value for call in program.calls for arg in call.args]
    changed = {name for arg in args for name in names_in(arg) if name in flow.stores}
    # what `out = step(...)` binds (a caller's stand-in call, laying out an argument it passes,
    # `_callee.laid_out_in_caller`, binds nothing)
    for call in program.calls:
        around = flow.parent.get(id(call))
        if isinstance(around, cst.Assign) and len(around.targets) == 1:
            changed |= set(target_names(around.targets[0].target))
    if hit := free_names(body) & changed:
        why = (
            f"the body reads `{min(hit)}` of `{program.host.name.value}` itself, which the step "
            "is passed or returns: its layout changes"
        )
        raise NotVisible(why, Decline.CLOSURE)


def analyze_calls(
    host: cst.FunctionDef,
    step: str,
    options: Options,
    body: cst.FunctionDef,
    qualname: Qualname,
    facts: ModuleFacts = NO_FACTS,
    given: Callable[[Program, str, int], Layout] | None = None,
    siblings: tuple[str, ...] = (),
    methods: tuple[str, ...] = (),
    carried: bool = False,
    outer: Flow | None = None,
    flow: Flow | None = None,
    maker: cst.Assign | cst.FunctionDef | None = None,
    own: cst.FunctionDef | None = None,
) -> Program:
    """Return the program of `host`, a function calling `step`, a step made outside it (at
    module level or by a decorator, or passed to it: `given` then lays out the parameters it
    reads, and, `carried`, the caller follows what it returns, `_callee.py`; `siblings` its
    parameters bound to other steps; `methods`, functions it calls that are followed on their
    own, their arguments checked there, their results no step's; `outer`, the flow of the
    function `host` is nested in): every argument and result of its calls followed; raise
    NotVisible for why not. A step `host` makes comes with its `flow` and `maker`, what makes
    it (`analyze`); `own`: the def `step = jax.pmap(step, ...)` maps (brax's trainers), whose
    reads, the pmap's own, are not the step's: a read that either may reach is not followed."""
    if flow is None:
        flow = Flow(host, outer=outer)
        if step in flow.stores:
            raise NotVisible(f"`{step}` is bound in `{host.name.value}` too", Decline.REBOUND)
    body = unbound(body, options.bound)
    uses = flow.loads.get(step, [])
    if own is not None:  # a read in a nested function is the step's: it declines PL203 below
        reached = [flow.reach.of(use) if not _nested(flow, use) else frozenset() for use in uses]
        if any(own in r and len(r) > 1 for r in reached):
            why = f"a read of `{step}` may be the def or the step made of it"
            raise NotVisible(why, Decline.REBOUND)
        uses = [use for use, r in zip(uses, reached, strict=True) if own not in r]
    uses = [use for use in uses if not _identity_read(flow, use)]
    made = [_call_of(flow, use, step, host.name.value) for use in uses]
    if not made:
        raise NotVisible(f"`{step}` is not called in `{host.name.value}`", Decline.NOT_CALLED)
    if options.tail is not None and any(b in flow.stores or b in facts.defs for b in TAIL_BUILTINS):
        why = "`static_broadcasted_argnums` is read with a builtin this module binds again"
        raise NotVisible(why, Decline.OPTION)
    body, passed, keywords = _signature(body, made, step, options.tail)
    arity = len(body.params.params)
    fixed = _fixed_positions(options, passed)
    forms = forms_of(flow, qualname, facts)
    # a call in a nested def or lambda runs when that is called: not followed
    inner = next((n for c in made if (n := _nested(flow, c)) is not None), None)
    if inner is not None:
        where = f" `{inner.name.value}`" if isinstance(inner, cst.FunctionDef) else ""
        why = f"`{step}` is called in a nested function{where}"
        raise NotVisible(why, Decline.CALLED_NESTED)
    for made_call in made:
        _mean_of_unknown(flow, forms, made_call, step, host)
    calls = [_step_call(flow, forms, call, step, body) for call in made]
    program = Program(host, None, options.fun, options.axis, options.donate, [False] * arity, None)
    program.unnamed, program.fixed, program.statics = not options.named, fixed, options.statics_arg
    program.tail = options.tail[1] if options.tail is not None else None
    program.params = [p.name.value for p in body.params.params]
    program.keywords, program.given, program.carries = keywords, given, carried
    entry = facts.replicated.get(id(host), NOT_DECLARABLE)
    program.declared, program.spelling, program.seen = entry.copies, entry.spelling, entry.seen
    program.unseen = entry.unseen
    program.helpers, program.made = helpers_of(flow, qualname), maker
    program.calls = [c.call for c in calls]
    _keyword_calls(program, calls, keywords)
    sibling_calls(program, flow, siblings, facts.defs, methods)
    site = _Site(program, flow, forms, calls)
    for position in range(arity):
        if position not in fixed:
            _follow_argument(site, position)
    if program.squeezed or keywords:
        _check_lambda(program, flow)
    assumed: set[str] = set()
    program.outputs, program.varying = body_outputs(
        body,
        program.batches,
        options.literal,
        qualname,
        facts.defs,
        options.spellings,
        facts.imported,
        facts.norm_axes,
        assumed,
    )
    program.assumed = tuple(sorted(assumed))
    read = set().union(*program.arithmetic.values())
    targets = [(i, name) for c in calls for i, name in enumerate(c.targets)]
    if combined := [name for i, name in targets if name in read and program.varying[i]]:
        why = f"`{combined[0]}`, a result of `{step}` that may differ between devices, is "
        raise NotVisible(why + "combined into an argument of the step", Decline.RESULT_VARIES)
    wanted = 1 if program.outputs is None else program.outputs
    for call in calls:
        if call.readback is None and len(call.targets) != wanted:
            why = f"a call of `{step}` binds its results other than one name each"
            raise NotVisible(why, Decline.RESULTS_UNNAMED)
        if call.readback is not None:
            indexed = isinstance(call.readback, cst.Subscript)  # `[0]` of a tuple: its first
            if any(program.varying) or program.outputs is not None and indexed:
                why = f"`{step}(...)[0]` of a tuple or of a per-device result"
                raise NotVisible(why, Decline.RESULTS_UNNAMED)
            # `step(...)[0]` -> `step(...)`, `unreplicate(step(...))` -> `step(...)`
            why = f"a readback of device 0 deleted: `{step}`'s result is replicated"
            program.rewrite(call.readback, why, lambda updated, at=call.read: _at(updated, at))  # type: ignore[misc]
        for output, name in enumerate(call.targets):
            _follow_result(site, step, name, output)
    # every read accepted: a result flattened (or not read) still needs an axis to lie on
    for output, value in sorted(scalar_outputs(body, qualname).items()):
        if program.varying[output]:
            which = "the step's result" + ("" if program.outputs is None else f" {output + 1}")
            why = (
                f"{which}, `{_short(value)}`, may differ between devices and is one number per "
                f"device: the program-level form has no axis to lay them side by side on "
                f"(`out_specs=P({code(program.axis)})` needs one)"
            )
            raise NotVisible(why, Decline.RESULT_VARIES)
    return program


def sibling_calls(
    program: Program,
    flow: Flow,
    siblings: tuple[str, ...],
    defs: Defs,
    methods: tuple[str, ...] = (),
) -> None:
    """Record the calls of the other steps `siblings` of the function: the statements binding
    their results and the values they are passed (fed to those steps: checked there), also
    through a def of the module a sibling is passed to (`passed_feeds`); of `methods`, calls
    followed on their own, only the values passed (their results are no step's)."""
    for sibling in (*siblings, *methods):
        for use in flow.loads.get(sibling, []):
            other = flow.parent.get(id(use))
            if isinstance(other, cst.Call) and other.func is use:
                program.sibling_feeds |= {id(a.value) for a in other.args}
                if sibling not in methods:
                    program.siblings.add(id(flow.parent.get(id(other))))
            else:
                program.sibling_feeds |= passed_feeds(flow, use, defs)


def passed_feeds(flow: Flow, use: cst.Name, defs: Defs) -> set[int]:
    """The ids of the caller's arguments that the def a step is passed to (`use`) only passes
    on to that step, `callee(p_step=use, params=state.params)` -> `state.params` when `params` is
    read in the callee only in calls of `p_step`: the step's own program lays them out."""
    if (found := passed_to(flow, use, defs)) is None:
        return set()
    _, callee, param, args = found
    inner = Flow(callee)
    fed = set()
    for name, value in args.items():
        reads = inner.loads.get(name, [])
        if name != param and reads and all(_passed_to_step(inner, r, param) for r in reads):
            fed.add(id(value))
    return fed


def _passed_to_step(flow: Flow, use: cst.Name, step: str) -> bool:
    """`step(..., use.field, ...)`: `use` (or a field of it) is an argument of a call of `step`."""
    found = flow.passed(field_top(flow, use))
    return found is not None and single_name(found[1].func) == step and not found[0].star


def helpers_of(flow: Flow, qualname: Qualname) -> set[str]:
    """The names the function binds once to the number of devices or a lambda (a replicating
    one), and reads: their binding goes when the rewrite leaves them unread."""
    return {
        name
        for name in flow.stores
        if (value := value_of_name(flow.only(name), name)) is not None
        and flow.loads.get(name)
        and (isinstance(value, cst.Lambda) or is_device_count(value, flow, qualname))
    }


def forms_of(flow: Flow, qualname: Qualname, facts: ModuleFacts) -> Forms:
    """The known forms (replications, splits, readbacks) as `flow`'s function spells them."""
    return Forms(
        qualname,
        lambda node: is_device_count(node, flow, qualname),
        {name: d for name, d in facts.defs.items() if name not in flow.stores},
        # the lambda `name` is bound to, when that is its only binding in the function
        lambda name: value if isinstance(value := flow.value(name), cst.Lambda) else None,
        bound={name: v for name, v in facts.values.items() if name not in flow.stores},
        imported=facts.imported,
        elsewhere=facts.elsewhere,
    )


def lambda_def(fun: cst.Lambda) -> cst.FunctionDef:
    """`lambda x: e` as the def `def _(x): return e`, for the body's analysis."""
    body = cst.IndentedBlock([cst.SimpleStatementLine([cst.Return(fun.body)])])
    return cst.FunctionDef(cst.Name("_"), fun.params, body)


def _fixed_positions(options: Options, arity: int) -> dict[int, str]:
    """Return the positions not mapped: `in_axes` None ("none") and static ones ("static")."""
    fixed = {i: "static" for i in options.statics}
    if any(i >= arity or i < 0 for i in fixed):
        why = "`static_broadcasted_argnums` names an argument the calls do not pass by position"
        raise NotVisible(why, Decline.OPTION)
    axes = options.in_axes
    if axes is None or isinstance(axes, cst.Integer) and axes.value == "0":
        return fixed  # `in_axes=0`: every argument mapped, as by default
    items = [e.value for e in axes.elements] if isinstance(axes, cst.Tuple) else None
    # pmap reads the entries of the arguments not static only (`in_axes[i]`): static ones at
    # the end may have none, `in_axes=(None, 0, None)` for `f(w, x, lr, scale)`, `scale` static
    dynamic = [i for i in range(arity) if i not in fixed]
    covered = items is not None and max(dynamic, default=-1) < len(items) <= arity
    if items is None or len(items) != arity and not (fixed and covered):
        raise NotVisible("`in_axes` is not a tuple with one entry per argument", Decline.OPTION)
    for i, item in enumerate(items):
        if isinstance(item, cst.Name) and item.value == "None":
            fixed.setdefault(i, "none")
        elif not (isinstance(item, cst.Integer) and item.value == "0"):
            why = f"an `in_axes` entry other than 0 or None, `{_short(item)}`"
            if isinstance(item, (cst.Dict, cst.Tuple, cst.List)):  # a pytree of axes
                why += ": axes given leaf by leaf are not read (one 0 or None for the argument)"
            raise NotVisible(why, Decline.OPTION)
    return fixed


def _nested(flow: Flow, node: cst.CSTNode) -> cst.FunctionDef | cst.Lambda | None:
    """The innermost def or lambda of the function `node` is in, else None."""
    kinds = (cst.FunctionDef, cst.Lambda)
    return next((a for a in flow.ancestors(node) if isinstance(a, kinds)), None)


def _call_of(flow: Flow, use: cst.Name, step: str, host: str) -> cst.Call:
    """The call `step(...)` that `use` is the function of; raise NotVisible for any other use."""
    call = flow.parent.get(id(use))
    if not isinstance(call, cst.Call) or call.func is not use:
        why = f"`{step}` is used other than called: {_goes(call, flow.parent, host)}"
        raise NotVisible(why, Decline.NOT_CALLED_ONLY)
    return call


_IDENTITY = (cst.In, cst.NotIn, cst.Is, cst.IsNot)


def _identity_read(flow: Flow, use: cst.Name) -> bool:
    """`use` reads the step only as an object: `step not in self._compiled`, `step is other`,
    `self._compiled.add(step)` (big_vision's image-text evaluators log each step's first
    compilation so). The rewrite keeps one object per step: these read the same."""
    around = flow.parent.get(id(use))
    if isinstance(around, cst.Comparison) and around.left is use:
        return all(isinstance(t.operator, _IDENTITY) for t in around.comparisons)
    if isinstance(around, cst.ComparisonTarget):
        return isinstance(around.operator, (cst.Is, cst.IsNot))
    call = flow.parent.get(id(around)) if isinstance(around, cst.Arg) else None
    spelled = ("{s}.add({x})", "{s}.discard({x})")
    return isinstance(call, cst.Call) and any(holes_of(t, call) is not None for t in spelled)


def unnamed_step(around: cst.CSTNode | None, host: str, parents: dict | None = None) -> NotVisible:
    """Why a step made other than by `name = jax.pmap(...)` is not followed: where it goes."""
    if isinstance(around, cst.Assign) and len(around.targets) == 1:
        target = around.targets[0].target
        if isinstance(target, cst.Attribute):
            why = (
                f"the step is stored in the attribute `{_short(target)}`: its calls (in other "
                "methods, maybe through other objects) are not followed"
            )
            return NotVisible(why, Decline.NOT_NAMED)
    if around is None or isinstance(around, cst.Assign):
        return NotVisible(NOT_NAMED, Decline.NOT_NAMED)
    return NotVisible(f"the step is {_goes(around, parents or {}, host)}", Decline.NOT_NAMED)


def _goes(around: cst.CSTNode | None, parents: dict, host: str) -> str:
    """Where a step used as a value goes, from the node around it: returned, passed, stored."""
    if isinstance(around, cst.Element):  # `return step, other`: the tuple's place
        around = parents.get(id(parents.get(id(around))))
    if isinstance(around, cst.Return):
        return f"returned by `{host}`: its callers' calls are not followed"
    call = parents.get(id(around)) if isinstance(around, cst.Arg) else None
    if isinstance(call, cst.Call):
        return f"passed to `{_short(call.func)}(...)`: what that does with it is not followed"
    if isinstance(around, cst.Assign) and len(around.targets) == 1:
        return f"bound to `{_short(around.targets[0].target)}` as well"
    if isinstance(around, cst.BaseExpression):  # `step not in self._compiled`: what reads it
        return f"read in `{_short(around)}`"
    return "used as a value"


def _signature(
    body: cst.FunctionDef,
    calls: list[cst.Call],
    step: str,
    tail: tuple[int, cst.BaseExpression] | None = None,
) -> tuple[cst.FunctionDef, int, tuple[str, ...]]:
    """Return the body as its calls fill it, how many arguments they pass by position, and the
    parameters they fill by keyword (in the def's order).

    Every call must fill the same parameters: the first k by position, and some others by
    keyword (pmap maps keyword arguments over their leading axis, as `in_axes=0`). The body
    returned takes exactly those parameters (positional ones first, then the keyword ones),
    without defaults; a parameter no call fills keeps its default, the same on every device.
    With a static `tail` (`f(a, ..., *args)`, every star argument static), the calls pass the
    def's `k` parameters by position and then anything (`*choice`): those go through as they
    are, and the body returned takes the `k`.
    """
    params = body.params
    others = params.star_kwarg or params.posonly_params or params.kwonly_params
    if tail is not None and tail_fits(params, tail[0]) and not others:
        for call in calls:
            head = list(itertools.takewhile(lambda a: not a.star and a.keyword is None, call.args))
            if len(head) != tail[0] or any(a.keyword is not None for a in call.args):
                raise _call_differs(step, f"passes other than its {tail[0]} named arguments first")
        return body.with_changes(params=cst.Parameters(params=params.params)), tail[0], ()
    extra = isinstance(params.star_arg, cst.Param)  # `*args` (a bare `*` takes nothing)
    if extra or params.star_kwarg or params.posonly_params:
        why = "the body takes `*args`, `**kwargs` or positional-only parameters"
        raise NotVisible(why, Decline.SIGNATURE)
    if any(a.star for call in calls for a in call.args):
        raise _call_differs(step, "unpacks its arguments (`*` or `**`)")
    # how many by position (before any keyword: syntax), which by keyword
    keyed = [[a.keyword.value for a in c.args if a.keyword] for c in calls]
    filled = {(len(c.args) - len(k), frozenset(k)) for c, k in zip(calls, keyed, strict=True)}
    if len(filled) != 1:
        why = f"the calls of `{step}` pass different arguments (by position or keyword)"
        raise NotVisible(why, Decline.CALLS_DIFFER)
    count, keywords = filled.pop()
    order = [*params.params, *params.kwonly_params]
    if count > len(params.params):
        raise _call_differs(step, "passes more arguments than the body takes")
    names = [p.name.value for p in order]
    if any(k not in names[count:] for k in keywords):
        raise _call_differs(step, "passes a keyword the body does not take")
    taken = [*params.params[:count], *(p for p in order[count:] if p.name.value in keywords)]
    if missing := [p.name.value for p in order if p.default is None and p not in taken]:
        raise _call_differs(step, f"does not pass `{missing[0]}`")
    bare = cst.MaybeSentinel.DEFAULT
    plain = [p.with_changes(default=None, equal=bare, comma=bare, star=bare) for p in taken]
    view = body.with_changes(params=cst.Parameters(params=plain))
    return view, count, tuple(p.name.value for p in taken[count:])


def _step_call(
    flow: Flow, forms: Forms, call: cst.Call, step: str, body: cst.FunctionDef
) -> _StepCall:
    """Return `call` as a `_StepCall`: the values it passes by parameter of `body`, the names
    its results are bound to (or its readback at once); raise NotVisible for any other form."""
    around = flow.parent.get(id(call))
    named = [a for a in call.args if not a.star]  # a static tail's star arguments: not the body's
    slots = bound_arguments(body, call.with_changes(args=named))  # each call fills `body`
    assert slots is not None
    values = [slots[p.name.value] for p in body.params.params]
    if not isinstance(around, cst.Assign) or len(around.targets) != 1:
        # `step(...)[0]`, `unreplicate(step(...))`
        if (found := read_at_once(flow, forms, call)) is not None:
            return _StepCall(found[0], call, [], values, readback=found[0], read=found[1])
        raise not_read_back(flow, call, step)
    targets = target_names(around.targets[0].target)
    if "?" in targets:
        why = f"a result of `{step}` is not bound to a plain name"
        raise NotVisible(why, Decline.RESULTS_UNNAMED)
    unpack = _unpacked_next(flow, around, targets)
    if unpack is not None:  # the results are bound where `out` is unpacked
        targets = target_names(unpack.targets[0].target)
    return _StepCall(around, call, targets, values, unpack=unpack)


def _check_lambda(program: Program, flow: Flow, calls: list[cst.Call] | None = None) -> None:
    """The body is called from a lambda (`lambda x, k: f(x, k[0], lr=lr)`): its parameters must
    not hide a name the call reads, and a value `partial` bound, now read when the step is
    traced (at its `calls`, or where they are made from), must be the one it bound: the
    bindings reaching the calls are those reaching the step's making."""
    if clash := set(program.params) & free_names(program.body):
        why = f"the step's parameter `{min(clash)}` is also a name in the mapped function"
        raise NotVisible(why, Decline.SIGNATURE)
    fun = program.body
    if not isinstance(fun, cst.Call) or program.made is None:
        return  # made at module level: a function rebinds a global only with `global`
    made = flow.reach.before(program.made)
    names = [name for arg in fun.args[1:] for name in sorted(names_in(arg.value))]
    for name, call in itertools.product(names, program.calls if calls is None else calls):
        at = flow.reach.before(flow.statement(call))
        if at.get(name, ENTRY_ONLY) != made.get(name, ENTRY_ONLY):
            why = f"`{name}`, which `partial` binds, is bound again after the step is made"
            raise NotVisible(why, Decline.SIGNATURE)


def _made_before(program: Program, flow: Flow, binding: cst.CSTNode) -> bool:
    """Whether the step is made on every path to `binding` (the mesh exists there)."""
    made = program.made
    if made is None:
        return True
    name = made.name if isinstance(made, cst.FunctionDef) else made.targets[0].target
    assert isinstance(name, cst.Name)
    return flow.reach.before(flow.statement(binding)).get(name.value) == {made}


def _keyword_calls(program: Program, calls: list[_StepCall], keywords: tuple[str, ...]) -> None:
    """Record the edit of each call passing keyword arguments: passed by position instead."""
    for call in calls if keywords else ():
        named = [a for a in call.call.args if a.keyword is not None]
        order = [a.keyword.value for a in named if a.keyword is not None]
        simple = all(root_name(a.value) for a in named)  # names, or their fields
        if order != list(keywords) and not simple:
            why = "keyword arguments computed in another order than the parameters they fill"
            raise NotVisible(why, Decline.CALLS_DIFFER)
        why = (
            f"keyword arguments passed by position ({', '.join(f'`{k}`' for k in keywords)}): "
            "`jax.shard_map` takes positional arguments only"
        )
        program.rewrite(call.call, why, lambda updated: positional_call(updated, keywords))  # type: ignore[arg-type]


def positional_call(call: cst.Call, keywords: tuple[str, ...]) -> cst.Call:
    """`step(a, b, k=c)` -> `step(a, b, c)`: the keyword arguments passed by position, in the
    order of `keywords` (`jax.shard_map` takes positional arguments only)."""
    plain = [a for a in call.args if a.keyword is None]
    by_keyword = {a.keyword.value: a for a in call.args if a.keyword is not None}
    bare = cst.MaybeSentinel.DEFAULT
    moved = [by_keyword[k].with_changes(keyword=None, equal=bare) for k in keywords]
    args = [*plain, *moved]  # every argument moved: each keeps the comma of its place
    args = [a.with_changes(comma=c.comma) for a, c in zip(args, call.args, strict=True)]
    return call.with_changes(args=args)


def _unpacked_next(flow: Flow, assign: cst.Assign, targets: list[str]) -> cst.Assign | None:
    """`a, b = out` as the next statement, `out` bound and read nowhere else (AlgoPerf's
    `outputs = step(...)` then `new_state, loss = outputs`): the results are bound to `a, b`."""
    line = flow.parent.get(id(assign))
    block = flow.parent.get(id(line))
    if len(targets) != 1 or not isinstance(line, cst.SimpleStatementLine) or len(line.body) != 1:
        return None
    lines = list(block.body) if isinstance(block, cst.IndentedBlock) else []
    following = next((b for a, b in itertools.pairwise(lines) if a is line), None)
    if not isinstance(following, cst.SimpleStatementLine) or len(following.body) != 1:
        return None
    unpack = following.body[0]
    if not isinstance(unpack, cst.Assign) or len(unpack.targets) != 1:
        return None
    target = unpack.targets[0].target
    names = target_names(target) if isinstance(target, (cst.Tuple, cst.List)) else ["?"]
    if single_name(unpack.value) != targets[0] or "?" in names or targets[0] in names:
        return None
    stores, loads = flow.stores.get(targets[0], []), flow.loads.get(targets[0], [])
    return unpack if len(stores) == 1 and len(loads) == 1 and loads[0] is unpack.value else None


class _Site(NamedTuple):
    """What following an argument or a result reads throughout: the step's program, the flow of
    the function calling it, the forms that function spells, the step's calls there."""

    program: Program
    flow: Flow
    forms: Forms
    calls: list[_StepCall]


def _follow_argument(site: _Site, position: int) -> None:
    """Lay out the argument at `position`: the join of the layouts of the bindings that reach
    each call (a binding of the plain value that `x = replicate(x)` then stacks reaches no
    call: not counted)."""
    program, flow, forms, calls = site
    # One per value reaching a call: its layout, and whether it is drawn from an iterator not
    # seen into (`_drawn`)
    reached: list[tuple[Layout, bool]] = []
    fields = False  # a field of a name passed, `step(state.params)`: laid out as the name is
    blocking: list[str] = []  # the values whose layout is not known, and where they come from
    # Those that are parameters of the host a `pmap-replicated` entry can name: by text, the name
    declarable: dict[str, str] = {}
    classified: dict[int, Layout] = {}  # by id of a binding: its layout (its edit recorded once)
    slots: list[cst.Name] = []  # each name passed, or whose field is (`state.params`)
    through: set[int] = set()  # by id: the unpackings of a tuple followed to its part

    for call in calls:
        value = call.values[position]
        leaves: list[cst.BaseExpression] | None = [value]
        if root_name(value) is None:
            layout = _inline_kind(site, value, position)
            if layout is Layout.UNKNOWN and _generated_batches(site, position):
                layout = Layout.PER_DEVICE
            leaves = _leaves(forms, value) if layout is Layout.UNKNOWN else None
        if leaves is None:
            if unknown := layout is Layout.UNKNOWN:
                _check_part(forms, value)
                blocking.append(f"`{_short(value)}`")
            # `np.asarray(batch["mask"])` passed as it is: computed from a name drawn on every path
            root = _derived_from(value) if unknown else None
            reached.append((layout, root is not None and _drawn_everywhere(root, flow)))
        for leaf in leaves or ():  # `{"params": params}`: each value laid out as passed alone
            if (root := root_name(leaf)) is None:
                layout = _inline_kind(site, leaf, position)
                reached.append((layout, False))
                blocking += [f"`{_short(leaf)}`"] if layout is Layout.UNKNOWN else []
            else:
                fields = fields or root is not leaf
                slots.append(root)
    for use in slots:
        name = use.value
        reaching = flow.reach.of(use) or {ENTRY}  # the bindings whose value it may be
        parameter = name in flow.params
        for binding in reaching:
            if binding is ENTRY and program.given and parameter:
                given = program.given(program, name, position)  # the caller's argument
                reached.append((given, False))
                program.entries[name] = given
            elif binding is ENTRY and parameter and name in program.declared:
                reached.append((Layout.REPLICAS, False))
                program.entries[name] = Layout.REPLICAS  # its other reads are followed too
                _declared_copies(program, name)
            elif binding is ENTRY:
                host = program.host.name.value
                where = f"a parameter of `{host}`" + ("" if parameter else " or a global")
                if not parameter and len(reaching) > 1:  # bound in the function, not always
                    where = f"not bound on every path in `{host}` to the call"
                if host == "__main__":
                    where = "a global bound outside the `__main__` block"
                reached.append((Layout.UNKNOWN, False))
                blocking.append(f"`{name}`, {where}")
                if parameter and program.spelling and host != "__main__":
                    declarable[blocking[-1]] = name
            elif (part := _unpacked_part(binding, name, forms)) is not None:
                if id(binding) not in through:  # a loop back through it adds nothing
                    through.add(id(binding))
                    slots.append(part)
            else:
                layout = classified.get(id(binding)) or _binding_kind(site, binding, name, position)
                feeds = {id(c.values[position]) for c in calls}
                if layout is Layout.UNKNOWN and iterated_batches(
                    program, flow, forms, binding, name, feeds
                ):
                    layout = Layout.PER_DEVICE  # an input iterator a def of the module makes
                classified[id(binding)] = layout
                if unknown := layout is Layout.UNKNOWN:
                    if isinstance(binding, cst.Assign):
                        _check_part(forms, binding.value, name)
                    blocking.append(_binding_text(name, binding, flow, forms.qualname))
                reached.append((layout, unknown and _drawn(binding, name, flow)))
    layouts = [layout for layout, _ in reached]
    if layouts and all(drawn for _, drawn in reached) and position not in program.fixed:
        _convert_drawn(site, position, blocking)
        return
    if fields and Layout.KEYS in layouts:
        layouts.append(Layout.UNKNOWN)  # the keys of one device are a key array, not fields
    joined = functools.reduce(Layout.join, layouts, Layout.NOTHING)
    if joined in (Layout.UNKNOWN, Layout.NOTHING):
        unknown = Layout.UNKNOWN in layouts or not layouts
        why = f"comes from elsewhere ({'; '.join(dict.fromkeys(blocking))})" if unknown else ""
        which = f"argument {position + 1}"
        if position >= len(program.params) - len(program.keywords):
            which = f"keyword argument `{program.params[position]}`"
        if not unknown:
            mixed = ", ".join(sorted({layout.value for layout in layouts}))
            why = f"is mixed ({mixed} on different paths)"
        code = Decline.ARGUMENT_UNKNOWN if unknown else Decline.ARGUMENT_MIXED
        why = f"{which} of the step {why}: its layout is not visible"
        if unknown and set(blocking) == declarable.keys():
            why += _declare_hint(program, flow, declarable.values())
        raise NotVisible(why, code)
    program.batches[position] = joined in (Layout.PER_DEVICE, Layout.KEYS)
    if joined is Layout.KEYS:
        program.squeezed.add(position)
    for name in sorted({use.value for use in slots}):  # every name passed, or its field
        if not any(id(b) in program.siblings for b in flow.stores.get(name, [])):
            _follow_stacked(site, name, joined)


PART = (
    "{value} stacks over {part}, not visibly every device of this process "
    "(`jax.local_devices()`, `jax.local_device_count()`): pmap maps the step over those devices "
    "alone, the program-level form over every device of the job"
)


def _check_part(forms: Forms, value: cst.BaseExpression, name: str | None = None) -> None:
    """Decline PL306 if `value`, an argument of the step or bound to one (`name`), is a
    replication, a split or keys over a count or devices not visibly every device of this
    process (brax's `jax.random.split(key, local_devices_to_use)`), or holds one (`_part_of`)."""
    if (found := _part_of(forms, value)) is None:
        return
    made, part = found
    what = f"`{_short(value)}`" if name is None else f"`{name}` = `{_short(value)}`"
    if made is not value:
        what += f", holding `{_short(made)}`,"
    raise NotVisible(PART.format(value=what, part=f"`{_short(part)}`"), Decline.PART_OF_DEVICES)


def _part_of(forms: Forms, value: cst.BaseExpression, depth: int = 0) -> _Pair | None:
    """The value stacked over part of the devices that `value` is or holds, and that part: a
    stacking of it (`jnp.stack(jax.random.split(key, n))`), a field of a container or of a
    class built with keyword arguments (brax's `TrainingState(key=...)`), or what a def of the
    module returns (brax sac's `_init_training_state`); None if none is seen."""
    part = forms.over_part(value)
    if part is not None or depth > 3 or not isinstance(value, (cst.Call, *CONTAINER_NODES)):
        return None if part is None else (value, part)
    inner: list[cst.BaseExpression] = []
    if isinstance(value, cst.Call):
        args, func = value.args, forms.qualname(value.func)
        if func in STACKS and (one := positional(value, 1)) is not None:
            inner += one
        elif args and all(a.keyword is not None and not a.star for a in args):
            inner += [a.value for a in args]  # a class's fields, or a dict's
        helper = forms.defs.get(code(value.func))
        for returned in nodes_in(helper.body, cst.Return, SCOPES) if helper else ():
            inner += [returned.value] if returned.value is not None else []
    inner += _leaves(forms, value) or []
    return next((found for node in inner if (found := _part_of(forms, node, depth + 1))), None)


STACKS = frozenset({"jax.numpy.stack", "numpy.stack", "jax.numpy.asarray", "numpy.asarray"})
CONTAINER_NODES = (cst.Dict, cst.Tuple, cst.List)


def _declare_hint(program: Program, flow: Flow, params: Iterable[str]) -> str:
    """How the project can say what the callers of the host pass for its parameters `params`,
    when they are all that blocks: the entry of `[tool.jaxmigrate] pmap-replicated` that would
    declare them equal copies per device; or, when the host hands the step's results back to
    those callers, why such an entry would not take the program-level form."""
    if held := _hands_back(program, flow):
        return (
            f"; a `pmap-replicated` entry would not take it: `{program.host.name.value}` "
            f"returns the step's results (`{held}`) to its callers, who hold them with a device "
            "axis (PL401)"
        )
    names = ", ".join(dict.fromkeys(params))
    unseen = [program.unseen[p] for p in dict.fromkeys(params) if p in program.unseen]
    return (
        "; if every caller passes equal copies of one value, one per local device (not a batch "
        "split over the devices), the project can say so in `[tool.jaxmigrate]`: "
        f'`pmap-replicated = ["{program.spelling}({names})"]`'
        + "".join(f" ({why})" for why in unseen[:1])
    )


def _hands_back(program: Program, flow: Flow) -> str | None:
    """A name `program.host` returns (alone or in a tuple) that holds the step's results on
    some path (bound to a call of the step, or to such a name), None if none: the callers a
    `pmap-replicated` entry speaks of would get one value back where they hold copies
    (AlgoPerf's `update_params`, returning the new parameters to its runner)."""
    calls = {id(call) for call in program.calls}

    def result(use: cst.Name, depth: int = 0) -> bool:
        values = [b.value for b in flow.reach.of(use) if isinstance(b, cst.Assign)]
        deeper = lambda v: isinstance(v, cst.Name) and depth < 4 and result(v, depth + 1)
        return any(id(v) in calls or deeper(v) for v in values)

    def names(value: cst.BaseExpression | None) -> list[cst.Name]:  # `a`, `(a, (b, c))`
        if isinstance(value, cst.Tuple):
            return [name for element in value.elements for name in names(element.value)]
        return [value] if isinstance(value, cst.Name) else []

    returns = nodes_in(program.host.body, cst.Return, SCOPES)
    return next((use.value for r in returns for use in names(r.value) if result(use)), None)


CONTAINERS = frozenset({"builtins.dict", "flax.core.FrozenDict", "flax.core.freeze"})
CONTAINERS |= {"flax.core.frozen_dict.FrozenDict", "flax.core.frozen_dict.freeze"}


def _leaves(forms: Forms, value: cst.BaseExpression) -> list[cst.BaseExpression] | None:
    """The values a container passed to the step holds (`{"k": v}`, `(a, b)`, `dict(k=v)`,
    flax's `FrozenDict(k=v)`/`freeze({...})`), each laid out as passed alone; None for any
    other expression (or a container with `*`/`**` in it)."""
    call = value if isinstance(value, cst.Call) else None
    builtin = call is not None and code(call.func) == "dict" and "dict" not in forms.defs
    if call is not None and (builtin or forms.qualname(call.func) in CONTAINERS):
        if len(call.args) == 1 and call.args[0].keyword is None and not call.args[0].star:
            return _leaves(forms, call.args[0].value)  # `freeze({...})`, `FrozenDict({...})`
        keyworded = all(a.keyword is not None and not a.star for a in call.args)
        return [a.value for a in call.args] if keyworded else None
    plain = cst.DictElement if isinstance(value, cst.Dict) else cst.Element  # no `*`, `**`
    if isinstance(value, CONTAINER_NODES) and all(isinstance(e, plain) for e in value.elements):
        return [e.value for e in value.elements]  # type: ignore[union-attr]
    return None


def _fed(forms: Forms, calls: list[_StepCall]) -> set[int]:
    """The ids of the values the calls pass: each argument, and each value of a container
    passed (`_leaves`)."""
    found = set()
    stack = [arg.value for c in calls for arg in c.call.args]
    while stack:
        node = stack.pop()
        found.add(id(node))
        stack += _leaves(forms, node) or []
    return found


CONVERTED = (
    "a batch drawn from {source}, split per device there, -> one global batch sharded on the "
    "mesh where it is passed (`{helper}`: each device's rows in order); once that pipeline "
    "yields flat batches, the conversion goes"
)


UNCOPIED = (
    "`{name}`, a parameter whose callers pass equal copies, one per device ({seen}), -> one "
    "value at the entry of `{host}` (`{helper}`: device 0's copy, replicated over the job's "
    "devices); its callers pass what they passed"
)
DECLARED = "`[tool.jaxmigrate] pmap-replicated`"


def _declared_copies(program: Program, name: str) -> None:
    """`name`, a parameter of the host the project declares its callers pass as equal copies
    per device (pmap's layout of a replicated value: big_vision's trainers give every evaluator
    `params_repl`), is read by the step: it becomes one value at the host's entry, the rest of
    the host reading that value (`Program.uncopied`, written by `rewrite_host`)."""
    if name in program.uncopied:
        return
    program.uncopied.append(name)
    param = next(p for p in params_of(program.host.params) if p.name.value == name)
    why = UNCOPIED.format(
        name=name,
        seen=program.seen or DECLARED,
        host=program.host.name.value,
        helper=program.uncopier,
    )
    program.edit(param.name, why, lambda: param.name)


def _drawn(binding: cst.CSTNode, name: str, flow: Flow, depth: int = 0) -> bool:
    """`for name in it` (or `for i, name in ...`), `name = next(it)`: a value drawn from an
    iterator, fresh data at each step (not state carried from one step to the next); or a part
    of one (`_taken_from`, `depth` parts deep: a part of itself, `batch = prep(batch)` in a
    loop, is carried, and the depth ends the search)."""
    if isinstance(binding, (cst.For, cst.CompFor)):
        return name in target_names(binding.target)
    if not isinstance(binding, cst.Assign) or len(binding.targets) != 1:
        return False
    drawn = holes_of("next({it})", binding.value) is not None  # `name = next(it)`
    drawn = drawn and name in target_names(binding.targets[0].target)
    return drawn or _taken_from(binding, name, flow, depth) is not None


def _taken_from(binding: cst.Assign, name: str, flow: Flow, depth: int = 0) -> cst.Name | None:
    """The drawn value whose part `binding` binds to `name`, with the loop or `next` drawing it
    (`labels = batch.pop("labels")`, `labels, mask = batch["labels"], batch["mask"]`,
    `images = batch.get("image")`: a batch's leaves, split per device as the batch is); None
    when the part is not one of a value drawn on every path."""
    part = _lined_up(binding.targets[0].target, binding.value, name)
    whole = _derived_from(part) if part is not None and single_name(part) is None else None
    drawn = whole is not None and depth <= 3 and _drawn_everywhere(whole, flow, depth)
    return whole if drawn else None


def _drawn_everywhere(name: cst.Name, flow: Flow, depth: int = 0) -> bool:
    """Every binding of `name` reaching it draws from an iterator (`_drawn`), or binds a part or
    a transform of such a value (`_taken_from`)."""
    reaching = flow.reach.of(name) or {ENTRY}
    return ENTRY not in reaching and all(_drawn(b, name.value, flow, depth + 1) for b in reaching)


def _new_trailing_axes(part: cst.Subscript) -> bool:
    """`x[..., None]` (`None`s after `...`): new axes after the others, the leading one, each
    device's, untouched (big_vision's `labels[..., None]`)."""
    first, *rest = [s.slice.value if isinstance(s.slice, cst.Index) else None for s in part.slice]
    nones = all(isinstance(r, cst.Name) and r.value == "None" for r in rest)
    return isinstance(first, cst.Ellipsis) and bool(rest) and nones


def _derived_from(part: cst.BaseExpression, depth: int = 0) -> cst.Name | None:
    """The one name `part` is computed from, row for row, as a batch's part or transform is:
    `batch["image"]`, `batch.pop("labels")`, `batch.get("mask")`, `np.asarray(x)`,
    `jax.tree.map(lambda x: np.asarray(memoryview(x)), batch)`, `transform(batch)` (a call
    whose every argument is that name, a part of it, a lambda or a literal); else None. pmap
    maps the leading axis of whatever reaches it, so a value computed from a batch drawn per
    device is converted where it is passed as the batch is (`_convert_drawn`)."""
    if depth > 6:
        return None
    if isinstance(part, cst.Name):
        return part
    if isinstance(part, cst.Subscript) and (len(part.slice) == 1 or _new_trailing_axes(part)):
        return _derived_from(part.value, depth + 1)
    if not isinstance(part, cst.Call) or any(a.star for a in part.args):
        return None
    if (found := holes_of("{x}.pop({k})", part) or holes_of("{x}.get({k})", part)) is not None:
        return _derived_from(found["x"], depth + 1)
    sources = [
        _derived_from(a.value, depth + 1)
        for a in part.args
        if not isinstance(a.value, (cst.Lambda, cst.BaseNumber, cst.BaseString))
    ]
    names = {s.value if s is not None else None for s in sources}
    return sources[0] if sources and len(names) == 1 and None not in names else None


def _convert_drawn(site: _Site, position: int, blocking: list[str]) -> None:
    """The argument at `position` is drawn from an iterator whose layout is not visible (another
    module's input pipeline, a parameter): pmap took its leading axis as this process's devices,
    each device its slice; the program-level form takes this process's rows of one global batch,
    the same rows on the same device: converted where it is passed, named (`program.converter`).
    Its other reads keep the value as drawn."""
    program, flow, forms, calls = site
    program.batches[position] = True
    for value in [call.values[position] for call in calls]:
        name = value if isinstance(value, cst.Name) else None  # two loops may both draw `x`
        drawn, reach = (name.value, flow.reach.of(name)) if name is not None else ("", ())
        own = {_binding_text(drawn, b, flow, forms.qualname) for b in reach if b is not ENTRY}
        source = own.pop() if len(own) == 1 else blocking[0] if blocking else "an iterator"
        why = CONVERTED.format(source=source, helper=program.converter)

        def converted(value: cst.BaseExpression = value) -> cst.BaseExpression:
            args = [cst.Arg(value), cst.Arg(cst.parse_expression(program.sharding))]
            return cst.Call(cst.Name(program.converter), args)

        program.edit(value, why, converted)
    program.converts = True


def _binding_text(name: str, binding: cst.CSTNode, flow: Flow, qualname: Qualname) -> str:
    """Where `name` gets a value whose layout is not known: `name = <value>`, a loop over ...;
    an iterator the loop reads is named with the call making it (maybe another module's)."""
    whole = _taken_from(binding, name, flow) if isinstance(binding, cst.Assign) else None
    if whole is not None:  # a part of a drawn value: named with the value it is taken from
        texts = {_binding_text(whole.value, b, flow, qualname) for b in flow.reach.of(whole)}
        # `batch = transform(batch)`: named as drawn
        return min(texts) if whole.value == name else f"`{name}`, a part of {min(texts)}"
    if isinstance(binding, cst.Assign):
        target = binding.targets[-1].target
        if isinstance(target, (cst.Tuple, cst.List)):  # `state, fn = state`: AlgoPerf's
            return f"`{name}`, unpacked from `{_short(binding.value)}`"
        return f"`{name}` = `{_short(binding.value)}`"
    if isinstance(binding, cst.NamedExpr):
        return f"`{name}` := `{_short(binding.value)}`"
    if isinstance(binding, cst.WithItem):
        return f"`{name}`, bound by `with {_short(binding.item)} as ...`"
    if isinstance(binding, cst.MatchCase):
        return f"`{name}`, captured by `case {_short(binding.pattern)}`"
    if isinstance(binding, cst.AnnAssign):  # `x: T = value`: not followed
        return f"`{name}`, bound by an annotated assignment, which is not followed"
    if not isinstance(binding, (cst.For, cst.CompFor)):
        return f"`{name}`, bound by a `{type(binding).__name__}` statement"
    source: cst.BaseExpression = binding.iter
    if isinstance(source, cst.Call) and code(source.func) in ("zip", "enumerate") and source.args:
        # the batches: `enumerate(it)`; `zip(it, range(n))`'s argument the name is drawn from
        target = binding.target
        items = target.elements if isinstance(target, (cst.Tuple, cst.List)) else ()
        at = [i for i, e in enumerate(items) if single_name(e.value) == name]
        zipped = code(source.func) == "zip" and at and at[0] < len(source.args)
        source = source.args[at[0] if zipped else -1].value
    text = f"`{name}`, a loop variable over `{_short(source)}`"
    made = flow.value(source.value) if isinstance(source, cst.Name) else None
    if isinstance(made, cst.Call):
        where = qualname(made.func)
        text += f" = `{_short(made)}`" + (f" (`{where}`)" if where and "." in where else "")
        text += ": the layout of its batches is that function's"
    return text


def _follow_stacked(site: _Site, name: str, joined: Layout) -> None:
    """Check every read of an argument the function stacks for the step (`x = replicate(x)`,
    `b = shard(b)`) and no step makes, laid out as `joined`: the stacking is deleted, so once
    stacked it is read only fed to a step or (replicated) as device 0's copy, a readback then
    deleted."""
    program, flow, forms, calls = site
    replicated, keys = joined is Layout.REPLICAS, joined is Layout.KEYS
    assigns = [b for b in flow.stores.get(name, []) if isinstance(b, cst.Assign)]
    laid_out = lambda b: any(id(n) in program.nodes for n in _laid_out_parts(b.value))
    # and `x = x - lr * g` after a call: replicated as well
    fed_back = lambda b: id(b) in program.arithmetic and _after_a_call(flow, b, calls)
    stackings: list[cst.CSTNode] = [b for b in assigns if laid_out(b) or fed_back(b)]
    stackings += [ENTRY] if name in program.entries else []  # a parameter: the caller's value
    blocking: list[cst.CSTNode] = []  # each read that blocks: every one is named
    for use in _reads(site, name, set(stackings)):  # once stacked
        if not replicated and not keys and _flat_batch(program, flow, forms, use, name):
            continue
        if not (replicated and _read_as_one(site, use, name, None, Decline.STACKED_READ)):
            blocking.append(field_top(flow, use))
    if blocking:
        layout = "replicated" if replicated else "split into per-device slices"
        layout = "made per-device keys" if keys else layout

        def flattened(use: cst.CSTNode, call: cst.Call) -> str | None:
            """Why keys `call` flattens as a batch (`tohost(keys)`) block, else None."""
            if not keys or not isinstance(use, cst.BaseExpression):
                return None
            if _flattening_helper(forms, call, use) is None:
                return None  # keys flattened as a batch (`tohost(keys)`): not the same rows
            return "flattened there, where the program-level form keeps one key per device"

        read = readers(flow, blocking, forms.qualname, flattened)
        why = f"`{name}`, {layout} for the step, is read other than passed to it: {read}"
        raise NotVisible(why, Decline.STACKED_READ)


def _flat_batch(program: Program, flow: Flow, forms: Forms, use: cst.Name, name: str) -> bool:
    """`tohost(batch["inputs"])`, a module helper flattening over devices (`_flattening_helper`)
    a batch split for the step, or a field of it: the rows of this process's part of the global
    batch, in the same order; recorded as that edit."""
    top = field_top(flow, use)
    call = found[1] if (found := flow.passed(top)) is not None else None
    if call is None or _flattening_helper(forms, call, top) is None:
        return False
    reason = (
        f"`{code(call.func)}`, a flattening over devices of `{name}` split for the step, deleted: "
        "this process's rows of the batch"
    )
    program.edit(call, reason, lambda: _flat_value(program, call, top, forms))
    return True


def _waited(flow: Flow, use: cst.Name, forms: Forms) -> bool:
    """`use.block_until_ready()` (or `jax.block_until_ready(use)`) as a statement of its own,
    or `use` passed to a def of the code base that only waits for what that parameter holds:
    it waits for the value and reads nothing of its layout.

    The def: `u.chrono.pause(wait_for=(params, opt))`, `use` passed, whole or as an element of
    a tuple or list written there, to a def of the module or of another module of the code
    base (`forms.imported`) that only waits for that parameter (`only_waits_on`)."""
    if waits(flow.parent, use, forms.qualname):
        return True
    value: cst.CSTNode | None = field_top(flow, use)  # `wait_for=params["student"]` too
    if isinstance(element := flow.parent.get(id(value)), cst.Element):  # `wait_for=(a, b)`
        items = flow.parent.get(id(element))
        value = items if isinstance(items, (cst.Tuple, cst.List)) else None
    if value is None or (found := flow.passed(value)) is None:
        return False
    call = found[1]
    local = forms.defs.get(single_name(call.func) or "")
    function = (
        Function(local, False, forms.qualname, forms.defs)
        if local is not None
        else forms.imported.function(_callee_name(flow, forms, call.func))
    )
    param = parameter_for(function.fn, call, found[0], function.bound) if function else None
    return function is not None and param is not None and only_waits_on(function, param)


def _callee_name(flow: Flow, forms: Forms, func: cst.BaseExpression) -> str | None:
    """What `func` names: its qualified name, or for `obj.method` of a name the function binds
    once to an instance (`chrono = u.Chrono()`), the method of that class (`...Chrono.pause`)."""
    name = forms.qualname(func)
    if name is not None or not isinstance(func, cst.Attribute):
        return name
    owner = single_name(func.value) or ""
    value = value_of_name(flow.only(owner), owner)
    if not isinstance(value, cst.Call):
        return None
    cls = forms.qualname(value.func)
    return f"{cls}.{func.attr.value}" if cls is not None else None


def _inline_kind(site: _Site, value: cst.BaseExpression, position: int) -> Layout:
    """Lay out an argument passed as an expression (or the value bound to a name passed),
    and record its edit."""
    program, flow, forms, _ = site
    # `a if c else b`: where the two paths meet; `shard(x) / 255.0`: elementwise with a number,
    # the same layout
    scaled = _scaled(value)
    fields = ["body", "orelse"] if isinstance(value, cst.IfExp) else []
    fields += [f for f in ("left", "right") if scaled is not None and getattr(value, f) is scaled]
    if fields:
        parts = [_inline_kind(site, getattr(value, f), position) for f in fields]
        layout = functools.reduce(Layout.join, parts)
        if layout is Layout.PER_DEVICE:
            _put_once(program, value, fields)
        replicas = scaled is not None and layout is Layout.REPLICAS
        source = forms.replicated_source(scaled) if replicas else None  # type: ignore[arg-type]
        if source is not None and program.reasons.get(id(scaled)) == REPLICATED:
            # `replicate(w8) * 0.1` computed on the jax array pmap's replication made, as before
            array = lambda: fill(REPLICA_ARRAY, {**program.context(), "x": source})
            program.edit(scaled, REPLICATED_ARRAY, array)  # type: ignore[arg-type]
        kept = scaled is None or layout in (Layout.PER_DEVICE, Layout.REPLICAS)
        return layout if kept else Layout.UNKNOWN
    if (replicated := forms.replicated_source(value)) is not None:
        _replication(site, value, replicated, position)
        return Layout.REPLICAS
    if (batch := forms.split(value)) is not None:
        _split_kept(site, value, batch.source)
        program.edit(value, batch.row.why, lambda: batch.rewrite(program.context()))
        return Layout.PER_DEVICE
    if _named_splits(program, flow, forms, value):
        return Layout.PER_DEVICE
    if (keys := forms.key_split(value)) is not None:
        program.edit(value, keys.row.why, lambda: keys.rewrite(program.context()))
        return Layout.KEYS
    return Layout.UNKNOWN


def _scaled(value: cst.BaseExpression) -> cst.BaseExpression | None:
    """`x * 2`, `x / 255.0`, `1.0 - x`: the other operand of an elementwise operation with a
    number written out, which reads the same of a stacked value and of the flat one; else
    None."""
    if not isinstance(value, cst.BinaryOperation) or not isinstance(value.operator, ELEMENTWISE):
        return None
    for number, other in ((value.left, value.right), (value.right, value.left)):
        if isinstance(number, cst.UnaryOperation) and isinstance(number.operator, cst.Minus):
            number = number.expression
        if isinstance(number, (cst.Integer, cst.Float)):
            return other
    return None


def _laid_out_parts(value: cst.BaseExpression) -> Iterator[cst.BaseExpression]:
    """`value` and the parts of it `_inline_kind` lays out in its place: a conditional's two
    branches, the operand of an operation with a number (an edit there stacks the whole)."""
    yield value
    if isinstance(value, cst.IfExp):
        yield from _laid_out_parts(value.body)
        yield from _laid_out_parts(value.orelse)
    if (scaled := _scaled(value)) is not None:
        yield from _laid_out_parts(scaled)


def _put_once(program: Program, value: cst.BaseExpression, fields: list[str]) -> None:
    """`split(a) if c else split(b)`, `shard(images) * 0.1`: the parts of `value` in `fields` (a
    conditional's branches, the operand of an operation with a number), each converted to this
    process's part of a global batch, converted once around `value` (`put(sharding, a if c
    else b)`, `put(sharding, images * 0.1)`), one edit where there were several. The operation
    is then computed on the flat batch as the original computed it (NumPy's uint8 times a float
    is float64, rounded once to float32 at pmap's call; on the global jax array, float32 with
    0.1 rounded first). Rewrites that are not the same put (call and sharding) stay where they
    are."""
    parts = [getattr(value, field) for field in fields]
    if not all(id(p) in program.edits for p in parts):
        return  # a part converted where its name is bound: nothing to join here
    made, why = [program.edits[id(p)] for p in parts], program.reasons[id(parts[0])]
    for p in parts:
        del program.edits[id(p)], program.nodes[id(p)], program.reasons[id(p)]

    def once() -> cst.BaseExpression:
        puts = [edit(p) for edit, p in zip(made, parts, strict=True)]  # the nodes are not read
        calls = [p for p in puts if isinstance(p, cst.Call) and len(p.args) == 2]
        if len(calls) != len(puts) or len({(code(c.func), code(c.args[0])) for c in calls}) != 1:
            return value.with_changes(**dict(zip(fields, puts, strict=True)))
        flat = value.with_changes(**{f: c.args[1].value for f, c in zip(fields, calls)})
        put = calls[0]
        return put.with_changes(args=[put.args[0], put.args[1].with_changes(value=flat)])

    program.edit(value, why, once)


GENERATED = (
    f"{SPLIT_EDIT} deleted: the generator yields the flat batch, which goes into "
    "the batch sharded on the mesh"
)


def _generated_batches(site: _Site, position: int) -> bool:
    """Every call passes `next(it)` here, `it = gen()` bound once and read only so, `gen` a
    generator def of the function called only there, each of its `yield`s a split of a flat
    batch (or a tuple of splits, or of names only a split reaches and read only in a `yield`):
    the input pipeline then yields flat batches (its splits deleted) and each `next(it)` becomes
    this process's part of a global batch. Record the edits and return True; else False."""
    program, flow, forms, calls = site
    values = [c.values[position] for c in calls]
    found = [holes_of("next({it})", v) for v in values]
    reads = [it for h in found if h is not None and isinstance(it := h["it"], cst.Name)]
    if len(reads) != len(values) or "next" in flow.stores or "next" in forms.defs:
        return False
    binding = flow.only(reads[0].value)
    made = binding.value if isinstance(binding, cst.Assign) else None
    if any(flow.reach.of(r) != {binding} for r in reads) or not isinstance(made, cst.Call):
        return False
    if {id(use) for use in flow.loads.get(reads[0].value, [])} != {id(r) for r in reads}:
        return False  # `it` read other than by the step's `next(it)`
    generator = flow.only(single_name(made.func))
    if not isinstance(generator, cst.FunctionDef) or generator.decorators or generator.asynchronous:
        return False
    if flow.loads.get(generator.name.value) != [made.func]:
        return False  # called elsewhere too: those batches are not the step's
    if (edits := _yielded_splits(generator, flow, forms)) is None:
        return False
    for node, source in edits:
        program.edit(node, GENERATED, lambda s=source: s)  # type: ignore[misc]
    for value in values:
        batch = lambda v=value: fill(GLOBAL_BATCH, {**program.context(), "x": v})  # type: ignore[misc]
        program.edit(value, BATCH, batch)
    return True


def _yielded_splits(generator: cst.FunctionDef, flow: Flow, forms: Forms) -> list[_Pair] | None:
    """Return each split the generator's `yield`s give (the split, its flat source), else None."""
    inner = Flow(generator, outer=flow)  # the count of devices may be the function's
    yields = [y.value for y in nodes_in(generator.body, cst.Yield, SCOPES)]  # not its defs'
    values = [v for v in yields if isinstance(v, cst.BaseExpression)]
    if not values or len(values) != len(yields):
        return None  # a bare `yield`, or `yield from`
    counts = lambda node: is_device_count(node, inner, forms.qualname)

    def value_of(name: cst.Name) -> cst.BaseExpression | None:  # the one value reaching it
        found = inner.reach.of(name)
        return value_of_name(next(iter(found)), name.value) if len(found) == 1 else None

    splits = Forms(forms.qualname, counts, forms.defs, values=value_of)
    tuples = [v.elements if isinstance(v, cst.Tuple) else [cst.Element(v)] for v in values]
    items = [e.value for t in tuples for e in t]  # each item of a tuple yielded
    inside = {id(n) for v in values for n in nodes_in(v, cst.Name)}
    return _split_items(inner, splits, items, inside)


def _split_items(
    flow: Flow, forms: Forms, items: list[cst.BaseExpression], inside: set[int]
) -> list[_Pair] | None:
    """Each of `items` with its flat source: a split, or a name every binding reaching it binds
    to a split, those bindings' reads all in `inside` (ids of names; a read elsewhere would see
    the flat value), each split given; None when one is neither."""
    pairs: list[_Pair] = []
    for item in items:
        if (source := forms.shard_source(item)) is not None:
            pairs.append((item, source))
            continue
        if not isinstance(item, cst.Name):
            return None
        for binding in flow.reach.of(item):
            value = value_of_name(binding, item.value)
            source = forms.shard_source(value) if value is not None else None
            reads = [u for u in flow.loads.get(item.value, []) if binding in flow.reach.of(u)]
            if value is None or source is None or any(id(u) not in inside for u in reads):
                return None
            pairs.append((value, source))
    return pairs


def value_of_name(binding: cst.CSTNode | None, name: str) -> cst.BaseExpression | None:
    """The value `name = value` binds, else None."""
    return binding.value if assigned_name(binding) == name else None  # type: ignore[union-attr]


SPLIT_NAMED = f"{SPLIT_EDIT} deleted: the flat value goes into the batch sharded on the mesh"


def _named_splits(program: Program, flow: Flow, forms: Forms, value: cst.BaseExpression) -> bool:
    """`{"x": xs, "y": ys}` (or a tuple), each element a split or a name bound once, after the
    step is made, to a split (`xs = x.reshape((n, -1, 3))`) and read only there: the literal
    becomes this process's part of a batch, each such name bound to the flat value. Record the
    edits and return True; else False (nothing recorded)."""
    # no `**d`, `*t`
    leaves = _leaves(forms, value) if isinstance(value, (cst.Dict, cst.Tuple)) else None
    if not leaves:
        return False
    items = {id(v): v for v in leaves}
    pairs = _split_items(flow, forms, [*items.values()], {id(n) for n in nodes_in(value, cst.Name)})
    flat = {id(split): source for split, source in pairs or () if id(split) in items}
    named = [(flow.parent[id(v)], v, s) for v, s in pairs or () if id(v) not in items]
    if not named or any(
        flow.only(assigned_name(b)) is not b or not _made_before(program, flow, b)
        for b, _, _ in named
    ):
        return False  # `xs, ys = ...`: the flat value would rebind the other names too
    for _, split, source in named:
        program.edit(split, SPLIT_NAMED, lambda s=source: s)  # type: ignore[misc]
    batch = lambda: fill(GLOBAL_BATCH, {**program.context(), "x": replaced(value, flat)})
    program.edit(value, BATCH, batch)
    return True


REPLICATED = row_named("replicate").why
REPLICA_ARRAY = "{jax}.numpy.asarray({x})"
REPLICATED_ARRAY = (
    "a replication deleted: the value as a jax array, replicated (`P()`), the operation with a "
    "number on it computed as on pmap's replicas"
)
COPIED = (
    f"{COPY} of the value, replicated (`P()`): the step donates it, and "
    "passing the value itself would donate the program's own buffers"
)


def _replication(
    site: _Site, value: cst.BaseExpression, source: cst.BaseExpression, position: int
) -> None:
    """Record the edit of a replication of `source` passed at `position`: deleted, or a copy
    when the step donates that argument (pmap donated the replicas, never `source` itself);
    a copy stays one (`a, b = replicate((x, y))`, `a` donated: both copied). When `source`
    may be committed to one device (`_committed`; never a tuple written out), it is copied to
    the host."""
    program, flow, forms, _ = site
    reason = program.reasons.get(id(value), "")
    if reason == COPIED or reason.startswith(HOSTED[:40]):
        return
    # `jax.device_get(x)`: a host value, placed by the step
    if (committed := _committed(flow, forms, source)) is not None:
        why = HOSTED.format(how=committed)
        program.edit(value, why, lambda: fill(HOST_COPY, {**program.context(), "x": source}))
    elif not donated(program, position):
        _check_python_float(site, value, source)
        if (changed := _changed_in_place(flow, source, value, site.forms.defs)) is not None:
            why = (
                f"`{code(source)}`, replicated for the step, is changed in place after: "
                f"`{_short(changed)}` (the program-level form passes the value itself, changed)"
            )
            raise NotVisible(why, Decline.STACKED_READ)
        program.edit(value, REPLICATED, lambda: source)
    else:
        program.edit(value, COPIED, lambda: fill(DONATED_COPY, {**program.context(), "x": source}))


# Of a float only, knowingly: a Python int (`"step": 0`, flax `TrainState.create`'s step) stays
# weakly typed in the program-level form too, and where the step mixes it with bfloat16 (a warmup
# factor `(step + 1) / n`) or int8 values the numbers differ; declining every `TrainState` would
# decline most flax programs, so verification catches those (PL603, the faithful form is written).
def _check_python_float(
    site: _Site, replication: cst.BaseExpression, source: cst.BaseExpression
) -> None:
    """Raise PL303 if `source` visibly is or holds a Python float (`0.05`, `lr` bound to one,
    `{"lr": 0.05}` written out or bound), which `replication` makes an array that is not weakly
    typed (its row of the table is `strong`: itself, leaf by leaf, or a helper's summary)."""
    row = site.forms.transfer(replication, REPLICATIONS)
    if row is None or not row.row.strong:
        return
    if (found := _float_leaf(site, source)) is not None:
        why = (
            f"`{code(source)}`, replicated for the step, holds a Python float "
            f"(`{_short(found)}`): pmap's replicas of it are a float32 array, "
            "the float itself is weakly typed in the step (`bfloat16` arithmetic "
            "with it stays `bfloat16`)"
        )
        raise NotVisible(why, Decline.STACKED_READ)


def _float_leaf(site: _Site, node: cst.CSTNode, depth: int = 0) -> cst.CSTNode | None:
    """The Python float `node` visibly is or holds: `0.05`, `-lr`, `float(x)`, `x.item()` (a
    float or an int, both weakly typed), `lr * 2` of one; a leaf of a container written out at
    any depth (`dict(w=w, lr=0.05)` too), either branch of `a if c else b`, an item of a
    container (`lrs[1]`); followed through the names bound to them, a parameter's default and a
    global's one value (`CONFIG = {...}`, `LR = 0.05`); else None."""
    flow = site.flow
    inner = node.expression if isinstance(node, cst.UnaryOperation) else node
    if depth > 8 or isinstance(inner, cst.Float):
        return node if isinstance(inner, cst.Float) else None
    func = inner.func if isinstance(inner, cst.Call) else None
    if isinstance(func, cst.Attribute) and func.attr.value == "item":  # `x.item()`
        return None if inner.args else node  # type: ignore[attr-defined]
    if isinstance(func, cst.Name) and func.value == "float" and "float" not in flow.stores:
        return node
    if isinstance(inner, cst.BinaryOperation):  # of Python numbers only: `lr * w` is an array
        sides = [(s, _float_leaf(site, s, depth + 1)) for s in (inner.left, inner.right)]
        plain = all(isinstance(s, cst.Integer) or f is not None for s, f in sides)
        return node if plain and any(f is not None for _, f in sides) else None
    parts: list[cst.CSTNode] = []
    if isinstance(inner, (cst.Dict, cst.Tuple, cst.List)):
        parts = [getattr(e, "value", e) for e in inner.elements]
    elif isinstance(inner, cst.IfExp):
        parts = [inner.body, inner.orelse]
    elif isinstance(inner, cst.Subscript):
        parts = [inner.value]
    elif isinstance(inner, cst.Call):
        parts = list(_leaves(site.forms, inner) or _fields(site, inner))
    elif isinstance(inner, cst.Name):
        reaching = flow.reach.of(inner)
        parts = [b.value for b in reaching if isinstance(b, cst.Assign)]
        own = params_of(flow.host.params) if isinstance(flow.host, cst.FunctionDef) else []
        mine = [p for p in own if p.name.value == inner.value]
        parts += [p.default for p in mine if p.default is not None and ENTRY in reaching]
        if (value := site.forms.bound.get(inner.value)) is not None and not mine:
            parts.append(value)  # a global read: its one value (`CONFIG = {...}`)
    return next((f for p in parts if (f := _float_leaf(site, p, depth + 1)) is not None), None)


def _fields(site: _Site, call: cst.Call) -> list[cst.BaseExpression]:
    """The arguments of a call of a class of the module (`State(w=w, lr=0.05)`, a flax
    `struct.dataclass`: its fields are the leaves), none for any other call: of a name neither
    imported, nor a def of the module, nor bound in the function."""
    func, forms = call.func, site.forms
    if not isinstance(func, cst.Name) or forms.qualname(func) is not None:
        return []
    if func.value in forms.defs or func.value in site.flow.stores:
        return []
    return [a.value for a in call.args if not a.star]


# Methods changing their array or container in place (`w.fill(0)`, `params.update(...)`), and
# functions changing their first argument (`np.copyto(w, v)`, `rng.shuffle(w)`).
IN_PLACE = MUTATING | {"fill", "resize", "put", "itemset", "partition", "shuffle"}
IN_PLACE_FIRST = frozenset({"copyto", "shuffle", "put", "place", "putmask", "fill_diagonal"})


def _changed_in_place(
    flow: Flow, source: cst.BaseExpression, replication: cst.BaseExpression, defs: Defs
) -> cst.CSTNode | None:
    """A statement that may change in place, after `replication` ran, a value a name in
    `source` holds (`w *= 0`, `params["w"] = v`, `w.fill(0)`, `np.copyto(w, v)`, a def of the
    module `defs` doing so to its parameter), else None. pmap's replicas are copies; the
    program-level form passes `source` itself, which sees it."""
    names = {n.value for n in name_reads(source)}  # not `replicate(f(w=x))`'s keyword `w`
    for name in sorted(flow.aliases(names & (set(flow.stores) | flow.params))):
        for change in _in_place_changes(flow, name, defs):
            if not isinstance(flow.host, cst.FunctionDef) or flow.ran_before(change, [replication]):
                return flow.statement(change)
    return None


def _in_place_changes(flow: Flow, name: str, defs: Defs, depth: int = 0) -> Iterator[cst.CSTNode]:
    """The nodes of `flow`'s function whose statements may change in place the value `name`
    holds: `name += v`, then its reads that do (`_changes`)."""
    yield from (b for b in flow.stores.get(name, []) if isinstance(b, cst.AugAssign))
    yield from (use for use in flow.loads.get(name, []) if _changes(flow, use, defs, depth))


def _changes(flow: Flow, use: cst.Name, defs: Defs, depth: int) -> bool:
    """Whether the statement of `use` may change in place the value it reads: stores into a
    part of it, calls a method changing it, or passes it where it is changed (a function's
    first argument, `out=`, a parameter a def of the module `defs` changes)."""
    top: cst.BaseExpression = use  # `w[0].a`, `w.fill`: the parts of `w` read
    while isinstance(up := flow.parent.get(id(top)), (cst.Attribute, cst.Subscript)):
        if up.value is not top:
            break
        top = up
    stored = top is not use and getattr(flow.parent.get(id(top)), "target", None) is top
    if stored or isinstance(top, cst.Attribute) and top.attr.value in IN_PLACE:
        return True  # `w[0] = v`, `w.a += v`, `del w["k"]`; `w.fill(0)`, `params.update(...)`
    if (found := flow.passed(use)) is None:
        return False
    arg, call = found
    func = call.func
    called = func.attr.value if isinstance(func, cst.Attribute) else single_name(func)
    first = call.args[0] is arg and not arg.keyword and called in IN_PLACE_FIRST
    if first or arg.keyword is not None and arg.keyword.value == "out":
        return True  # `np.copyto(w, v)`, `np.add(a, b, out=w)`
    # `reset(params)`, `def reset(tree): tree["w"] = ...`
    fn = defs.get(single_name(func) or "")
    if fn is None or depth > 2 or (param := parameter_for(fn, call, arg)) is None:
        return False
    return any(True for _ in _in_place_changes(Flow(fn), param, defs, depth + 1))


def _split_kept(site: _Site, split: cst.BaseExpression, source: cst.BaseExpression) -> None:
    """Raise PL303 when the flat `source` of a split made before the step's call (`xb =
    jnp.reshape(x, ...)`) may be changed in place between the two (`x *= 2`): the split is a
    copy of the values then (or, of a NumPy array, a view sharing the change), the flat batch
    made there a copy: the two forms would pass different values."""
    calls = [site.flow.statement(c.call) for c in site.calls]
    flow = site.flow
    if flow.statement(split) in calls:
        return  # split in the call: nothing runs in between
    change = _changed_in_place(flow, source, split, site.forms.defs)
    if change is not None and any(flow.ran_before(call, [change]) for call in calls):
        why = (
            f"the flat batch of `{_short(split)}`, split for the step, is changed in place "
            f"before the step's call: `{_short(change)}`"
        )
        raise NotVisible(why, Decline.STACKED_READ)


HOSTED = (
    "a replication of a value that may be committed to one device ({how}) -> the value copied "
    "to the host: the step places it, replicated (`P()`); a committed value it would refuse"
)
HOST_COPY = "{jax}.device_get({x})"
COMMITTING = frozenset({"backend", "device"})


def _committed(flow: Flow, forms: Forms, source: cst.BaseExpression) -> str | None:
    """How the value `source` (a name) may be committed to one device, else None: a binding
    reaching it calls `jax.jit(f, backend="cpu")`, or a def made so (big_vision's
    `@functools.partial(jax.jit, backend="cpu") def init(rng)`, `jax.jit(tx.init,
    backend="cpu")(params)`). pmap copied such a value to its devices; `jax.jit` refuses it
    beside arguments on the mesh ("incompatible devices")."""
    if not isinstance(source, cst.Name):
        return None
    makers: list[cst.BaseExpression] = []  # the function called, then how it is made
    for binding in flow.reach.of(source):
        if not isinstance(binding, cst.Assign) or not isinstance(binding.value, cst.Call):
            continue
        func = binding.value.func
        makers.append(func)
        name = single_name(func)
        for d in [*flow.stores.get(name, []), forms.defs.get(name)] if name else []:
            if isinstance(d, cst.FunctionDef):
                makers += [x.decorator for x in d.decorators]
            elif isinstance(d, cst.Assign):
                makers.append(d.value)
    return next((how for node in makers if (how := _committing(node, forms))), None)


def _committing(node: cst.BaseExpression, forms: Forms) -> str | None:
    """`jax.jit(f, backend=...)`, `functools.partial(jax.jit, backend=...)`: the keyword, as
    written; else None."""
    if not isinstance(node, cst.Call):
        return None
    name = forms.qualname(node.func)
    if name == PARTIAL and node.args:  # `partial(jax.jit, ...)`: the keywords of the jit
        name = forms.qualname(node.args[0].value)
    if name != "jax.jit":
        return None
    found = next((a for a in node.args if a.keyword and a.keyword.value in COMMITTING), None)
    return f"`{code(found)}`" if found is not None else None


BATCH = row_named("shard").why


def _binding_kind(site: _Site, binding: cst.CSTNode, name: str, position: int) -> Layout:
    """Return how a binding of an argument lays it out (a result of the step fed back is equal
    copies, as every result the program-level form takes is)."""
    program, flow, forms, calls = site
    if not isinstance(binding, cst.Assign) or len(binding.targets) != 1:
        return Layout.UNKNOWN
    if any(c.binds(binding) for c in calls) or id(binding) in program.siblings:
        return Layout.REPLICAS  # a result of the step (or another's)
    if name in program.carried.get(id(binding), ()):
        program.carried_read.add(name)  # checked once that def's returns are followed
        return Layout.REPLICAS  # one a def the step is passed to returns (`_callee.py`)
    if single_name(binding.targets[0].target) != name:
        return _unpacked_replication(site, binding, name, position)
    if (results := _arithmetic_results(site, binding.value, name)) is not None:
        program.arithmetic[id(binding)] = results
        return Layout.REPLICAS  # results combined elementwise: equal copies
    if _mean_of_results(site, binding, name):
        return Layout.REPLICAS
    if forms.replicated_source(binding.value) is None and not _made_before(program, flow, binding):
        return Layout.UNKNOWN  # a batch or keys made before the mesh exists
    return _inline_kind(site, binding.value, position)


def _unpacked_part(binding: cst.CSTNode, name: str, forms: Forms) -> cst.Name | None:
    """`a, b = (x, y)`, maybe through calls keeping each leaf's layout (`np.asarray`, a
    helper whose summary is one, brax's `_strip_weak_type((state, env_state))`): the name the
    tuple holds where `name` is unpacked, laid out as it is; else None."""
    if not isinstance(binding, cst.Assign) or len(binding.targets) != 1:
        return None
    target, value = binding.targets[0].target, binding.value
    for _ in range(3):  # carriers of carriers
        found = forms.transfer(value, KEEPING) if isinstance(value, cst.Call) else None
        value = found.source if found is not None else value
    part = _lined_up(target, value, name) if isinstance(value, cst.Tuple) else None
    return part if isinstance(part, cst.Name) else None


def _lined_up(
    target: cst.BaseExpression, value: cst.BaseExpression, name: str
) -> cst.BaseExpression | None:
    """`a, b = x, y`: the value written where `name` is unpacked (`x` for `a`), `value` itself
    where `target` is `name`; None when the target or the value is no tuple or list, or they do
    not line up (a starred item)."""
    if single_name(target) == name:
        return value
    sequence = (cst.Tuple, cst.List)
    if not isinstance(target, sequence) or not isinstance(value, sequence):
        return None
    items, values = target.elements, value.elements
    if len(items) != len(values) or any(type(e) is not cst.Element for e in (*items, *values)):
        return None
    at = [i for i, e in enumerate(items) if single_name(e.value) == name]
    return values[at[0]].value if len(at) == 1 else None


def _repacked(flow: Flow, forms: Forms, use: cst.Name) -> bool:
    """`use` is the part of a tuple unpacked into its own name, `x, y = keep((x, y))`, laid out
    as it is (`_unpacked_part`): its reads are followed from there as the name's."""
    return _unpacked_part(flow.statement(use), use.value, forms) is use


def _unpacked_replication(site: _Site, binding: cst.Assign, name: str, position: int) -> Layout:
    """`a, b = replicate((x, y))`: a replication of a tuple written out, unpacked into as many
    names, replicates each (vision_transformer's `params_repl, opt_state_repl`); the
    replication is deleted (`a, b = (x, y)`). Else unknown."""
    target = binding.targets[0].target
    source = site.forms.replicated_source(binding.value)
    if not isinstance(target, cst.Tuple) or not isinstance(source, cst.Tuple):
        return Layout.UNKNOWN
    names = [single_name(e.value) if type(e) is cst.Element else None for e in target.elements]
    plain = all(type(e) is cst.Element for e in source.elements)
    if name not in names or None in names or not plain or len(names) != len(source.elements):
        return Layout.UNKNOWN
    _replication(site, binding.value, source, position)
    return Layout.REPLICAS


def _mean_of_results(
    site: _Site, binding: cst.CSTNode, name: str, seen: frozenset[int] = frozenset()
) -> bool:
    """`state = sync_batch_stats(state)`: a mean over devices (the table's row, called or read
    through a helper's summary) of `name` as only the step's calls (or a sibling's), or such
    means, leave it. Those results are equal copies (a result that may differ between devices
    is PL402, at its read here): their mean is the value itself, so the call goes (`state =
    state`, dropped) and the value is fed back. Recorded as a read of the results
    (`program.arithmetic`)."""
    program, flow, forms, calls = site
    value = value_of_name(binding, name)
    found = forms.transfer(value, MEANS) if value is not None else None
    if value is None or found is None:
        return False
    if not isinstance(found.source, cst.Name) or found.source.value != name:
        return False
    seen |= {id(binding)}  # a loop back to this mean: the same value, no other source
    reaching = flow.reach.of(found.source)
    known = lambda b: any(c.binds(b) for c in calls) or id(b) in program.siblings or id(b) in seen
    if not reaching or not all(known(b) or _mean_of_results(site, b, name, seen) for b in reaching):
        return False  # a value besides the step's results: not known to be equal copies
    program.arithmetic[id(binding)] = set()
    program.means.add(id(binding))  # the same value as the results it is of (`_one_source`)
    program.edit(value, found.row.why, lambda: found.rewrite(program.context()))
    return True


def _mean_of_unknown(
    flow: Flow, forms: Forms, call: cst.Call, step: str, host: cst.FunctionDef
) -> None:
    """Raise PL301 when `step` is a mean over devices (`avg_fn = jax.pmap(lambda x:
    lax.pmean(x, "x"), "x")`, AlgoPerf) of a value from outside the function: the mean is the
    value itself only for equal copies, and whether they are is that value's layout, which
    comes from the callers (AlgoPerf's batch norm statistics, per device, come from the
    submission's `update_params`)."""
    made = flow.value(step)
    found = forms.transfer(call.with_changes(func=made), MEANS) if made else None
    root = root_name(found.source) if found is not None else None
    if found is None or root is None or ENTRY not in flow.reach.of(root):
        return
    kind = "a parameter of" if root.value in flow.params else "a global read in"
    where = f"{kind} `{host.name.value}`"
    why = (
        f"`{step}` is a mean over devices, the value itself only for equal copies; its argument "
        f"`{_short(found.source)}` comes from elsewhere (`{root.value}`, {where}): whether it "
        "holds equal copies on the devices is not visible"
    )
    raise NotVisible(why, Decline.ARGUMENT_UNKNOWN)


def _mean_around(forms: Forms, flow: Flow, use: cst.Name) -> cst.Call | None:
    """Return the mean over devices (`MEANS`) whose value `use` is, if any."""
    calls = [node for node in list(flow.ancestors(use))[:4] if isinstance(node, cst.Call)]
    found = ((call, forms.transfer(call, MEANS)) for call in calls)
    return next((call for call, mean in found if mean is not None and mean.source is use), None)


ELEMENTWISE = (
    cst.Add,
    cst.Subtract,
    cst.Multiply,
    cst.Divide,
    cst.FloorDivide,
    cst.Modulo,
    cst.Power,
)


def _arithmetic_results(site: _Site, value: cst.BaseExpression, name: str) -> set[str] | None:
    """The results read by `name = name - 0.1 * grads`: elementwise arithmetic of `name`,
    numbers and results bound only by calls of the step (each then checked to be the same on
    every device); None for any other value. Rows that are all equal combine into rows that
    are all equal: the value stays replicated, its device axis is not read."""
    _, flow, _, calls = site
    names: set[str] = set()
    nodes: list[cst.BaseExpression] = [value]
    while nodes:
        node = nodes.pop()
        if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, ELEMENTWISE):
            nodes += [node.left, node.right]
        elif isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Minus):
            nodes.append(node.expression)
        elif isinstance(node, cst.Name):
            names.add(node.value)
        elif not isinstance(node, (cst.Integer, cst.Float)):
            return None
    results = names - {name}
    for result in results:
        bindings = flow.stores.get(result, [])
        if not bindings or not all(any(c.binds(b) for c in calls) for b in bindings):
            return None
    return results if names else None


# Reductions over every axis whose value is the same for n equal copies of a value as for the
# value itself (a sum is not: n times it)
SAME_OF_COPIES = frozenset({"mean", "max", "min", "amax", "amin", "nanmean", "nanmax", "nanmin"})


def _reduced_whole(flow: Flow, forms: Forms, use: cst.Name) -> bool:
    """`jnp.mean(r)`, `np.max(r)`, `r.mean()`: a result the same on every device reduced over
    every axis, no `axis=`, reads the same of the stacked copies and the flat value."""
    parent = flow.parent.get(id(use))
    call = flow.parent.get(id(parent)) if isinstance(parent, (cst.Arg, cst.Attribute)) else None
    found = full_reduction(call, forms.qualname) if isinstance(call, cst.Call) else None
    return found is not None and found[1] is use and found[0] in SAME_OF_COPIES


def _follow_result(site: _Site, step: str, name: str, output: int) -> None:
    """Check every read of a result: a readback (then deleted) or fed back to the step.

    A result that differs between devices must be read only flattened over the devices
    (`r.reshape(-1)`, `r.reshape((-1,) + r.shape[2:])`): the flat result is that already.
    """
    program, flow, forms, _ = site
    if program.varying[output]:
        _follow_flattened(site, step, name)
        return

    def read_back(b: cst.CSTNode) -> object:  # a sibling's results, or a readback of them
        readback = isinstance(b, cst.Assign) and forms.readback_of(b.value, name)
        return id(b) in program.siblings or readback

    for use in _reads(site, name, _one_source(site, step, name, read_back)):
        if (listed := _appended_to(flow, use)) is not None:
            _follow_list(site, step, listed)
            continue
        # `jnp.mean(loss)` (`_reduced_whole`): the same of equal copies and of the value, kept
        kept = _follow_items(program, flow, forms, use, name) or _reduced_whole(flow, forms, use)
        if kept or _read_as_one(site, use, name, output, Decline.RESULT_READ):
            continue
        # A result returned as it is (`return state`, flax's `train_and_evaluate`), stacked
        # over the devices: the callers' reads are not followed (maybe in another module)
        host = program.host.name.value
        how = _goes(flow.parent.get(id(use)), flow.parent, host)  # `return state, history` too
        why = f"`{name}`, a result of `{step}`, is read other than as `{name}[0]`: {how}"
        if how.startswith("returned"):
            why = (
                f"`{name}`, a result of `{step}`, is returned by `{host}` with its device axis: "
                f"the reads of `{host}()`'s callers (maybe in other modules) are not followed"
            )
        raise NotVisible(why, Decline.RESULT_READ)


def _read_as_one(site: _Site, use: cst.Name, name: str, output: int | None, why: Decline) -> bool:
    """Whether `use` reads equal copies (a replication, or a result `output` of the step) as
    the one value the program-level form holds: a readback of device 0 (deleted), returned to
    the caller that gave it or follows it (`carried_out`), or passed on (`save_checkpoint(state)`,
    `return state`: `_passon.py`; `why`, the decline of a result read); the edits recorded."""
    program, flow, forms, _ = site
    return (
        _readback_deleted(site, use, name)
        or carried_out(program, flow, use, output)
        or passed_on(program, flow, forms, use, name, why)
    )


def _reads(site: _Site, name: str, bindings: set[cst.CSTNode]) -> Iterator[cst.Name]:
    """The reads of `name` that `bindings` may reach, or its bindings as a part of a tuple
    unpacked (`x, y = keep((x, y))`: laid out as the part, `_unpacked_part`), but those fed to
    a step (or a field of it, `step(state.params)`, or in a container passed: checked there),
    read in `x = x - lr * g` (an argument replicated as its parts are), only waited for
    (`_waited`) or the part unpacked into `name` itself (its reads are followed from there)."""
    program, flow, forms, calls = site
    feeds = _fed(forms, calls) | program.sibling_feeds
    bindings = bindings | {b for b in flow.stores.get(name, []) if _unpacked_part(b, name, forms)}
    for use in flow.loads.get(name, []):
        arithmetic = any(id(a) in program.arithmetic for a in flow.ancestors(use))
        if not flow.reach.of(use) & bindings or id(field_top(flow, use)) in feeds or arithmetic:
            continue
        if not _waited(flow, use, forms) and not _repacked(flow, forms, use):
            yield use


def carried_out(program: Program, flow: Flow, use: cst.Name, output: int | None) -> bool:
    """`return use` or `return ..., use, ...` in a def a step is passed to, followed from its
    caller (`program.given`): recorded (`program.carried_out`) for the caller, which binds it
    and follows it as the step's result (`_callee.carried_back`)."""
    if not program.carries:
        return False
    parent, index = flow.parent.get(id(use)), None
    value: cst.BaseExpression = use
    if isinstance(parent, cst.Element) and parent.value is use:
        items = flow.parent.get(id(parent))
        if not isinstance(items, cst.Tuple) or any(
            not isinstance(e, cst.Element) for e in items.elements
        ):
            return False
        index = next(i for i, e in enumerate(items.elements) if e is parent)
        parent, value = flow.parent.get(id(items)), items
    if not isinstance(parent, cst.Return) or parent.value is not value:
        return False
    known = program.carried_out.get(id(use), (index, None))[1]
    program.carried_out[id(use)] = (index, output if output is not None else known)
    return True


def _readback_deleted(site: _Site, use: cst.Name, name: str) -> bool:
    """Record the deletion of the readback of device 0 reading `use`, if it is one; a copy
    when what it becomes is the value itself, kept (not read at once into a Python or numpy
    value, `int(state.step[0])`), and a call of the step may donate it later (`donated_after`)."""
    program, flow, forms, _ = site
    found = _readback_around(flow, forms, use, name) or _tuple_readback(program, flow, forms, use)
    if found is None:
        return False
    node, value = found
    kept = aliased(value) and not _read_on_host(flow, forms, node)  # the value itself, kept
    if kept and donated_after(program, flow, use, node):
        copied = lambda: fill(DONATED_COPY, {**program.context(), "x": value})
        program.edit(node, READ_BACK_COPIED.format(name=name), copied)
    else:
        why = f"a readback of device 0 deleted: `{name}` is the same on every device"
        program.edit(node, why, lambda: value)
    return True


# Calls reading an array into a new Python or numpy value: what they are given is not kept
ON_HOST = frozenset(
    {"int", "float", "bool", "str", "print", "numpy.asarray", "numpy.array", "jax.device_get"}
)


def _read_on_host(flow: Flow, forms: Forms, node: cst.CSTNode) -> bool:
    """Whether `node` is passed to a call reading it into a new host value (`ON_HOST`)."""
    func = found[1].func if (found := flow.passed(node)) is not None else None
    return func is not None and bool({single_name(func), forms.qualname(func)} & ON_HOST)


READ_BACK_COPIED = (
    "a readback of device 0 -> a copy of the value: `{name}` is the same on every device"
    + DONATED_LATER
)


def _tuple_readback(program: Program, flow: Flow, forms: Forms, use: cst.Name) -> _Pair | None:
    """`jax.tree.map(lambda x: np.array(x[0]), (params["student"], opt))` (big_vision's distill
    trainer): a readback of device 0 of a tuple written there, `use` (or a field of it) one of
    its items. Deleted when every item is surely the same on every device (`surely_replicated`:
    a replication or a result of the step that is, on every path); returns (the readback, what
    it becomes), else None. An item that may differ between devices blocks it, and is named
    (big_vision's vqvae reads back `(params_repl, opt_repl, state_repl)`, its state per device)."""
    item = flow.parent.get(id(field_top(flow, use)))
    items = flow.parent.get(id(item))
    passed = flow.passed(items)  # the tuple, an argument
    if not isinstance(item, cst.Element) or not isinstance(items, cst.Tuple) or passed is None:
        return None
    call = passed[1]
    stand_in = call.deep_replace(items, cst.Name("__tuple__"))
    assert isinstance(stand_in, cst.Call)
    if (found := forms.readback_value(stand_in, "__tuple__")) is None:
        return None

    def stacked(value: cst.BaseExpression) -> bool:  # copies or results, on every path
        root = base_of(value)
        return isinstance(root, cst.Name) and surely_stacked(program, flow, forms, root)

    # The body's results not known yet (an argument's reads): a result of the step among the
    # items is checked again where the results are followed (`_follow_result`)
    unsure = [
        e.value for e in items.elements if not surely_replicated(program, flow, forms, e.value)
    ]
    other = next((v for v in unsure if program.varying or not stacked(v)), None)
    # An item not surely the same on every device blocks it: a result of the step that may
    # differ between devices (PL402: the program-level form has no device 0's share of it),
    # else a value whose copies are not known to be equal (PL401).
    if other is not None:
        read = f"`{code(other)}` is read back as device 0's copy with `{use.value}` "
        read += f"(`{_short(call)}`), and "
        if stacked(other):
            why = "it is a result that may differ between devices: the program-level form holds "
            why += "one value of it, not device 0's share"
            raise NotVisible(read + why, Decline.RESULT_VARIES)
        why = "its copies are not known to be equal on every device"
        raise NotVisible(read + why, Decline.RESULT_READ)
    root, value = found  # the stand-in put back: `(a, b)`, or the copy per leaf of it
    return call, items if value is root else replaced(value, {id(root): items})


def _one_source(
    site: _Site, step: str, name: str, allowed: Callable[[cst.CSTNode], object]
) -> set[cst.CSTNode]:
    """Return the bindings of `name` to results of the calls; raise NotVisible when a read they
    reach may also read another value: not a binding before the calls of a name passed to a
    step (an argument's, checked there) or to `None`, nor `allowed`, nor the name unbound on
    that path (a parameter's value is another value; so is `metrics = {"loss": zeros(n)}`
    before the loop, whose layout nothing checks)."""
    program, flow, _, calls = site
    made = {b for b in flow.stores.get(name, []) if any(c.binds(b) for c in calls)}
    parameter = name in flow.params
    # Passed to a step (this one or another of the function): a binding before the calls is
    # an argument's, whose layout is checked there (`params = replicate(params)`)
    loads = flow.loads.get(name, [])
    fed = any(name in names_in(a.value) for c in calls for a in c.call.args)
    fed = fed or any(id(field_top(flow, u)) in program.sibling_feeds for u in loads)
    for use in loads:
        reaching = flow.reach.of(use)
        if not reaching & made:
            continue
        for binding in reaching - made:
            before = binding is not ENTRY and not _after_a_call(flow, binding, calls)
            if binding is ENTRY:  # a parameter's value, but the caller's equal copies (as results)
                other = parameter and program.entries.get(name) is not Layout.REPLICAS
            elif before:  # an argument's, or `None`
                other = not fed and not _bound_to_none(binding)
            else:  # bound after a call, not allowed nor the results' own (their mean, deleted)
                other = not allowed(binding) and id(binding) not in program.means
            if other:
                why = f"`{name}` holds a result of `{step}` and something else"
                if before:
                    why += f" (`{_short(binding)}` before its calls, whose layout is not followed)"
                raise NotVisible(why, Decline.RESULT_READ)
    return made


def _bound_to_none(binding: cst.CSTNode) -> bool:
    """`x = None`: a value no read of a result can take for it (indexing it raises)."""
    return isinstance(binding, cst.Assign) and single_name(binding.value) == "None"


def _follow_items(program: Program, flow: Flow, forms: Forms, use: cst.Name, name: str) -> bool:
    """`for k, v in name.items():` (or `for v in name.values():`) of a replicated dict of
    results, `v` read only as `v[0]` where the loop binds it (big_vision's logging of its
    measurements; `v` may be another loop's name elsewhere): each readback deleted. False when the read is not such a loop."""
    loop = flow.statement(use)
    if not isinstance(loop, cst.For) or loop.orelse:
        return False
    item: str | None = None
    if (holes_of("{d}.values()", loop.iter) or {}).get("d") is use:
        item = single_name(loop.target)
    elif (holes_of("{d}.items()", loop.iter) or {}).get("d") is use:
        pair = holes_of("({k}, {v})", loop.target) or holes_of("[{k}, {v}]", loop.target)
        names = [single_name(pair[h]) for h in "kv"] if pair else []
        item = names[1] if len(set(names) - {None}) == 2 else None
    if item is None or item == name or loop not in flow.stores.get(item, []):
        return False
    found = []
    for read in flow.loads.get(item, []):
        reaching = flow.reach.of(read)
        if loop not in reaching:
            continue  # `value` of another loop (`for key, value in evaluator.run(...)`)
        if (around := _readback_around(flow, forms, read, item)) is None or reaching != {loop}:
            return False
        found.append(around)
    why = f"a readback of device 0 deleted: the values of `{name}` are the same on every device"
    for readback, value in found:
        program.edit(readback, why, lambda v=value: v)  # type: ignore[misc]
    return True


def _gathered_list(flow: Flow, forms: Forms, use: cst.Name) -> cst.Call | None:
    """Return `common_utils.get_metrics(L)` reading `L` of `L.append(use)`, if any."""
    listed = _appended_to(flow, use)
    for load in flow.loads.get(listed or "", []):
        call = flow.parent.get(id(flow.parent.get(id(load))))
        if isinstance(call, cst.Call) and _gathering(forms, call, load.value) is not None:
            return call
    return None


def _appended_to(flow: Flow, use: cst.Name) -> str | None:
    """Return `L` of a statement `L.append(use)`, `L` a list the function makes, else None (a
    list it is given is its caller's: `use` is passed on to a call not followed, `_passon`)."""
    call = flow.parent.get(id(flow.parent.get(id(use))))
    holes = holes_of("{l}.append({v})", call) if isinstance(call, cst.Call) else None
    statement = isinstance(flow.parent.get(id(call)), cst.Expr)
    if not holes or holes["v"] is not use or not statement:
        return None
    listed = holes["l"]
    given = isinstance(listed, cst.Name) and ENTRY in flow.reach.of(listed)
    return None if given else single_name(listed)


def _follow_list(site: _Site, step: str, name: str) -> None:
    """`L.append(r)` of replicated results, `L` read only as `common_utils.get_metrics(L)`
    (device 0 of each, fetched and stacked) or where that value has replaced it.

    `get_metrics(L)` becomes `common_utils.stack_forest(jax.device_get(L))`: the same stacked
    host values, from results that have no device axis.
    """
    program, flow, forms, calls = site
    results = {t for c in calls for i, t in enumerate(c.targets) if not program.varying[i]}
    deleted = f"a readback of device 0 of each of `{name}` deleted: the results are replicated"
    gathered: list[cst.CSTNode] = []
    readbacks = {}  # `L = jax.device_get(jax.tree_map(lambda x: x[0], L))`: by id of the read
    for binding in flow.stores.get(name, []):
        value = binding.value if isinstance(binding, cst.Assign) else None
        if isinstance(binding, cst.Assign) and _binds_empty_list(binding, name):
            continue
        reads = [r for r in nodes_in(value, cst.Name) if r.value == name] if value else []
        readback = _readback_around(flow, forms, reads[0], name) if len(reads) == 1 else None
        if readback is not None and isinstance(binding, cst.Assign) and len(binding.targets) == 1:
            readbacks[id(reads[0])] = readback  # device 0's copy of every result: the results
        elif value is None or _gathering(forms, value, name) is None:
            why = f"`{name}`, a list of results of `{step}`, is bound to other values"
            raise NotVisible(why, Decline.METRICS_LIST)
        gathered.append(binding)
    for use in flow.loads.get(name, []):
        arg = flow.parent.get(id(use))
        call = flow.parent.get(id(arg))
        # `history.append(state)` (of a list the function makes: `_appended_to`)
        item = call.args[0].value if isinstance(call, cst.Call) and len(call.args) == 1 else None
        appended = isinstance(item, cst.Name) and _appended_to(flow, item) == name
        if appended and item.value in results:  # type: ignore[union-attr]
            continue
        found = _gathering(forms, call, name) if isinstance(call, cst.Call) else None
        if id(use) in readbacks:
            node, value = readbacks[id(use)]
            program.edit(node, deleted, lambda v=value: v)  # type: ignore[misc]
        elif found is not None and isinstance(arg, cst.Arg) and isinstance(call, cst.Call):
            program.edit(call, deleted, lambda f=found: f.rewrite(program.context()))  # type: ignore[misc]
        elif not flow.reach.of(use) <= set(gathered):
            why = f"`{name}`, a list of results of `{step}`, is read other than by `get_metrics`"
            raise NotVisible(why, Decline.METRICS_LIST)


def _binds_empty_list(binding: cst.Assign, name: str) -> bool:
    """`name = []`, or `name, other = [], []` (lists started together, flax's loops)."""
    value = _lined_up(binding.targets[0].target, binding.value, name)
    return len(binding.targets) == 1 and isinstance(value, cst.List) and not value.elements


def _gathering(forms: Forms, node: cst.BaseExpression, name: str) -> Match | None:
    """Return `X.get_metrics(name)` (flax's `common_utils`, `X` its owner) as its row, else
    None."""
    found = match(node, forms.qualname, table=GET_METRICS)
    ok = found is not None and single_name(found.source) == name and "owner" in found.holes
    return found if ok else None


def _follow_flattened(site: _Site, step: str, name: str) -> None:
    """A result that may differ between devices: read only flattened. `r = r.reshape(-1)`
    rebinds `r` to the flat value: a read that only that binding reaches reads the flat value."""
    program, flow, forms, _ = site

    def flat(b: cst.CSTNode) -> object:  # `r = r.reshape(-1)`: the flat value
        value = b.value if isinstance(b, cst.Assign) else None
        return isinstance(value, cst.Call) and _flattening(forms, value, name)

    made = _one_source(site, step, name, flat)
    reached = [use for use in flow.loads.get(name, []) if flow.reach.of(use) & made]
    varies = (
        f"`{name}`, a result of `{step}` that may differ between devices (the body does not "
        f"reduce it over {code(program.axis)})"
    )
    as_is = "as it is: the flat result has the same elements in order"
    means = [m for m in (_mean_around(forms, flow, use) for use in reached) if m is not None]
    if means:  # the sync is what needs one value per device: named first
        why = (
            f"{varies}, is averaged over the devices by `{_short(means[0])}`: the program-level "
            "form holds one value of it, not one per device to average"
        )
        raise NotVisible(why, Decline.RESULT_VARIES)
    reshapes = [r for r in (_reshaped(flow, use, name) for use in reached) if r is not None]
    in_shapes = {id(n) for r in reshapes for a in r.args for n in nodes_in(a, cst.Name)}
    for use in reached:  # not the argument's value, nor the flat value `r = r.reshape(-1)` binds
        if _waited(flow, use, forms) or id(use) in in_shapes:  # `r.shape[-1]` of a reshape
            continue
        # `r.reshape(...)`, `r` in its shape too
        around = [a for a in list(flow.ancestors(use))[:6] if isinstance(a, cst.Call)]
        node = next((a for a in around if _flattening(forms, a, name)), None)
        if node is not None:
            helper = _flattening_helper(forms, node, name)
            what = f"a flattening of `{name}` over devices"
            what = f"`{code(node.func)}`, {what}," if helper is not None else what
            reason = f"{what} deleted: the result is flat already"
            if _whole(helper or node):
                reason = f"`{name}` flattened {as_is}"
            program.edit(node, reason, lambda n=node: _flat_value(program, n, name, forms))  # type: ignore[misc]
        elif (reshape := _reshaped(flow, use, name)) is not None:
            reason = f"`{name}` {'reshaped' if reshape.args else 'flattened'} {as_is}"
            program.edit(reshape, reason, lambda r=reshape: _local_reshape(program, r, name))  # type: ignore[misc]
        else:
            why = f"{varies}, is read other than flattened"
            if (gathered := _gathered_list(flow, forms, use)) is not None:
                why = (
                    f"{varies}, is appended to a list read by `{_short(gathered)}`: device 0's "
                    "own share, which the program-level form, one value for all devices, does "
                    "not have (reducing it in the body would change the numbers read)"
                )
            raise NotVisible(why, Decline.RESULT_VARIES)
        program.flat_reads = True


def _flattening(forms: Forms, node: cst.Call, name: str) -> bool:
    """`name.reshape(-1)` (maybe copied first), or a module helper doing that to `name`."""
    return (
        flattens(node, name, forms.host_copy) or _flattening_helper(forms, node, name) is not None
    )


def _flattening_helper(
    forms: Forms, node: cst.Call, name: str | cst.BaseExpression
) -> cst.Call | None:
    """Return the flattening in the module helper `node` calls on `name` alone, its parameter
    read as `name`: flax's `tohost`, `n_device, n_batch, *rest = x.shape` then
    `return np.array(x).reshape((n_device * n_batch,) + tuple(rest))`, or one `return` of a
    flattening; else None."""
    args = positional(node, 1)
    helper = forms.defs.get(node.func.value) if isinstance(node.func, cst.Name) else None
    if helper is None or args is None or code(args[0]) != code(_expression(name)):
        return None
    params = helper.params  # one plain parameter, nothing else (a bare `*` needs keywords)
    if len(params.params) != 1 or len(params_of(params)) != 1 or helper.decorators:
        return None
    param = params.params[0].name.value
    lines = _statements(helper.body)  # `def tohost(x): return ...` on one line too
    lines = lines[1:] if lines and _is_docstring(lines[0]) else lines
    smalls = [line.body[0] for line in lines if isinstance(line, cst.SimpleStatementLine)]
    if len(smalls) != len(lines) or any(len(line.body) != 1 for line in lines):  # type: ignore[attr-defined]
        return None
    last = smalls[-1] if smalls else None
    value = last.value if isinstance(last, cst.Return) else None
    if not isinstance(value, cst.Call):
        return None
    one = len(smalls) == 1 and flattens(value, param, forms.host_copy)
    two = len(smalls) == 2 and _flattens_by_shape(smalls[0], value, param, forms)
    return value if one or two else None


def _flattens_by_shape(
    unpack: cst.BaseSmallStatement, value: cst.Call, param: str, forms: Forms
) -> bool:
    """`a, b, *rest = x.shape` and `x.reshape((a * b,) + tuple(rest))` (`x` maybe copied)."""
    one = isinstance(unpack, cst.Assign) and len(unpack.targets) == 1
    if not one or code(unpack.value) != f"{param}.shape":  # type: ignore[attr-defined]
        return False
    target = unpack.targets[0].target  # type: ignore[attr-defined]
    holes = holes_of("({a}, {b}, *{t})", target) or holes_of("[{a}, {b}, *{t}]", target)
    names = [single_name(holes[k]) for k in "abt"] if holes else [None]
    if None in names or len({*names, param}) != 4:
        return False
    for text in ("{x}.reshape(({a} * {b},) + tuple({t}))", "{x}.reshape(({a} * {b}, *{t}))"):
        found = holes_of(text, value)
        if found is not None and [single_name(found[k]) for k in "abt"] == names:
            return single_name(found["x"]) == param or forms.host_copy(found["x"], param)
    return False


def _flat_value(
    program: Program, flattening: cst.Call, name: str | cst.BaseExpression, forms: Forms
) -> cst.BaseExpression:
    """The flat result, copied as the flattening copied it (`np.asarray(r).reshape(-1)`)."""
    helper = _flattening_helper(forms, flattening, name)
    if helper is not None and _whole(helper):  # `tohost(r)` of `r.reshape(-1)`: of the part
        arg = flattening.args[0]
        return flattening.with_changes(args=[arg.with_changes(value=_local_part(program, name))])
    whole = flattening if _whole(flattening) else None  # `r.reshape(-1)`: of the flat part
    flattening = helper or flattening  # `tohost(r)`: its flattening, of the flat result
    assert isinstance(flattening.func, cst.Attribute)
    copy = flattening.func.value
    value = _local_part(program, name, host=not isinstance(copy, cst.Call))
    if isinstance(copy, cst.Call):  # copied to the host as the original did
        value = copy.with_changes(args=[copy.args[0].with_changes(value=value)])
    if whole is None:
        return value
    return whole.with_changes(func=whole.func.with_changes(value=value))  # type: ignore[attr-defined]


def _whole(flattening: cst.Call) -> bool:
    """`r.reshape(-1)`: every axis of the stacked result flattened, the device axis and the
    axes of each device's value alike, so kept (of the flat result: the same elements in
    order); `r.reshape((-1,) + r.shape[2:])` merges the device axis into the next alone, which
    the flat result has done already."""
    return holes_of("{x}.reshape(-1)", flattening) is not None


def _reshaped(flow: Flow, use: cst.Name, name: str) -> cst.Call | None:
    """`name.reshape(shape)`, `name.flatten()`, `name.ravel()`, whose shape is the same of the
    stacked and of the flat result: the two have the same elements in the same (row-major)
    order. The shape may read `name` only as the same in both: its last axes (`name.shape[-1]`,
    `name.shape[-2:]`), not its leading axes, its number of axes or its size."""
    method = flow.parent.get(id(use))
    call = flow.parent.get(id(method))
    if not isinstance(method, cst.Attribute) or not isinstance(call, cst.Call):
        return None
    if call.func is not method or any(a.keyword is not None or a.star for a in call.args):
        return None  # `order="F"`: another order
    if method.attr.value in ("flatten", "ravel"):
        return None if call.args else call
    if method.attr.value != "reshape" or not call.args:
        return None
    reads = [n for a in call.args for n in nodes_in(a.value, cst.Name) if n.value == name]
    return call if all(_same_when_flat(flow, n) for n in reads) else None


def _same_when_flat(flow: Flow, use: cst.Name) -> bool:
    """`r.shape[-k]` or `r.shape[-k:]`, `k` written out: the same of the stacked and the flat `r`
    (its size is not: on a job of several processes the flat `r` is global, its part this
    process's)."""
    index = flow.parent.get(id(flow.parent.get(id(use))))
    for text in ("{r}.shape[-{k}]", "{r}.shape[-{k}:]"):
        holes = holes_of(text, index) if isinstance(index, cst.Subscript) else None
        if holes is not None and holes["r"] is use and isinstance(holes["k"], cst.Integer):
            return True
    return False


def _local_reshape(program: Program, call: cst.Call, name: str) -> cst.BaseExpression:
    """Return `call`, `name.reshape(...)`, of this process's part of the result instead."""
    assert isinstance(call.func, cst.Attribute)
    return call.with_changes(func=call.func.with_changes(value=_local_part(program, name)))


def _local_part(
    program: Program, name: str | cst.BaseExpression, host: bool = True
) -> cst.BaseExpression:
    """This process's part of a result sharded over the devices (in one process, all of it);
    read into numpy under a mesh set for the program (`Program.numpy`) unless `host` is False
    (the original copied it to the host itself: `np.asarray(r).reshape(-1)`)."""
    part = fill(LOCAL_PART, {**program.context(), "x": _expression(name)})
    if host and program.numpy is not None:
        return fill(HOST_ARRAY, {**program.context(), "x": part})
    return part


def _expression(name: str | cst.BaseExpression) -> cst.BaseExpression:
    """Return `name` as an expression (a plain name for a string)."""
    return cst.Name(name) if isinstance(name, str) else name


def _after_a_call(flow: Flow, binding: cst.CSTNode, calls: list[_StepCall]) -> bool:
    """Whether a call of the step may run before `binding` (else: an argument's plain value)."""
    return flow.ran_before(binding, [c.assign for c in calls])


SEQUENCE_INDEXED = (
    "`{read}` reads the first item of `{name}`, a list or tuple here (stacked over the devices "
    "item by item), not device 0's copy: without the device axis it would read another value"
)
STACKED = Decline.STACKED_READ


def _readback_around(flow: Flow, forms: Forms, use: cst.Name, name: str) -> _Pair | None:
    """Return the readback of device 0 reading `use` and what it becomes, else None; raise
    PL303 when it indexes a list or tuple bound in the function (`sequence_bound`)."""
    found = readback_around(flow, forms, use, name)
    if found is not None and sequence_bound(flow, forms, name) and forms.indexes_whole(found[0]):
        raise NotVisible(SEQUENCE_INDEXED.format(read=code(found[0]), name=name), STACKED)
    return found
