"""Move pytrees between devices and the host, in a form both workers can pickle and compare.

Inputs travel as the containers the program used with array leaves replaced by `HostArray` /
`HostKey` (so the receiving side rebuilds uncommitted `jax.Array`s and typed keys), numpy leaves
left as numpy. Outputs travel flattened: `(path, leaf)` pairs and the tree's structure as
`Node`s (node types by qualified name, dict keys and field names, static data in stable form).
Functions and other objects become `Opaque` values with a key that is the same in every process
(a function's `module.qualname`), never a `repr` that shows an address.
"""

from __future__ import annotations

import functools
import re
from collections import OrderedDict
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .compat import PRNG_KEY, tree_leaves, tree_map
from .values import Flat, HostArray, HostDrawn, HostKey, Node, Opaque

SCALARS = (bool, int, float, complex, str, bytes, type(None))
__all__ = ["Flat", "HostArray", "HostDrawn", "HostKey", "Node", "Opaque", "from_host", "to_host"]
ADDRESS = re.compile(r"0x[0-9a-fA-F]{4,}")


def is_key(x: Any) -> bool:
    """Return True for a typed PRNG key array."""
    if PRNG_KEY is None:  # a JAX before typed keys (0.4.16): keys are plain uint32 arrays
        return False
    return isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, PRNG_KEY)


def key_to_host(x: jax.Array) -> HostKey:
    """Return the raw data and implementation name of a typed key array."""
    impl = jax.random.key_impl(x)
    return HostKey(np.asarray(jax.random.key_data(x)), str(getattr(impl, "name", impl)))


def leaf_to_host(x: Any) -> Any:
    """Return an input leaf as it travels: `jax.Array`s become HostArray/HostKey."""
    if is_key(x):
        return key_to_host(x)
    if isinstance(x, jax.Array):
        return HostArray(np.array(process_local(x)))  # a copy: a view would keep the buffer
    return x


def process_local(x: jax.Array) -> Any:
    """Return `x`, or, for an array spanning other processes' devices too (a multi-process
    job's global array), this process's part of it as pmap would hold it: the rows of its own
    devices (`multihost_utils.global_array_to_host_local_array`). An array of another sharding
    raises: the call is not recorded. An array with no part here is returned as it is: reading
    it raises JAX's own "spans non-addressable devices"."""
    if x.is_fully_addressable or not x.addressable_shards:
        return x
    from jax.experimental import multihost_utils

    sharding = x.sharding
    mesh = getattr(sharding, "mesh", None)
    if not isinstance(sharding, jax.sharding.NamedSharding) or not isinstance(
        mesh, jax.sharding.Mesh
    ):
        raise TypeError(f"a global array sharded as {type(sharding).__name__}")
    return multihost_utils.global_array_to_host_local_array(x, mesh, sharding.spec)


def leaf_from_host(x: Any) -> Any:
    """Return the device form of a travelling input leaf (uncommitted arrays, typed keys)."""
    if isinstance(x, HostKey):
        return jax.random.wrap_key_data(jnp.asarray(x.data), impl=x.impl)
    if isinstance(x, HostArray):
        return jnp.asarray(x.value)
    if isinstance(x, HostDrawn):  # a fresh iterator at each run: a run draws what it drew
        return iter([from_host(item) for item in x.items])
    return x


def _is_host_leaf(x: Any) -> bool:
    return isinstance(x, (HostArray, HostKey, HostDrawn))


def to_host(tree: Any) -> Any:
    """Return `tree` with its device leaves copied to the host."""
    return tree_map(leaf_to_host, tree)


def from_host(tree: Any) -> Any:
    """Return `tree` with travelling leaves rebuilt on the device."""
    return tree_map(leaf_from_host, tree, is_leaf=_is_host_leaf)


def has_tracer(tree: Any) -> bool:
    """Return True if any leaf is a tracer (a call made while tracing cannot be recorded)."""
    return any(isinstance(leaf, jax.core.Tracer) for leaf in tree_leaves(tree))


def qualified_name(fn: Any) -> str | None:
    """Return `module.qualname` of a function (through jit/pmap/partial wrappers), or None."""
    if isinstance(fn, functools.partial):
        inner = qualified_name(fn.func)
        return None if inner is None else f"partial({inner})"
    seen = 0
    while hasattr(fn, "__wrapped__") and seen < 16:  # jit, pmap and functools.wraps keep it
        fn, seen = fn.__wrapped__, seen + 1
    module = getattr(fn, "__module__", None)
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
    if not isinstance(name, str):
        return None
    return f"{module}.{name}" if isinstance(module, str) else name


def type_name(kind: type) -> str:
    """Return a type's `module.qualname`."""
    return f"{kind.__module__}.{kind.__qualname__}"


def opaque(x: Any) -> Opaque:
    """Return an object as an `Opaque` value with a stable key when it has one."""
    try:
        text = repr(x)
    except Exception:  # noqa: BLE001 - a broken __repr__ still gets a name
        text = f"<{type_name(type(x))}>"
    text = text if len(text) <= 200 else text[:197] + "..."
    if isinstance(x, type):
        return Opaque(text, "type " + type_name(x))
    if callable(x):
        name = qualified_name(x)
        if name is not None:
            return Opaque(text, "function " + name)
        return Opaque(text, None, f"a {type_name(type(x))} without a qualified name")
    if ADDRESS.search(text):
        return Opaque(text, None, f"a {type_name(type(x))} shown only by its address")
    return Opaque(text, f"{type_name(type(x))}: {text}")


def stable(x: Any) -> Any:
    """Return a node's static data in a form comparable across processes."""
    if isinstance(x, SCALARS):
        return x
    if type(x) in (tuple, list):
        return type(x)(stable(v) for v in x)
    if isinstance(x, tuple):  # a NamedTuple: its type and its fields
        return (type_name(type(x)), tuple(stable(v) for v in x))
    if isinstance(x, dict) and all(isinstance(k, SCALARS) for k in x):
        return {k: stable(v) for k, v in x.items()}
    return opaque(x)


def output_leaf(x: Any) -> Any:
    """Return an output leaf in comparable host form."""
    if is_key(x):
        return key_to_host(x)
    if isinstance(x, jax.Array):
        return np.array(process_local(x))  # a copy: a view would keep the buffer in use
    if isinstance(x, (np.ndarray, np.generic)):
        return np.asarray(x)
    if isinstance(x, SCALARS):
        return x
    return opaque(x)


LEAVES = (bool, int, float, complex, str, bytes, np.ndarray, np.generic, jax.Array)
PLAIN = frozenset((bool, int, float, complex, str, bytes))
DICT, LIST, TUPLE, NONE = (type_name(k) for k in (dict, list, tuple, type(None)))


def describe(tree: Any) -> Node | None:
    """Return the structure of `tree` as nodes (None for a leaf), one level at a time.

    Plain dicts (string keys), lists, tuples and None are described directly, as JAX would
    (sorted keys, `['key']` and `[i]` paths): a million small dicts take seconds, not minutes.
    """
    kind = type(tree)
    if kind in LEAVES or isinstance(tree, LEAVES):
        return None
    if kind is dict and all(type(k) is str for k in tree):
        keys = sorted(tree)
        return Node(DICT, keys, tuple((f"[{k!r}]", describe(tree[k])) for k in keys))
    if kind is list or kind is tuple:
        children = tuple((f"[{i}]", describe(v)) for i, v in enumerate(tree))
        return Node(LIST if kind is list else TUPLE, None, children)
    if tree is None:
        return Node(NONE, None, ())
    pairs, treedef = jax.tree_util.tree_flatten_with_path(tree, is_leaf=lambda x: x is not tree)
    data = treedef.node_data()  # type: ignore[attr-defined]  # missing from the stubs
    if data is None:
        return None
    kind, aux = data
    children = tuple((jax.tree_util.keystr(path), describe(child)) for path, child in pairs)
    return Node(type_name(kind), stable(aux), children)


def unsorted(x: Any) -> bool:
    """Return True for a dict whose keys JAX cannot sort to flatten it (`{0: a, "loss": b}`)."""
    if not isinstance(x, dict) or isinstance(x, OrderedDict):
        return False
    try:
        sorted(x)
    except TypeError:
        return True
    return False


def keyed(tree: Any) -> Any:
    """Return `tree` with each dict whose keys cannot be sorted keyed by each key's type and
    repr (`{"int:0": a, "str:'loss'": b}`): compared key by key, as any dict is."""

    def fix(x: Any) -> Any:
        if not unsorted(x):
            return x
        return {
            f"{type(k).__name__}:{ADDRESS.sub('0x...', repr(k))}": keyed(v) for k, v in x.items()
        }

    return jax.tree.map(fix, tree, is_leaf=unsorted)


class Unflattenable(Exception):
    """An output JAX cannot flatten: it ran, but cannot be compared."""


def flatten_output(out: Any) -> Flat:
    """Return `out` flattened with host leaves (blocked on) and its structure.

    One walk gives both, in JAX's order and with its paths (`[0]['loss']`); plain dicts,
    lists, tuples and None are walked directly, other nodes through JAX. A dict whose keys JAX
    cannot sort is keyed by each key's type and repr first (`keyed`).
    """
    try:
        try:
            treedef = jax.tree_util.tree_structure(out)
        except ValueError:  # a dict with keys of mixed types: JAX cannot sort them
            out = keyed(out)
            treedef = jax.tree_util.tree_structure(out)
    except Exception as exc:  # a custom node's flatten may raise anything
        raise Unflattenable(f"{type(exc).__name__}: {exc}") from exc
    leaves: list[tuple[str, Any]] = []
    structure = walk(out, "", leaves)
    return Flat(ADDRESS.sub("0x...", str(treedef)), tuple(leaves), structure)


def walk(tree: Any, path: str, leaves: list[tuple[str, Any]]) -> Node | None:
    """Append the host leaves of `tree` (under `path`) to `leaves`; return its structure."""
    kind = type(tree)
    if kind in PLAIN:  # as `output_leaf` would, without its (slow) jax.Array check
        leaves.append((path, tree))
        return None
    if kind is dict and all(type(k) is str for k in tree):
        keys = sorted(tree)
        parts = [(f"[{k!r}]", tree[k]) for k in keys]
        return Node(DICT, keys, tuple((p, walk(v, path + p, leaves)) for p, v in parts))
    if kind is list or kind is tuple:
        parts = [(f"[{i}]", v) for i, v in enumerate(tree)]
        children = tuple((p, walk(v, path + p, leaves)) for p, v in parts)
        return Node(LIST if kind is list else TUPLE, None, children)
    if tree is None:
        return Node(NONE, None, ())
    if kind in LEAVES or isinstance(tree, LEAVES):
        leaves.append((path, output_leaf(tree)))  # np.array(x) blocks on a jax.Array
        return None
    jax.block_until_ready(tree)
    pairs = jax.tree_util.tree_flatten_with_path(tree)[0]
    leaves.extend((path + jax.tree_util.keystr(p), output_leaf(leaf)) for p, leaf in pairs)
    return describe(tree)


def shapes(tree: Any) -> list[str]:
    """Return the dtype and shape of every leaf of a travelling tree, as short text."""

    def one(x: Any) -> str:
        value = x.value if isinstance(x, HostArray) else x.data if isinstance(x, HostKey) else x
        if isinstance(value, (np.ndarray, np.generic)):
            kind = "key" if isinstance(x, HostKey) else str(value.dtype)
            return f"{kind}{list(np.shape(value))}"
        return type(x).__name__

    return [one(x) for x in tree_leaves(tree, is_leaf=_is_host_leaf)]


SHOWN = 100  # leaves listed in a reply's `output_shapes`; a million would swamp the report


def flat_shapes(flat: Flat) -> list[str]:
    """Return the path, dtype and shape of the first `SHOWN` leaves of a flattened output."""

    def one(path: str, x: Any) -> str:
        value = x.data if isinstance(x, HostKey) else x
        if isinstance(value, (np.ndarray, np.generic)):
            kind = "key" if isinstance(x, HostKey) else str(value.dtype)
            return f"{path or '.'}: {kind}{list(np.shape(value))}"
        return f"{path or '.'}: {type(x).__name__}"

    shown = [one(path, x) for path, x in flat.leaves[:SHOWN]]
    more = len(flat.leaves) - SHOWN
    return shown + ([f"... and {more} more leaves"] if more > 0 else [])
