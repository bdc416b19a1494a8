"""Check, while the original runs, what a program-level pmap rewrite assumes of its step.

The program-level form passes a value the original replicated (`replicate(x)`,
`jnp.broadcast_to(x, (n,) + x.shape)`, a result fed back) as one unstacked value (`P()`), and
reads a result the original read on device 0 (`r[0]`) as the whole value: both are right only
if the original's stacked value is the same on every device. A step's `layout` (from its
site's details) names the argument positions and results treated so; each concrete call of the
`jax.pmap` made on the step's lines is checked, and the first values that differ between
devices are reported (`layout_violations` in the original's reply). Calls made while tracing
are not checked (their values are not known).

A factory returning its step (big_vision's `get_eval_fn`) is replayed on the calls recorded for
what it returned, through the same adapters: the original's step returns its results in the flat
layout (`flat_out`), and the rewrite's takes each recorded call brought to it (`flat_in`).

The step's calls are also compared one by one through layout adapters (`steps`): the original's
stacked arguments and results are brought to the flat layout (a replicated value: device 0's
copy; a split batch or a result read flattened: its blocks joined), the rewrite's step (the
`jax.jit` made on its own lines) is captured as it is, and the first `MAX_STEP_CALLS` calls of
each side travel with the unit's outputs, so a unit that returns nothing (a `main()` that logs)
is still compared, and a difference names the step call and the argument or result.

A function the program-level form rewrites may return a value it stacked (`return state`, read
by no caller: `returns_one` in the step's layout) as one value; its output is compared against
device 0's copy of the original's, where all copies are equal (`one_copy`).
"""

from __future__ import annotations

import contextlib
import enum
import sys
from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np

from .compat import tree_leaves, tree_map
from .references import patched
from .values import Flat

MAX_STEP_CALLS = 3
LAYOUT = "_jaxmigrate_layout"  # on a step made on a layout's lines (`checked`, `capturing`)


def differs(value: Any) -> bool:
    """Return True if some leaf of a stacked pytree is not the same on every device (exactly:
    a replicated value is a copy, and a pmean/psum result is the same bits on each device)."""
    for leaf in tree_leaves(value):
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
        return np.array(leaf)  # a copy: see _host
    except Exception:  # noqa: BLE001 - a value we cannot read is not checked
        return None


def concrete(tree: Any) -> bool:
    """Return True unless some leaf of `tree` is being traced."""
    return not any(isinstance(x, jax.core.Tracer) for x in tree_leaves(tree))


def on_host(tree: Any) -> Any:
    """Return `tree` with its arrays read to the host (blocking on them), in the dtype JAX
    computes them in (a float64 numpy argument is float32 to `jax.jit` without x64); a Python
    number as the step takes it, a 0-d array: the program-level form passes `state.step`, an
    `int`, where pmap took its stacked copies, whose device 0's copy is an array."""
    return tree_map(lambda x: _host(x) if hasattr(x, "shape") or _number(x) else x, tree)


def _number(x: Any) -> bool:
    return isinstance(x, (bool, int, float, complex)) and not isinstance(x, enum.Enum)


def _host(x: Any) -> np.ndarray:
    # A copy, never `np.asarray`: on the CPU that is a view that keeps the device buffer in use,
    # and a buffer in use is not donated: a rewrite that donates an array the program reads
    # again would run under verification and raise once written ("Array has been deleted").
    value = np.array(x)
    return value.astype(jax.dtypes.canonicalize_dtype(value.dtype), copy=False)


def flatten(tree: Any, kind: str) -> Any:
    """Return a stacked value in the flat layout: "replicated" -> device 0's copy, "batch" ->
    the blocks joined along the first axis, "static" (`jax.jit`'s `static_argnums` in the
    rewrite) exactly as it is (a Python number stays hashable), anything else on the host."""
    if kind == "static":
        return tree
    if kind == "replicated":
        return tree_map(lambda x: _host(x)[0] if np.ndim(x) else x, tree)
    if kind == "batch":
        return tree_map(lambda x: np.reshape(_host(x), (-1, *np.shape(x)[2:])), tree)
    return on_host(tree)


def flat_args(layout: dict[str, Any], args: tuple[Any, ...]) -> tuple[Any, ...]:
    """Return the arguments of a call of the original's step in the flat layout (read before
    the call: it may donate them)."""
    kinds = layout.get("args", [])
    past = "static" if layout.get("static_tail") else ""  # a static `*args` tail
    return tuple(flatten(a, kinds[i] if i < len(kinds) else past) for i, a in enumerate(args))


def flat_results(layout: dict[str, Any], out: Any) -> Any:
    """Return the results of a call of the original's step in the flat layout."""
    results = out if layout.get("tuple") and isinstance(out, tuple) else (out,)
    varying = layout.get("varying", [])
    flat = tuple(
        flatten(r, "batch" if i < len(varying) and varying[i] else "replicated")
        for i, r in enumerate(results)
    )
    return flat if layout.get("tuple") else flat[0]


def by_position(
    layout: dict[str, Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[Any, ...] | None:
    """Return a call's arguments by the step's parameters, its keyword arguments last in the
    step's order (`jax.shard_map` takes no keywords: the rewrite passes them so); None when
    it passes other keywords than the layout's."""
    if not kwargs:
        return tuple(args)
    keywords = layout.get("keywords", [])
    if set(kwargs) != set(keywords):
        return None
    return (*args, *(kwargs[k] for k in keywords))


def checked(
    step: Callable[..., Any],
    layout: dict[str, Any],
    name: str,
    found: list[str],
    steps: list[Any] | None = None,
    called: set[int] | None = None,
) -> Callable[..., Any]:
    """Return `step` (a pmapped callable) checking each call against `layout`, and keeping
    its first calls in the flat layout in `steps` (when given); a call, concrete or traced,
    adds the layout's `line` to `called`."""
    calls = 0

    def call(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        if called is not None:
            called.add(layout["line"])
        if not concrete((args, kwargs)):
            return step(*args, **kwargs)
        calls += 1
        passed = by_position(layout, args, kwargs) or args
        for position in layout.get("replicated", []):
            if position < len(passed) and differs(passed[position]) and not found:
                found.append(
                    f"argument {position + 1} of `{name}` differs between devices in the "
                    f"original (call {calls}): it is not replicated, as `P()` assumes"
                )
        keep = (
            steps is not None and len(steps) < MAX_STEP_CALLS and (passed is not args or not kwargs)
        )
        # on the host as `capturing` keeps the rewrite's calls (a static number read too)
        before = on_host(flat_args(layout, passed)) if keep else ()
        out = step(*args, **kwargs)
        results = out if layout.get("tuple") and isinstance(out, tuple) else (out,)
        for index in layout.get("results", []):
            if index < len(results) and differs(results[index]) and not found:
                which = f"result {index + 1}" if layout.get("tuple") else "the result"
                found.append(
                    f"{which} of `{name}` differs between devices in the original "
                    f"(call {calls}): it is not replicated, as `P()` assumes"
                )
        if keep and steps is not None:
            steps.append({"arguments": before, "results": flat_results(layout, out)})
        return out

    setattr(call, LAYOUT, layout)
    return call


def flat_out(fn: Any) -> Any:
    """Return the original's step `fn` (`checked`) returning its results in the flat layout:
    a factory returns it, and its recorded calls are replayed on both sides (`flat_in`).
    Any other callable as it is."""
    layout = getattr(fn, LAYOUT, None)
    if layout is None:
        return fn

    def call(*args: Any, **kwargs: Any) -> Any:
        return flat_results(layout, fn(*args, **kwargs))

    return call


def flat_in(fn: Any) -> Any:
    """Return the rewrite's step `fn` (`capturing`) taking the original's stacked calls: each
    brought to the flat layout first (`flat_args`), as the original's results are by
    `flat_out`. A call passing other keywords than the step's, and any other callable, as they
    are."""
    layout = getattr(fn, LAYOUT, None)
    if layout is None:
        return fn

    def call(*args: Any, **kwargs: Any) -> Any:
        passed = by_position(layout, args, kwargs)
        if passed is None:
            return fn(*args, **kwargs)
        return fn(*flat_args(layout, passed))

    return call


@contextlib.contextmanager
def capturing(layouts: list[dict[str, Any]], path: str, steps: list[Any]) -> Iterator[None]:
    """Patch `jax.jit` so that the rewrite's steps (made on the layouts' `candidate_line`s of
    the file `path`) keep their first concrete calls, on the host, in `steps`."""
    real = jax.jit

    def jit(*args: Any, **kwargs: Any) -> Any:
        jitted = real(*args, **kwargs)
        frame = _caller()
        if frame is None or frame.f_code.co_filename != path:
            return jitted
        layout = next(
            (
                lay
                for lay in layouts
                if lay["candidate_line"] <= frame.f_lineno <= lay["candidate_end_line"]
            ),
            None,
        )
        if layout is None:
            return jitted

        def call(*call_args: Any, **call_kwargs: Any) -> Any:
            keep = concrete(call_args) and not call_kwargs and len(steps) < MAX_STEP_CALLS
            before = on_host(call_args) if keep else ()  # before the call: it may donate them
            out = jitted(*call_args, **call_kwargs)
            if keep:
                steps.append({"arguments": before, "results": on_host(out)})
            return out

        setattr(call, LAYOUT, layout)
        return call

    with patched(jax, "jit", jit):
        yield


@contextlib.contextmanager
def checking(
    layouts: list[dict[str, Any]],
    path: str,
    steps: list[Any] | None = None,
    called: set[int] | None = None,
) -> Iterator[list[str]]:
    """Patch `jax.pmap` so that the steps made on the layouts' lines of the file `path` are
    checked (and their calls kept in `steps`, when given; the `line` of each layout whose step
    was called added to `called`); yield the list the first violation is appended to."""
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
                return checked(step, layout, f"jax.pmap({name})", found, steps, called)
        return step

    with patched(jax, "pmap", pmap):
        yield found


def _caller() -> Any:
    return sys._getframe(2)  # pmap's caller: where the step is made


def one_copy(layouts: list[dict[str, Any]], ref: Flat, new: Flat) -> Flat:
    """`ref`, the original's output, with each array of its returned value (`['output']`) that
    stacks equal copies of `new`'s array there as device 0's copy, when a step's layout says
    the function returns one value where the original stacked it (`returns_one`). Copies that
    differ stay stacked: the outputs differ."""
    if not any(layout.get("returns_one") for layout in layouts):
        return ref
    if len(ref.leaves) != len(new.leaves):
        return ref
    leaves = []
    for (where, a), (_, b) in zip(ref.leaves, new.leaves):
        stacked = (
            where.startswith("['output']")
            and isinstance(a, np.ndarray)
            and isinstance(b, np.ndarray)
            and a.ndim == b.ndim + 1
            and a.shape[1:] == b.shape
            and len(a) > 0
        )
        if stacked and all(np.array_equal(c, a[0], equal_nan=a.dtype.kind in "fc") for c in a):
            a = a[0]
        leaves.append((where, a))
    return Flat(ref.treedef, tuple(leaves), ref.structure)
