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
class HostKey:
    """A typed PRNG key array: its raw key data and the name of its implementation."""

    data: np.ndarray
    impl: str


@dataclass(frozen=True)
class Opaque:
    """An output leaf that is neither an array nor a plain scalar, kept as its `repr`."""

    text: str


@dataclass(frozen=True)
class Flat:
    """A flattened output: the tree structure as text and each leaf with its path."""

    treedef: str
    leaves: tuple[tuple[str, Any], ...]
