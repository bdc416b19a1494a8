"""Rewrite the removed `jax.experimental.host_callback` calls as `io_callback`.

## Why
`jax.experimental.host_callback` was deprecated on March 20, 2024 (JAX 0.4.26, google/jax#20385)
and then removed: on current JAX (0.10.2) `from jax.experimental import host_callback` raises
`ImportError`, so a module using it no longer imports. Its last release already implemented
`call` with the new external callbacks, and `id_tap` was gone.

## Before
```python
import jax
from jax.experimental import host_callback as hcb


def device_fun(m):
    return hcb.call(host_eig, m, result_shape=jax.ShapeDtypeStruct(m.shape[:-1], m.dtype))


def step(x):
    hcb.id_tap(log_tap, x)
    return x * 2
```

## After
```python
import jax
from jax.experimental import io_callback


def device_fun(m):
    return io_callback(
        host_eig, jax.ShapeDtypeStruct(m.shape[:-1], m.dtype), m, ordered=True
    )


def step(x):
    io_callback(lambda arg: log_tap(arg, ()), None, x, ordered=True)
    return x * 2
```

- `call(f, arg, result_shape=shape)` becomes `io_callback(f, shape, arg, ordered=True)`: what
  JAX's last `host_callback.call` ran, less its `sharding=SingleDeviceSharding(
  jax.local_devices()[0])`, which changes nothing under `jax.jit` (the callback runs once, on
  device 0, with the whole operand, either way) and raises inside `shard_map` and `pmap`, where
  the original host_callback ran once per device, as the rewrite does. When `f` is pure,
  `jax.pure_callback(f, shape, arg)` is the idiomatic form, but it may be dropped when its result
  is unused or merged with an equal call, so it is not written for you.
- `id_tap(tap, arg)` calls `tap(arg, transforms)` on the host and returns `arg` (or `result=`).
  As a statement, or as `y = id_tap(tap, x)` / `return id_tap(tap, x)` with `x` (or `result=`) a
  name, it becomes an ordered `io_callback` statement calling `tap(arg, ())` (the transforms of an
  untransformed program), followed by `y = x` / `return x` (dropped for `x = id_tap(tap, x)`).
- `barrier_wait()` becomes `jax.effects_barrier()`, which waits for the ordered effects.

The host_callback import goes once nothing else uses it; `io_callback` and `jax` are imported
when missing.

## Safety
safe for `call` and `barrier_wait` (the rewrite is the body of JAX's own last implementation,
checked on an 8-device CPU mesh under `jax.jit`, `jax.pmap` and `jax.shard_map`).
`id_tap` sites are unsafe: under `jax.vmap` or `jax.grad` its tap saw batched or primal values with
the transforms named, where an ordered `io_callback` cannot be batched or differentiated, and the
host function now receives `jax.Array`s placed on the CPU rather than NumPy arrays.

## Skips
- `call_with_device=True`, `tap_with_device=True`, `callback_flavor=` (no io_callback equivalent;
  JAX's own shim raised for them), `device_index=` other than 0 (`io_callback(sharding=...)` on
  that device fails unless the computation already spans it), `*args`/`**kwargs`, a result shape
  given as a number.
- `id_tap` whose value is used inside a larger expression, or whose returned argument is not a
  plain name (it would be evaluated twice); `id_tap` in a def the module passes to (or decorates
  with) `jax.vmap`, `jax.grad` or another transformation an ordered `io_callback` raises under,
  or in a def such a def calls; `id_print` (its printed format has no exact
  counterpart: use `jax.debug.print`); any other `host_callback` name, or one used as a value.

## Verification
not needed for `call` and `barrier_wait`. An original using host_callback no longer imports on
current JAX, so `id_tap` rewrites cannot be run against it there: they stay unverified and are
applied with `--unsafe-fixes` or in review, unless `--reference-jax` runs the original on a JAX
that has host_callback (0.4.30 does); the calls compared are then those of the def holding the tap.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import ClassVar

import libcst as cst
from libcst.codemod import CodemodContext

from jaxmigrate.model import Safety
from jaxmigrate.toolkit.cstutil import AncestorTracking, jax_ref
from jaxmigrate.toolkit.emit import is_read
from jaxmigrate.toolkit.names import dotted
from jaxmigrate.toolkit.passes import Pass

MODULE = "jax.experimental.host_callback"
CALL, ID_TAP, ID_PRINT, BARRIER = (
    f"{MODULE}.{n}" for n in ("call", "id_tap", "id_print", "barrier_wait")
)
CALL_PARAMS = ("callback_func", "arg")
CALL_KEYWORDS = frozenset({"result_shape", "call_with_device", "device_index", "callback_flavor"})
TAP_PARAMS = ("tap_func", "arg")
TAP_KEYWORDS = frozenset({"result", "tap_with_device", "device_index", "callback_flavor"})
# Transformations an ordered `io_callback` raises under (`Cannot vmap ordered IO callback`, no JVP).
TRANSFORMS = frozenset(
    f"jax.{n}"
    for n in ("vmap", "grad", "value_and_grad", "jacfwd", "jacrev", "hessian", "jvp", "vjp")
)
PARTIAL = "functools.partial"


class LeftAlone(Exception):
    """A host_callback use this pass leaves alone; the message is the reason."""


class HostCallback(AncestorTracking, Pass):
    """Rewrite the removed `jax.experimental.host_callback` calls as `io_callback`."""

    NAME: ClassVar[str] = "host-callback"
    CODE: ClassVar[str] = "JM106"
    SAFETY: ClassVar[Safety] = Safety.SAFE
    MIN_JAX: ClassVar[tuple[int, int]] = (0, 5)  # `jax.experimental.io_callback`: JAX 0.4.2
    QUALNAMES: ClassVar[tuple[str, ...]] = (MODULE,)
    LITERALS: ClassVar[tuple[str, ...]] = ("host_callback",)
    TRIGGER: ClassVar[re.Pattern[str]] = re.compile(r"\bhost_callback\b")

    def __init__(self, context: CodemodContext) -> None:
        super().__init__(context)
        self._handled: set[int] = set()
        self._transformed: dict[str, str] | None = None

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        call = _value_call(node.body[0]) if len(node.body) == 1 else None
        if call is not None and self.qualname(call.func) == ID_TAP:
            self._handled.add(id(call))  # rewritten with its statement, on leaving it

    # Statements: id_tap's value, and calls standing alone -----------------------------------
    def leave_SimpleStatementLine(
        self, original_node: cst.SimpleStatementLine, updated_node: cst.SimpleStatementLine
    ) -> cst.BaseStatement | cst.FlattenSentinel[cst.BaseStatement]:
        if len(original_node.body) != 1:
            return updated_node
        small, new = original_node.body[0], updated_node.body[0]
        call = _value_call(small)
        if call is None or id(call) not in self._handled:
            return updated_node
        try:
            args = _bind(call, TAP_PARAMS, TAP_KEYWORDS)
            self._check_untransformed()
            tap = self._tap(call, args)
            value = args.get("result", args["arg"])
            after = self._after_tap(small, new, value)
        except LeftAlone as why:
            self.skip(call, str(why))
            return updated_node
        if not self.site(
            call,
            "`host_callback.id_tap` -> an ordered `io_callback` statement",
            safety=Safety.UNSAFE,
        ):
            return updated_node
        self._drop(call.func)
        line = updated_node.with_changes(body=[cst.Expr(tap)])
        if after is None:
            return line
        rest = cst.SimpleStatementLine(
            body=[after], trailing_whitespace=updated_node.trailing_whitespace
        )
        return cst.FlattenSentinel(
            [line.with_changes(trailing_whitespace=cst.TrailingWhitespace()), rest]
        )

    def _after_tap(
        self, small: cst.BaseSmallStatement, new: cst.BaseSmallStatement, value: cst.Arg
    ) -> cst.BaseSmallStatement | None:
        """Return what stands for id_tap's value after the tap: `y = x`, `return x`, or None."""
        if isinstance(small, cst.Expr):
            return None
        if not isinstance(value.value, cst.Name):
            raise LeftAlone(
                "`id_tap` returns an expression that is not a plain name (it would be "
                "evaluated twice)"
            )
        if isinstance(small, cst.Return) and isinstance(new, cst.Return):
            return new.with_changes(value=value.value)
        assert isinstance(small, cst.Assign) and isinstance(new, cst.Assign)
        target = small.targets[0].target
        if (
            len(small.targets) == 1
            and isinstance(target, cst.Name)
            and target.value == value.value.value
        ):
            return None
        return new.with_changes(value=value.value)

    def _tap(self, call: cst.Call, args: dict[str, cst.Arg]) -> cst.Call:
        for key in ("tap_with_device", "device_index", "callback_flavor"):
            if key in args and not _is_default(args[key].value, key):
                raise LeftAlone(f"`{key}=` has no `io_callback` equivalent")
        tap = args["tap_func"].value
        if not isinstance(tap, (cst.Name, cst.Attribute)) or dotted(tap) is None:
            raise LeftAlone(
                "the tap function is an expression: wrap it by hand (`lambda arg: tap(arg, ())`)"
            )
        name = "arg" if (dotted(tap) or "").split(".")[0] != "arg" else "value"
        wrapper = cst.parse_expression(f"lambda {name}: {dotted(tap)}({name}, ())")
        return cst.Call(
            self._io_callback(),
            [
                cst.Arg(wrapper),
                cst.Arg(cst.Name("None")),
                cst.Arg(args["arg"].value),
                cst.Arg(cst.Name("True"), keyword=cst.Name("ordered"), equal=_equal()),
            ],
        )

    def _check_untransformed(self) -> None:
        """Raise LeftAlone if the def around the tap is one the module vmaps or differentiates."""
        defs = [n for n in self.ancestors if isinstance(n, cst.FunctionDef)]
        if not defs:
            return
        if self._transformed is None:
            self._transformed = self._transformed_defs()
        for fn in reversed(defs):  # the def holding the tap, or one it is nested in
            name = fn.name.value
            if name in self._transformed:
                raise LeftAlone(
                    f"`{name}` is transformed by {self._transformed[name]} here: an ordered "
                    "`io_callback` cannot be batched or differentiated (the tap saw the "
                    "transforms)"
                )

    def _transformed_defs(self) -> dict[str, str]:
        """Return `{name: transform}` for each name the module passes to, or decorates with, a
        transformation in TRANSFORMS (directly or through `functools.partial`), and each def of
        the module such a def calls, at any depth (`jax.vmap(outer)`, `outer` calling `inner`)."""
        found: dict[str, str] = {}

        def transform(func: cst.BaseExpression) -> str | None:
            if isinstance(func, cst.Call) and self.qualname(func.func) == PARTIAL and func.args:
                func = func.args[0].value
            qualname = self.qualname(func)
            return f"`{qualname}`" if qualname in TRANSFORMS else None

        for node in _nodes(self.ancestors[0]):
            if isinstance(node, cst.Call) and node.args and not node.args[0].keyword:
                first, what = node.args[0].value, transform(node.func)
                if what and isinstance(first, cst.Name):
                    found.setdefault(first.value, what)
            elif isinstance(node, cst.FunctionDef):
                for deco in node.decorators:
                    what = transform(deco.decorator)
                    if what:
                        found.setdefault(node.name.value, what)
        defs = [n for n in _nodes(self.ancestors[0]) if isinstance(n, cst.FunctionDef)]
        calls = {
            fn.name.value: {
                c.func.value
                for c in _nodes(fn.body)
                if isinstance(c, cst.Call) and isinstance(c.func, cst.Name)
            }
            for fn in defs
        }
        todo = list(found)
        while todo:  # what a transformed def calls runs transformed too
            caller = todo.pop()
            for callee in calls.get(caller, set()) - set(found):
                found[callee] = f"{found[caller].partition(' (')[0]} (through `{caller}`)"
                todo.append(callee)
        return found

    # Expressions: call, barrier_wait, and everything else --------------------------------
    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        qualname = self.qualname(original_node.func)
        if (
            qualname is None
            or not qualname.startswith(MODULE + ".")
            or id(original_node) in self._handled
        ):
            return updated_node
        try:
            if qualname == CALL:
                new = self._call(_bind(updated_node, CALL_PARAMS, CALL_KEYWORDS))
                message = (
                    "`host_callback.call` -> `io_callback`, as JAX's last host_callback ran it"
                )
            elif qualname == BARRIER:
                if any(a.star for a in updated_node.args):
                    raise LeftAlone("`*args`/`**kwargs` passed to `barrier_wait`")
                new = cst.Call(self.jax_attr("effects_barrier"), [])
                message = "`host_callback.barrier_wait()` -> `jax.effects_barrier()`"
            elif qualname == ID_TAP:
                raise LeftAlone(
                    "`id_tap`'s value is used inside an expression: make the tap its own statement"
                )
            elif qualname == ID_PRINT:
                raise LeftAlone("`id_print` has no exact counterpart: use `jax.debug.print`")
            else:
                raise LeftAlone(f"`{qualname}` has no counterpart in current JAX")
        except LeftAlone as why:
            self.skip(original_node, str(why))
            return updated_node
        if not self.site(original_node, message):
            return updated_node
        self._drop(original_node.func)
        return self.fit(original_node, new, rearranged=True)

    def _call(self, args: dict[str, cst.Arg]) -> cst.Call:
        for key in ("call_with_device", "callback_flavor", "device_index"):
            if key in args and not _is_default(args[key].value, key):
                raise LeftAlone(f"`{key}=` has no `io_callback` equivalent")
        shape = args["result_shape"].value if "result_shape" in args else cst.Name("None")
        if isinstance(shape, (cst.Integer, cst.Float, cst.UnaryOperation)):
            raise LeftAlone("a number as `result_shape=`: `io_callback` needs a shape and a dtype")
        return cst.Call(
            self._io_callback(),
            [
                cst.Arg(args["callback_func"].value),
                cst.Arg(shape),
                cst.Arg(args["arg"].value),
                cst.Arg(cst.Name("True"), keyword=cst.Name("ordered"), equal=_equal()),
            ],
        )

    def visit_Attribute(self, node: cst.Attribute) -> None:
        self._check_value(node)

    def visit_Name(self, node: cst.Name) -> None:
        self._check_value(node)

    def visit_Import(self, node: cst.Import) -> bool:
        return False

    def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
        return False

    def _check_value(self, node: cst.Name | cst.Attribute) -> None:
        """Skip a host_callback function used as a value: its calls are not visible."""
        parent = self.ancestors[-1] if self.ancestors else None
        if isinstance(parent, cst.Attribute) or not is_read(node, parent):
            return
        if isinstance(parent, cst.Call) and parent.func is node:
            return
        qualname = self.qualname(node)
        if qualname is not None and qualname.startswith(MODULE + "."):
            self.skip(node, f"`{qualname}` used as a value: its calls are not visible")

    # Helpers ------------------------------------------------------------------------------
    def _io_callback(self) -> cst.BaseExpression:
        return jax_ref(self, self.resolver, "experimental.io_callback", local="io_callback")

    def _drop(self, func: cst.BaseExpression) -> None:
        name = dotted(func)
        if name is None:
            return
        self.drop_import_if_unused(name if "." not in name else name.rpartition(".")[0])


def _nodes(tree: cst.CSTNode) -> list[cst.CSTNode]:
    """Return every node of `tree`, parents before children."""
    out: list[cst.CSTNode] = []
    stack: list[cst.CSTNode] = [tree]
    while stack:
        node = stack.pop()
        out.append(node)
        stack.extend(reversed(node.children))
    return out


def _value_call(small: cst.BaseSmallStatement) -> cst.Call | None:
    """Return the call of `f(...)`, `y = f(...)` or `return f(...)` (one plain target)."""
    plain = isinstance(small, (cst.Expr, cst.Return))
    if plain or (isinstance(small, cst.Assign) and len(small.targets) == 1):
        value = getattr(small, "value", None)
        return value if isinstance(value, cst.Call) else None
    return None


def _bind(
    call: cst.Call, positional: Sequence[str], keywords: frozenset[str]
) -> dict[str, cst.Arg]:
    """Return the arguments of a host_callback call by parameter name; raise LeftAlone if unclear."""
    found: dict[str, cst.Arg] = {}
    for i, arg in enumerate(call.args):
        if arg.star:
            raise LeftAlone(f"`{arg.star}` unpacking: which parameters it fills is not known")
        name = arg.keyword.value if arg.keyword else (positional[i] if i < len(positional) else "")
        if name not in (*positional, *keywords) or name in found:
            raise LeftAlone(
                f"unexpected argument `{name or '#' + str(i)}`: the call failed already"
            )
        found[name] = arg
    missing = [p for p in positional if p not in found]
    if missing:
        raise LeftAlone(f"no `{missing[0]}` argument")
    return found


def _is_default(node: cst.BaseExpression, key: str) -> bool:
    if key == "device_index":
        return isinstance(node, cst.Integer) and node.value == "0"
    return isinstance(node, cst.Name) and node.value in ("False", "None")


def _equal() -> cst.AssignEqual:
    return cst.AssignEqual(
        whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")
    )
