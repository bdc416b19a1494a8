"""What the worker side uses of JAX, on every JAX it runs under (0.4.13 to today's).

The original side may run the JAX the code was written for (`--reference-jax 0.4.30`, even
0.4.13), so the worker package uses only what those releases have, or these stand-ins:
`jax.tree_util` (`jax.tree` is 0.4.25), meshes without axis types (0.5), no `AbstractMesh` or
`jax.set_mesh` (0.5, 0.7), no typed PRNG key dtype (0.4.16). User code is never patched.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
from jax.sharding import Mesh
from jax.tree_util import tree_leaves, tree_map

__all__ = [
    "MESH_TYPES",
    "PRNG_KEY",
    "axis_types",
    "concrete_mesh",
    "make_mesh",
    "tree_leaves",
    "tree_map",
]

MESH_TYPES: tuple[type, ...] = tuple(
    t for t in (Mesh, getattr(jax.sharding, "AbstractMesh", None)) if t is not None
)
PRNG_KEY: Any = getattr(jax.dtypes, "prng_key", None)


def axis_types(mesh: Any) -> list[str]:
    """Return the names of a mesh's axis types ([] before JAX had them)."""
    return [t.name for t in getattr(mesh, "axis_types", None) or ()]


def make_mesh(devices: Any, names: tuple[str, ...], types: list[str]) -> Mesh:
    """Return `Mesh(devices, names)` with the axis types named, where JAX has them."""
    kinds = getattr(jax.sharding, "AxisType", None)
    if kinds is None or not types:
        return Mesh(devices, names)
    return Mesh(devices, names, axis_types=tuple(getattr(kinds, t) for t in types))


def concrete_mesh() -> Any:
    """Return the mesh `jax.set_mesh` made current, or None (before JAX had it: None)."""
    from jax._src import mesh as mesh_lib

    get = getattr(mesh_lib, "get_concrete_mesh", None)
    return get() if get is not None else None


def use_compilation_cache(env: Mapping[str, str]) -> bool:
    """Turn on JAX's persistent compilation cache in the folder the parent named
    (`JAXMIGRATE_XLA_CACHE`, see `jaxmigrate.verify.xlacache`), for every program; return whether
    it is on. Not under JAX before 0.5, nor beside a user's own `JAX_COMPILATION_CACHE_DIR`."""
    path = env.get("JAXMIGRATE_XLA_CACHE", "")
    if not path or env.get("JAX_COMPILATION_CACHE_DIR"):
        return False
    try:
        version = tuple(int(p) for p in jax.__version__.split(".")[:2])
    except ValueError:
        return False
    if version < (0, 5):
        return False
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
    return True
