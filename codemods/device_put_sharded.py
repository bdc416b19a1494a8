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
from libcst.codemod import CodemodContext
from libcst.helpers import parse_template_expression
from libcst.metadata import PositionProvider

from jaxmigrate.cstutil import (
    AncestorTracking,
    Bindings,
    fit_call,
    fresh_name,
    is_read,
    jnp_ref,
    make_leading_axis_sharding,
    names_in,
)
from jaxmigrate.model import Safety
from jaxmigrate.names import dotted
from jaxmigrate.passes import Pass

LEGACY = "jax.device_put_sharded"
PARAMS = ("shards", "devices")
STRAY = (
    "`jax.device_put_sharded` used but not called: it no longer exists (JAX >= 0.10), so this "
    "line fails; rewrite it by hand"
)
MESSAGE = "`jax.device_put_sharded` was removed in JAX 0.10: use `jax.device_put`"


class DevicePutSharded(AncestorTracking, Pass):
    """Rewrite the removed `jax.device_put_sharded` as `jax.device_put` with a `NamedSharding`."""

    NAME: ClassVar[str] = "device-put-sharded"
    CODE: ClassVar[str] = "JM105"
    SAFETY: ClassVar[Safety] = Safety.SAFE
    MIN_JAX: ClassVar[tuple[int, int]] = (0, 5)
    QUALNAMES: ClassVar[tuple[str, ...]] = (LEGACY,)
    LITERALS: ClassVar[tuple[str, ...]] = ("device_put_sharded",)
    TRIGGER: ClassVar[re.Pattern[str]] = re.compile(r"\bdevice_put_sharded\b")

    def __init__(self, context: CodemodContext) -> None:
        super().__init__(context)
        self._tree: cst.Module | None = None
        self._bindings: Bindings | None = None
        self._lines: list[str] | None = None

    @property
    def bindings(self) -> Bindings:
        """Where every name of the module is bound (built on first use)."""
        if self._bindings is None:
            assert self._tree is not None
            self._bindings = Bindings.of(self._tree)
        return self._bindings

    def line_of(self, node: cst.CSTNode) -> str:
        """Return the source line `node` starts on."""
        if self._lines is None:
            assert self._tree is not None
            self._lines = self.state.cache.lines(self._tree)
        return self._lines[self.get_metadata(PositionProvider, node).start.line - 1]

    def visit_Module(self, node: cst.Module) -> None:
        self._tree = node

    def visit_Import(self, node: cst.Import) -> bool:
        return False

    def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
        return False

    def visit_Name(self, node: cst.Name) -> None:
        self._check_use(node)

    def visit_Attribute(self, node: cst.Attribute) -> None:
        self._check_use(node)

    def _check_use(self, node: cst.Name | cst.Attribute) -> None:
        parent = self.ancestors[-1] if self.ancestors else None
        if not is_read(node, parent) or self.qualname(node) != LEGACY:
            return
        if not (isinstance(parent, cst.Call) and parent.func is node):
            self.skip(node, STRAY)

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if self.qualname(original_node.func) != LEGACY:
            return updated_node
        reason = self._why_not(original_node)
        if reason is not None:
            self.skip(original_node, reason)
            return updated_node
        if not self.site(original_node, MESSAGE):
            return updated_node
        base = dotted(original_node.func) or ""
        self.drop_import_if_unused(base if "." not in base else base.rpartition(".")[0])
        return self._rewrite(original_node, updated_node)

    def _why_not(self, call: cst.Call) -> str | None:
        """Return why this call is left alone, or None to rewrite it."""
        args = call.args
        if any(a.star for a in args):
            return "`*args` / `**kwargs`: which parameters they fill is not known"
        names = tuple(
            PARAMS[i] if a.keyword is None else a.keyword.value for i, a in enumerate(args)
        )
        if names != PARAMS:
            return f"arguments {', '.join(names) or '(none)'}: expected (shards, devices) in order"
        if self._placed_per_device(args[0].value):
            return (
                "the shards are put on devices one by one, and `jnp.stack` cannot stack arrays "
                "committed to different devices: stack them on the host, or build the array with "
                "`jax.make_array_from_single_device_arrays`"
            )
        return None

    def _placed_per_device(self, shards: cst.BaseExpression) -> bool:
        """Return True if `shards` (or any value assigned to that name) calls `device_put(x, d)`."""
        found = [shards]
        if isinstance(shards, cst.Name):
            found.extend(self.bindings.values(shards.value))
        calls = [c for node in found for c in _calls_in(node)]
        return any(
            self.qualname(c.func) == "jax.device_put"
            and (len(c.args) > 1 or any(a.keyword and a.keyword.value == "device" for a in c.args))
            for c in calls
        )

    def _rewrite(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        shards, devices = updated.args
        jnp = jnp_ref(self, self.bindings)
        leaves = fresh_name(("xs", "leaves", "shard"), names_in(jnp) | names_in(shards.value))
        stacked = parse_template_expression(
            "{tree_map}(lambda *{leaves}: {stack}({leaves}), *{shards})",
            tree_map=self.jax_attr("tree.map"),
            leaves=cst.Name(leaves),
            stack=cst.Attribute(jnp, cst.Name("stack")),
            shards=shards.value,
        )
        sharding = make_leading_axis_sharding(self, self.bindings, devices.value)
        new = updated.with_changes(
            func=self.jax_attr("device_put"),
            args=[_positional(shards, stacked), _positional(devices, sharding)],
        )
        return fit_call(updated, new, self.line_of(original))


def _positional(arg: cst.Arg, value: cst.BaseExpression) -> cst.Arg:
    return arg.with_changes(value=value, keyword=None, equal=cst.MaybeSentinel.DEFAULT)


def _calls_in(node: cst.CSTNode) -> list[cst.Call]:
    class _Calls(cst.CSTVisitor):
        def __init__(self) -> None:
            self.found: list[cst.Call] = []

        def visit_Call(self, call: cst.Call) -> None:
            self.found.append(call)

    collector = _Calls()
    node.visit(collector)
    return collector.found
