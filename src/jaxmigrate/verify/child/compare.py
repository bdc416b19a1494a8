"""Compare two flattened outputs: structure, shapes and dtypes exactly, values by dtype.

Structure is compared node by node: node types by qualified name, dict keys and field names,
static data by value (functions by `module.qualname`). Floating values agree within a tolerance
that depends on the dtype (two compiled programs may sum in different orders), a Python float
within float64's, or float32's when both floats are float32 values (read off a float32 result);
integers, booleans, PRNG key data and other scalars must be equal. A mismatch names the pytree path, the shapes
and the largest absolute and relative errors, in full.

An opaque value (a function, an object) never fails: it agrees when both sides have the same
stable key, and is otherwise "not comparable", with the reason, in `notes`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .values import Flat, HostKey, Node, Opaque

# (rtol, atol) per floating dtype; atol is scaled by the reference's magnitude when above 1.
TOLERANCES: dict[str, tuple[float, float]] = {
    "float64": (1e-9, 1e-12),
    "float32": (1e-5, 1e-6),
    "float16": (4e-3, 1e-3),
    "bfloat16": (3.2e-2, 1e-2),
}


EXACT = (bool, int, float, str, bytes, type(None))  # plain values: equal is equal


def tolerance(dtype: np.dtype) -> tuple[float, float]:
    """Return (rtol, atol) for values of `dtype` (complex: that of its components)."""
    name = dtype.name
    if dtype.kind == "c":
        name = np.dtype(f"f{dtype.itemsize // 2}").name
    if name in TOLERANCES:
        return TOLERANCES[name]
    return 0.25, 0.1  # float8 and other narrow types: only gross differences are meaningful


def is_inexact(a: np.ndarray) -> bool:
    """Return True for floating or complex arrays (including bfloat16 and float8)."""
    return a.dtype.kind in "fc" or a.dtype.name.startswith(("bfloat", "float"))


def wide(a: np.ndarray) -> np.ndarray:
    """Return `a` as complex128 or float64, for arithmetic on any floating dtype."""
    return a.astype(np.complex128 if a.dtype.kind == "c" else np.float64)


def errors(ref: np.ndarray, new: np.ndarray) -> tuple[float, float]:
    """Return the largest absolute and relative differences, ignoring shared NaNs."""
    a, b = wide(ref), wide(new)
    both_nan = np.isnan(a) & np.isnan(b)
    same = (a == b) | both_nan
    diff = np.where(same, 0.0, np.abs(a - b))
    diff = np.where(np.isnan(diff), np.inf, diff)
    if diff.size == 0:
        return 0.0, 0.0
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        rel = diff / np.maximum(np.abs(a), np.finfo(np.float64).tiny)
    rel = np.where(np.isnan(rel), np.inf, rel)
    return float(diff.max()), float(np.where(same, 0.0, rel).max())


def close(ref: np.ndarray, new: np.ndarray, precision: np.dtype | None = None) -> bool:
    """Return True if floating arrays agree within the tolerance of `precision`, by default
    their dtype (NaNs in place)."""
    rtol, atol = tolerance(ref.dtype if precision is None else precision)
    a, b = wide(ref), wide(new)
    scale = max(1.0, float(np.nanmax(np.abs(a), initial=0.0, where=np.isfinite(a))))
    return bool(np.allclose(a, b, rtol=rtol, atol=atol * scale, equal_nan=True))


def _array_mismatch(
    where: str, ref: np.ndarray, new: np.ndarray, precision: np.dtype | None = None
) -> dict[str, Any] | None:
    info: dict[str, Any] = {"path": where, "shape": list(ref.shape), "dtype": ref.dtype.name}
    if ref.shape != new.shape:
        return {
            **info,
            "why": f"shape {list(new.shape)}, expected {list(ref.shape)}",
            "new_shape": list(new.shape),
        }
    if ref.dtype != new.dtype:
        return {
            **info,
            "why": f"dtype {new.dtype.name}, expected {ref.dtype.name}",
            "new_dtype": new.dtype.name,
        }
    if is_inexact(ref):
        equal = np.array_equal(ref, new, equal_nan=ref.dtype.kind in "fc")
        if equal or close(ref, new, precision):
            return None
        max_abs, max_rel = errors(ref, new)
        return {
            **info,
            "why": f"values differ: max abs err {max_abs:.3g}, max rel err {max_rel:.3g}",
            "max_abs_err": max_abs,
            "max_rel_err": max_rel,
        }
    if np.array_equal(ref, new):
        return None
    count = int(np.sum(ref != new))
    return {**info, "why": f"{count} of {ref.size} exact values differ"}


def _holds_float32(x: float) -> bool:
    """Return True if the float32 nearest `x` is `x` (NaN and infinities included)."""
    with np.errstate(over="ignore"):
        return bool(np.isnan(x) or float(np.float32(x)) == x)


def opaque_note(where: str, ref: Opaque, new: Any) -> str | None:
    """Return why an opaque reference leaf is not comparable with `new`, or None if equal."""
    if isinstance(new, Opaque) and ref.key is not None and ref.key == new.key:
        return None
    if ref.key is None:
        return f"{where}: not comparable: {ref.why or ref.text}"
    other = new.key or new.why if isinstance(new, Opaque) else type(new).__name__
    return f"{where}: not comparable: {other}, reference {ref.key}"


def leaf_mismatch(
    where: str, ref: Any, new: Any, notes: list[str] | None = None
) -> dict[str, Any] | None:
    """Return why two leaves differ (a dict with `path` and `why`), or None if they agree.

    An opaque reference leaf never differs: when not comparable, the reason goes to `notes`.
    """
    kind = type(ref)
    if kind is type(new) and kind in EXACT and ref == new:  # the common case, without numpy
        return None
    if isinstance(ref, Opaque):
        note = opaque_note(where, ref, new)
        if note is not None and notes is not None:
            notes.append(note)
        return None
    if isinstance(ref, HostKey) or isinstance(new, HostKey):
        if not (isinstance(ref, HostKey) and isinstance(new, HostKey)):
            return {"path": where, "why": "a PRNG key on one side only"}
        if ref.impl != new.impl:
            return {"path": where, "why": f"PRNG impl {new.impl}, expected {ref.impl}"}
        found = _array_mismatch(where, ref.data, new.data)
        return None if found is None else {**found, "why": "PRNG key data: " + found["why"]}
    if isinstance(ref, (np.ndarray, np.generic)) and isinstance(new, (np.ndarray, np.generic)):
        return _array_mismatch(where, np.asarray(ref), np.asarray(new))
    if isinstance(new, Opaque):
        return {"path": where, "why": f"{new.key or new.text}, expected {type(ref).__name__}"}
    if type(ref) is not type(new):
        return {"path": where, "why": f"{type(new).__name__}, expected {type(ref).__name__}"}
    if isinstance(ref, float) and isinstance(new, float):
        # A Python float read off a float32 result (`float(loss)`, `loss.item()`) holds float32's
        # precision: two such floats agree as float32 values do. One a float32 cannot hold
        # exactly was computed in float64, and both are compared at float64's tolerance.
        narrow = _holds_float32(ref) and _holds_float32(new)
        precision = np.dtype(np.float32) if narrow else None
        return _array_mismatch(where, np.asarray(ref), np.asarray(new), precision)
    return None if ref == new else {"path": where, "why": f"{new!r}, expected {ref!r}"}


def static_mismatch(where: str, ref: Any, new: Any, notes: list[str]) -> str | None:
    """Return why two nodes' static data differ, or None (opaque parts go to `notes`)."""
    if isinstance(ref, Opaque) or isinstance(new, Opaque):
        if isinstance(ref, Opaque):
            note = opaque_note(f"{where} (static)", ref, new)
        else:
            note = f"{where} (static): not comparable: {new.key or new.why}, reference {ref!r}"
        if note is not None:
            notes.append(note)
        return None
    if type(ref) is not type(new):
        return f"static data {new!r}, expected {ref!r}"
    if isinstance(ref, (tuple, list)):
        if len(ref) != len(new):
            return f"static data {new!r}, expected {ref!r}"
        found = (static_mismatch(where, a, b, notes) for a, b in zip(ref, new))
        return next((f for f in found if f is not None), None)
    if isinstance(ref, dict):
        if list(ref) != list(new):
            return f"static data keys {list(new)}, expected {list(ref)}"
        found = (static_mismatch(where, ref[k], new[k], notes) for k in ref)
        return next((f for f in found if f is not None), None)
    return None if ref == new else f"static data {new!r}, expected {ref!r}"


def _node_text(node: Node | None) -> str:
    return "a leaf" if node is None else f"a {node.type} node"


def _keys_why(ref: list[str], new: list[str]) -> str:
    missing = [k for k in ref if k not in new]
    extra = [k for k in new if k not in ref]
    if not missing and not extra:
        return f"children in order {new}, expected {ref}"
    parts = [f"missing {missing}" if missing else "", f"extra {extra}" if extra else ""]
    return "children " + ", ".join(p for p in parts if p)


def structure_mismatch(
    where: str, ref: Node | None, new: Node | None, notes: list[str]
) -> dict[str, Any] | None:
    """Return where two pytree structures first differ, or None if they have the same shape."""
    if ref is None or new is None:
        if ref is None and new is None:
            return None
        why = f"{_node_text(new)}, expected {_node_text(ref)}"
        return {"path": where, "why": f"pytree structure: {why}"}
    if ref.type != new.type:
        why = f"node type {new.type}, expected {ref.type}"
        return {"path": where, "why": f"pytree structure: {why}"}
    ref_keys, new_keys = [k for k, _ in ref.children], [k for k, _ in new.children]
    if ref_keys != new_keys:
        count = f"of {len(new_keys)} children, expected {len(ref_keys)}: "
        why = f"{ref.type} {count if len(new_keys) != len(ref_keys) else ''}"
        why += _keys_why(ref_keys, new_keys)
        return {"path": where, "why": f"pytree structure: {why}"}
    static = static_mismatch(where, ref.aux, new.aux, notes)
    if static is not None:
        return {"path": where, "why": f"pytree structure: {ref.type} {static}"}
    for (key, a), (_, b) in zip(ref.children, new.children):
        found = structure_mismatch(where + key, a, b, notes)
        if found is not None:
            return found
    return None


def compare(
    ref: Flat, new: Flat, notes: list[str] | None = None, inputs: bool = False
) -> dict[str, Any] | None:
    """Return the first difference between two outputs, or None when they agree.

    What could not be compared (opaque values without a shared stable key) is appended to
    `notes`; it never makes the outputs differ. `inputs`: two calls' arguments, where a Python
    number of `new` stands for the array of no axes `ref` holds there when it holds that number
    (flax's `TrainState.step`, `0`, made an array by the replication the program-level form
    deletes: the step traces both alike).
    """
    notes = [] if notes is None else notes
    if ref.structure is not None and new.structure is not None:
        found = structure_mismatch("output", ref.structure, new.structure, notes)
        if found is not None:
            return found
    elif ref.treedef != new.treedef:
        return {"path": "output", "why": f"pytree structure {new.treedef}, expected {ref.treedef}"}
    if len(ref.leaves) != len(new.leaves):
        return {"path": "output", "why": f"{len(new.leaves)} leaves, expected {len(ref.leaves)}"}
    for (where, a), (_, b) in zip(ref.leaves, new.leaves):
        found = leaf_mismatch(f"output{where}", a, _as_number_of(a, b) if inputs else b, notes)
        if found is not None:
            return found
    return None


def _as_number_of(ref: Any, new: Any) -> Any:
    """`new`, a Python number, as an array of `ref`'s dtype when `ref` is an array of no axes
    holding exactly it; else `new`."""
    if type(new) not in (bool, int, float) or not isinstance(ref, (np.ndarray, np.generic)):
        return new
    if np.ndim(ref) != 0:
        return new
    try:
        same = np.asarray(new, dtype=np.asarray(ref).dtype)
    except (OverflowError, ValueError):
        return new
    return same if same.item() == new else new


def has_values(flat: Flat) -> bool:
    """Return True if an output has a leaf compared by value (not only opaque ones), or none."""
    return not flat.leaves or any(not isinstance(leaf, Opaque) for _, leaf in flat.leaves)


def max_errors(ref: Flat, new: Flat) -> tuple[float, float]:
    """Return the largest absolute and relative errors over all floating leaves."""
    worst = (0.0, 0.0)
    for (_, a), (_, b) in zip(ref.leaves, new.leaves):
        arrays = isinstance(a, np.ndarray) and isinstance(b, np.ndarray)
        if arrays and a.shape == b.shape and is_inexact(a) and is_inexact(b):
            e = errors(a, b)
            worst = (max(worst[0], e[0]), max(worst[1], e[1]))
    return worst
