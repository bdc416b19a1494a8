"""Rewrite `jax.experimental.shard_map.shard_map` as `jax.shard_map`.

## Why
`jax.shard_map` became public in JAX 0.6.1 and the experimental endpoint was deprecated in 0.8.0
("jax.experimental.shard_map is deprecated in v0.8.0. Used jax.shard_map instead."). The new
function takes `f` positionally and everything else by keyword (`mesh=`, `in_specs=`,
`out_specs=`; positional ones raise `TypeError`), `check_rep` became `check_vma`, and the old
`auto=` (removed in 0.8.0) is expressed the other way round, as the manual `axis_names=`.

## Before
```python
from jax.experimental.shard_map import shard_map

f = shard_map(body, mesh, P("x"), P(), check_rep=False)
```

## After
```python
import jax

f = jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P(), check_vma=False)
```

Every spelling of the old function is recognised: `from jax.experimental.shard_map import
shard_map [as x]`, `import jax.experimental.shard_map as shmap` (`shmap.shard_map`),
`from jax.experimental import shard_map` (`shard_map.shard_map`), function-local imports and
aliases. `@partial(shard_map, mesh=..., in_specs=..., out_specs=...)` decorators become the
decorator factory `@jax.shard_map(mesh=..., in_specs=..., out_specs=...)`; a
`partial(shard_map, ...)` kept as a value becomes `partial(jax.shard_map, ...)`. Imports left
unused are removed and `import jax` is added when missing.

`auto=A` becomes `axis_names=`, the mesh axes that are *not* in `A`, which is how the old
endpoint computed it (`frozenset(mesh.axis_names) - auto`). When `A` is a literal set of names
and the mesh's axis names are visible (the mesh is built inline, or is a name whose only
assignment, in the scope the name resolves to, is `mesh = Mesh(..., ("x", "y"))` or
`jax.make_mesh(..., ("x", "y"))`), the complement is written out: `axis_names={"x"}`.
Otherwise it is computed at run time, `axis_names=frozenset(mesh.axis_names) - A`, which needs
the mesh to be a plain name or attribute (it is then read twice). `auto=frozenset()` is dropped.

## Safety
safe: `jax.experimental.shard_map.shard_map(f, mesh, in_specs, out_specs, check_rep)` is, in
JAX 0.10.2, literally `jax.shard_map(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs,
check_vma=check_rep)` (both call the same internal function), and in 0.6.1-0.7.x the endpoint
passed `axis_names=frozenset(mesh.axis_names) - auto` to that function, which is what the rewrite
writes. A `partial(shard_map, ...)` kept as a value is rewritten only when it binds `mesh`,
`in_specs` and `out_specs` by keyword, so its callers can only pass `f`.

## Skips
- Calls with `*args` / `**kwargs`: which parameters they fill is not known.
- Calls missing `f`, `mesh`, `in_specs` or `out_specs`, or with unknown keywords: they fail today.
- `auto=` when the mesh is neither a plain name nor statically known (it would be evaluated
  twice), when `auto=` names every mesh axis, or when `frozenset` is rebound in the file.
- `shard_map` passed around as a value (its callers may pass mesh and specs positionally), and
  `partial(shard_map, ...)` values with positional arguments or without all three keywords.
- An import of the old endpoint whose name is also bound to something else, such as the common
  `try: from jax import shard_map` / `except ImportError: from jax.experimental.shard_map import
  shard_map` fallback: the calls could mean either function, so they are left alone.
- Look-alikes: `flax.nnx.shard_map`, a function of your own called `shard_map`, `jax.shard_map`.

## Verification
not needed for the keyword moves and renames; the fixtures of this pass run old and new code on
an 8-device CPU mesh (for `auto=`, which no longer runs, against an equivalent reference).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import ClassVar

import libcst as cst
from libcst.codemod import CodemodContext

from jaxmigrate.model import Safety
from jaxmigrate.toolkit.cstutil import (
    AncestorTracking,
    parenthesized,
)
from jaxmigrate.toolkit.emit import is_read, with_keyword
from jaxmigrate.toolkit.meshes import mesh_axes_in_view, string_elements
from jaxmigrate.toolkit.names import dotted
from jaxmigrate.toolkit.passes import Pass

LEGACY = "jax.experimental.shard_map.shard_map"
PARTIAL = "functools.partial"
PARAMS = ("f", "mesh", "in_specs", "out_specs", "check_rep", "auto")
RENAMED = {"check_rep": "check_vma"}
REQUIRED = ("mesh", "in_specs", "out_specs")
_Thunk = Callable[[], cst.Call]
_ArgsThunk = Callable[[], list[cst.Arg]]
_ValueThunk = Callable[[cst.Arg], cst.BaseExpression]

STRAY = (
    "`shard_map` used as a value: its callers may pass mesh and specs positionally, which "
    "`jax.shard_map` rejects"
)
STRAY_DECORATOR = "`@shard_map` without arguments: the call fails today"
MESSAGE = "`jax.experimental.shard_map.shard_map` is deprecated: use `jax.shard_map` with keywords"


class LeftAlone(Exception):
    """A call this pass leaves alone; the message is the reason."""


class ExperimentalShardMap(AncestorTracking, Pass):
    """Rewrite `jax.experimental.shard_map.shard_map` as `jax.shard_map`."""

    NAME: ClassVar[str] = "experimental-shard-map"
    CODE: ClassVar[str] = "JM102"
    SAFETY: ClassVar[Safety] = Safety.SAFE
    MIN_JAX: ClassVar[tuple[int, int]] = (0, 7)
    REFERENCE: ClassVar[str | None] = "widened-shard-map"
    QUALNAMES: ClassVar[tuple[str, ...]] = (LEGACY,)
    TRIGGER: ClassVar[re.Pattern[str]] = re.compile(r"shard_map\b")

    @classmethod
    def applies_to(cls, source: str) -> bool:
        """The legacy `shard_map` can only be reached through a path naming `jax.experimental`."""
        return "experimental" in source and cls.TRIGGER.search(source) is not None

    def __init__(self, context: CodemodContext) -> None:
        super().__init__(context)
        self.decorators: set[int] = set()

    # Finding ------------------------------------------------------------------------------
    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        for deco in node.decorators:
            if isinstance(deco.decorator, cst.Call) and self._is_partial(deco.decorator):
                self.decorators.add(id(deco.decorator))

    def visit_Name(self, node: cst.Name) -> None:
        self._check_use(node)

    def visit_Attribute(self, node: cst.Attribute) -> None:
        self._check_use(node)

    def _check_use(self, node: cst.Name | cst.Attribute) -> None:
        parent = self.ancestors[-1] if self.ancestors else None
        if not is_read(node, parent) or self.qualname(node) != LEGACY:
            return
        if not self._handled(node, self.ancestors):
            self.skip(node, STRAY_DECORATOR if isinstance(parent, cst.Decorator) else STRAY)

    def visit_Import(self, node: cst.Import) -> bool:
        return False

    def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
        if node.relative or node.module is None or isinstance(node.names, cst.ImportStar):
            return False
        module = dotted(node.module)
        for alias in node.names:
            if f"{module}.{dotted(alias.name)}" not in (LEGACY, LEGACY.rpartition(".")[0]):
                continue
            bound = alias.asname.name if alias.asname is not None else alias.name
            if isinstance(bound, cst.Name) and self.qualname(bound) is None:
                self.skip(
                    alias,
                    f"`{bound.value}` is also bound to something else (e.g. a "
                    "try/except ImportError fallback): its calls are left alone",
                )
        return False

    def _handled(self, ref: cst.BaseExpression, parents: Sequence[cst.CSTNode]) -> bool:
        """Return True for a call `shard_map(...)`, `partial(shard_map, ...)`, or `x = shard_map`
        (calls through such an alias are rewritten where they are)."""
        parent = parents[-1]
        if isinstance(parent, cst.Call):
            return parent.func is ref
        if isinstance(parent, cst.Assign):
            return len(parent.targets) == 1 and isinstance(parent.targets[0].target, cst.Name)
        if isinstance(parent, cst.Arg) and len(parents) > 1:
            call = parents[-2]
            return isinstance(call, cst.Call) and call.args[0] is parent and self._is_partial(call)
        return False

    def _is_partial(self, node: cst.Call) -> bool:
        return (
            self.qualname(node.func) == PARTIAL
            and bool(node.args)
            and node.args[0].keyword is None
            and not node.args[0].star
            and self.qualname(node.args[0].value) == LEGACY
        )

    # Rewriting ----------------------------------------------------------------------------
    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if self.qualname(original_node.func) == LEGACY:
            legacy, rewrite = original_node.func, self._rewrite_call
        elif self._is_partial(original_node):
            legacy, rewrite = original_node.args[0].value, self._rewrite_partial
        else:
            return updated_node
        try:
            new = rewrite(original_node, updated_node)
        except LeftAlone as why:
            self.skip(original_node, str(why))
            return updated_node
        if not self.site(original_node, MESSAGE):
            return updated_node
        self._drop(legacy)
        return self.fit(original_node, new())

    def _rewrite_call(self, original: cst.Call, updated: cst.Call) -> _Thunk:
        args = self._keywords(original.args, updated.args, needs_f=True)
        return lambda: updated.with_changes(func=self.jax_attr("shard_map"), args=args())

    def _rewrite_partial(self, original: cst.Call, updated: cst.Call) -> _Thunk:
        rest = original.args[1:]
        if any(a.keyword is None for a in rest):
            raise LeftAlone("`partial(shard_map, ...)` binds positional arguments")
        args = self._keywords(rest, updated.args[1:], needs_f=False)
        if id(original) in self.decorators:

            def factory() -> cst.Call:
                self._drop(original.func)
                return updated.with_changes(func=self.jax_attr("shard_map"), args=args())

            return factory
        first = updated.args[0]
        return lambda: updated.with_changes(
            args=[first.with_changes(value=self.jax_attr("shard_map")), *args()]
        )

    def _keywords(
        self, original: Sequence[cst.Arg], updated: Sequence[cst.Arg], *, needs_f: bool
    ) -> _ArgsThunk:
        """Check the legacy arguments; return a builder of the new ones (all but f by keyword)."""
        named: dict[str, int] = {}
        for i, arg in enumerate(original):
            if arg.star:
                raise LeftAlone(f"`{arg.star}` splat: which parameters it fills is not known")
            if arg.keyword is None and i >= len(PARAMS):
                raise LeftAlone("more positional arguments than the legacy `shard_map` takes")
            name = PARAMS[i] if arg.keyword is None else arg.keyword.value
            if name not in PARAMS or name in named:
                raise LeftAlone(f"unexpected argument `{name}`: the call fails today")
            if name == "f" and i != 0:
                raise LeftAlone("`f=` after other arguments: moving it first reorders evaluation")
            named[name] = i
        if not needs_f and "f" in named:
            raise LeftAlone("`partial(shard_map, f=...)`: the function is bound early")
        missing = [n for n in (("f",) if needs_f else ()) + REQUIRED if n not in named]
        if missing:
            raise LeftAlone(f"no `{'`, `'.join(missing)}` argument: the call fails today")
        auto = self._axis_names(original, named) if "auto" in named else None

        def build() -> list[cst.Arg]:
            out: list[cst.Arg] = []
            for i, arg in enumerate(updated):
                name = PARAMS[i] if arg.keyword is None else arg.keyword.value
                if name == "f":
                    out.append(arg.with_changes(keyword=None, equal=cst.MaybeSentinel.DEFAULT))
                elif name != "auto":
                    out.append(with_keyword(arg, RENAMED.get(name, name)))
                elif auto is not None:
                    out.append(with_keyword(arg, "axis_names").with_changes(value=auto(arg)))
            if len(out) < len(updated) and out:
                out[-1] = out[-1].with_changes(comma=updated[-1].comma)
            return out

        return build

    # auto= -> axis_names= -----------------------------------------------------------------
    def _axis_names(self, original: Sequence[cst.Arg], named: dict[str, int]) -> _ValueThunk | None:
        """Return how to write `axis_names=` for the legacy `auto=`; None drops `auto=`."""
        auto = original[named["auto"]].value
        mesh = original[named["mesh"]].value
        excluded = self._literal_names(auto)
        if excluded is not None and not excluded:
            return None
        axes = mesh_axes_in_view(mesh, self.resolver)
        if axes is not None and excluded is not None:
            manual = [s for s in axes if s.evaluated_value not in excluded]
            if not manual:
                raise LeftAlone("`auto=` names every mesh axis; review this one by hand")
            return lambda arg: cst.Set([cst.Element(s) for s in manual])
        if not isinstance(mesh, (cst.Name, cst.Attribute)) or dotted(mesh) is None:
            raise LeftAlone("`auto=` needs the mesh twice and the mesh is not a plain name")
        if self.resolver.bound("frozenset"):
            raise LeftAlone("`frozenset` is rebound in this file")
        return lambda arg: cst.BinaryOperation(
            left=cst.parse_expression(f"frozenset({dotted(mesh)}.axis_names)"),
            operator=cst.Subtract(),
            right=parenthesized(arg.value),
        )

    def _literal_names(self, node: cst.BaseExpression) -> set[str] | None:
        """Return the names in `{"y"}` / `frozenset({"y"})` / `frozenset()`, else None."""
        if isinstance(node, cst.Call) and dotted(node.func) in ("frozenset", "set"):
            if self.resolver.bound(dotted(node.func) or "") or any(a.keyword for a in node.args):
                return None
            if not node.args:
                return set()
            if len(node.args) != 1 or node.args[0].star:
                return None
            if not isinstance(node.args[0].value, (cst.Set, cst.Tuple, cst.List)):
                return None
            node = node.args[0].value
        elif not isinstance(node, cst.Set):
            return None
        strings = string_elements(node.elements)
        return None if strings is None else {str(s.evaluated_value) for s in strings}

    def _drop(self, node: cst.BaseExpression) -> None:
        name = dotted(node)
        if name is None:
            return
        self.drop_import_if_unused(name if isinstance(node, cst.Name) else name.rpartition(".")[0])
