"""Batches from an input iterator a def of the module makes: flax imagenet's `create_input_iter`.

```python
def prepare_tf_data(xs):
    local_device_count = jax.local_device_count()
    def _prepare(x):
        x = x._numpy()
        return x.reshape((local_device_count, -1) + x.shape[1:])   # split per device
    return jax.tree_util.tree_map(_prepare, xs)

def create_input_iter(...):
    ds = input_pipeline.create_split(...)
    it = map(prepare_tf_data, ds)
    it = jax_utils.prefetch_to_device(it, 2)                        # put on the devices
    return it
```

The function calling the step iterates it (`for step, batch in zip(range(n), train_iter)`,
`eval_batch = next(eval_iter)`) and passes each batch to a step. In the program-level form the
iterator yields this process's flat batch, as JAX's spmd_mnist generator does once migrated
(`_flow._generated_batches`), and each step call takes
`jax.make_array_from_process_local_data(batch_sharding, batch)`: the split in the mapped def goes
(`return x`), and so does the prefetch to the devices (`it = it`: the batch is put on the mesh
at the call, JAX's dispatch being asynchronous), as flax's lm1b passes host batches to its
`jax.jit` step.

Taken when the iterator def returns, through names bound once, an optional
`prefetch_to_device(it, n)` of `map(f, ds)`, `f` a def of the module returning a split of its
argument (or `tree_map` of a def nested in it, or of a lambda, returning one); every iterator the
function makes with it is read only so, each batch read only as passed to a step of the function
(this one, or one taken with it); and no other code uses the two defs (another function of the
module, another module of the code base: `FileState.outside`). flax's notebook calls
`train.create_input_iter` for a pmap of its own, which reads its batches split per device: the
iterator then stays as it is, and each batch is converted where the step takes it
(`global_batch`, as a batch of an iterator the analysis does not see into).
"""

from __future__ import annotations

import libcst as cst

from jaxmigrate.toolkit.emit import code

from ._forms import Forms, is_device_count, positional, single_name
from ._layout import GLOBAL_BATCH, SPLIT_EDIT, TREE_MAPS, fill, holes_of, match
from ._passon import pmaps, program_of
from ._program import Program
from ._reach import SCOPES, Flow, assigned_name, nodes_in

BUILTINS = ("next", "zip", "enumerate", "map")
SPLIT = (
    SPLIT_EDIT + " deleted in `{fn}`: the input iterator yields the flat batch, "
    "which goes into the batch sharded on the mesh at the step's call"
)
PREFETCH = (
    "a prefetch to the devices deleted in `{fn}`: the flat batch is put on the mesh at the step's "
    "call"
)
AT_CALL = "a batch of the input iterator -> this process's part of a batch sharded on the mesh"


def iterated_batches(
    program: Program,
    flow: Flow,
    forms: Forms,
    binding: cst.CSTNode,
    name: str,
    feeds: set[int],
) -> bool:
    """`name`, bound by `binding` (a loop over, or `next` of, an iterator a def of the module
    makes) and read only as the step's argument (`feeds`: the ids of the values this step's
    calls pass at this position) or a sibling step's: record the edits (the def yields flat
    batches, each call takes the global batch) and return True. Else False."""
    reach = flow.reach
    it = _iterator(binding, name)
    made = list(reach.of(it)) if it is not None else []
    if it is None or len(made) != 1 or not isinstance(made[0], cst.Assign):
        return False
    call = made[0].value
    maker = forms.defs.get(single_name(call.func) or "") if isinstance(call, cst.Call) else None
    if maker is None or not isinstance(call, cst.Call) or maker is program.host:
        return False
    if any(b in flow.stores or b in forms.defs for b in BUILTINS) or pmaps(maker, forms):
        return False  # `next`, `zip`, `map` ... rebound: not the builtins read here
    batches: list[tuple[cst.CSTNode, str]] = []  # every iterator it makes here: their batches
    makers = flow.loads.get(maker.name.value, [])
    for use in makers:
        made_it = assigned_call(flow, use)
        if made_it is None:
            return False
        for read in flow.loads.get(made_it[1], []):
            if made_it[0] not in reach.of(read):
                continue
            if reach.of(read) != {made_it[0]}:
                return False
            found = _iterated(flow, read)
            if found is None:
                return False
            batches.append(found)
    if (flat := _flat_iterator(maker, forms)) is None:
        return False
    edits, mapped = flat
    if forms.elsewhere(maker.name.value, (program.host,)) or forms.elsewhere(
        mapped.value, (maker,)
    ):
        return False  # its batches stay split for that code: converted at the step's call
    step_feeds = feeds | program.sibling_feeds
    at_calls: list[cst.Name] = []
    for bound, batch in batches:
        for read in flow.loads.get(batch, []):
            if bound not in reach.of(read):
                continue
            target = bound.target if isinstance(bound, cst.For) else None
            if read is target or any(a is target for a in flow.ancestors(read)):
                continue  # the loop's own target
            if id(read) not in step_feeds:
                return False  # the batch read otherwise: its rows would change
            if id(read) in feeds:
                at_calls.append(read)
    for fn, node, value, why, helpers in edits:
        mine = program_of(program, fn)
        mine.edit(node, why.format(fn=fn.name.value), lambda value=value: value)  # type: ignore[misc]
        mine.helpers |= helpers
    for read in at_calls:
        made_global = lambda v=read: fill(GLOBAL_BATCH, {**program.context(), "x": v})  # type: ignore[misc]
        program.edit(read, AT_CALL, made_global)
    program.inputs += [*makers, mapped]
    return True


def assigned_call(flow: Flow, use: cst.Name) -> tuple[cst.Assign, str] | None:
    """`it = use(...)`: the binding and `it`, else None."""
    call = flow.parent.get(id(use))
    assign = flow.parent.get(id(call))
    if not isinstance(call, cst.Call) or call.func is not use or not isinstance(assign, cst.Assign):
        return None
    target = assigned_name(assign)
    return (assign, target) if target is not None and assign.value is call else None


def _iterator(binding: cst.CSTNode, name: str) -> cst.Name | None:
    """The iterator `binding` reads `name` from: `for name in it`, `for i, name in zip(r, it)`
    or `enumerate(it)`, `name = next(it)`; else None."""
    if isinstance(binding, cst.Assign):  # `next(it)`
        found = holes_of("next({it})", binding.value)
        return it if found is not None and isinstance(it := found["it"], cst.Name) else None
    if not isinstance(binding, cst.For):
        return None
    source, target = binding.iter, binding.target
    if isinstance(source, cst.Name):
        return source if single_name(target) == name else None
    if not isinstance(source, cst.Call) or code(source.func) not in ("zip", "enumerate"):
        return None
    args = [a.value for a in source.args]
    if any(a.keyword is not None or a.star for a in source.args) or not args:
        return None
    index = 1 if code(source.func) == "enumerate" else len(args) - 1
    last = args[-1]
    names = [e.value for e in target.elements] if isinstance(target, cst.Tuple) else []
    if not isinstance(last, cst.Name) or len(names) <= index:
        return None
    return last if single_name(names[index]) == name else None


def _iterated(flow: Flow, use: cst.Name) -> tuple[cst.CSTNode, str] | None:
    """The binding and the name a read of the iterator gives batches to (the loop's last target,
    or the name `next(it)` is bound to), else None."""
    binding = flow.statement(use)
    batch = assigned_name(binding)
    if isinstance(binding, cst.For):
        target = binding.target
        names = [e.value for e in target.elements] if isinstance(target, cst.Tuple) else [target]
        batch = single_name(names[-1]) if names else None
    return (binding, batch) if batch and _iterator(binding, batch) is use else None


Edit = tuple[cst.FunctionDef, cst.BaseExpression, cst.BaseExpression, str, set[str]]


def _flat_iterator(maker: cst.FunctionDef, forms: Forms) -> tuple[list[Edit], cst.Name] | None:
    """The edits making `maker` return an iterator of flat batches (its optional prefetch to
    the devices deleted, the split of the def it maps deleted), and the name of that def as
    `map` reads it; None if it is not one."""
    value = _returned(maker)
    inner = Flow(maker)
    edits: list[Edit] = []
    while isinstance(value, cst.Name):
        bound = inner.reach.of(value)
        one = next(iter(bound)) if len(bound) == 1 else None
        reads = [r for r in inner.loads.get(value.value, []) if one in inner.reach.of(r)]
        if not isinstance(one, cst.Assign) or len(reads) != 1:
            return None
        value = one.value
        found = match(value, forms.qualname)
        if found is not None and found.row.name == "prefetch_to_device":
            source = found.holes["x"]
            edits.append((maker, value, source, PREFETCH, set()))
            value = source
        elif (mapping := holes_of("map({f}, {xs})", value)) and "map" not in inner.stores:
            f = mapping["f"]  # the def mapped over the batches
            mapped = forms.defs.get(single_name(f) or "")
            if not isinstance(f, cst.Name) or mapped is None or mapped is maker:
                return None
            if pmaps(mapped, forms) or (split := _split_by(mapped, forms)) is None:
                return None
            return [*edits, split], f
    return None


def _split_by(fn: cst.FunctionDef, forms: Forms) -> Edit | None:
    """`fn` returns a split of its one argument (or a `tree_map` of one): the edit deleting it."""
    value = _returned(fn)
    if len(fn.params.params) != 1 or value is None:
        return None
    outer = Flow(fn)
    splits = Forms(
        forms.qualname, lambda node: is_device_count(node, outer, forms.qualname), forms.defs
    )
    found = splits.split(value)
    if found is None:  # `tree_map(_prepare, xs)`, `_prepare` a def nested in `fn`
        args = positional(value, 2) if isinstance(value, cst.Call) else None
        func = value.func if isinstance(value, cst.Call) else value
        nested = outer.only(single_name(args[0])) if args else None  # the def `fn` binds
        if forms.qualname(func) not in TREE_MAPS or not isinstance(nested, cst.FunctionDef):
            return None
        reads = outer.loads.get(nested.name.value, [])
        if len([r for r in reads if r is not nested.name]) != 1:
            return None  # the nested def called otherwise too
        value = _returned(nested)
        if len(nested.params.params) != 1 or value is None:
            return None
        found = splits.split(value)
    if found is None:
        return None
    count = single_name(found.holes.get("n", cst.Name("_")))
    helpers = {count} if count and count in outer.stores else set()
    return (fn, value, found.source, SPLIT, helpers)


def _returned(fn: cst.FunctionDef) -> cst.BaseExpression | None:
    """What the one `return` of `fn` (outside its nested scopes) returns, else None."""
    returns = list(nodes_in(fn.body, cst.Return, SCOPES))
    return returns[0].value if len(returns) == 1 else None
