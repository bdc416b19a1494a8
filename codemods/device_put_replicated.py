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
from libcst.codemod import CodemodContext
from libcst.helpers import parse_template_expression
from libcst.metadata import PositionProvider

from jaxmigrate.cstutil import (
    AncestorTracking,
    Bindings,
    fit_call,
    fresh_name,
    is_read,
    is_reusable,
    jnp_ref,
    make_leading_axis_sharding,
    names_in,
)
from jaxmigrate.model import Safety
from jaxmigrate.names import dotted
from jaxmigrate.passes import Pass

LEGACY = "jax.device_put_replicated"
PARAMS = ("x", "devices")
PURE_CALLS = frozenset({"jax.devices", "jax.local_devices"})
STRAY = (
    "`jax.device_put_replicated` used but not called: it no longer exists (JAX >= 0.10), so this "
    "line fails; rewrite it by hand"
)
MESSAGE = "`jax.device_put_replicated` was removed in JAX 0.10: use `jax.device_put`"


class DevicePutReplicated(AncestorTracking, Pass):
    """Rewrite the removed `jax.device_put_replicated` as `jax.device_put` with a `NamedSharding`."""

    NAME: ClassVar[str] = "device-put-replicated"
    CODE: ClassVar[str] = "JM104"
    SAFETY: ClassVar[Safety] = Safety.SAFE
    MIN_JAX: ClassVar[tuple[int, int]] = (0, 5)
    QUALNAMES: ClassVar[tuple[str, ...]] = (LEGACY,)
    LITERALS: ClassVar[tuple[str, ...]] = ("device_put_replicated",)
    TRIGGER: ClassVar[re.Pattern[str]] = re.compile(r"\bdevice_put_replicated\b")

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
            return f"arguments {', '.join(names) or '(none)'}: expected (x, devices) in order"
        if not is_reusable(args[1].value, lambda c: self.qualname(c.func) in PURE_CALLS):
            return (
                "`devices` is not a plain expression and the rewrite uses it twice: "
                "bind it to a name first"
            )
        if self.bindings.bound("len"):
            return "`len` is rebound in this file"
        return None

    def _rewrite(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        x, devices = updated.args
        jnp = jnp_ref(self, self.bindings)
        leaf = fresh_name(("a", "leaf", "arr"), names_in(devices.value) | names_in(jnp) | {"len"})
        stacked = parse_template_expression(
            "{tree_map}(lambda {leaf}: {stack}([{leaf}] * len({devices})), {x})",
            tree_map=self.jax_attr("tree.map"),
            leaf=cst.Name(leaf),
            stack=cst.Attribute(jnp, cst.Name("stack")),
            devices=devices.value,
            x=x.value,
        )
        sharding = make_leading_axis_sharding(self, self.bindings, devices.value)
        new = updated.with_changes(
            func=self.jax_attr("device_put"),
            args=[_positional(x, stacked), _positional(devices, sharding)],
        )
        return fit_call(updated, new, self.line_of(original))


def _positional(arg: cst.Arg, value: cst.BaseExpression) -> cst.Arg:
    return arg.with_changes(value=value, keyword=None, equal=cst.MaybeSentinel.DEFAULT)
