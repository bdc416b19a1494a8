"""A step passed to a def of the module: `evaluate(p_eval_step=p_eval_step, params=state.params)`.

The step is made in one function (the caller) and only passed, as an argument, to a def of the
module (the callee) that calls it through its parameter (flax's lm1b and wmt: `evaluate`,
`generate_prediction`). The callee is followed as a function calling a step made outside it
(`analyze_calls`: its calls, arguments and results), its parameter bound to the step; a step
argument that the callee reads from another of its parameters (`params`) is the caller's argument
for that parameter, laid out in the caller as an argument of a call of the step would be (a
replication, a result of another step fed back, ...), and read in the callee only as passed to
the step. The caller's program makes the mesh and the step, and edits the caller's arguments;
the callee's program edits its batches, readbacks, metrics and flattenings, over a mesh equal to
the caller's (`jax.sharding.Mesh(jax.devices(), (axis,))`: meshes of the same devices and axes
are equal, so the step compiled for one takes arrays of the other).

Taken only when the callee is a def of the module called once, in the caller, holding no pmap of
its own nor calling a step made at module level, and each use of the step is such a pass;
anything else keeps the reason found first. A step called only in a def nested in the caller
(brax's `training_epoch_with_timing`, made after the step in the same block, called once) is
followed the same way, the def calling it by its own name; its edits are made with the
caller's, and it reads the caller's mesh and batch sharding. The callers of the module's defs
in other modules of the code base are not seen (as for a step made at module level).

What such a def returns of the step's results (`return state, metrics`, flax's `train_epoch`,
brax's `training_epoch_with_timing`) comes back to the caller, which binds it (`state, metrics
= train_epoch(p_train_step, state, ...)`): there it is the step's result too, fed back to the
def at the next call and read back at the end (`carried_back`). The names the caller binds to
such results are taken for them while the def's arguments are laid out (`claimed`), and
checked once its results are followed: a value returned on some paths only, or bound whole,
or read in the caller other than as the step's result is, blocks (PL301, PL401).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import libcst as cst
import libcst.matchers as m

from ._declines import Decline, NotVisible
from ._flow import (
    _check_closure,
    _check_lambda,
    _follow_argument,
    _follow_result,
    _nested,
    _Site,
    _StepCall,
    analyze_calls,
    forms_of,
    helpers_of,
    sibling_calls,
)
from ._forms import Qualname, bound_arguments, single_name, target_names
from ._layout import Layout
from ._passon import passed_to
from ._program import Program
from ._reach import SCOPES, Flow, nodes_in
from ._specs import options_of
from ._summary import ModuleFacts


def called_nested(
    flow: Flow, uses: list[cst.Name], step: str, statement: cst.BaseStatement
) -> tuple[cst.Call, cst.FunctionDef, str, dict[str, cst.BaseExpression]] | None:
    """Every use of `step` is in one def `inner` nested in the function, made after the step
    in the same block and called there once, `inner(...)`, its name bound by that def only
    (brax's `training_epoch_with_timing`): the call, `inner`, the step's name (what `inner`
    calls it by) and every argument by parameter; else None."""
    inner = {id(n): n for n in (_nested(flow, use) for use in uses)}
    found = next(iter(inner.values())) if len(inner) == 1 else None
    if not isinstance(found, cst.FunctionDef) or _nested(flow, found) is not None:
        return None
    block = flow.parent.get(id(found))
    lines = list(block.body) if isinstance(block, cst.IndentedBlock) else []
    if found not in lines or statement not in lines[: lines.index(found)]:
        return None  # a call of `inner` may come before the step is made
    name = found.name.value
    uses = flow.loads.get(name, [])
    call = flow.parent.get(id(uses[0])) if len(uses) == 1 else None
    if flow.stores.get(name) != [found] or not isinstance(call, cst.Call):
        return None
    args = bound_arguments(found, call) if call.func is uses[0] else None
    return None if args is None or step in args else (call, found, step, args)


def laid_out_in_caller(
    site: _Site,
    call: cst.Call,
    program: Program,
    value: cst.BaseExpression,
    position: int,
    step: str,
) -> Layout:
    """Lay out `value`, which the function `caller` follows passes at `call` for a parameter
    that the callee's `program` passes to the step at `position`, as if `caller` passed it to
    the step there (a replication deleted, a parameter declared as copies made one value):
    return its layout for the callee. `site`: the caller's, with no call of the step."""
    caller = site.program
    arity = len(program.batches)
    caller.batches = caller.batches or [False] * arity
    caller.params, caller.keywords = program.params, program.keywords
    values: list[cst.BaseExpression] = [cst.Name("_")] * arity
    values[position] = value
    proxy = cst.Call(cst.Name(step), [cst.Arg(value)])  # feeds: this argument only
    _follow_argument(site._replace(calls=[_StepCall(call, proxy, [], values)]), position)
    caller.calls.append(proxy)
    if position in caller.squeezed:
        return Layout.KEYS
    return Layout.PER_DEVICE if caller.batches[position] else Layout.REPLICAS


def argument_for(
    args: Mapping[str, cst.BaseExpression], param: str, callee: str, caller: str
) -> cst.BaseExpression:
    """The argument the def `caller` passes for the parameter `param` of the def `callee`, which
    `callee` passes to the step (`args`: the call's arguments by parameter); raise NotVisible
    when it passes none."""
    if (value := args.get(param)) is None:
        why = f"`{param}`, a parameter of `{callee}` passed to the step, is not passed"
        raise NotVisible(f"{why} by `{caller}`", Decline.ARGUMENT_UNKNOWN)
    return value


def returned_results(callee: cst.FunctionDef) -> tuple[list[list[cst.BaseExpression]], bool]:
    """The values each `return` of `callee` (outside its nested scopes) returns, by index in
    the tuple returned, and whether they are values returned whole (`return state`); none when
    a `return` returns nothing, or they differ in shape."""
    found: list[list[cst.BaseExpression]] = []
    shapes: set[int | None] = set()
    for node in nodes_in(callee.body, cst.Return, SCOPES):
        value = node.value
        if value is None:
            return [], False
        tupled = m.matches(value, m.Tuple([m.ZeroOrMore(m.Element())]))
        items = cst.ensure_type(value, cst.Tuple).elements if tupled else [cst.Element(value)]
        found.append([e.value for e in items])
        shapes.add(len(found[-1]) if tupled else None)
    return (found, shapes == {None}) if len(shapes) == 1 else ([], False)


def claimed(
    callee: cst.FunctionDef,
    returned: list[list[cst.BaseExpression]],
    step: str,
    statement: cst.CSTNode | None,
    call: cst.Call,
) -> dict[int, str]:
    """In the caller, `a, b = callee(...)` (`statement`): by index of what the callee returns,
    the name bound to it where every `return` there returns a name the callee binds from a call
    of `step` (taken for the step's result while the callee's arguments are laid out, checked
    once its results are followed: `carried_back`); `returned`: what its `return`s return
    (`returned_results`)."""
    lines = nodes_in(callee.body, cst.SimpleStatementLine, SCOPES)
    assigns = [s for line in lines for s in line.body if isinstance(s, cst.Assign)]
    calls = [a for a in assigns if m.matches(a.value, m.Call(func=m.Name(step)))]
    bound = {n for a in calls for t in a.targets for n in target_names(t.target)}  # `a, b = step()`
    if not returned or not isinstance(statement, cst.Assign) or len(statement.targets) != 1:
        return {}
    target = statement.targets[0].target
    parts = target.elements if isinstance(target, (cst.Tuple, cst.List)) else [cst.Element(target)]
    names = [single_name(e.value) if isinstance(e, cst.Element) else None for e in parts]
    if statement.value is not call or len(names) != len(returned[0]):
        return {}
    return {
        i: n
        for i, n in enumerate(names)
        if n is not None and all(single_name(items[i]) in bound for items in returned)
    }


def carried_back(
    site: _Site,
    statement: cst.CSTNode | None,
    call: cst.Call,
    inner: Program,
    returned: tuple[list[list[cst.BaseExpression]], bool],
    claims: dict[int, str],
    step: str,
) -> None:
    """The callee returns results of the step (`return state, metrics`: `inner.carried_out`),
    or a parameter the caller gives as equal copies: in the caller, which binds them
    (`state, metrics = callee(...)`), each is the step's result, followed there (fed back to
    the callee, its readbacks deleted). Raise PL401 when an index holds such a value on some
    paths only, or the caller binds it otherwise, or does not take it for what it is."""
    if not inner.carried_out or (isinstance(statement, cst.Expr) and statement.value is call):
        return  # none returned, or the result not read
    returned_items, whole = returned
    name = single_name(call.func)
    results: dict[str, int] = {}
    for index in range(len(returned_items[0]) if returned_items else 0):
        found = [inner.carried_out.get(id(items[index])) for items in returned_items]
        if all(f is None for f in found):
            continue
        outputs = {f[1] for f in found if f is not None}
        target = claims.get(index)
        what = "its value" if whole else f"item {index + 1} of what it returns"
        why = f"`{name}` returns a result of the step as {what}"
        if None in found:
            raise NotVisible(f"{why} on one path, another value on another", Decline.RESULT_READ)
        if len(outputs - {None}) != 1:
            raise NotVisible(f"{why}, not the same one on every path", Decline.RESULT_READ)
        if target is None:
            raise NotVisible(
                f"{why}, which its caller does not bind to a name", Decline.RESULT_READ
            )
        assert all(f is not None and f[0] == (None if whole else index) for f in found)
        output = (outputs - {None}).pop()
        assert output is not None
        results[target] = output
    # A claimed name no `return` carries out holds what the callee bound again after the step's
    # call (`loss = loss[0]`, a readback the callee's form deletes): a value without a device
    # axis in both forms, unless the caller laid it out as the step's result meanwhile.
    for index, target in sorted(claims.items()):
        if target in results or target not in site.program.carried_read:
            continue
        rebound = single_name(returned_items[0][index]) if returned_items else None
        why = f"`{target}`, bound to what `{name}` returns, is not only the step's result"
        if rebound is not None:  # bound from the step's call, then rebound (`x = x[0]`)
            why += f": `{rebound}` is bound again in `{name}` before it is returned"
        raise NotVisible(why, Decline.RESULT_READ)
    assert statement is not None
    back = _StepCall(statement, call, [], [])
    for target, output in results.items():
        _follow_result(site._replace(calls=[back]), step, target, output)


def follow_passed(
    why: NotVisible,
    host: cst.FunctionDef,
    statement: cst.SimpleStatementLine,
    pmap: cst.Call,
    body: cst.FunctionDef,
    qualname: Qualname,
    siblings: tuple[str, ...],
    facts: ModuleFacts,
    local: cst.CSTNode | None,
    unnamed: cst.BaseExpression,
    called_once: Callable[[cst.FunctionDef, cst.Call], bool],
) -> Program:
    """Return the caller's program of a step `statement` makes in `host` and only passes to a
    def of the module (`called_once` says that def is called there only and holds no pmap);
    raise `why` (the step is used other than called) when it is not such a step, or why the
    callee's calls are not taken."""
    assign = statement.body[0]
    assert isinstance(assign, cst.Assign)
    step = single_name(assign.targets[0].target)
    flow = Flow(host, skip=local)
    assert step is not None  # `analyze` raised PL101 for any other target before `why`
    uses = [  # not the pmap's own `f` of `f = jax.pmap(f, ...)` (brax's trainers)
        u for u in flow.loads.get(step, []) if all(a is not statement for a in flow.ancestors(u))
    ]
    nested = why.code is Decline.CALLED_NESTED
    found = [passed_to(flow, use, facts.defs) for use in uses]
    one = found[0] if len(found) == 1 else None
    one = called_nested(flow, uses, step, statement) if nested else one
    if one is None or not (nested or called_once(one[1], one[0])):
        raise why
    call, callee, param, args = one
    options = options_of(pmap, qualname, unnamed, facts.constants)
    caller = Program(host, statement, options.fun, options.axis, options.donate, [], None)
    caller.unnamed = not options.named
    caller.made = assign
    caller.helpers = helpers_of(flow, qualname)  # `n`, which a nested def may read (`outer`)
    sibling_calls(caller, flow, siblings, facts.defs)
    site = _Site(caller, flow, forms_of(flow, qualname, facts), [])  # the caller's, no call

    def given(program: Program, name: str, position: int) -> Layout:
        """Lay out in the caller its argument for the callee's parameter `name`, passed to the
        step at `position`: return its kind for the callee."""
        value = argument_for(args, name, callee.name.value, host.name.value)
        return laid_out_in_caller(site, call, program, value, position, step)

    binding = flow.parent.get(id(call))
    returned = returned_results(callee)  # what the callee returns, read once
    claims = claimed(callee, returned[0], param, binding, call)
    if claims:  # taken for the step's results until the callee's are followed: checked below
        caller.carried[id(binding)] = frozenset(claims.values())
    try:
        others = tuple(p for p, v in args.items() if p != param and single_name(v) in siblings)
        inner = analyze_calls(
            callee,
            param,
            options,
            body,
            qualname,
            facts,
            given,
            others,
            carried=True,
            outer=flow if nested else None,  # of its free names
        )
        caller.outputs, caller.varying = inner.outputs, inner.varying
        carried_back(site, binding, call, inner, returned, claims, param)
    except NotVisible as deeper:
        how = "called in the nested function" if nested else "passed to"
        text = f"`{step}` is {how} `{callee.name.value}`, where {deeper.why}"
        raise NotVisible(text, deeper.code) from None
    caller.batches, caller.fixed, caller.statics = inner.batches, inner.fixed, inner.statics
    caller.squeezed, caller.params, caller.keywords = inner.squeezed, inner.params, inner.keywords
    caller.callees = [inner, *caller.callees]
    if caller.squeezed or caller.keywords:
        _check_lambda(caller, flow, [call])
    if local is not None:
        _check_closure(caller, body, flow)
    return caller
