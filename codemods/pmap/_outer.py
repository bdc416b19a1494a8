"""Steps made outside the functions that call them: a pmap decorator on a def of the module, or
`step = jax.pmap(...)` at module level. Where they are called, and where the program sets the
mesh they run on (`jax.set_mesh`, in the one function that calls them or that calls every
function calling them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import libcst as cst

from jaxmigrate.toolkit.emit import code

from ._declines import Decline, NotVisible
from ._flow import analyze_calls, keywords_in_place
from ._forms import Qualname, single_name
from ._program import Program
from ._reach import SCOPES, Flow, nodes_in
from ._specs import Options, all_devices
from ._summary import ModuleFacts

MESH = "jax.sharding.Mesh"
MAKE_MESH = frozenset({"jax.make_mesh", "jax.sharding.make_mesh"})
ARRAYS = frozenset({"numpy.array", "numpy.asarray", "jax.numpy.array", "jax.numpy.asarray"})
AUTO = "jax.sharding.AxisType.Auto"


class Site(Protocol):
    """What the groups read and set of a step's site (`_survey.PmapUse`, which imports this
    module): where it is, how it is spelled, and why its program-level form is not taken."""

    node: cst.CSTNode
    ref: cst.BaseExpression
    fallback: str


@dataclass
class OuterStep:
    """One step made outside the functions calling it, and its program in each of them."""

    site: Site
    name: str  # what the functions call
    body: cst.FunctionDef
    options: Options
    decorated: bool  # made by a decorator on `body` (else `name = jax.pmap(...)`)
    programs: list[Program] = field(default_factory=list)  # one per function calling it


@dataclass
class OuterGroup:
    """The steps whose mesh one function sets, and where: the edits are all written or none."""

    steps: list[OuterStep]
    setup: cst.FunctionDef  # the function that sets the mesh
    before: cst.BaseStatement  # the statement of `setup` the mesh is set before
    end: cst.BaseStatement | None  # the one it is unset before (a generator's); None: the end
    mesh: str = "mesh"  # the name of the mesh, made or reused
    make: bool = True  # False: a mesh of pmap's already bound to `mesh` is reused
    around: frozenset[int] = frozenset()  # the ids of the nodes around the functions (a class)


def module_function(flow: Flow, module: cst.Module, node: cst.CSTNode) -> cst.FunctionDef | None:
    """Return the def of the module `node` is in, or the method of a class of the module (a
    def of its body: big_vision's `Evaluator.run`); None at module level or in a nested scope."""
    match [a for a in flow.ancestors(node) if isinstance(a, SCOPES)]:  # nearest first
        case [cst.FunctionDef() as fn] if fn in module.body:
            return fn
        case [cst.FunctionDef() as fn, cst.ClassDef() as klass] if klass in module.body:
            return fn if fn in klass.body.body else None  # type: ignore[union-attr]
    return None


def callers(flow: Flow, module: cst.Module, name: str) -> list[cst.FunctionDef]:
    """Return the defs of the module reading `name`; raise NotVisible if read elsewhere."""
    found: list[cst.FunctionDef] = []
    for use in flow.loads.get(name, []):
        host = module_function(flow, module, use)
        if host is None:
            why = f"`{name}` is used outside the functions of the module"
            scopes = [a for a in flow.ancestors(use) if isinstance(a, SCOPES)]  # nearest first
            call = flow.parent.get(id(use))
            match scopes:
                case [cst.FunctionDef() as method, cst.ClassDef() as owner]:  # big_vision's `run`
                    why += f" (in `{owner.name.value}.{method.name.value}`, a method)"
                case [inner, *_, cst.FunctionDef() as outer] if (
                    outer in module.body
                    and isinstance(call, cst.Call)
                    and call.func is use
                    and not any(isinstance(a, cst.ClassDef) for a in scopes)
                ):  # a def (or lambda) nested in a function of the module, in no class
                    where = f" `{inner.name.value}`" if isinstance(inner, cst.FunctionDef) else ""
                    why = f"`{name}` is called in a nested function{where} of `{outer.name.value}`"
                    raise NotVisible(why, Decline.CALLED_NESTED)
            raise NotVisible(why, Decline.USED_OUTSIDE)
        if host not in found:
            found.append(host)
    if not found:
        raise NotVisible(f"`{name}` is not called in this module", Decline.NOT_CALLED)
    return found


def follow_step(
    step: OuterStep,
    flow: Flow,
    module: cst.Module,
    qualname: Qualname,
    facts: ModuleFacts,
) -> OuterStep:
    """Fill in the program of every function calling the step; raise NotVisible for why not.
    `facts`: the module's, as a step made in a function is read with (its defs, constants, the
    code base's modules it imports, its batch norms' axes, the parameters declared copies)."""
    for host in callers(flow, module, step.name):
        if host is step.body:
            raise NotVisible(f"`{step.name}` calls itself", Decline.NOT_CALLED)
        step.programs.append(
            analyze_calls(host, step.name, step.options, step.body, qualname, facts)
        )
    first = step.programs[0]
    if any(p.squeezed for p in step.programs):  # a decorator cannot wrap the body in a lambda
        why = f"`{step.name}` gets per-device keys and is made outside a function"
        raise NotVisible(why, Decline.KEYS_OUTSIDE)
    for program in step.programs[1:]:
        if program.batches != first.batches:
            why = f"`{step.name}` gets a batch in one function and a replicated value in another"
            raise NotVisible(why, Decline.CALLS_DIFFER)
        if program.params != first.params:
            why = f"`{step.name}` is called with other arguments in one function than in another"
            raise NotVisible(why, Decline.CALLS_DIFFER)
    if step.decorated:
        keywords_in_place(first, step.body, step.name)
    return step


def setup_function(
    step: OuterStep, flow: Flow, module: cst.Module, strings: set[str]
) -> cst.FunctionDef:
    """Return the function that sets the mesh: the one calling the step, or the one function
    calling all that do (each of those called there only, by name)."""
    hosts = list({id(p.host): p.host for p in step.programs}.values())
    if len(hosts) == 1:
        return hosts[0]
    candidates = [
        d
        for d in module.body
        if isinstance(d, cst.FunctionDef)
        and all(h is d or _called_only_in(flow, module, h.name.value, d, strings) for h in hosts)
    ]
    if len(candidates) != 1:
        names = ", ".join(f"`{h.name.value}`" for h in hosts)
        why = (
            f"`{step.name}` is called in {names}, and no one function of the module calls them "
            "all: where to set the mesh is not visible"
        )
        raise NotVisible(why, Decline.SETUP)
    return candidates[0]


def _called_only_in(
    flow: Flow, module: cst.Module, name: str, setup: cst.FunctionDef, strings: set[str]
) -> bool:
    """Return True if every use of `name` in the module is a call in `setup`."""
    uses = flow.loads.get(name, [])
    if not uses or name in strings:
        return False
    return all(
        isinstance(call := flow.parent.get(id(use)), cst.Call)
        and call.func is use
        and module_function(flow, module, use) is setup
        for use in uses
    )


def mesh_region(
    setup: cst.FunctionDef, flow: Flow, group: list[OuterStep]
) -> tuple[cst.BaseStatement, cst.BaseStatement | None]:
    """Return the statements of `setup`'s body the mesh is set before and unset before: the
    first calling a step, or a function calling one, or making a batch; and None (the end of
    the function) unless `setup` is a generator. A generator's `yield` hands control to the
    code iterating it, which must not run under the mesh (a pmap or another mesh's
    `shard_map` there raises): the mesh is unset before the first statement holding a `yield`
    after the first. Raise NotVisible when no statement calls the step, or (PL602) when it is
    called, or its batches made, in or after that statement."""
    if not isinstance(setup.body, cst.IndentedBlock):
        why = f"`{setup.name.value}` is written on its `def` line: no block to set the mesh in"
        raise NotVisible(why, Decline.SETUP)
    hosts = {p.host.name.value for s in group for p in s.programs}
    marks: list[cst.CSTNode] = []
    for program in (p for step in group for p in step.programs if p.host is setup):
        marks += program.calls
        marks += [n for i, n in program.nodes.items() if "batch" in program.reasons[i]]
    for name in hosts - {setup.name.value}:  # `flow` may be `setup`'s own (a method's copy)
        within = flow.host is setup
        marks += [u for u in flow.loads.get(name, []) if within or setup in flow.ancestors(u)]
    marked = {id(a) for m in marks for a in flow.ancestors(m)}  # the statements among them
    statements = list(setup.body.body)
    start = next((i for i, s in enumerate(statements) if id(s) in marked), None)
    if start is None:
        raise NotVisible(f"no statement of `{setup.name.value}` calls the step", Decline.NOT_CALLED)
    yields = [any(True for _ in nodes_in(s, cst.Yield, SCOPES)) for s in statements[start:]]
    if not any(yields):
        return statements[start], None
    end = start + yields.index(True)
    if any(id(s) in marked for s in statements[end:]):
        why = (
            f"`{setup.name.value}` is a generator that yields where it calls the step: the mesh "
            "`jax.set_mesh` sets for the step would stay set in the code iterating it"
        )
        raise NotVisible(why, Decline.SETUP)
    return statements[start], statements[end]


def mesh_in_scope(
    scopes: list[cst.BaseSuite | cst.Module],
    made: cst.CSTNode,
    flow: Flow,
    axis: cst.BaseExpression,
    qualname: Qualname,
) -> str | None:
    """Return the name of a mesh of pmap's bound in `scopes` (the function, the module) by a
    statement before the one holding `made`: `Mesh(jax.devices(), (axis,))`, Auto. Raise
    NotVisible for a mesh that is not pmap's: two meshes would be in use."""
    found: str | None = None
    holding = {id(made), *(id(a) for a in flow.ancestors(made))}
    for scope in scopes:
        before = True
        for line in scope.body:
            before = before and id(line) not in holding
            small = line.body if isinstance(line, cst.SimpleStatementLine) else ()
            for node in (s for s in small if isinstance(s, cst.Assign) and len(s.targets) == 1):
                if (kind := mesh_kind(node.value, axis, qualname)) is None:
                    continue
                target = node.targets[0].target
                if kind != "pmap" or (name := single_name(target)) is None:
                    why = f"a mesh already in scope (`{code(target)}`) is not pmap's: {kind}"
                    raise NotVisible(why, Decline.MESH)
                if before and found is None:
                    found = name
    return found


def mesh_kind(node: cst.BaseExpression, axis: cst.BaseExpression, qualname: Qualname) -> str | None:
    """Return "pmap" for a mesh of pmap's over `axis`, the reason for any other mesh, else None."""
    if not isinstance(node, cst.Call):
        return None
    name = qualname(node.func)
    if name in MAKE_MESH:
        return "`jax.make_mesh` has Explicit axes by default and its device order is the topology's"
    if name != MESH:
        return None
    args = [a for a in node.args if a.keyword is None]
    keywords = {a.keyword.value: a.value for a in node.args if a.keyword is not None}
    devices = args[0].value if args else keywords.get("devices")
    array = devices if isinstance(devices, cst.Call) and len(devices.args) == 1 else None
    if array is not None and qualname(array.func) in ARRAYS:  # `np.array(jax.devices())`
        devices = array.args[0].value
    if devices is None or not all_devices(devices, qualname):
        return "its devices are not `jax.devices()` in order"
    names = _only(args[1].value if len(args) > 1 else keywords.get("axis_names"))
    want = axis.evaluated_value if isinstance(axis, cst.SimpleString) else None
    if not isinstance(names, cst.SimpleString) or names.evaluated_value != want:
        return f"its axes are not ({code(axis)},)"
    types = _only(keywords.get("axis_types"))
    extra = set(keywords) - {"devices", "axis_names", "axis_types"}
    if extra or len(args) > 2 or (types is not None and qualname(types) != AUTO):
        return "its axis types are not Auto"
    return "pmap"


def _only(node: cst.BaseExpression | None) -> cst.BaseExpression | None:
    """The one element of the tuple `node` (`("i",)`), else `node`."""
    if isinstance(node, cst.Tuple) and len(node.elements) == 1:
        return node.elements[0].value
    return node
