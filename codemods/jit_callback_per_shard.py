"""Run a per-row `pure_callback` on each shard of its input instead of on the gathered array.

## Why
Under plain `jax.jit`, a `jax.pure_callback` whose operand is sharded runs once, on device 0, with
the whole array gathered there (XLA warns "Involuntary full rematerialization"), and its result
comes back maximal-sharded on device 0 (JAX 0.10.2, cookbook case 12a). A callback that declares
itself batch-polymorphic (`vmap_method="expand_dims"` or `"broadcast_all"`: it treats leading
axes as independent rows) can instead run once per shard, concurrently, inside a `jax.shard_map`
over the operand's sharding: 6-8x faster in the cookbook for a callback whose cost grows with
its input (`benchmarks/callback_per_shard.py` measures it here).

## Before
```python
import functools

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

mesh = Mesh(np.array(jax.devices()), ("rows",))


@functools.partial(jax.jit, in_shardings=NamedSharding(mesh, P("rows")))
def sort_rows(x):
    return jax.pure_callback(host_sort, jax.ShapeDtypeStruct(x.shape, x.dtype), x, vmap_method="expand_dims")
```

## After
```python
import functools

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

mesh = Mesh(np.array(jax.devices()), ("rows",))


@functools.partial(jax.jit, in_shardings=NamedSharding(mesh, P("rows")))
def sort_rows(x):
    return jax.shard_map(
        lambda x: jax.pure_callback(host_sort, jax.ShapeDtypeStruct(x.shape, x.dtype), x, vmap_method="expand_dims"),
        mesh=mesh,
        in_specs=P("rows"),
        out_specs=P("rows"),
    )(x)
```

The site is a `jax.pure_callback(host, jax.ShapeDtypeStruct(x.shape, dtype), x,
vmap_method="expand_dims" | "broadcast_all")` in the body of a function jitted with
`in_shardings=NamedSharding(mesh, P(...))` (`@partial(jax.jit, in_shardings=...)` or
`f = jax.jit(g, in_shardings=...)`; a tuple of shardings is read at the parameter's position),
where `x` is a parameter of that function that its body never rebinds. The callback call is kept
as it was, inside a lambda whose parameter is `x`, so its result shape is the shard's.

## Safety
unsafe: a performance rewrite that is right only if the host function treats rows
independently, which `vmap_method` suggests but does not prove. The host function then sees each
shard (`(n / devices, ...)`) on its own host thread instead of the whole array once. Applied only
when verified (or with `--unsafe-fixes`).

## Skips
- Shardings that are not a literal `NamedSharding(mesh, P(...))` with the operand's spec, a mesh
  that is not a plain name, or a function that rebinds the mesh's name or the operand.
- A spec that splits an axis besides the leading one (`P("data", "model")`): each shard would hold
  part of every row.
- Callbacks with more than one operand, keyword operands, a result shape other than
  `jax.ShapeDtypeStruct(x.shape, dtype)`, or another `vmap_method`.
- Callbacks already inside a `shard_map`, or in functions nested in the jitted one.

## Verification
the original runs, so it is the reference: the verifier calls the jitted function on the same
inputs (recorded, declared or synthesized with a leading axis divisible by the device count)
before and after, and compares the outputs. Simulated CPU meshes occasionally hang in per-shard
callbacks (cookbook case 12a); the verifier retries a hang once.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import ClassVar

import libcst as cst
from libcst.codemod import CodemodContext

from jaxmigrate.model import Safety
from jaxmigrate.toolkit.emit import fit_call

from ._jit_callback_per_shard_checks import LeftAlone, SiteChecks, keyword

PURE = "jax.pure_callback"
SHARD_MAP = "jax.shard_map"
PER_ROW = frozenset({"expand_dims", "broadcast_all"})
MESSAGE = (
    "`pure_callback` on a sharded operand under `jax.jit` runs once on the gathered array: run it "
    "per shard in a `jax.shard_map` (it declares vmap_method={method!r})"
)


class JitCallbackPerShard(SiteChecks):
    """Run a per-row `pure_callback` on each shard of its input instead of on the gathered array."""

    NAME: ClassVar[str] = "jit-callback-per-shard"
    CODE: ClassVar[str] = "JM204"
    SAFETY: ClassVar[Safety] = Safety.UNSAFE
    MIN_JAX: ClassVar[tuple[int, int]] = (0, 7)
    QUALNAMES: ClassVar[tuple[str, ...]] = (PURE,)
    LITERALS: ClassVar[tuple[str, ...]] = ("vmap_method",)
    TRIGGER: ClassVar[re.Pattern[str]] = re.compile(r"\bvmap_method\b")

    def __init__(self, context: CodemodContext) -> None:
        super().__init__(context)
        self._tree: cst.Module | None = None
        self._functions: list[tuple[cst.FunctionDef, cst.BaseExpression | None]] = []
        self._shard_maps = 0
        self._jitted: dict[str, cst.BaseExpression] | None = None

    def visit_Module(self, node: cst.Module) -> None:
        self._tree = node

    # Where a callback is: the jitted function around it, and shard_maps -------------------
    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self._functions.append((node, self._in_shardings(node)))

    def leave_FunctionDef(
        self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef
    ) -> cst.FunctionDef:
        self._functions.pop()
        return updated_node

    def visit_Call(self, node: cst.Call) -> None:
        if self.qualname(node.func) == SHARD_MAP:
            self._shard_maps += 1

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if self.qualname(original_node.func) == SHARD_MAP:
            self._shard_maps -= 1
            return updated_node
        if self.qualname(original_node.func) != PURE:
            return updated_node
        method = keyword(original_node, "vmap_method")
        if not isinstance(method, cst.SimpleString) or method.evaluated_value not in PER_ROW:
            return updated_node  # not declared per-row: not this rule's business
        if self._shard_maps or not self._functions or self._functions[-1][1] is None:
            return updated_node  # per shard already, or no sharding in sight
        try:
            operand, mesh, spec = self._check(original_node)
        except LeftAlone as why:
            self.skip(original_node, str(why))
            return updated_node
        if not self.site(original_node, MESSAGE.format(method=method.evaluated_value)):
            return updated_node
        inner = cst.Call(
            self.jax_attr("shard_map"),
            [
                cst.Arg(cst.Lambda(cst.Parameters([cst.Param(cst.Name(operand))]), updated_node)),
                _kw("mesh", mesh),
                _kw("in_specs", spec),
                _kw("out_specs", spec.deep_clone()),
            ],
        )
        room = self.room(original_node)
        room = replace(room, tail=room.tail + len(f"({operand})"))  # the call of the shard_map
        laid = fit_call(original_node, inner, room, self.state.style)
        return cst.Call(laid, [cst.Arg(cst.Name(operand))])


def _kw(name: str, value: cst.BaseExpression) -> cst.Arg:
    equal = cst.AssignEqual(
        whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")
    )
    return cst.Arg(value, keyword=cst.Name(name), equal=equal)
