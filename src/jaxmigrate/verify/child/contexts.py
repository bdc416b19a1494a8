"""Mesh contexts: describe the meshes a program had active, and re-enter a call's contexts.

A call is replayed under the `with` items that enclosed it in the program, evaluated from the
source of the side being run (the original's `with mesh:`, the rewrite's `with
jax.set_mesh(mesh):`). A local the with-item reads that its function assigns once before it
(`mesh = jax.make_mesh(...)`) is evaluated from that assignment (`bind`); names still unresolved
(a mesh made from a parameter) are bound to the mesh recorded while the program ran.
"""

from __future__ import annotations

import ast
import builtins
from contextlib import ExitStack
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh

from .compat import MESH_TYPES, axis_types, concrete_mesh, make_mesh


def describe_mesh(mesh: Any) -> dict[str, Any] | None:
    """Return a JSON description of a concrete mesh (names, shape, device ids, axis types)."""
    if not isinstance(mesh, Mesh) or mesh.empty:
        return None
    return {
        "axis_names": [str(n) for n in mesh.axis_names],
        "shape": list(mesh.devices.shape),
        "device_ids": [int(d.id) for d in mesh.devices.flat],
        "axis_types": axis_types(mesh),
    }


def active_meshes() -> list[dict[str, Any]]:
    """Return the meshes set by `with mesh:` and by `jax.set_mesh`, as descriptions."""
    from jax._src import mesh as mesh_lib

    found = [
        describe_mesh(mesh_lib.thread_resources.env.physical_mesh),
        describe_mesh(concrete_mesh()),
    ]
    return [d for d in found if d is not None]


def build_mesh(desc: dict[str, Any]) -> Mesh:
    """Return the mesh a description names, on this process's devices."""
    by_id = {d.id: d for d in jax.devices()}
    devices = np.array([by_id[i] for i in desc["device_ids"]]).reshape(desc["shape"])
    return make_mesh(devices, tuple(desc["axis_names"]), desc.get("axis_types", []))


def _fallback(code: Any, namespace: dict[str, Any], meshes: list[Mesh]) -> dict[str, Any]:
    if not meshes:
        return {}
    free = [n for n in code.co_names if n not in namespace and not hasattr(builtins, n)]
    return dict.fromkeys(free, meshes[0])


def bind(bindings: list[list[str]], namespace: dict[str, Any]) -> dict[str, Any]:
    """Return the locals a context's with-items read (`Context.bindings`), each evaluated in
    `namespace` and those before it; one that cannot be (it reads a parameter) is left out."""
    found: dict[str, Any] = {}
    for name, expr in bindings:
        try:
            found[name] = eval(compile(expr, "<mesh context>", "eval"), namespace, dict(found))
        except Exception:  # noqa: BLE001, S112 - then the recorded mesh stands in for it
            continue
    return found


def enter(
    stack: ExitStack,
    expr: str,
    namespace: dict[str, Any],
    meshes: list[Mesh],
    bound: dict[str, Any] | None = None,
) -> str:
    """Enter one with-item evaluated in `namespace` and the locals `bound` for it; return what
    was entered, or why not. Names still free are bound to the first of `meshes`."""
    code = compile(expr, "<mesh context>", "eval")
    local = dict(bound or {})
    try:
        value = eval(code, namespace, local | _fallback(code, namespace | local, meshes))
    except Exception as exc:  # noqa: BLE001 - a context we cannot rebuild is reported
        return f"skipped `{expr}` ({type(exc).__name__}: {exc})"
    is_call = isinstance(ast.parse(expr, mode="eval").body, ast.Call)
    if isinstance(value, MESH_TYPES) or (is_call and hasattr(value, "__enter__")):
        stack.enter_context(value)
        return f"entered `{expr}`"
    return f"skipped `{expr}` (not a mesh)"
