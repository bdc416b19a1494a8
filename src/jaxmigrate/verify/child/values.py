"""The values that travel between processes: host arrays, key data, flattened outputs.

Plain dataclasses over numpy (no JAX), so that comparison needs nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class HostArray:
    """A `jax.Array` copied to the host."""

    value: np.ndarray


@dataclass(frozen=True)
class HostDrawn:
    """An iterator a recorded call was given (a generator of batches): the items the call drew
    from it, each as it travels; replayed as a fresh iterator over them at every run."""

    items: tuple[Any, ...]


@dataclass(frozen=True)
class HostKey:
    """A typed PRNG key array: its raw key data and the name of its implementation."""

    data: np.ndarray
    impl: str


@dataclass(frozen=True)
class Opaque:
    """A value that is neither an array nor a plain scalar (a function, an object).

    `key` is a stable identity that is the same in two processes (a function's
    `module.qualname`, a `repr` without addresses), or None when there is none: the value is
    then not comparable, for the reason `why`. An opaque value never fails a comparison.
    """

    text: str
    key: str | None = None
    why: str = ""


@dataclass(frozen=True)
class Node:
    """One pytree node: its type's qualified name, its static data, and its children.

    `aux` is the node's static data in stable form (plain values, with `Opaque` for functions
    and objects); each child is `(key, node)`, where the key is the child's path step
    (`['params']`, `.tx`, `[0]`) and the node is None for a leaf.
    """

    type: str
    aux: Any
    children: tuple[tuple[str, Node | None], ...]


@dataclass(frozen=True)
class Flat:
    """A flattened output: the tree structure (as text, and as nodes) and each leaf with its path.

    Without `structure` (older pickles, hand-made values) the text is compared instead.
    """

    treedef: str
    leaves: tuple[tuple[str, Any], ...]
    structure: Node | None = None
