"""Move pytrees between devices and the host, in a form both workers can pickle and compare.

Inputs travel as the containers the program used with array leaves replaced by `HostArray` /
`HostKey` (so the receiving side rebuilds uncommitted `jax.Array`s and typed keys), numpy leaves
left as numpy. Outputs travel flattened: the tree structure's text and `(path, leaf)` pairs.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .values import Flat, HostArray, HostKey, Opaque

SCALARS = (bool, int, float, complex, str, bytes, type(None))
__all__ = ["Flat", "HostArray", "HostKey", "Opaque", "from_host", "to_host"]


def is_key(x: Any) -> bool:
    """Return True for a typed PRNG key array."""
    return isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


def key_to_host(x: jax.Array) -> HostKey:
    """Return the raw data and implementation name of a typed key array."""
    impl = jax.random.key_impl(x)
    return HostKey(np.asarray(jax.random.key_data(x)), str(getattr(impl, "name", impl)))


def leaf_to_host(x: Any) -> Any:
    """Return an input leaf as it travels: `jax.Array`s become HostArray/HostKey."""
    if is_key(x):
        return key_to_host(x)
    if isinstance(x, jax.Array):
        return HostArray(np.asarray(x))
    return x


def leaf_from_host(x: Any) -> Any:
    """Return the device form of a travelling input leaf (uncommitted arrays, typed keys)."""
    if isinstance(x, HostKey):
        return jax.random.wrap_key_data(jnp.asarray(x.data), impl=x.impl)
    if isinstance(x, HostArray):
        return jnp.asarray(x.value)
    return x


def _is_host_leaf(x: Any) -> bool:
    return isinstance(x, (HostArray, HostKey))


def to_host(tree: Any) -> Any:
    """Return `tree` with its device leaves copied to the host."""
    return jax.tree.map(leaf_to_host, tree)


def from_host(tree: Any) -> Any:
    """Return `tree` with travelling leaves rebuilt on the device."""
    return jax.tree.map(leaf_from_host, tree, is_leaf=_is_host_leaf)


def has_tracer(tree: Any) -> bool:
    """Return True if any leaf is a tracer (a call made while tracing cannot be recorded)."""
    return any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree.leaves(tree))


def output_leaf(x: Any) -> Any:
    """Return an output leaf in comparable host form."""
    if is_key(x):
        return key_to_host(x)
    if isinstance(x, (jax.Array, np.ndarray, np.generic)):
        return np.asarray(x)
    if isinstance(x, SCALARS):
        return x
    return Opaque(repr(x))


def flatten_output(out: Any) -> Flat:
    """Block on `out` and return it flattened with host leaves."""
    jax.block_until_ready(out)
    pairs, treedef = jax.tree_util.tree_flatten_with_path(out)
    leaves = tuple((jax.tree_util.keystr(path), output_leaf(leaf)) for path, leaf in pairs)
    return Flat(str(treedef), leaves)


def shapes(tree: Any) -> list[str]:
    """Return the dtype and shape of every leaf of a travelling tree, as short text."""

    def one(x: Any) -> str:
        value = x.value if isinstance(x, HostArray) else x.data if isinstance(x, HostKey) else x
        if isinstance(value, (np.ndarray, np.generic)):
            kind = "key" if isinstance(x, HostKey) else str(value.dtype)
            return f"{kind}{list(np.shape(value))}"
        return type(x).__name__

    return [one(x) for x in jax.tree.leaves(tree, is_leaf=_is_host_leaf)]


def flat_shapes(flat: Flat) -> list[str]:
    """Return the path, dtype and shape of every leaf of a flattened output, as short text."""

    def one(path: str, x: Any) -> str:
        value = x.data if isinstance(x, HostKey) else x
        if isinstance(value, (np.ndarray, np.generic)):
            kind = "key" if isinstance(x, HostKey) else str(value.dtype)
            return f"{path or '.'}: {kind}{list(np.shape(value))}"
        return f"{path or '.'}: {type(x).__name__}"

    return [one(path, x) for path, x in flat.leaves]
