"""References: equivalent forms of the original that run when the original cannot.

Each reference is a context manager that patches one legacy entry point while the original
module is imported and called (the worker imports a fresh copy of the module under the patch):

- `vmap-oracle`: `jax.pmap` becomes `jax.vmap(..., axis_name=...)`, which has pmap's semantics
  including named collectives and nested maps (0.10.2's pmap breaks on nested pmap and negative
  axes; cookbook cases 04 and 07).
- `widened-shard-map`: `shard_map` with every mesh axis manual (drops `axis_names` / `auto`); a
  callback in a partial-auto region then runs, and is equivalent when the specs never name the
  auto axes (cookbook case 12e). Side effects keep their count: in a widened region,
  `io_callback` and `jax.debug.callback` run on the first device along the formerly automatic
  axes only (their result shared with `psum`), once per manual shard, as `jax.debug.callback`
  runs in a partial-auto region; pure callbacks run on every device.
- `pjit-in-shardings`: pjit's removed `in_axis_resources` / `out_axis_resources` keywords are
  passed as `in_shardings` / `out_shardings` (cookbook case 10).

Any of them may be combined with `safe-rewrites` (the original with its safe sites rewritten).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
from collections.abc import Callable, Iterator
from typing import Any

import jax

from .compat import tree_map

ORIGINAL = "original"
SAFE_REWRITES = "safe-rewrites"


@contextlib.contextmanager
def patched(owner: Any, name: str, value: Any) -> Iterator[None]:
    """Set `owner.name` to `value` for the duration of the block."""
    old = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, old)


def _as_tuple(argnums: Any) -> tuple[int, ...]:
    return (argnums,) if isinstance(argnums, int) else tuple(argnums)


def oracle_pmap(
    fun: Callable[..., Any] | None = None,
    axis_name: Any = None,
    *,
    in_axes: Any = 0,
    out_axes: Any = 0,
    static_broadcasted_argnums: Any = (),
    **_ignored: Any,
) -> Any:
    """Return `fun` mapped with `jax.vmap` as pmap would map it (statics closed over)."""
    if fun is None:
        return functools.partial(
            oracle_pmap,
            axis_name=axis_name,
            in_axes=in_axes,
            out_axes=out_axes,
            static_broadcasted_argnums=static_broadcasted_argnums,
        )
    static = _as_tuple(static_broadcasted_argnums)

    @functools.wraps(fun)
    def mapped(*args: Any, **kwargs: Any) -> Any:
        dyn = [i for i in range(len(args)) if i not in static]
        axes = in_axes
        if isinstance(in_axes, tuple) and len(in_axes) == len(args):
            axes = tuple(in_axes[i] for i in dyn)

        def body(*dyn_args: Any, **kw: Any) -> Any:
            full = list(args)
            for i, value in zip(dyn, dyn_args):
                full[i] = value
            return fun(*full, **kw)

        vmapped = jax.vmap(body, in_axes=axes, out_axes=out_axes, axis_name=axis_name)
        return vmapped(*[args[i] for i in dyn], **kwargs)

    return mapped


# The formerly automatic axes of the widened shard_maps being traced, innermost last.
_AUTO: list[tuple[str, ...]] = []


def _auto_axes(drop: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[str, ...]:
    """Return the axes a shard_map call leaves automatic (`auto=`, or the mesh's axes that
    `axis_names=` does not name; none when every axis is manual)."""
    value = kwargs.get(drop)
    if not value:
        return ()
    if drop == "auto":
        return tuple(value)
    mesh = kwargs.get("mesh") or (args[1] if len(args) > 1 else None)
    if mesh is None:
        mesh = jax.sharding.get_abstract_mesh()
    return tuple(a for a in mesh.axis_names if a not in value)


def widened(real: Callable[..., Any], drop: str) -> Callable[..., Any]:
    """Return `real` (a shard_map) with the keyword `drop` removed: every mesh axis manual.

    While the body is traced, the axes that were automatic are on `_AUTO`, so the callbacks it
    makes can run once per manual shard.
    """

    def shard_map(*args: Any, **kwargs: Any) -> Any:
        if not args:  # decorator factory: `jax.shard_map(mesh=..., ...)(f)`
            return lambda f: shard_map(f, **kwargs)
        auto = _auto_axes(drop, args, kwargs)
        kwargs.pop(drop, None)
        f = args[0]

        @functools.wraps(f)
        def body(*a: Any, **k: Any) -> Any:
            _AUTO.append(auto)
            try:
                return f(*a, **k)
            finally:
                _AUTO.pop()

        return real(body, *args[1:], **kwargs)

    return shard_map


def once_per_manual_shard(real: Callable[..., Any], *, has_result: bool) -> Callable[..., Any]:
    """Return `real` (a callback) gated to the first device along the widened axes: each side
    effect happens as often as in the partial-auto region (the rewrite's own gate)."""

    def callback(*args: Any, **kwargs: Any) -> Any:
        axes = _AUTO[-1] if _AUTO else ()
        if not axes or not args or args[0] is None:
            return real(*args, **kwargs)
        lax, jnp = jax.lax, importlib.import_module("jax.numpy")
        shapes = args[1] if has_result and len(args) > 1 else None

        def skip() -> Any:
            return tree_map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)

        out = lax.cond(lax.axis_index(axes) == 0, lambda: real(*args, **kwargs), skip)
        return out if shapes is None else lax.psum(out, axes)

    return callback


def _widened_shard_map() -> contextlib.ExitStack:
    stack = contextlib.ExitStack()
    stack.enter_context(patched(jax, "shard_map", widened(jax.shard_map, "axis_names")))
    legacy = importlib.import_module("jax.experimental.shard_map")
    stack.enter_context(patched(legacy, "shard_map", widened(legacy.shard_map, "auto")))
    experimental = importlib.import_module("jax.experimental")
    io = once_per_manual_shard(experimental.io_callback, has_result=True)
    stack.enter_context(patched(experimental, "io_callback", io))
    debug = once_per_manual_shard(jax.debug.callback, has_result=False)
    stack.enter_context(patched(jax.debug, "callback", debug))
    return stack


def with_in_shardings(real: Callable[..., Any]) -> Callable[..., Any]:
    """Return `real` (pjit) accepting the removed `*_axis_resources` keywords as shardings."""

    def pjit(*args: Any, **kwargs: Any) -> Any:
        for old, new in (
            ("in_axis_resources", "in_shardings"),
            ("out_axis_resources", "out_shardings"),
        ):
            if old in kwargs:
                kwargs[new] = kwargs.pop(old)
        return real(*args, **kwargs)

    return pjit


def _pjit_in_shardings() -> contextlib.AbstractContextManager[None]:
    legacy = importlib.import_module("jax.experimental.pjit")
    return patched(legacy, "pjit", with_in_shardings(legacy.pjit))


REFERENCES: dict[str, Callable[[], contextlib.AbstractContextManager[Any]]] = {
    ORIGINAL: contextlib.nullcontext,
    "vmap-oracle": lambda: patched(jax, "pmap", oracle_pmap),
    "widened-shard-map": _widened_shard_map,
    "pjit-in-shardings": _pjit_in_shardings,
}


def reference(name: str) -> contextlib.AbstractContextManager[Any]:
    """Return the patches of a reference named like `vmap-oracle` or `safe-rewrites+vmap-oracle`.

    `safe-rewrites` is not a patch: it makes the worker run the original with its safe rewrites
    applied (a module that no longer imports on the installed JAX, because of a removed import
    path, runs once its safe sites are rewritten: those provably keep behaviour).
    """
    stack = contextlib.ExitStack()
    for part in name.split("+"):
        if part != SAFE_REWRITES:
            stack.enter_context(REFERENCES[part]())
    return stack
