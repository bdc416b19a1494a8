"""Make host callbacks run inside shard_maps that leave some mesh axes automatic.

## Why
A host callback (`jax.pure_callback`, `jax.experimental.io_callback`) lowered where some mesh
axes are manual and others automatic fails at lowering (JAX 0.6 to 0.10, jit or not) with

    NotImplementedError: callbacks are only supported in spmd computations when all mesh axes
    are partitioned manually (no partial automatic sharding).

It appears when code moves to `jax.shard_map(..., axis_names={...})` (or the removed
experimental `auto=`, which the experimental-shard-map pass turns into `axis_names=` first) over
a multi-axis mesh and keeps a callback inside, directly or through a helper function.

## Before
```python
import jax
import numpy as np
from jax.sharding import Mesh, PartitionSpec as P

mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))


def body(v):
    y = jax.pure_callback(np.sin, jax.ShapeDtypeStruct(v.shape, v.dtype), v)
    return y * 2


step = jax.jit(
    jax.shard_map(body, mesh=mesh, in_specs=P("data"), out_specs=P("data"), axis_names={"data"})
)
```

## After
```python
import jax
import numpy as np
from jax.sharding import Mesh, PartitionSpec as P

mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))


def body(v):
    y = jax.shard_map(
        lambda v: jax.pure_callback(np.sin, jax.ShapeDtypeStruct(v.shape, v.dtype), v),
        in_specs=P(),
        out_specs=P(),
        axis_names={"model"},
        check_vma=False,
    )(v)
    return y * 2


step = jax.jit(
    jax.shard_map(body, mesh=mesh, in_specs=P("data"), out_specs=P("data"), axis_names={"data"})
)
```

A callback is found in the body of a `jax.shard_map` whose `axis_names=` is a strict subset of
the mesh's axes (a literal, or `frozenset(mesh.axis_names) - {...}`), the mesh's axis names
being visible in the file (`Mesh(..., ("data", "model"))` or `jax.make_mesh(...)` inline or
assigned once to the name passed as `mesh=`). The body may be a function of the file, a local
function, a lambda, `functools.partial(f, ...)`, or a decorated `def` (`@jax.shard_map(...)`,
`@partial(jax.shard_map, ...)`); calls are followed through the functions of the file, and a
shard_map nested in the body adds its axes. Three rewrites, the smallest that is correct:

- **nest** (`pure_callback`, the shard_map under `jax.jit`): the callback runs in a
  `jax.shard_map` over the remaining axes without `mesh=` (it uses the context mesh; passing
  `mesh=` raises), `in_specs=P()`, `out_specs=P()`, `check_vma=False` (cookbook case 12b). Its
  operands become the lambda's parameters, the callback call is kept as it was. The callback
  then runs once per device (duplicated along the automatic axes), which is right for a pure
  function. The rest of the body keeps its automatic sharding.
- **widen** (`pure_callback` that cannot be nested: not under `jax.jit`, where a nested
  shard_map does not run, or in a function also used elsewhere): `axis_names=` is dropped, so
  every mesh axis is manual. Allowed only when the specs never name the automatic axes and the
  functions reached never mention them, so each device computes what its manual shard computed.
- **widen and gate** (`io_callback`, ordered or not; nesting an ordered one aborts the process,
  nesting an unordered one repeats its side effect on every automatic device): the shard_map is
  widened and the callback runs on the first device along the formerly automatic axes only,
  its result shared with `psum`, so each side effect happens once per manual shard, as before:

```python
y = jax.lax.psum(
    jax.lax.cond(
        jax.lax.axis_index("model") == 0,
        lambda: io_callback(log, jax.ShapeDtypeStruct(v.shape, v.dtype), v, ordered=True),
        lambda: jnp.zeros(v.shape, v.dtype),
    ),
    "model",
)
```

(other result shapes get `jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)`; a
callback with no result, `io_callback(log, None, ...)`, is just the `cond`). The cookbook's gate
needs `check_vma=False` because its other branch, `jnp.zeros_like(v)`, varies along the manual
axes; zeros built from the result shape do not, so `check_vma` is left as it was.

`jax.debug.callback` and `jax.debug.print` work in such regions with one automatic axis (once
per manual shard) and are left alone. With two or more automatic axes JAX 0.10.2 raises
`TypeError: axis_index() takes 1 positional argument but 2 were given` from its own lowering of
them; those are widened and gated like an `io_callback`.

## Safety
unsafe: the rewrite moves where and how often a host function runs. Nested pure callbacks run
once per device instead of once per manual shard (their results are equal); the widened region
loses the automatic sharding of its other computations (same values, more memory per device).
A site is applied once verified by execution (or with `--unsafe-fixes`).

## Skips
- The mesh's axis names are not visible (a parameter, an attribute, a mesh from `jax.set_mesh`
  without `mesh=`), or `axis_names=` is computed: which axes are automatic is not known.
- The body is not a function of this file (a parameter, an attribute, an import): its callbacks
  cannot be seen. Callbacks in other modules are never seen.
- A callback passed around as a value (`partial(jax.pure_callback, ...)`), or a `pure_callback`
  to nest called with `*args`/`**kwargs` (its operands are not known).
- An `io_callback` whose shard_map cannot be widened (its specs or its functions name an
  automatic axis, or it holds another shard_map), or that sits in a function also used outside
  this shard_map, or in a nested shard_map; an `io_callback` whose result shapes are computed by
  a call (the gate repeats them).
- A `pure_callback` that can be neither nested nor widened.
- A function reached from the shard_map under two different sets of manual axes.

## Verification
the original raises, so its reference is the widened program (every mesh axis manual, the
verifier's `widened-shard-map` reference, cookbook case 12e), which is sound when the specs never
name the automatic axes; in it, `io_callback` and `jax.debug.callback` run once per manual shard,
so a target that returns what its host functions saw is compared on that too (a rewrite that
only widened would call them twice as often, and fail). The fixtures run the original's
`reference()` (that widened form, or what it computes; for `io_callback`, the side effects
counted by a `jax.debug.callback`, which runs once per manual shard) and the rewrite on an
8-device CPU mesh and compare values and side effects.
"""

from __future__ import annotations

import ast
import re
from typing import ClassVar

import libcst as cst

from jaxmigrate.model import Safety
from jaxmigrate.toolkit.facts import AstFacts
from jaxmigrate.toolkit.names import walk
from jaxmigrate.toolkit.scope import ScopeModel

from ._choice import Choice
from ._survey import (
    DEBUG,
    EXPERIMENTAL_SHARD_MAP,
    HOST_CALLBACK,
    IO,
    PURE,
    SHARD_MAP,
    Survey,
)


def _may_decide(call: ast.Call, facts: AstFacts) -> bool:
    """Return False when `call` is surely no shard_map the pass reports (a site or a skip).

    Only a shard_map given `axis_names=` (after JM102, which turns the experimental `auto=` into
    it), or given arguments past its body other than by keyword (`*`, `**`, a positional mesh:
    its axes are then not known), is planned; any other runs every mesh axis manual, and its
    callbacks need nothing. A shard_map is a call of `jax.shard_map` (or the experimental one),
    or one taking it first (`partial(jax.shard_map, ...)`), however it is imported or aliased.
    """
    heads = [call.func, *call.args[:1]]
    if not any(facts.meanings(head) & _SHARD_MAPS for head in heads):
        return False
    return (
        len(call.args) > 1
        or any(isinstance(a, ast.Starred) for a in call.args)
        or any(k.arg is None or k.arg in ("axis_names", "auto") for k in call.keywords)
    )


_SHARD_MAPS = frozenset({SHARD_MAP, EXPERIMENTAL_SHARD_MAP})


class PartialAutoCallback(Choice):
    """Make host callbacks run inside shard_maps that leave some mesh axes automatic."""

    NAME: ClassVar[str] = "partial-auto-callback"
    CODE: ClassVar[str] = "JM203"
    SAFETY: ClassVar[Safety] = Safety.UNSAFE
    MIN_JAX: ClassVar[tuple[int, int]] = (0, 7)
    REFERENCE: ClassVar[str | None] = "widened-shard-map"
    QUALNAMES: ClassVar[tuple[str, ...]] = (SHARD_MAP, PURE, IO, *sorted(DEBUG))
    TRIGGER: ClassVar[re.Pattern[str]] = re.compile(
        r"\b(?:pure_callback|io_callback|debug|host_callback)\b"  # JM106 makes io_callbacks
    )

    @classmethod
    def applies_to(cls, source: str) -> bool:
        """A callback and a shard_map in the same file: the body is followed within it."""
        return "shard_map" in source and cls.TRIGGER.search(source) is not None

    @classmethod
    def may_apply_to(cls, facts: AstFacts) -> bool:
        """Both a shard_map and a callback; earlier passes turn the experimental shard_map
        into `jax.shard_map` (JM102) and host_callback calls into `io_callback` (JM106)."""
        return (
            facts.mentions((SHARD_MAP, EXPERIMENTAL_SHARD_MAP))
            and facts.mentions((PURE, IO, *DEBUG, HOST_CALLBACK))
            and any(_may_decide(call, facts) for call in facts.nodes(ast.Call))
        )

    def has_candidates(self, tree: cst.Module, names: ScopeModel) -> bool:
        for wanted in ((SHARD_MAP,), (PURE, IO, *DEBUG)):
            paths = names.paths_to(wanted)
            if paths is not None and not paths:
                return False
        return True

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        self.survey = Survey(tree, self.resolver)
        walk(self.survey, tree)
        covered: set[int] = set()
        for region in self.survey.regions:
            for unit in self._reach(region, [], None).units:
                covered.update(id(r) for r in unit.regions)
        for region in self.survey.regions:
            if id(region) not in covered:
                self._plan(region)
        return tree.visit(self) if self.edits else tree
