"""Rewrite the removed `jax.device_put_replicated` as `jax.device_put` with a `NamedSharding`.

## Why
`jax.device_put_replicated(x, devices)` was deprecated in JAX 0.8.1 and removed in 0.10.0
(accessing it raises `AttributeError`). It stacked `len(devices)` copies of every leaf of the
pytree `x` along a new leading axis and put slice `i` on `devices[i]`: an array sharded over a
1-D mesh of `devices`. The rewrite is the drop-in replacement from JAX's own migration guide
(docs/migrate_pmap.md, "Drop-in replacements"), written out in place.

## Before
```python
import jax

params = jax.device_put_replicated(params, jax.local_devices())
```

## After
```python
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

params = jax.device_put(
    jax.tree.map(lambda a: jnp.stack([a] * len(jax.local_devices())), params),
    NamedSharding(Mesh(np.array(jax.local_devices()), ("x",)), P("x")),
)
```

Names the module already imports are reused (`jnp`, `np`, `Mesh`, `NamedSharding`, `P`, however
spelt); missing ones are imported under their customary names, or spelt in full
(`jax.sharding.PartitionSpec`, `jax.numpy.stack`) when that name means something else here.

## Safety
safe: compared with JAX 0.10.2's own implementation (`jax._src.api.device_put_replicated`) on
numpy and Python scalars (including weak types), float64 inputs, bfloat16, PRNG keys, uncommitted,
committed and sharded arrays, nested pytrees with `None`, and device lists in any order: same
values, dtypes, weak types, shapes, device order and sharding of the leading axis. The only
differences are for inputs the old function rejected or the mesh axis name (`"x"`, on an Auto
mesh, where axis names do not constrain later use).

## Skips
- `devices` that is not a plain expression (a name, attribute, subscript, literal list or a
  `jax.devices()` / `jax.local_devices()` call): the rewrite evaluates it twice. Bind it to a name
  first.
- `*args` / `**kwargs`, missing or unknown arguments, keywords in reverse order.
- Any other use of `jax.device_put_replicated` (passed as a value, stored, aliased): the name
  no longer exists, so such a line fails; it is reported for a hand edit (calls through a plain
  alias `put = jax.device_put_replicated` are rewritten where they are).
- `len` rebound in the file; a function of your own called `device_put_replicated`, and the
  private `jax._src.api.device_put_replicated`, which still exists.

## Verification
not needed at run time: the fixtures of this pass run the rewritten code on an 8-device CPU mesh
against JAX's own (private) implementation and compare values and device placement.
"""

from __future__ import annotations

import re
from typing import ClassVar

import libcst as cst
from libcst.helpers import parse_template_expression

from jaxmigrate.model import Safety
from jaxmigrate.toolkit.cstutil import is_reusable, jnp_ref, names_in
from jaxmigrate.toolkit.emit import fresh_name

from ._device_put import RemovedDevicePut

LEGACY = "jax.device_put_replicated"
PURE_CALLS = frozenset({"jax.devices", "jax.local_devices"})


class DevicePutReplicated(RemovedDevicePut):
    """Rewrite the removed `jax.device_put_replicated` as `jax.device_put` with a `NamedSharding`."""

    NAME: ClassVar[str] = "device-put-replicated"
    CODE: ClassVar[str] = "JM104"
    SAFETY: ClassVar[Safety] = Safety.SAFE
    MIN_JAX: ClassVar[tuple[int, int]] = (0, 5)
    QUALNAMES: ClassVar[tuple[str, ...]] = (LEGACY,)
    LITERALS: ClassVar[tuple[str, ...]] = ("device_put_replicated",)
    TRIGGER: ClassVar[re.Pattern[str]] = re.compile(r"\bdevice_put_replicated\b")
    LEGACY: ClassVar[str] = LEGACY
    PARAMS: ClassVar[tuple[str, str]] = ("x", "devices")
    MESSAGE: ClassVar[str] = (
        "`jax.device_put_replicated` was removed in JAX 0.10: use `jax.device_put`"
    )

    def why_not(self, call: cst.Call) -> str | None:
        reason = super().why_not(call)
        if reason is not None:
            return reason
        if not is_reusable(call.args[1].value, lambda c: self.qualname(c.func) in PURE_CALLS):
            return (
                "`devices` is not a plain expression and the rewrite uses it twice: "
                "bind it to a name first"
            )
        if self.resolver.bound("len"):
            return "`len` is rebound in this file"
        return None

    def stacked(
        self, first: cst.BaseExpression, devices: cst.BaseExpression, call: cst.Call
    ) -> cst.BaseExpression:
        jnp = jnp_ref(self, self.resolver)
        leaf = fresh_name(("a", "leaf", "arr"), names_in(devices) | names_in(jnp) | {"len"})
        return parse_template_expression(
            "{tree_map}(lambda {leaf}: {stack}([{leaf}] * len({devices})), {x})",
            tree_map=self.jax_attr("tree.map"),
            leaf=cst.Name(leaf),
            stack=cst.Attribute(jnp, cst.Name("stack")),
            devices=devices,
            x=first,
        )
