"""A value stacked for a step, passed on to a def of the module that reads only device 0's copy.

flax's imagenet example saves its replicated state through a def of the module,
`save_checkpoint(state, workdir)`, which reads device 0's copy first thing
(`state = jax.device_get(jax.tree_util.tree_map(lambda x: x[0], state))`). In the program-level
form the state is one global array, the same everywhere: that readback goes, in the def, as it
would in the function calling the step (`_flow._follow_stacked`), and the def is rewritten with
it (a `Program` of the def with those edits only, planned as a def a step is passed to is).

Taken when the value is passed whole (not a field of it) to a def of the module, by position
or keyword, and every read of that parameter in the def is such a readback of the value the
def was given. The def must then take values of that layout from every caller: every read of
its name in the module is a call passing the same value stacked for a step of the same function
(`checked`), and no other module of the code base reads its name (`FileState.outside`, from
`pipeline/codebase.py`): a def of a module in a package may be called from outside the code
base, so it counts as called. A value returned from a public function whose result nobody in
the code base reads (`FileState.outside` again: the example's `train_and_evaluate`, called by
its `main.py` and tests as a statement) is no read of its layout either: the caller gets a
global array where it got stacked copies, and no code of the code base looks. That holds of
every program, its step made in the function or outside it (a module-level step, a step stored
on `self`), but not of a function `[tool.jaxmigrate] pmap-replicated` declares: the callers the
entry speaks of are not seen, and they read what they are given.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from itertools import takewhile

import libcst as cst

from jaxmigrate.toolkit.emit import code as code_of
from jaxmigrate.toolkit.passes import Callers

from ._declines import Decline, NotVisible
from ._forms import Forms, base_of, bound_arguments, readback_around, single_name
from ._layout import DONATED_COPY, fill
from ._program import Program
from ._reach import ENTRY, Flow, assigned_name, nodes_in
from ._specs import Untranslatable, argnums


def passed_on(
    program: Program,
    flow: Flow,
    forms: Forms,
    use: cst.Name,
    name: str,
    code: Decline = Decline.STACKED_READ,
) -> bool:
    """Return True for a read of `name`, replicated for the step, that `checked` decides:
    passed to a def of the module reading only device 0's copy, or returned (`code`: the
    decline when the result is read, PL401 for a result of the step, else PL303)."""
    return (
        read_back_in_def(program, flow, forms, use, name)
        or returned_unread(program, flow, use, code)
        or copied(program, flow, forms, use, name)
    )


LIBRARIES = ("jax.", "numpy.", "flax.", "optax.")  # their functions' reads are the table's


def copied(program: Program, flow: Flow, forms: Forms, use: cst.Name, name: str) -> bool:
    """`evaluator.run(params_repl)`: `use`, a value replicated for the step, passed whole (or as
    an item of a dict, tuple or list written there) to a call the analysis does not follow (no
    def of the module, no function of the libraries the transfer table knows). The call gets
    what it got under pmap, one copy of the value per local device, stacked:
    `device_copies(params_repl)`, a helper the module gets once (`program.copier`), named in the
    site's message as the boundary left in pmap's layout. A literal whose every item is surely
    replicated is copied whole (`device_copies({"params": p, "task": t})`)."""
    passed: cst.CSTNode = use
    item = flow.parent.get(id(use))
    if isinstance(item, (cst.Element, cst.DictElement)) and item.value is use:
        literal = flow.parent.get(id(item))  # `run({"params": params_repl, ...})`: each copied
        if isinstance(literal, (cst.Dict, cst.Tuple, cst.List)):
            passed = literal
    arg = flow.parent.get(id(passed))
    call = flow.parent.get(id(arg))
    if not isinstance(arg, cst.Arg) or arg.value is not passed or arg.star:
        return False
    if not isinstance(call, cst.Call) or single_name(call.func) in forms.defs:
        return False
    qualname = forms.qualname(call.func) or ""
    if qualname.startswith(LIBRARIES) or isinstance(call.func, (cst.Lambda, cst.Call)):
        return False
    if not surely_stacked(program, flow, forms, use):
        return False
    whole = passed is not use and all(  # a per-device result among them blocks by itself
        isinstance(root := base_of(e.value), cst.Name)
        and surely_stacked(program, flow, forms, root)
        for e in passed.elements  # type: ignore[attr-defined]
    )
    copied: cst.BaseExpression = passed if whole else use  # type: ignore[assignment]
    made = f"`{program.copier}(...)` of the {type(passed).__name__.lower()} written there"
    why = (
        f"`{name}` is passed to `{code_of(call.func)}(...)`, whose reads are not followed: it "
        "gets the copies per device it had under pmap, made by "
        + (made if whole else f"`{program.copier}({use.value})`")
    )
    program.edit(copied, why, lambda: cst.Call(cst.Name(program.copier), [cst.Arg(copied)]))
    program.copies = True
    return True


def read_back_in_def(program: Program, flow: Flow, forms: Forms, use: cst.Name, name: str) -> bool:
    """`save_checkpoint(state, workdir)`, `use` the value passed and `save_checkpoint` a def of
    the module reading only device 0's copy of it: record those readbacks' deletion in the def
    (a program of the def) and the call, for `checked`; return True. Else False."""
    if (passed := passed_to(flow, use, forms.defs)) is None:
        return False
    call, callee, param, _ = passed
    inner = Flow(callee)
    if callee is program.host or pmaps(callee, forms) or not inner.loads.get(param):
        return False
    found = []
    indexed = sequence_bound(flow, forms, name)  # `p[0]` its first item: not a readback
    for read in inner.loads[param]:
        reach = inner.reach.of(read)
        if reach and ENTRY not in reach:
            continue  # the value it is rebound to (`state = jax.device_get(...)`)
        if reach != {ENTRY}:  # that or another value, or none followed (a lambda, a nested def)
            return False
        around = readback_around(inner, forms, read, param)
        if around is None or indexed and forms.indexes_whole(around[0]):
            return False
        found.append(around)
    mine = program_of(program, callee)
    given = "" if param == name else f" `{name}`"
    kept = donated_after(program, flow, use, call)  # a copy of what the step donates later
    for node, value in found:
        why = (
            f"a readback of device 0 deleted in `{callee.name.value}`: `{param}`, passed"
            f"{given} from `{program.host.name.value}`, is the same on every device"
        )
        if kept and aliased(value):
            why = why.replace("deleted", "-> a copy of the value", 1) + DONATED_LATER
            copy = lambda value=value: fill(DONATED_COPY, {**mine.context(), "x": value})
            mine.edit(node, why, copy)  # type: ignore[misc]
        else:
            mine.edit(node, why, lambda value=value: value)  # type: ignore[misc]
    program.passed_on.append(call)
    return True


def passed_to(
    flow: Flow, use: cst.Name, defs: Mapping[str, cst.FunctionDef]
) -> tuple[cst.Call, cst.FunctionDef, str, dict[str, cst.BaseExpression]] | None:
    """`callee(..., q=use, ...)` (or by position), `callee` a def of the module: the call, the
    callee, the parameter `q` bound to `use` and every argument by parameter; else None."""
    if (passed := flow.passed(use)) is None:
        return None
    call = passed[1]
    callee = defs.get(single_name(call.func) or "")
    args = bound_arguments(callee, call) if callee is not None else None
    if callee is None or args is None:
        return None
    param = next((p for p, v in args.items() if v is use), None)
    return None if param is None else (call, callee, param, args)


def parameter_for(
    fn: cst.FunctionDef, call: cst.Call, arg: cst.Arg, bound: bool = False
) -> str | None:
    """The parameter of the def `fn` that `arg`, an argument of `call`, fills: a named one,
    else `*args` or `**kwargs`, which then hold it (`bound`: a method of an instance, `self`
    filled already); None when that is not visible (`*x` passed, or `arg` is one) or none
    does (the call fails)."""
    params = fn.params
    plain = [a for a in call.args if a.keyword is None and a.star != "**"]  # by position
    if arg.star or arg in plain and any(a.star for a in plain):
        return None  # `*x`: the positions are not known
    positional = [p.name.value for p in (*params.posonly_params, *params.params)][bound:]
    named = [p.name.value for p in (*params.params, *params.kwonly_params)]
    if arg.keyword is not None and arg.keyword.value in named:
        return arg.keyword.value
    if arg in plain and (index := plain.index(arg)) < len(positional):
        return positional[index]
    rest = params.star_kwarg if arg.keyword is not None else params.star_arg
    return rest.name.value if isinstance(rest, cst.Param) else None


def surely_stacked(
    program: Program, flow: Flow, forms: Forms, use: cst.Name, same: bool = False
) -> bool:
    """Return True if `use`, a read in the function calling the step itself (not in a nested
    def or lambda, which may run before the replication: big_vision's `init` closure), reads
    on every path a replication or a step's result: its copies are then what pmap passed.
    `same`: a result of the step only where it is one that is the same on every device."""
    inside = takewhile(lambda a: a is not program.host, flow.ancestors(use))
    if any(isinstance(a, (cst.FunctionDef, cst.Lambda)) for a in inside):
        return False
    calls = {id(c) for c in program.calls}
    reach = flow.reach.of(use)
    return bool(reach) and all(
        isinstance(b, cst.Assign)
        and (
            id(b.value) in calls
            and not (same and _differs(program, b, use.value))
            or forms.replicated_source(b.value) is not None
        )
        for b in reach
    )


def surely_replicated(
    program: Program, flow: Flow, forms: Forms, value: cst.BaseExpression
) -> bool:
    """Return True if `value`, a name or a field of one (`params["student"]`), is the same on
    every device on every path: `surely_stacked`, and no binding reaching it gives it a result
    of the step that may differ between devices."""
    root = base_of(value)
    return isinstance(root, cst.Name) and surely_stacked(program, flow, forms, root, same=True)


def _differs(program: Program, binding: cst.Assign, name: str) -> bool:
    """Whether `binding`, of the step's results, binds `name` to one that may differ between
    devices (or to them all, one of which may)."""
    target = binding.targets[0].target
    if not isinstance(target, cst.Tuple):
        return any(program.varying)
    names = [single_name(e.value) for e in target.elements]
    pairs = zip(names, program.varying)
    return len(names) != len(program.varying) or any(v and n == name for n, v in pairs)


DONATED_LATER = (
    ", and a later call of the step donates it (the readback, a new array under pmap, kept it)"
)


def program_of(program: Program, fn: cst.FunctionDef) -> Program:
    """The program of the def `fn` holding edits only, made for `program` (once)."""
    mine = next((p for p in program.callees if p.host is fn and not p.calls), None)
    if mine is None:
        mine = Program(fn, None, program.body, program.axis, None, [], None)
        program.callees.append(mine)
    return mine


SEQUENCES = (cst.List, cst.Tuple, cst.ListComp)


def sequence_bound(flow: Flow, forms: Forms, name: str, seen: tuple[str, ...] = ()) -> bool:
    """Whether `name` is bound in the function to a list or tuple written out (stax's layers,
    `[(w, b), ...]`), a replication of one, or a name so bound: `name[0]` reads its first item
    (over the devices, under pmap), not device 0's copy."""
    for binding in flow.stores.get(name, []):
        if not isinstance(binding, cst.Assign) or assigned_name(binding) != name:
            continue
        value = forms.replicated_source(binding.value) or binding.value
        if isinstance(value, SEQUENCES) or _returns_sequence(forms, value):
            return True
        source = single_name(value) or name
        if source not in (name, *seen) and sequence_bound(flow, forms, source, (*seen, name)):
            return True
    return False


def _returns_sequence(forms: Forms, value: cst.BaseExpression) -> bool:
    """`init_params(...)`, a def of the module each of whose `return`s gives a list or tuple
    written out."""
    fn = forms.defs.get(single_name(value.func) or "") if isinstance(value, cst.Call) else None
    returns = list(nodes_in(fn.body, cst.Return, (cst.FunctionDef, cst.Lambda))) if fn else []
    return bool(returns) and all(isinstance(r.value, SEQUENCES) for r in returns)


def aliased(value: cst.BaseExpression) -> bool:
    """Whether `value`, what a readback becomes, is the value read or a part of it
    (`state.params`, `metrics["loss"]`), not a new array (`jax.device_get(state)`)."""
    return isinstance(base_of(value), cst.Name)


def donated(program: Program, position: int | None) -> bool:
    """Return True if the step donates the argument at `position` (any, when not literal; None:
    no parameter of the step)."""
    if program.donate is None or position is None:
        return False
    try:
        return position in argnums(program.donate.value)
    except Untranslatable:  # computed: any argument may be donated
        return True


def _position(program: Program, index: int, arg: cst.Arg) -> int | None:
    """The position of the step's parameter that `arg`, the `index`th argument of a call of the
    step, fills; None when it fills none."""
    if arg.keyword is None:
        return index
    return program.params.index(arg.keyword.value) if arg.keyword.value in program.params else None


def donated_after(program: Program, flow: Flow, use: cst.Name, at: cst.CSTNode) -> bool:
    """Whether a call of the step that may run after `at` (any, for `at` in a nested def)
    donates a value `use` reads: its name in an argument it donates, read there from a binding
    reaching `use`. What `at` keeps of it, a
    readback of device 0 (a new array under pmap) deleted, would be deleted with it."""
    if program.donate is None:
        return False
    reaching = flow.reach.of(use)
    inside = takewhile(lambda a: a is not program.host, flow.ancestors(at))
    nested = any(isinstance(a, cst.FunctionDef) for a in inside)  # it runs when called
    for call in program.calls:
        args = enumerate(call.args)
        passed = [a.value for i, a in args if a.star or donated(program, _position(program, i, a))]
        names = [n for value in passed for n in nodes_in(value, cst.Name) if n.value == use.value]
        if any(flow.reach.of(n) & reaching for n in names) and (
            nested or flow.ran_before(call, [at])
        ):
            return True
    return False


def returned_unread(program: Program, flow: Flow, use: cst.Name, code: Decline) -> bool:
    """`return state` (the value whole) from the function calling the step: recorded for
    `checked`, which takes it when nobody reads that function's result."""
    statement = flow.parent.get(id(use))
    if not isinstance(statement, cst.Return) or statement.value is not use:
        return False
    program.returns.append((use.value, code))
    return True


PASSED_ELSEWHERE = (
    "`{name}` reads device 0's copy of a value replicated for the step, and is also used "
    "{where}: its callers there may pass another layout"
)
INPUTS_ELSEWHERE = (
    "the step's batches come from an iterator of `{name}`, which would yield flat batches, but "
    "it is also used {where}, where they may be read split per device"
)


def checked(
    program: Program, flow: Flow, outside: Callers | None, strings: Collection[str]
) -> None:
    """Raise PL303 when a def `read_back_in_def` took is read other than in the calls it took,
    here or in another module, or when a function returning a stacked value (`returned_unread`)
    has its result read. `flow` is the module's; `outside` how other modules use the module's
    functions (None: not known, every public one counts as called and read); `strings` the
    module's strings (a name in `__all__` is exported: used elsewhere)."""
    for taken, why, code in (  # the reads taken, by the name read
        ([c.func for c in program.passed_on], PASSED_ELSEWHERE, Decline.STACKED_READ),
        (program.inputs, INPUTS_ELSEWHERE, Decline.ARGUMENT_UNKNOWN),
    ):
        ids = {id(n) for n in taken}
        for name in dict.fromkeys(single_name(n) or "" for n in taken):
            loads = flow.loads.get(name, [])
            here = [u for u in loads if id(u) not in ids and not defined(flow, u)]
            where = where_in(flow, here[0]) if here else elsewhere(name, outside, strings)
            if where:
                raise NotVisible(why.format(name=name, where=where), code)
    host = program.host.name.value
    if program.returns:
        here = [u for u in flow.loads.get(host, []) if not defined(flow, u)]
        reading = [u for u in here if not isinstance(_statement(flow, u), cst.Expr)]
        where = where_in(flow, reading[0]) if reading else elsewhere(host, outside, strings, "read")
        if not isinstance(flow.parent.get(id(program.host)), cst.Module):
            where = "where its callers are not followed (it is no def at module level)"
        elif program.uncopied and not program.seen:  # the callers the entry speaks of
            where = "by the callers `[tool.jaxmigrate] pmap-replicated` says pass it copies"
        if where:
            value, code = program.returns[0]
            returned = f"`{value}` is returned by `{host}` with its device axis"
            raise NotVisible(f"{returned}, and `{host}`'s result is read {where}", code)


def where_in(flow: Flow, use: cst.Name) -> str:
    """Where in the module `use` is: "in `f`", the def around it, or "at module level"."""
    node = next((a for a in flow.ancestors(use) if isinstance(a, cst.FunctionDef)), None)
    return f"in `{node.name.value}`" if node is not None else "at module level"


def pmaps(fn: cst.FunctionDef, forms: Forms) -> bool:
    """Return True if `fn` holds a pmap (its own program would rewrite it too)."""
    called = [c.func for c in nodes_in(fn, cst.Call)]
    called += [d.decorator for d in nodes_in(fn, cst.Decorator)]
    return any(forms.qualname(f) == "jax.pmap" for f in called)


def defined(flow: Flow, use: cst.Name) -> bool:
    parent = flow.parent.get(id(use))
    return isinstance(parent, (cst.FunctionDef, cst.ClassDef)) and parent.name is use


def _statement(flow: Flow, use: cst.Name) -> cst.CSTNode | None:
    """The small statement whose expression is the call of `use` (`f(...)` alone), else the
    first node around `use` that is no call of it."""
    parent = flow.parent.get(id(use))
    if isinstance(parent, cst.Call) and parent.func is use:
        parent = flow.parent.get(id(parent))
    return parent


def elsewhere(
    name: str, outside: Callers | None, strings: Collection[str], how: str = "called"
) -> str:
    """Where other code may use the module's function `name` (`how`: "called", or "read" for
    its result), or a string names it (`__all__`: exported); "" when nowhere."""
    if outside is None:
        found = "" if name.startswith("_") else "maybe by other modules (the code base is not read)"
    else:
        found = getattr(outside.of(name), how)
    return found or ("in a string (`__all__`)" if name in strings else "")
