"""Check, while the original runs, what a program-level pmap rewrite assumes of its step.

The program-level form passes a value the original replicated (`replicate(x)`,
`jnp.broadcast_to(x, (n,) + x.shape)`, a result fed back) as one unstacked value (`P()`), and
reads a result the original read on device 0 (`r[0]`) as the whole value: both are right only
if the original's stacked value is the same on every device. A step's `layout` (from its
site's details) names the argument positions and results treated so; each concrete call of the
`jax.pmap` made on the step's lines is checked, and the first values that differ between
devices are reported (`layout_violations` in the original's reply). Calls made while tracing
are not checked (their values are not known).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np

from .references import patched


def differs(value: Any) -> bool:
    """Return True if some leaf of a stacked pytree is not the same on every device (exactly:
    a replicated value is a copy, and a pmean/psum result is the same bits on each device)."""
    for leaf in jax.tree.leaves(value):
        if isinstance(leaf, jax.core.Tracer) or not hasattr(leaf, "shape") or not leaf.shape:
            continue
        stacked = _readable(leaf)
        if stacked is None:
            continue
        nan = stacked.dtype.kind in "fc"
        if any(
            not np.array_equal(stacked[0], stacked[k], equal_nan=nan)
            for k in range(1, stacked.shape[0])
        ):
            return True
    return False


def _readable(leaf: Any) -> np.ndarray | None:
    """Return a leaf's values on the host (a PRNG key's data), or None if it cannot be read."""
    try:
        if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
            leaf = jax.random.key_data(leaf)
        return np.asarray(leaf)
    except Exception:  # noqa: BLE001 - a value we cannot read is not checked
        return None


def checked(
    step: Callable[..., Any], layout: dict[str, Any], name: str, found: list[str]
) -> Callable[..., Any]:
    """Return `step` (a pmapped callable) checking each call against `layout`."""
    calls = 0

    def call(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        for position in layout.get("replicated", []):
            if position < len(args) and differs(args[position]) and not found:
                found.append(
                    f"argument {position + 1} of `{name}` differs between devices in the "
                    f"original (call {calls}): it is not replicated, as `P()` assumes"
                )
        out = step(*args, **kwargs)
        results = out if layout.get("tuple") and isinstance(out, tuple) else (out,)
        for index in layout.get("results", []):
            if index < len(results) and differs(results[index]) and not found:
                which = f"result {index + 1}" if layout.get("tuple") else "the result"
                found.append(
                    f"{which} of `{name}` differs between devices in the original "
                    f"(call {calls}): it is not replicated, as `P()` assumes"
                )
        return out

    return call


@contextlib.contextmanager
def checking(layouts: list[dict[str, Any]], path: str) -> Iterator[list[str]]:
    """Patch `jax.pmap` so that the steps made on the layouts' lines of the file `path` are
    checked; yield the list the first violation is appended to."""
    found: list[str] = []
    real = jax.pmap

    def pmap(*args: Any, **kwargs: Any) -> Any:
        step = real(*args, **kwargs)
        frame = _caller()
        if frame is None or frame.f_code.co_filename != path:
            return step
        for layout in layouts:
            if layout["line"] <= frame.f_lineno <= layout["end_line"]:
                name = getattr(args[0], "__name__", "the step") if args else "the step"
                return checked(step, layout, f"jax.pmap({name})", found)
        return step

    with patched(jax, "pmap", pmap):
        yield found


def _caller() -> Any:
    return sys._getframe(2)  # pmap's caller: where the step is made
