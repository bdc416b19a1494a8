"""Rewrite the removed `jax.device_put_sharded` as `jax.device_put` with a `NamedSharding`.

## Why
`jax.device_put_sharded(shards, devices)` was deprecated in JAX 0.8.1 and removed in 0.10.0
(accessing it raises `AttributeError`). It took a list of pytrees of equal structure, one per
device, stacked them leaf by leaf along a new leading axis and put slice `i` on `devices[i]`: an
array sharded over a 1-D mesh of `devices`. The rewrite is the drop-in replacement from JAX's own
migration guide (docs/migrate_pmap.md, "Drop-in replacements"), written out in place.

## Before
```python
import jax

batch = jax.device_put_sharded(list(batches), devices)
```

## After
```python
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

batch = jax.device_put(
    jax.tree.map(lambda *xs: jnp.stack(xs), *list(batches)),
    NamedSharding(Mesh(np.array(devices), ("x",)), P("x")),
)
```

Names the module already imports are reused (`jnp`, `np`, `Mesh`, `NamedSharding`, `P`, however
spelt); missing ones are imported under their customary names, or spelt in full when that name
means something else here. `shards` and `devices` are each evaluated once, in the same order.
The call is laid out in the file's own width and indentation.

When the shards are the rows of an array, `list(x)` with `x` a local name every assignment of
which makes an array (`np.asarray`, `einops.rearrange`, `x.reshape(...)`, ...; a parameter `x`
must be overwritten so at the top of the function first), the array itself is put: its slices
go from the host straight to their devices, where stacking the rows with `jnp.stack` would first
gather the whole batch on the default device (an input pipeline's hot path, as in big_vision's
`shard_and_put`):

```python
x = jax.device_put(x, NamedSharding(Mesh(np.array(devices), ("x",)), P("x")))
```

## Safety
safe: compared with JAX 0.10.2's own implementation (`jax._src.api.device_put_sharded`) on lists
and tuples of numpy arrays, Python scalars (including weak types), float64, bfloat16, PRNG keys,
uncommitted arrays and arrays committed to one device, nested pytrees with `None`, and device lists
in any order: same values, dtypes, weak types, shapes, device order and sharding of the leading
axis. Differences, all for inputs that are not the common case:
- shards that are `jax.Array`s committed to *different* devices: `jnp.stack` raises `ValueError:
  Received incompatible devices`, where the old function placed them without a copy. A call whose
  shards are visibly placed with `jax.device_put(..., device)` is skipped for that reason;
- inputs the old function rejected (shards of different dtypes, which `jnp.stack` promotes, or a
  number of shards that is a multiple of `len(devices)`) now go through;
- the mesh axis is called `"x"`, on an Auto mesh, where axis names do not constrain later use.

## Skips
- Shards placed on devices one by one (`jax.device_put(x, d)` in the `shards` expression or in the
  one assignment of the name passed as `shards`): stack them on the host, or build the array with
  `jax.make_array_from_single_device_arrays`.
- `*args` / `**kwargs`, missing or unknown arguments, keywords in reverse order.
- Any other use of `jax.device_put_sharded` (passed as a value, stored, aliased): the name no longer
  exists, so such a line fails; it is reported for a hand edit (calls through a plain alias
  `put = jax.device_put_sharded` are rewritten where they are).
- A function of your own called `device_put_sharded`, and the private
  `jax._src.api.device_put_sharded`, which still exists.

## Verification
not needed at run time: the fixtures of this pass run the rewritten code on an 8-device CPU mesh
against JAX's own (private) implementation and compare values and device placement.
"""

from __future__ import annotations

import re
from typing import ClassVar

import libcst as cst
from libcst.helpers import parse_template_expression
from libcst.metadata import PositionProvider

from jaxmigrate.model import Safety
from jaxmigrate.toolkit.cstutil import jnp_ref, names_in
from jaxmigrate.toolkit.emit import fresh_name
from jaxmigrate.toolkit.scope import BindingKind

from ._device_put import RemovedDevicePut

LEGACY = "jax.device_put_sharded"
# numpy / jax.numpy functions that return one array, and array methods that do (`._numpy()` and
# `.numpy()`: TensorFlow's tensors to numpy).
ARRAY_FUNCTIONS = frozenset(
    [
        "array",
        "asarray",
        "ascontiguousarray",
        "stack",
        "concatenate",
        "reshape",
        "zeros",
        "ones",
        "full",
        "arange",
        "frombuffer",
        "transpose",
        "swapaxes",
        "moveaxis",
        "expand_dims",
        "squeeze",
    ]
)
ARRAY_METHODS = frozenset(
    ["reshape", "astype", "transpose", "swapaxes", "squeeze", "_numpy", "numpy"]
)


class DevicePutSharded(RemovedDevicePut):
    """Rewrite the removed `jax.device_put_sharded` as `jax.device_put` with a `NamedSharding`."""

    NAME: ClassVar[str] = "device-put-sharded"
    CODE: ClassVar[str] = "JM105"
    SAFETY: ClassVar[Safety] = Safety.SAFE
    MIN_JAX: ClassVar[tuple[int, int]] = (0, 5)
    QUALNAMES: ClassVar[tuple[str, ...]] = (LEGACY,)
    LITERALS: ClassVar[tuple[str, ...]] = ("device_put_sharded",)
    TRIGGER: ClassVar[re.Pattern[str]] = re.compile(r"\bdevice_put_sharded\b")
    LEGACY: ClassVar[str] = LEGACY
    PARAMS: ClassVar[tuple[str, str]] = ("shards", "devices")
    MESSAGE: ClassVar[str] = (
        "`jax.device_put_sharded` was removed in JAX 0.10: use `jax.device_put`"
    )

    def why_not(self, call: cst.Call) -> str | None:
        reason = super().why_not(call)
        if reason is None and self._placed_per_device(call.args[0].value):
            return (
                "the shards are put on devices one by one, and `jnp.stack` cannot stack arrays "
                "committed to different devices: stack them on the host, or build the array with "
                "`jax.make_array_from_single_device_arrays`"
            )
        return reason

    def _placed_per_device(self, shards: cst.BaseExpression) -> bool:
        """Return True if `shards` (or any value assigned to that name) calls `device_put(x, d)`."""
        found = [shards]
        if isinstance(shards, cst.Name):
            found.extend(self.resolver.values(shards.value))
        calls = [c for node in found for c in _calls_in(node)]
        return any(
            self.qualname(c.func) == "jax.device_put"
            and (len(c.args) > 1 or any(a.keyword and a.keyword.value == "device" for a in c.args))
            for c in calls
        )

    def _rows_of_array(self, call: cst.Call) -> bool:
        """Return True if the shards of `call` are `list(x)` where `x` is surely an array here: the shards
        are its rows, so `x` itself is what they stack into, already on the host (stacking the
        rows with `jnp.stack` would gather them on the default device first, and copy them out
        again: twice the transfers, on the input pipeline's hot path).

        `x` is a function's local name every assignment of which makes an array (`np.asarray`,
        `einops.rearrange`, `x.reshape(...)`, ...; `x = <this call>` aside), and a parameter `x`
        is overwritten by one of them at the top level of the function's body before the call's
        statement."""
        shards = call.args[0].value
        if not (
            isinstance(shards, cst.Call)
            and self.qualname(shards.func) is None
            and isinstance(shards.func, cst.Name)
            and shards.func.value == "list"
            and not self.resolver.bound("list")
            and len(shards.args) == 1
            and not shards.args[0].star
            and not shards.args[0].keyword
            and isinstance(shards.args[0].value, cst.Name)
        ):
            return False
        name = shards.args[0].value
        owner = self.resolver.scope_of(name).lookup(name.value)
        if owner is None or not isinstance(owner.node, cst.FunctionDef):
            return False
        bindings = owner.assigning(name.value)
        bindings = [b for b in bindings if b.value is not call]
        made = [b for b in bindings if b.plain and b.value is not None]
        params = [b for b in bindings if b.kind is BindingKind.PARAM]
        if len(made) + len(params) != len(bindings) or not made:
            return False
        if not all(_array_call(self, b.value) for b in made if b.value is not None):
            return False
        if not params:
            return True
        body = owner.node.body
        if not isinstance(body, cst.IndentedBlock):
            return False
        where = self.get_metadata(PositionProvider, shards).start
        start = (where.line, where.column)
        top = {id(b.node) for b in made}
        for statement in body.body:
            end = self.get_metadata(PositionProvider, statement).end
            if (end.line, end.column) > start:
                return False
            if isinstance(statement, cst.SimpleStatementLine) and any(
                id(small) in top for small in statement.body
            ):
                return True
        return False

    def stacked(
        self, first: cst.BaseExpression, devices: cst.BaseExpression, call: cst.Call
    ) -> cst.BaseExpression:
        if self._rows_of_array(call):
            assert isinstance(first, cst.Call)
            return first.args[0].value  # `list(x)` of an array: its rows stacked are `x`
        jnp = jnp_ref(self, self.resolver)
        leaves = fresh_name(("xs", "leaves", "shard"), names_in(jnp) | names_in(first))
        return parse_template_expression(
            "{tree_map}(lambda *{leaves}: {stack}({leaves}), *{shards})",
            tree_map=self.jax_attr("tree.map"),
            leaves=cst.Name(leaves),
            stack=cst.Attribute(jnp, cst.Name("stack")),
            shards=first,
        )


def _array_call(p: DevicePutSharded, value: cst.BaseExpression) -> bool:
    """Return True if `value` surely evaluates to an array (never a list, tuple or dict)."""
    if not isinstance(value, cst.Call):
        return False
    name = p.qualname(value.func) or ""
    module, _, function = name.rpartition(".")
    if module in ("numpy", "jax.numpy") and function in ARRAY_FUNCTIONS:
        return True
    if module == "einops" and function in ("rearrange", "repeat"):
        return True
    func = value.func
    return isinstance(func, cst.Attribute) and func.attr.value in ARRAY_METHODS


def _calls_in(node: cst.CSTNode) -> list[cst.Call]:
    class _Calls(cst.CSTVisitor):
        def __init__(self) -> None:
            self.found: list[cst.Call] = []

        def visit_Call(self, call: cst.Call) -> None:
            self.found.append(call)

    collector = _Calls()
    node.visit(collector)
    return collector.found
