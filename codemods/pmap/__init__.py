"""Rewrite `jax.pmap` as `jax.jit(jax.shard_map(...))`.

## Why
Since JAX 0.8.0 `jax.pmap` is a thin shim over `jit` + `shard_map` with behaviour changes of its
own (nested pmap no longer runs, negative axes are wrong, inputs committed to one device are
rejected), and the JAX team asks users to move to `jax.jit(jax.shard_map(...))` (docs:
`migrate_pmap`). The two differ in one way that silently changes numbers: pmap removes the mapped
axis before calling the function, shard_map hands it a block that keeps it (size 1), so
`x.shape[0]`, `x.sum()`, a 1-D `jnp.dot`, an untiled `all_gather` or a PRNG key mean something
else in the body.

## Before
```python
import functools

import jax


@functools.partial(jax.pmap, axis_name="batch", donate_argnums=(0,))
def train_step(params, batch):
    grads = jax.grad(loss)(params, batch)
    return params - 0.1 * jax.lax.pmean(grads, "batch")
```

## After
```python
import functools

import jax
import numpy as np
from jax.sharding import PartitionSpec as P


<the helper: `_faithful.helper_text()`, filled in below>


@functools.partial(
    shard_map_per_device,
    axis_name="batch",
    in_specs=P("batch"),
    out_specs=P("batch"),
    donate_argnums=(0,),
)
def train_step(params, batch):
    grads = jax.grad(loss)(params, batch)
    return params - 0.1 * jax.lax.pmean(grads, "batch")
```

The body is left exactly as it was: `shard_map_per_device` gives it
pmap's per-device view (each mapped axis squeezed on entry, every output expanded back on exit,
which is what JAX 0.10.2's own pmap does), so every body keeps its meaning, and callers keep
theirs: outputs still carry the leading device axis, so `flax.jax_utils.replicate/unreplicate`,
`shard(batch)`, `out[0]` and `jax.local_device_count()` reshapes work unchanged. The mesh is
pmap's: an Auto `Mesh` of the first n devices in `jax.devices()` order, n the size of the mapped
axis, built when `jax.jit` first traces a call (never at import, so `jax.distributed.initialize()`
and `XLA_FLAGS` set in `main()` still take effect), or of `devices=` / `backend=` when given.
The helper owns the `jax.jit` (`static_argnums`/`donate_argnums` are passed through to it): on a
multi-process job (`jax.distributed`), as in pmap, each process passes its own devices' slices;
they become its part of global arrays (`multihost_utils.host_local_array_to_global_array`) before
the jitted call, over a mesh of every device of the job, each process's devices together (pmap's
order), and each process gets its own part of the results back
(`global_array_to_host_local_array`). In one process the call is `jax.jit`'s and nothing else.

Run over files of a project, the helper is not pasted into each file: it is written once per
code base, as `<main package>/_pmap_compat.py`, and imported where needed (`from
jax._pmap_compat import shard_map_per_device`). The main package is the one named after the
distribution (else the only library package, else the largest); files in it, importing it, or in
or importing a package beside it use it, so JAX's `tests/`, flax's example folders and AlgoPerf's
`algorithms/` share their library's copy. Only a script importing no package of its code base
gets a copy beside it. The site's message names the module and why (`docs/architecture.md`).

## Two forms: program-level (the default) and faithful
`pmap-style = "idiomatic"` (`[tool.jaxmigrate]`, `--pmap-style` on `run` and `check`; the
default) takes the **program-level** form wherever the data flow around the step is fully visible:
the step is made in the function that calls it (`jax.pmap(body, ...)` or
`jax.pmap(functools.partial(body, k=...), ...)`, `body` a def of the module, a def of that
function (which `body = jax.pmap(body, ...)` may rebind: brax's trainers) or a lambda; or a `@partial(jax.pmap, ...)` def of that function, which becomes
`@partial(jax.jit, ...)` over `@partial(jax.shard_map, mesh=...)`, the mesh made just before the
def), or outside any
function (a pmap decorator on a def of the module, or `step = jax.pmap(...)` at module level) and
called in one function or in several that one function of the module calls; its arguments (names,
or the expressions below written in the call; keyword arguments too, which the calls then pass by
position: `jax.shard_map` takes no keywords) are replicated values (`flax.jax_utils.replicate`,
`jnp.broadcast_to(x, (n,) + x.shape)` or its `jax.tree.map`, `jnp.stack([x] * n)`, a module
helper doing one of these (read through its summary: a def of the module returning one row of
the table of a parameter, the number of local devices maybe passed, `_replicate(tree, n)`; the
call becomes the row's program-level form, and a private helper no longer called goes) or a
named lambda doing one of these; a donated one becomes a copy,
`jax.tree.map(jnp.copy, x)`, as pmap donated the replicas), splits of a
flat batch (`x.reshape((n, k) + x.shape[1:])`, or `x.reshape(n, k, *x.shape[1:])`, any `k`
without a call: the reshape succeeds
only when it is the rows per device; or its `jax.tree.map`, `common_utils.shard`, a
module helper doing one of these, of a loop variable too; `next(it)` of a generator of the
function, called once, whose every `yield` is such a split or a tuple of them: the generator then
yields the flat batches, JAX's spmd_mnist example), any of these packed in a tuple and unpacked
into the same names, maybe through calls keeping each leaf (`np.asarray`, `x.astype(x.dtype)`, a
module helper mapping one, brax's `state, env = _strip_weak_type((state, env))`, kept as it is),
per-device keys (`jax.random.split(k, n)`, `common_utils.shard_prng_key(k)`:
`P(axis)`, each device taking its own key, `key[0]`, in a lambda around the body; steps made in a
function only), `in_axes=None`
or static arguments, or its own results fed back; its results are read only as device 0's copy
(`r[0]`, a field `r.step[0]`/`r["loss"][0]`, `jax.device_get(r)[0]`, `jax.tree.map(lambda v:
v[0], r)`, `unreplicate(r)`, a module helper doing one of these; a call read so in any
expression, `return unreplicate(step(...))`), appended to a list read by
`common_utils.get_metrics` (-> `common_utils.stack_forest(jax.device_get(...))`), reduced
over every axis by a mean, maximum or minimum (`jnp.mean(r)`, `np.max(r)`, `r.mean()`: the
same of equal copies and of the value, kept), or fed back;
and each result is the same on every device, or is read only reshaped on the host
(`r.reshape(-1)`, `r.flatten()`, `r.reshape(-1, k)`, `r.reshape([-1, r.shape[-1]])`:
per-example predictions; the shape may read `r`'s last axes, not its leading ones, its number
of axes or its size), which gets `P(axis)` and becomes this process's part of the flat result
(`multihost_utils.global_array_to_host_local_array`; in one process, all of it), reshaped as
written: the stacked and the flat result have the same elements in order. Only a reshape
merging the device axis into the next alone (`r.reshape((-1,) + r.shape[2:])`, flax's `tohost`)
goes. "The same on every device" is read from the body (nested defs,
closures, `value_and_grad(..., has_aux=True)`, dicts, `if`/`else`, loops): a `pmean`/`psum`/
`pmax`/`pmin`/`all_gather` over the step's axis, a library function's results its summary says
are (flax's `DynamicScale.value_and_grad(..., axis_name=axis)`: its new scale, finite flag and
grads), a shape, or computed from replicated values alone; a
value computed from a batch or a key, `axis_index`, `ppermute`, a function of the module using
one, or a closure reading any of these differs (when unsure: differs, and the faithful form is
kept: batch-norm statistics of each device's forward pass, unless `pmean`'d). A tuple the body
builds, unpacks or indexes is read part by part (`aux, grads = grad_fn(params)` of
`jax.value_and_grad(loss_fn, has_aux=True)`, then `new_model_state, logits = aux[1]`: the
statistics the same, the logits not), outside loops. flax's `model.apply(..., mutable=
["batch_stats"])` (`state.apply_fn`) returns statistics the same on every device when every
`BatchNorm` named in the step's module and the code base's modules it imports is made (or bound
by `partial`) with `axis_name=` the step's axis, as flax imagenet's `models.py`; the step's
message then says so (`_body.averaged_axes`).
A batch split for the step read by the module's flattening helper (`tohost(batch["inputs"])`)
becomes this process's part of the global batch.
A mean over devices of the step's results (a pmapped `pmean` of its argument over its own axis,
flax imagenet's module-level `cross_replica_mean` called in `state = sync_batch_stats(state)`, a
helper returning `state.replace(batch_stats=cross_replica_mean(state.batch_stats))` or
`state.copy({"batch_stats": avg_fn(state["batch_stats"])})`) is the value itself when they are
equal copies: the call goes and the state is fed back, as flax's engineers removed
`sync_batch_stats` once the step `pmean`ed the statistics. Results that may differ between
devices (a batch norm without `axis_name`, or a model the analysis does not read) are really
averaged: PL402, naming the sync; a mean of a value from outside the function is PL301.
Module-level code that is then read nowhere goes with the group, each deletion a site of it:
a def or a `name = jax.pmap(...)` whose every read the group deletes or is in code so deleted
(`sync_batch_stats`, then `cross_replica_mean`), bound once, named in no string, used by no
other file of the code base (`_dead.left_unread`).
The device axis then disappears, as in the public migrations (big_vision, AlgoPerf, flax lm1b):

```python
def main():
    n = jax.local_device_count()
    p_train_step = jax.pmap(train_step, axis_name="batch", donate_argnums=(0,))
    params = jax.tree.map(lambda x: jnp.broadcast_to(x, (n,) + x.shape), params)
    for x, y in batches:
        batch = jax.tree.map(lambda v: v.reshape((n, -1) + v.shape[1:]), {"x": x, "y": y})
        params, loss = p_train_step(params, batch)
        log(loss[0])
    params = jax.tree.map(lambda x: x[0], params)
```
becomes
```python
def main():
    n = jax.local_device_count()
    mesh = jax.sharding.Mesh(jax.devices(), ("batch",))
    batch_sharding = jax.sharding.NamedSharding(mesh, P("batch"))
    p_train_step = jax.jit(
        jax.shard_map(
            train_step,
            mesh=mesh,
            in_specs=(P(), P("batch")),
            out_specs=(P(), P()),
            check_vma=False,
        ),
        donate_argnums=(0,),
    )
    for x, y in batches:
        batch = jax.make_array_from_process_local_data(batch_sharding, {"x": x, "y": y})
        params, loss = p_train_step(params, batch)
        log(loss)
```
The mesh (every device of the job, `jax.devices()` order) is made once, where the step was made
(an existing `jax.sharding.Mesh(jax.devices(), (axis,))` in scope is reused; a `jax.make_mesh`,
Explicit by default and in the topology's device order, keeps the faithful form);
replicated arguments and results are `P()` and passed or read as they are (the replication and
the readbacks are deleted); a batch is `P(axis)`: its per-device block is exactly the old
per-device slice, so the body is unchanged, collectives included; on a multi-process job each
process's flat batch becomes its part of the global batch (`make_array_from_process_local_data`;
in one process, the batch itself). `in_axes=None` -> `P()`, `static_broadcasted_argnums` ->
`static_argnums` (spec `None`), `donate_argnums` kept. `check_vma=False` keeps pmap's numbers: the
body's `pmean` of per-device gradients of a `P()` parameter (with `check_vma=True` those come out
already summed over devices; cookbook rule 9). The step and every replicate/split/readback edit
are one group of sites: written together or not at all. When verification runs and the group
fails (its outputs differ, or a value it treats as replicated differs between devices in the
original), its steps are migrated again in the faithful form, verified, and written if they
verify, the message saying why the program-level form failed. A step made outside the
functions calling it keeps no mesh of its own; the function that calls it (or the one function
calling every function that does) makes the mesh once, before the first call, as a program sets
up its devices (never at import: `jax.distributed.initialize` must run before any device query),
and runs the rest under `with jax.set_mesh(mesh):`. Scoped, not global: under a mesh set so, any
`jax.pmap` or `shard_map` over another mesh raises, so this is taken only when every pmap of the
module is migrated program-level over the same axis (code in other modules that the function
calls, running pmap or shard_map over other meshes, must be migrated too):

```python
@functools.partial(jax.pmap, axis_name="batch", donate_argnums=(0,))
def train_step(params, batch): ...
```
becomes
```python
@functools.partial(jax.jit, donate_argnums=(0,))
@functools.partial(
    jax.shard_map, in_specs=(P(), P("batch")), out_specs=(P(), P()), check_vma=False
)
def train_step(params, batch): ...


def main():
    ...
    mesh = jax.sharding.Mesh(jax.devices(), ("batch",))
    with jax.set_mesh(mesh):
        for x, y in batches:
            batch = jax.make_array_from_process_local_data(P("batch"), {"x": x, "y": y})
            params, loss = train_step(params, batch)
```
Steps made in one function share one mesh, and a result of one fed to another (a train step's
state to an evaluation step) is replicated on both sides.
A step made in a function and only passed to a def of the module called once, there, holding no
pmap (flax lm1b's `evaluate(p_eval_step=p_eval_step, params=state.params, ...)`), or only called
in a def nested in the function and called once after the step is made (brax's
`training_epoch_with_timing`), is followed in that def: its parameter is the step, and a
parameter it passes on to the step is the caller's argument, laid out in the caller (a
replication, another step's result) and read in the def only as passed; the def's own batches,
readbacks, `get_metrics` and `tohost` are edited there, over a mesh equal to the caller's
(`jax.sharding.Mesh(jax.devices(), (axis,))`; a nested def reads the caller's own); another
step's state passed to such a def and only passed on is that step's feed (not PL303).
What the def returns of the step's results (`return state, metrics`) and its caller binds to
names (`state, metrics = train_epoch(...)`) is the step's result in the caller too: fed back
to the def, read back at the end (`_callee.carried_back`).
A step stored on `self` (`self.step = jax.pmap(...)`, `self.eval_fn = get_eval_fn(...)`, a
factory of the module returning its pmap-decorated def, `self.repr_fn =
self.get_representation_fn(...)`, a method of the class doing so that no other class of the
module defines, or `self.predict_fn =
partial(_run_predict_fn, predict_fn)`, a module-level decorated def with its static arguments
bound, big_vision's mean evaluator) and called in one other method of the class is followed
in that method, which sets the mesh (`_stored.py`); the stores and the calls stay as written.
Several such steps called in one method are followed there together, under one mesh; when one
of them is not taken, the others say which and why (big_vision's retrieval evaluator). Steps
stored on `self` and called in several methods are followed when one of those methods calls
each other one, as `self.method(...)`, and nothing else reads it (big_vision's
discriminative classifier: `evaluate` calls `self._embed_texts(params, ...)`): each method is
read on a copy of its own, the mesh is set in the calling one, and a parameter of another
method passed to a step there is laid out where the calling method passes it, at each call.
A step the calling method passes to such a method as a value (big_vision's retrieval
evaluator: `self._embed(..., self._embed_images_p, ...)`, `self._embed(...,
self._embed_texts_p, ...)`) is followed there under the parameter's name, once per call; the
steps passed through one parameter must make the same edits there (else PL204).
A value replicated for a step and passed whole to a def of the module whose only reading of it
is device 0's copy (flax imagenet's `save_checkpoint(state, workdir)`, which begins
`state = jax.device_get(jax.tree_util.tree_map(lambda x: x[0], state))`) is the same value:
that readback goes in the def, as long as every use of the def's name, in the module and in
the rest of the code base, is such a call (`_passon.py`); `return state` from the function
calling the step is no read of its layout when nobody, in the module or the code base, reads
that function's result (its callers call it as a statement: the example's `main.py` and
tests). A def of a module in a package, which code outside the code base may import, counts
as called and read there (unless the code base's `[tool.jaxmigrate] closed-code-base = true`
says nothing outside imports it: then where its own files use it, `pipeline/codebase.py`); so
does a public def when the code base is not known (a text alone).
Batches from an input iterator a def of the module makes (flax imagenet's `create_input_iter`:
`prefetch_to_device(map(prepare_tf_data, ds), 2)`, `prepare_tf_data` splitting each batch per
device, maybe through `tree_map` of a def nested in it), iterated by the function calling the
step (`for step, batch in zip(range(n), it)`, `batch = next(it)`) and each batch read only as
passed to its steps, are flat batches once that split and that prefetch go; each call takes
`jax.make_array_from_process_local_data(batch_sharding, batch)` (`_inputs.py`). When other
code, in the module or the code base, uses those defs (flax's notebook calls `create_input_iter`
for a pmap of its own), the iterator stays as it is and each batch is converted where the step
takes it (`global_batch`, below).
Such a step must be used only as called in functions of the module (not named in a string such
as `__all__`, not passed around otherwise). Anything else (a step passed to other code, called where no one
function calls all its callers, arguments from outside the function, a result fed to another
step, a result that differs between devices and is read otherwise, a body with `try` or
`global`) gets the faithful form below, and the site's
message says why the program-level form was not taken. A parameter `[tool.jaxmigrate]
pmap-replicated` names (`"Evaluator.run(params)"`: its callers, which the analysis may not see,
pass equal copies of one value, one per local device) is replicated: the def begins with
`params = from_device_copies(params)` (device 0's copy, replicated over the job's devices), its
callers unchanged (`tests/test_pmap_declared_copies.py`); its other reads are followed as a
replicated value's, and a def returning the step's stacked result to those callers, whom the
analysis does not see, keeps the per-device form (PL401). A parameter that each call of its
def passes a replication (`replicate(params)`, or a name every binding reaching it binds to
one, or to a result a step kept per device, made by a factory of the code base, returns the same
on every device when fed its own: vision_transformer's `params_repl` through
`train.make_update_fn(...)`'s step, `_survey.kept_copies`), the def called only so, in its module (its functions, or its statements read in order,
a notebook's cells), and nowhere else (private, or no other module of the code base names it),
is taken as declared, the message saying it was seen
(`_survey._copies_seen`; fixture `program_copies_seen_at_every_call`). A site whose one
blocking value is such a parameter (PL301) ends its message with the entry that would declare
it. `pmap-style = "faithful"` selects the
faithful form everywhere. Fixtures: `tests/fixtures/pmap/program_*.py`, each paired with a
`faithful_program_*.py` of the same program (both executed on 8 CPU devices).

Forms: `jax.pmap(f, ...)` anywhere in an expression (assigned, on attributes, called inline,
`f = jax.pmap(f)`), `@jax.pmap`, `@functools.partial(jax.pmap, ...)`, with `jax` under any alias
or `pmap` imported by name, at module level or in a function. Arguments:
- `axis_name` (positional or keyword) is kept; an unnamed axis gets a name no string in the module
  uses (`"device"`); `in_axes`/`out_axes` become `in_specs`/`out_specs` of the same structure
  (`0` -> `P(name)`, `1` -> `P(None, name)`, `None` -> `P()`, tuples and dicts stay so);
- `static_broadcasted_argnums` -> `static_argnums=` of the helper's `jax.jit`, the static
  positions of `in_specs` set to `None` (passed through, not sharded); `donate_argnums` is carried
  to `jax.jit` unchanged (both count static arguments);
- `devices=` and `backend=` go to the mesh; `axis_size=` is dropped: in one process it only checks
  the mapped size, which the mesh is built from;
- keyword arguments of the call are mapped over their leading axis, as pmap maps them;
- `jax.pmap(jax.pmap(f, axis_name="j"), axis_name="i")` and two stacked pmap decorators become one
  shard_map over a 2-D mesh `("i", "j")` (nested pmap no longer runs on JAX 0.10.2).

The body is never rewritten into the "idiomatic" shard_map form (seeing a size-1 block): whether
a body is indifferent to that extra axis cannot be proven from its text in general (it calls
other functions), and the per-device form costs nothing to keep: the squeeze and expand are free
in XLA, and `jax.jit` dispatches faster than pmap did (`benchmarks/pmap_step.py`).

## Safety
unsafe. The per-device form keeps each body's meaning, but the program around it changes: `jit`
(not pmap) now places inputs, so inputs already sharded differently are resharded instead of
rejected; `out_axes=None` still returns device 0's value without proof that all devices agree
(`check_vma=False`, as pmap: with `check_vma=True` a gradient taken in the body with respect to a
replicated or closed-over value comes out summed over devices, 8x too large on 8 devices, and a
`lax.scan` whose carry starts replicated raises). On multi-process jobs a call made while tracing
(the pmapped function called inside another `jax.jit`) is not converted to global arrays.

## Skips
- `in_axes`/`out_axes` that are computed, negative (they need the rank), booleans, a top-level
  list or dict (pmap rejects those), or unpack with `*`/`**`.
- `static_broadcasted_argnums` that is computed (but `tuple(range(k, k + len(names)))` for a
  def `f(a, b, *args)` of `k` parameters: every star argument static, `in_specs=(P("i"),
  P("i")) + (None,) * len(names)`; big_vision's flexi trainers), or with one `in_axes` for all
  arguments when the function's arity is not visible (a lambda, `partial`, an attribute,
  `*args`, a default after the last static argument, unless every reference to a decorated def
  in its module is a call passing the same number of arguments by position: the specs are
  sized for those).
- `axis_name` that is computed (a call or subscript: it would be evaluated twice) or a tuple.
- Calls with `*args`/`**kwargs`, unknown keywords, more positional arguments than pmap takes, or
  `fun=` by keyword; `functools.partial(jax.pmap, ...)` kept as a value and `jax.pmap` passed
  around as a value (its calls are not visible). `t = jax.pmap if c else g` whose every use in
  its function is a call `t(f, axis_name="a")` (one literal `a`) is taken: `jax.pmap` becomes
  `functools.partial(shard_map_per_device, in_specs=P("a"), out_specs=P("a"))`. A shortcut
  bound at a module's level, `pmap = functools.partial(jax.pmap, axis_name=AXIS)` (ferminet's
  `constants.pmap`), stays; each call made through it, in its module or in another module of
  the code base (`constants.pmap(step, donate_argnums=1)`, `@functools.partial(constants.pmap)`,
  `@constants.pmap`), is read as the `jax.pmap(...)` call it makes and migrated there, and
  written as it was where it is not (`_shortcut.py`). A module calling it without importing
  `jax` says so (skipped).
- `functools.partial(jax.pmap, ...)` binding positional arguments (they would fill `fun`).
- Nested pmap that is not visible in one expression or one def (a pmapped function whose body
  pmaps again, `jax.pmap(g)` of a `g` pmapped in another statement), whose levels take other
  arguments than `axis_name` (and `donate_argnums` outside), or that is three levels deep; pmap
  decorators that are not adjacent.
- Every site of a module where `shard_map_per_device` already names something else.
- The program-level form is declined, and the faithful form kept, with a stable code first in
  the site's message (`program-level form not taken: [PL301] argument 1 of the step comes from
  elsewhere ...`), naming the value that blocks it and where; each code has a fixture
  (`tests/fixtures/pmap/decline_pl*.py`, or a `program_*_kept_faithful.py` case):
  - `PL101` the step is not assigned to a name by a statement of its own (`self.step =
    jax.pmap(...)`); `return jax.pmap(body, ...)` ending a def of the module (a factory) is
    followed when the factory's one call is `step = factory(...)`, a statement of a function
    calling `step`, and no other module calls it (a public factory in a package may be: PL101
    names that): the factory returns `jax.jit(jax.shard_map(body, mesh=...))` on a mesh of its
    own, the caller lays out the arguments and results, and the steps the caller makes itself
    are read with it, each the others' sibling (vision_transformer's `train_and_evaluate`);
  - `PL102` the pmapped function is not a def of the module (an attribute `model.apply`, an
    import, a parameter, a def nested in another function) and pmap names its axis (with no
    `axis_name` the body cannot name the axis: it holds no collective over it and runs on each
    device's slice alone, as each device's block of the program-level form, its results
    differing between devices when an argument does: `jax.pmap(partial(model.apply,
    train=False))` is followed as such a body);
  - `PL103` the step is called where it is made (`jax.pmap(f)(x)`);
  - `PL104` the step is made in a class body, a lambda or a block at module level other than
    `if __name__ == "__main__":` (`if jax.device_count() > 1:`; a pmap-decorated method whose
    `self` is static and that one other method of its class calls is followed there as a step
    stored on `self`, `jax.jit` keeping `self` static, unless another def of the module has its
    name or another module may name its class: PL201; one that a base class in another module
    of the code base calls, AlgoPerf's `self._eval_model(...)` in `BaseCifarWorkload`, is read
    there only to name what blocks it, and stays PL104 when nothing does). A step made in
    `if __name__ == "__main__":` is followed in that block as in a function, and one made at
    module level and used only there (a script's loop, a notebook's cells) in the module's
    statements, read as the body of one function: the mesh is made where the step is, its
    names are globals that no def of the module may read when the step is passed or returns
    them (PL304), and the module must have no other pmap (PL601: its statements are rewritten
    as one). Such a group is verified by running the module as `python file.py` does (a
    notebook's code cells, in order, as one script);
  - `PL105` a nested pmap; `PL106` the def has other decorators than pmap's;
  - `PL107` the step's name is bound more than once;
  - `PL108` a pmap option this form does not take (`devices=` other than `jax.devices()`,
    pmap's default, which is taken as none: lm1b's one device per process; `backend=`, `in_axes` other than
    a tuple of 0 and None, computed `static_broadcasted_argnums`, but the static tail of a
    def `f(a, b, *args)`, `tuple(range(2, 2 + len(names)))`, which the program-level form
    takes too: `jax.jit`'s `static_argnums` keeps the expression, `in_specs` is `(P(),
    P("i")) + (None,) * len(names)`, and the calls pass the `k` named arguments first, then
    any star arguments (`*choice`; other calls are PL204));
  - `PL109` the mapped axis has no literal name (a string, a name bound once at module level
    to one, brax's `_PMAP_AXIS_NAME = "i"`, or a field set once to one by a statement of a
    class's `__init__`, big_vision's `self._axis_name = "batch"`; kept as written);
  - `PL110` the body's parameters (`*args`, `**kwargs`, a `partial` binding a parameter the def
    lacks or a name bound again after the step is made, a parameter named as a global it reads);
  - `PL111` the step is made, from a def of the module, in a function the module calls more
    than once or in a loop (`run(params, xs)` twice, to resume from a checkpoint): pmap
    compiles a step of the same def once, `jax.jit(jax.shard_map(...))` made there would be
    compiled again at each call;
  - `PL201` the step is used other than called (passed to code of another module, to a def
    called more than once or holding a pmap, named in `__all__`; returned by a factory other
    code may call, a public one of a package unless `closed-code-base`; a def it is passed to
    that blocks names its value, with that value's code: "`p_eval_step` is passed to
    `evaluate`, where ..."; stored on `self` and passed to a method a subclass overrides,
    naming the override; reading it only as an object, `step not in self._compiled`,
    `self._compiled.add(step)`, is no such use); `PL202` used outside the functions of the module as well as in
    them (`STEPS = {"total": step}` beside `step(x)` in a def), or a name the function making
    it declares `global` or `nonlocal` (other functions may call it); `PL203` called in a nested
    function not followed (called more than once, or maybe before the step is made); `PL204` its calls pass different arguments (`*`/`**`, keywords out of order, a
    batch in one function and a replicated value in another; a method calling steps stored
    on `self`, passed by the method calling it a value the rewrite changes and that it reads
    other than as a step's argument); `PL205` not called;
  - `PL206` a call's results are bound other than to plain names (`d["k"] = step(...)`), or
    `step(...)[0]` of a tuple;
  - `PL301` an argument's layout comes from outside the function (a parameter, a global; the
    argument of a mean over devices, AlgoPerf's `avg_fn`). Parameters of a def whose callers the analysis does not see, when
    they alone block, end the message with the `[tool.jaxmigrate] pmap-replicated` entry that
    would declare them equal copies per device (`"Evaluator.run(params)"`: never for a batch;
    verification checks it where it runs the program). A value drawn from an iterator the
    analysis does not see into (`for batch in batches`, `batch = next(it)`, `it` another
    module's input pipeline or a parameter) is fresh data at each step, not state: pmap took its
    leading axis as this process's devices, so it is converted where it is passed, by a helper
    the rewrite defines once in the module (`global_batch(batch, batch_sharding)`: each device
    gets the rows it had), its other reads unchanged; the message names the pipeline, whose
    batches can be made flat later. `PL302` it is stacked on one path and not on another; `PL303` a value stacked for
    the step is read other than passed to it (or passed to a def reading device 0's copy that
    other code calls too, or returned from a function whose result is read). A replicated value
    passed to a call the analysis does not follow (big_vision's `evaluator.run(params_repl)`,
    whose evaluator pmaps a step of its own) gets the copies per device it had under pmap, by
    a helper the rewrite defines once in the module (`device_copies(params_repl)`), when every
    path to that read brings a replication or a step's result; a value only waited for by a def
    of the code base (`u.chrono.pause(wait_for=x)`) is no read of its layout; `PL304` the body reads a value of the function
    whose layout changes; `PL305` per-device keys for a step that cannot take its own key (a
    decorated step);
  - `PL306` an argument stacked over devices or a count not visibly every device of the
    process (brax's `jax.device_put_replicated(state,
    jax.local_devices()[:local_devices_to_use])`, `jax.random.split(key, local_devices_to_use)`,
    a literal `8`), or holding one: a def of the module returning it (brax sac's
    `_init_training_state`), a field of a class built with keyword arguments or of a container
    (brax v1's `TrainingState(key=jnp.stack(jax.random.split(key, local_devices_to_use)))`):
    pmap maps the step over those devices alone, the program-level form over every device of
    the job;
  - `PL401` a result is read other than as device 0's copy, fed back or flattened (returned
    with its device axis, kept with another value; a call read in an expression other than as
    device 0's copy: `return step(x)`, `state.copy({"k": step(x)})`); `PL402` a result that differs between
    devices is read other than flattened (averaged over the devices by a sync such as
    `sync_batch_stats(state)`: the program-level form holds one value, not one per device); `PL403` a list of results is read other than by
    `common_utils.get_metrics`;
  - `PL501` the body is not followed (no final `return`, `try`, `global`, a binding inside an
    expression);
  - `PL601` another mesh or pmap of the module would clash with the step's mesh (a
    `jax.make_mesh` in scope, steps over different axes, a pmap kept per-device), or a batch
    split for the step under `jax.set_mesh` is a jax array (made by a jax operation, or
    bound to one), which `jax.make_array_from_process_local_data` does not take there on a
    multi-process job;
  - `PL602` the step is called in several functions and no one function calls them all (a
    step stored on `self` and called in two methods, neither calling the other), or
    the function setting its mesh is a generator yielding where it calls the step (the mesh
    would stay set in the code iterating it; a generator yielding only after its calls has the
    mesh unset before its first `yield`), or is written on its `def` line (no block to set the
    mesh in);
  - `PL603` the program-level form failed verification (its group is migrated faithfully).

## Verification
The fixtures run each original (or, for nested pmap, the nested-`vmap` oracle) and its rewrite in
separate processes on an 8-device CPU mesh and compare outputs: rank-sensitive bodies, PRNG keys,
`out_axes=None`, static arguments, 4 of 8 devices, kwargs, nested pmap and `pure_callback` in the
body, and `check_vma` traps (a gradient of a closed-over value, a `lax.scan` with a replicated
initial carry). `jaxmigrate run` verifies each site the same way on the user's own inputs.
`tests/test_pmap_multihost.py` runs a pmap train step and its rewrite as a real 2-process job
(gloo collectives, 4 CPU devices per process): every process gets the numpy oracle's weights.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any, ClassVar

import libcst as cst
from libcst.metadata import PositionProvider

from jaxmigrate.model import Safety
from jaxmigrate.toolkit.cstutil import names_in
from jaxmigrate.toolkit.emit import Call, code, with_lambda_calls
from jaxmigrate.toolkit.facts import AstFacts
from jaxmigrate.toolkit.names import dotted, walk
from jaxmigrate.toolkit.passes import ModuleCache
from jaxmigrate.toolkit.scope import ScopeModel

from ._dead import bound_name, drop_dead_helpers, drop_dead_locals
from ._faithful import Faithful, after_imports, helper_text, with_helper
from ._outer import OuterGroup, OuterStep, Site
from ._program import Program, assign, edit_owners, numbered, rewrite_host
from ._shortcut import may_bind, restored, written_out
from ._stored import named_back
from ._survey import HELPER, PMAP, PmapUse, Survey, fun_arg

# The helper in the example, as the rule writes it (the text is `_faithful.HELPER_SOURCE`'s).
__doc__ = (__doc__ or "").replace(
    "<the helper: `_faithful.helper_text()`, filled in below>", helper_text().rstrip("\n")
)

PROGRAM_MESSAGE = (
    "`jax.pmap` -> `jax.jit(jax.shard_map(...))` over the flat data (program-level): replicated "
    "arguments and results `P()`, batches `P({axis})`, the device axis gone"
)
OUTER_MESSAGE = PROGRAM_MESSAGE.replace(":", ", on the mesh `{setup}` sets:", 1)
UNNAMED_NOTE = "; the unnamed mapped axis is called {}"  # as the faithful form says
SETUP_MESSAGE = (
    "the mesh of {steps}: {made} over every device of the job (`jax.devices()`, pmap's order); "
    "the rest of `{setup}` runs under it (`with jax.set_mesh(...)`){end}"
)

CONVERTER = "global_batch"  # the helper converting a batch drawn per device (`_convert_drawn`)
# Written one statement per line, 4-space indented: `fit_lines` breaks the lines too long.
CONVERTER_SOURCE = '''def {name}(batch, sharding):
    """`batch` as `jax.pmap` took it, split over this process's devices, as one global batch sharded by `sharding`: each device gets the same rows."""

    def rows(x):
        x = {np}.asarray(x)
        if x.ndim < 2:  # one value per device (pmap passed a scalar): no rows to shard
            raise ValueError(f"one value per device, no rows: {{x.shape}}")
        return {jax}.make_array_from_process_local_data(sharding, x.reshape(-1, *x.shape[2:]))

    return {jax}.tree.map(rows, batch)
'''
COPIER = "device_copies"  # the helper giving a call not followed its copies (`_passon.copied`)
COPIER_SOURCE = '''def {name}(tree):
    """`tree`, one value replicated on the mesh, as `jax.pmap` code takes it: a copy on each of this process's devices, stacked."""
    devices = {jax}.local_devices()
    mesh = {jax}.sharding.Mesh(devices, ("copies",))
    sharding = {jax}.sharding.NamedSharding(mesh, {jax}.sharding.PartitionSpec("copies"))

    def copies(x):  # on the host: a jax operation would run under the mesh `jax.set_mesh` sets
        x = {np}.asarray(x.addressable_data(0) if isinstance(x, {jax}.Array) else x)
        return {jax}.device_put({np}.broadcast_to(x, (len(devices), *x.shape)), sharding)

    return {jax}.tree.map(copies, tree)
'''
UNCOPIER = "from_device_copies"  # a parameter passed as copies -> one value (`_flow.UNCOPIED`)
UNCOPIER_SOURCE = '''def {name}(tree):
    """`tree` as `jax.pmap` code passes a replicated value, a copy on each of this process's devices, stacked, as one value replicated over every device of the job: device 0's copy (the copies are equal)."""
    mesh = {jax}.sharding.Mesh({jax}.devices(), ("copies",))
    sharding = {jax}.sharding.NamedSharding(mesh, {jax}.sharding.PartitionSpec())
    return {jax}.tree.map(lambda x: {jax}.device_put({np}.asarray(x[0]), sharding), tree)
'''
HELPERS = {CONVERTER: CONVERTER_SOURCE, COPIER: COPIER_SOURCE, UNCOPIER: UNCOPIER_SOURCE}


# The nodes a site's rewrite replaces (a call, a decorated def, `jax.pmap` kept as a value)
REWRITTEN = (cst.Call, cst.FunctionDef, cst.Name, cst.Attribute)
Said = tuple[cst.CSTNode, str]  # a site of a group: its node and its message


# The pass in three layers, one per section: `survey.Finding` holds the state and finds the uses,
# `faithful.Faithful` plans and emits the faithful form, `Pmap` runs both and the program form.
class Pmap(Faithful):
    """Rewrite `jax.pmap` as `jax.jit(jax.shard_map(...))`."""

    NAME: ClassVar[str] = "pmap"
    CODE: ClassVar[str] = "JM202"
    SAFETY: ClassVar[Safety] = Safety.UNSAFE
    MIN_JAX: ClassVar[tuple[int, int]] = (0, 7)  # `jax.shard_map` is public from JAX 0.6.1
    REFERENCE: ClassVar[str | None] = "vmap-oracle"
    READS_CALLERS: ClassVar[bool] = True  # `FileState.outside`: `_passon.py`
    READS_IMPORTS: ClassVar[bool] = True  # `FileState.modules`: `_imported.py`
    LITERALS: ClassVar[tuple[str, ...]] = ("pmap",)
    TRIGGER: ClassVar[re.Pattern[str]] = re.compile(r"\bpmap\b")
    # "pmean only works inside pmap": comments on a statement whose pmap the rewrite removed
    COMMENT_WORDS: ClassVar[tuple[str, str]] = ("pmap", "shard_map")
    QUALNAMES: ClassVar[tuple[str, ...]] = (PMAP,)

    @classmethod
    def mentioned_in(cls, facts: AstFacts) -> bool:
        """`jax.pmap`, or a name that may be a shortcut for it another module of the code base
        binds (`constants.pmap`: `_shortcut.py`; not JAX's own, `jax._src.api.pmap`)."""
        return super().mentioned_in(facts) or any(
            n.split(".")[-1] == "pmap" and not n.startswith("jax.") for n in facts.names
        )

    def has_candidates(self, tree: cst.Module, names: ScopeModel) -> bool:
        return "pmap" in names.all_names

    def transform_module(self, tree: cst.Module) -> cst.Module:
        """Run the rule on `tree`, its calls through a shortcut for `jax.pmap` written out
        (`_shortcut.py`); those it leaves as they are stay as they were."""
        texts = [self.state.cache.code(tree), *(text for _, text in self.state.modules)]
        if not any(may_bind(text) for text in texts):
            return super().transform_module(tree)
        if not self.state.cache.watch and not self.state.cache.watch_types:
            self.state.cache = ModuleCache(self.QUALNAMES, self.NODE_TYPES)
        written = written_out(tree, self.state.cache.names(tree), self.imported)
        if written is not None and written.unread:
            self._input = tree  # where `skip` finds the calls
            for node, why in written.unread:
                self.skip(node, why)
        if written is None or not written.written:
            return super().transform_module(tree)
        out = super().transform_module(written.module)
        return tree if out is written.module else restored(out, written)

    # Finding ------------------------------------------------------------------------------
    def visit_Module(self, node: cst.Module) -> None:
        self.survey = Survey(self.resolver, self.imported)
        walk(self.survey, node)
        found = [self._classify(ref, ancestors) for ref, ancestors in self.survey.refs]
        sites = self._stack_decorators([s for s in found if s is not None])
        self._mark_nested(sites)
        self._check_helper_name(node, sites)
        for site in sites:
            self.kept_pmaps |= bool(site.skip)
            if site.skip:
                self.skip(site.node, site.skip)
            else:
                self.sites[id(site.node)] = site
        if self.state.pmap_style == "idiomatic":
            self._find_programs(node)
            self._find_unread(node)
            for group in self.outer:
                self._record_outer(group)

    # Rewriting ----------------------------------------------------------------------------
    def on_leave(self, original_node: cst.CSTNode, updated_node: cst.CSTNode) -> Any:
        left = super().on_leave(original_node, updated_node)
        if left is not updated_node and isinstance(original_node, REWRITTEN):
            self.produced[id(original_node)] = left  # kept where a host is rewritten after
        return left

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        # `step = jax.pmap(...)` at module level: no mesh, the program's
        if (made := self.outer_calls.get(id(original_node))) is not None:
            call = with_lambda_calls(Call.of(made.step(None)))
            return self._laid_out(call, original_node, updated_node)
        site = self.sites.get(id(original_node))
        if site is None:
            return updated_node
        calls = [updated_node]
        while len(calls) < len(site.pmaps):
            fun = fun_arg(calls[-1])
            assert fun is not None and isinstance(fun.value, cst.Call)
            calls.append(fun.value)
        if (plan := self._planned(site, calls)) is None:
            return updated_node
        mapped = [plan.fun] if plan.fun is not None else []
        jit = Call(cst.Name(HELPER), [*mapped, *plan.helper, *plan.jit])
        jit = replace(jit, opening=Call.of(updated_node).opening)
        return self._laid_out(jit, original_node, updated_node)

    def leave_Name(
        self, original_node: cst.BaseExpression, updated_node: cst.BaseExpression
    ) -> cst.BaseExpression:
        site = self.sites.get(id(original_node))  # `jax.pmap` (or `pmap`) kept as a value
        return updated_node if site is None else self._value(site, updated_node)

    leave_Attribute = leave_Name

    def leave_If(self, original_node: cst.If, updated_node: cst.If) -> cst.If:
        host = self.main_blocks.get(id(original_node))  # `if __name__ == "__main__":`
        if host is None or id(host) not in self.programs:
            return updated_node
        out = self._rewrite_program(self.programs[id(host)], host)
        return updated_node if out is host else updated_node.with_changes(body=out.body)

    def leave_FunctionDef(
        self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef
    ) -> cst.FunctionDef:
        kept = self.stored.get(id(original_node))  # a method calling a step stored on `self`
        out = self._host_rewritten(original_node, kept.copy) if kept is not None else None
        if kept is not None and out is not None:
            return named_back(kept, out, self._indent(original_node), self.state.style)
        if id(original_node) in self.programs:
            return self._rewrite_program(self.programs[id(original_node)], updated_node)
        if id(original_node) in self.outer_defs:
            return self._outer_decorators(*self.outer_defs[id(original_node)], updated_node)
        if (out := self._host_rewritten(original_node, original_node)) is not None:
            return out
        decorators: list[cst.Decorator] = []
        pending = list(zip(original_node.decorators, updated_node.decorators))
        while pending:
            original, new = pending.pop(0)
            site = self.sites.get(id(original))
            stacked = [new, *(n for _, n in pending[: len(site.pmaps) - 1])] if site else []
            if site is None or (plan := self._planned(site, stacked)) is None:
                decorators.append(new)
                continue
            del pending[: len(site.pmaps) - 1]
            decorators += self._decorators(site, plan, new)
        return updated_node.with_changes(decorators=decorators)

    def _host_rewritten(
        self, original: cst.FunctionDef, host: cst.FunctionDef
    ) -> cst.FunctionDef | None:
        """Return `host` (the def `original`, or the copy of it a step stored on `self` is read
        in) with the edits of the programs calling steps made outside it and the mesh it sets;
        None when it has neither."""
        if id(host) not in self.host_programs and id(host) not in self.host_setups:
            return None
        programs, setup = self.host_programs.get(id(host), []), self.host_setups.get(id(host))
        indent, style = self._indent(original), self.state.style
        return rewrite_host(host, programs, setup, indent, style, self.produced)

    def _indent(self, fn: cst.FunctionDef) -> str:
        """Return the indentation of the body of `fn`."""
        return self.room(fn.body.body[0] if fn.body.body else fn).indent

    def _rewrite_program(
        self, programs: list[tuple[PmapUse, Program]], updated: cst.FunctionDef
    ) -> cst.FunctionDef:
        """Record the steps a function makes and their edits as one group; rewrite them all, or
        nothing. Steps over one axis share one mesh (made by the first) and one sharding."""
        sites: list[tuple[Site, Program | None, str]] = []
        for site, program in programs:
            axis = code(program.axis)
            text = PROGRAM_MESSAGE.format(axis=axis) + UNNAMED_NOTE.format(axis) * program.unnamed
            sites.append((site, program, text + "".join(f"; {a}" for a in program.assumed)))
        if not self._recorded(sites, [q for _, p in programs for q in (p, *p.callees)]):
            return updated
        host = programs[0][1].host
        taken = set(names_in(host))
        meshes: dict[str, str] = {}  # by axis: the mesh made or reused, and the sharding made
        shardings: dict[str, str] = {}
        for site, program in programs:
            if isinstance(program.statement, cst.FunctionDef):  # decorated: `partial` spelled
                program.partial = code(self._partial(site))
            self._spell(program)
            axis = code(program.axis)
            if axis in meshes:
                program.mesh, program.make_mesh = meshes[axis], False
            elif program.make_mesh:
                program.mesh = self._fresh("mesh", taken)
            meshes[axis] = program.mesh
            taken.add(program.mesh)
            if axis in shardings:
                program.sharding, program.make_sharding = shardings[axis], False
            else:
                program.sharding = self._fresh("batch_sharding", taken)
                if any(program.batches):
                    shardings[axis] = program.sharding
                    taken.add(program.sharding)
            self._plan_callees(program)
            if program.factory is not None:  # rewritten at the module's end (`leave_Module`)
                self.factories[id(program.factory[0])] = program
        first = programs[0][1].statement
        assert first is not None
        indent = self.room(first).indent
        steps = [p for _, p in programs]
        # the callees in `host`: rewritten with it (the others at the module's end)
        nested = [c for p in steps for c in p.callees if id(c.host) not in self.callee_programs]
        return rewrite_host(host, steps + nested, None, indent, self.state.style, self.produced)

    def _plan_callees(self, program: Program) -> None:
        """Spell what the programs of the defs a step is passed to need, and plan their
        rewrite (at the module's end: a def may come before its caller). Their mesh is made
        where used, equal to the caller's; a def nested in the caller reads the caller's."""
        for callee in program.callees:
            self._spell(callee)
            scope = self.resolver.scope_made_by(callee.host)
            if scope is not None and scope.parent is not None and scope.parent.kind != "module":
                callee.mesh, callee.sharding = program.mesh, program.sharding
                continue  # its edits are made with the caller's
            # made once at its entry, equal to the caller's; dropped when nothing reads them
            made = self.callee_meshes.setdefault(id(callee.host), {})
            axis = code(program.axis)
            if axis not in made:
                taken = set(names_in(callee.host)) | {n for pair in made.values() for n in pair}
                mesh = self._fresh("mesh", taken)
                made[axis] = (mesh, self._fresh("batch_sharding", taken | {mesh}))
            callee.mesh, callee.sharding = made[axis]
            callee.entry = [assign(callee.mesh, program.new_mesh())]
            callee.entry.append(assign(callee.sharding, program.new_sharding(callee.mesh)))
            callee.helpers |= {callee.mesh, callee.sharding}
            self.callee_programs.setdefault(id(callee.host), []).append(callee)

    def _spell(self, program: Program) -> None:
        """Spell what the rewrite of `program` writes as the module does (`PartitionSpec`, `jax`,
        `jax.numpy`; importing what it lacks), and drop the imports its edits leave unread. Name
        the module's helpers it asks for, each written once at the module's end: the converter of
        a batch drawn per device from an iterator not followed (`_flow._convert_drawn`), the
        copier of a replicated value for a call not followed (`_passon.copied`) and its inverse
        (`_flow.UNCOPIED`)."""
        self._drop_deleted_imports(program)
        program.spec = self._spec(imported=True)
        program.jax = dotted(self.module_ref("jax")) or "jax"
        program.jnp = self.resolver.module_binding("jax.numpy") or f"{program.jax}.numpy"
        for base, wanted, spelled in (
            (CONVERTER, program.converts, "converter"),
            (COPIER, program.copies, "copier"),
            (UNCOPIER, bool(program.uncopied), "uncopier"),
        ):
            if not wanted:
                continue
            if base not in self.converters:
                name = numbered(base, self.resolver.is_free)
                self.converters[base] = (name, program.jax, self._numpy(), program.jnp)
            setattr(program, spelled, self.converters[base][0])  # `program.converter`, ...
        if program.flat_reads:  # results read flattened: each process reads its own part
            hosts = "multihost_utils"  # `from jax.experimental import multihost_utils`
            bound = self.resolver.module_binding(f"jax.experimental.{hosts}")
            program.hosts = self._spelled(bound, "jax.experimental", hosts, hosts)

    def _with_converter(self, module: cst.Module) -> cst.Module:
        """The module with the helpers' defs after its imports, if a program asked for them."""
        for base, (name, jax, np, jnp) in reversed(self.converters.items()):
            source = HELPERS[base].format(name=name, jax=jax, np=np, jnp=jnp)
            module = with_helper(module, source, self.state.style, after_imports(module.body, 0))
        return module

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        host = self.main_blocks.get(id(original_node))  # a script's statements, read as a def
        if host is not None and id(host) in self.programs:  # the module's only program
            out = self._rewrite_program(self.programs[id(host)], host)
            if out is not host:  # not taken: the module as the other edits left it
                updated_node = updated_node.with_changes(body=out.body.body)
        # The defs steps are passed to and the factories taken, rewritten: by name and which def
        # of that name (a name may be bound by several defs: only the one analysed changes)
        new: dict[tuple[str, int], cst.FunctionDef] = {}
        for key, statement in _defs_by_occurrence(original_node):
            if programs := self.callee_programs.get(id(statement)):
                style, indent = self.state.style, self._indent(statement)
                new[key] = rewrite_host(statement, programs, None, indent, style, self.produced)
            if (program := self.factories.get(id(statement))) is not None:
                assert program.factory is not None  # a factory returning a step taken
                indent = self.room(program.factory[1]).indent
                new[key] = program.factory_rewritten(indent, self.state.style)
        defs = dict(_defs_by_occurrence(updated_node))
        changed = {id(defs[key]): fn for key, fn in new.items() if key in defs}
        body = [
            changed.get(id(s), s) for s in updated_node.body if bound_name(s) not in self.dropped
        ]
        updated = drop_dead_helpers(
            original_node, updated_node.with_changes(body=body), self.qualname
        )
        if self.lifted:
            updated = drop_dead_locals(original_node, updated)
        return super().leave_Module(original_node, self._with_converter(updated))

    def _record_outer(self, group: OuterGroup) -> None:
        """Record the steps of `group`, their edits and the mesh as one group of sites; when it
        is enabled, plan the rewrite of each function they touch."""
        setup = group.setup.name.value
        steps: list[tuple[Site, Program | None, str]] = []
        for step in group.steps:
            axis = code(step.options.axis)
            text = OUTER_MESSAGE.format(setup=setup, axis=axis)
            text += "" if step.options.named else UNNAMED_NOTE.format(axis)
            assumed = dict.fromkeys(a for p in step.programs for a in p.assumed)  # each once
            text += "".join(f"; {a}" for a in assumed)
            # each program calling the step lays its arguments out alike: one `in_specs`
            steps.append((step.site, step.programs[0] if step.programs else None, text))
        programs = [q for s in group.steps for p in s.programs for q in (p, *p.callees)]
        named = self._shown(", ".join(f"`{s.name}`" for s in group.steps))
        made = "made once" if group.make else f"`{group.mesh}` reused, a mesh"
        end = ", up to its first `yield`" if group.end is not None else ""
        text = SETUP_MESSAGE.format(steps=named, made=made, setup=setup, end=end)
        if self._recorded(steps, programs, (group.before, text)):
            self._plan_outer(group, programs)

    def _plan_outer(self, group: OuterGroup, programs: list[Program]) -> None:
        """Spell the names the rewrite of `group` (its steps' `programs`) needs, and say which
        node becomes what."""
        if group.make:
            group.mesh = self._fresh("mesh", set(names_in(group.setup)))
        for program in programs:
            self._spell(program)
            program.sharding = f"{code(program.spec)}({code(program.axis)})"  # the mesh set is used
            setup = program.host is group.setup
            program.mesh = group.mesh if setup else f"{program.jax}.sharding.get_mesh()"
            if program.flat_reads:
                program.numpy = self._numpy()
            self.host_programs.setdefault(id(program.host), []).append(program)
        for step in group.steps:
            made = step.programs[0]
            if step.decorated:
                self.outer_defs[id(step.body)] = (step, made)
            else:
                self.outer_calls[id(step.site.node)] = made
        making = [assign(group.mesh, programs[0].new_mesh())] if group.make else []
        setting = cst.parse_expression(f"{programs[0].jax}.set_mesh({group.mesh})")
        self.host_setups[id(group.setup)] = (group.before, making, setting, group.end)
        if self._visit_only is not None:  # the functions calling the steps hold no pmap
            # and the defs a program passes its values to (their readbacks deleted there)
            touched = {id(p.host) for p in programs}
            self._visit_only = self._visit_only | touched | {id(group.setup)} | group.around

    def _outer_decorators(
        self, step: OuterStep, program: Program, updated: cst.FunctionDef
    ) -> cst.FunctionDef:
        """`@partial(jax.jit, ...)` over `@partial(jax.shard_map, in_specs=..., ...)`: no mesh,
        the one the program sets with `jax.set_mesh` is used."""
        site = step.site
        assert isinstance(site, PmapUse)
        program.partial = code(self._partial(site))
        room = self.room(site.node)
        room = replace(room, column=room.column + 1, tail=0)  # after the `@`
        decorators = program.decorators(None, room, self.state.style)
        decorators[0] = decorators[0].with_changes(
            leading_lines=updated.decorators[0].leading_lines
        )
        return updated.with_changes(decorators=decorators)

    def _recorded(
        self, steps: list[tuple[Site, Program | None, str]], programs: list[Program], *more: Said
    ) -> bool:
        """Record as one group the sites of `steps`, each with its message and what its
        program-level form assumes (checked on the original), each edit of `programs` once (a
        batch or a replication two steps share is one edit), the deletions of module code the
        group leaves unread and the sites `more`; return whether the group is rewritten, then
        dropping that code and the imports that spelled the steps' `pmap`, if unread."""
        key = self.program_group(steps[0][0].node)
        enabled = []
        for site, program, text in steps:
            layout = {"layout": self._layout(site.node, program)} if program else None
            enabled.append(self.site(site.node, text, group=key, fallback=key, details=layout))
        edits = [(p.nodes[k], self._shown(p.reasons[k])) for k, p in edit_owners(programs).items()]
        enabled += [self.site(self._origin(n), t, group=key, fallback=key) for n, t in edits]
        enabled += self._record_unread(key)
        enabled += [self.site(self._origin(n), t, group=key, fallback=key) for n, t in more]
        if not all(enabled):
            return False
        self.lifted = True
        self._drop_unread(key)
        for site, _, _ in steps:
            if isinstance(site.ref, cst.Name):
                self.drop_import_if_unused(site.ref.value)
        return True

    def _shown(self, text: str) -> str:
        """`text` naming a step stored on `self` as the code does (`self.predict_fn`), not as
        the analysis of the method calling it does (`_predict_fn`, `_stored.Stored.name`)."""
        for kept in self.stored.values():
            for name, (attr, _) in kept.steps.items():
                text = text.replace(f"`{name}`", f"`{code(attr)}`")
        return text

    def _origin(self, node: cst.CSTNode) -> cst.CSTNode:
        """The node of the module `node` stands for: itself, or for a node of the copy of a
        method calling a step stored on `self` (`_stored.Stored`), the node it was copied from."""
        for kept in self.stored.values():
            if (found := kept.origins.get(id(node))) is not None:
                return found
        return node

    def _drop_deleted_imports(self, program: Program) -> None:
        """`from flax import jax_utils` goes when the replications deleted were its only use (and
        `functools` when the `partial` mapped is folded into a lambda)."""
        nodes = list(program.nodes.values())
        if program.wrapped() and isinstance(program.body, cst.Call):  # `partial` folded in
            nodes.append(program.body.func)
        for name in (name for node in nodes for name in names_in(node)):
            self.drop_import_if_unused(name)

    def _layout(self, node: cst.CSTNode, program: Program) -> dict[str, Any]:
        """Return what the program-level form assumes of the step made at `node`, for the
        verifier to check on the original (`verify/child/layouts.py`): the lines making it, the
        argument positions passed stacked and replicated (now `P()`), and the results read on
        device 0 (now read whole); and, to compare the step's calls through layout adapters,
        each argument's kind and which results are read flattened."""
        span = self.get_metadata(PositionProvider, node)

        def kind(i: int, batch: bool) -> str:
            if i in program.fixed:  # unmapped: "none" or "static"
                return "static" if program.fixed[i] == "static" else "fixed"
            # "keys": one per device, stacked in both forms (each device takes its own)
            return "keys" if i in program.squeezed else "batch" if batch else "replicated"

        kinds = [kind(i, batch) for i, batch in enumerate(program.batches)]
        return {
            "line": self.state.line_map(span.start.line),
            "end_line": self.state.line_map(span.end.line),
            "body": code(program.per_device_body()),  # what the rewrite's `jax.shard_map` maps
            "args": kinds,
            "keywords": list(program.keywords),  # the last `args`, passed by keyword
            "replicated": [i for i, kind in enumerate(kinds) if kind == "replicated"],
            "results": [i for i, varying in enumerate(program.varying) if not varying],
            "varying": list(program.varying),
            "tuple": program.outputs is not None,
            "static_tail": program.tail is not None,  # the star arguments past `args`: static
            # made and called outside any function: verified by running the module as a script
            "script": any(program.host is host for host in self.main_blocks.values()),
            # the function returns, unread, one value where it returned equal copies stacked
            "returns_one": bool(program.returns),
        }

    def _fresh(self, name: str, taken: set[str]) -> str:
        """Return `name`, or `name_1`, ...: one neither the function nor the module uses."""
        return numbered(name, lambda n: n not in taken and self.resolver.is_free(n))


def _defs_by_occurrence(module: cst.Module) -> list[tuple[tuple[str, int], cst.FunctionDef]]:
    """The module's top-level defs, each keyed by its name and how many defs of that name come
    before it (the same keys in the module before and after a transform that adds no def)."""
    seen: dict[str, int] = {}
    found = []
    for statement in module.body:
        if isinstance(statement, cst.FunctionDef):
            name = statement.name.value
            found.append(((name, seen.get(name, 0)), statement))
            seen[name] = seen.get(name, 0) + 1
    return found
