"""Pickle travelling values, with local functions and lambdas copied by value.

Real inputs hold functions that `pickle` cannot name: a flax `TrainState` keeps its optimizer's
`init`/`update` closures (`chain.<locals>.init_fn`), a config holds a lambda, a model holds the
plain function under `jax.nn.relu` (whose module holds a `custom_jvp` wrapper by that name). Such a function
travels as its code (marshal: both sides run the same interpreter), its closure's values, its
defaults, and the name of its module, whose namespace the receiving side gives it as globals.
When that module cannot be imported there (a test module: pytest put its folder on the path),
the globals the function names travel with it, by value, and stand in for the namespace.
"""

from __future__ import annotations

import importlib
import io
import marshal
import pickle
import sys
import types
from typing import Any

EMPTY = "__jaxmigrate_empty_cell__"


def rebuild_function(
    code: bytes,
    module: str,
    names: tuple[str, str],
    defaults: Any,
    kwdefaults: Any,
    closure: tuple[Any, ...] | None,
    attrs: dict[str, Any],
    used: dict[str, Any] | None = None,
) -> types.FunctionType:
    """Return the function `reduce_function` took apart, with `module`'s namespace as globals."""
    try:
        namespace = vars(sys.modules.get(module) or importlib.import_module(module))
    except Exception:  # noqa: BLE001 - not importable here: the names it uses came along
        namespace = {"__builtins__": __builtins__, "__name__": module, **(used or {})}
    cells = None
    if closure is not None:
        cells = tuple(types.CellType() if v == EMPTY else types.CellType(v) for v in closure)
    fn = types.FunctionType(marshal.loads(code), namespace, names[0], defaults, cells)
    fn.__qualname__ = names[1]
    fn.__kwdefaults__ = kwdefaults
    fn.__dict__.update(attrs)
    return fn


def cell_value(cell: types.CellType) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # a cell not yet filled
        return EMPTY


def by_value(fn: Any) -> bool:
    """Return True for a function that pickle cannot find by its qualified name."""
    return isinstance(fn, types.FunctionType) and (
        "<locals>" in fn.__qualname__ or fn.__name__ == "<lambda>" or not findable(fn)
    )


def findable(fn: types.FunctionType) -> bool:
    """Return True if `fn` is what its module holds under its qualified name.

    A function wrapped where it is defined is not: `jax.nn.relu` is a `custom_jvp` around the
    plain function a flax model holds as its activation, and pickle refuses that function.
    """
    found: Any = sys.modules.get(fn.__module__)
    for part in fn.__qualname__.split("."):
        found = getattr(found, part, None)
    return found is fn


def global_names(code: types.CodeType) -> set[str]:
    """Return the global names a code object (and the code nested in it) may read."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= global_names(const)
    return names


def used_globals(fn: types.FunctionType) -> dict[str, Any] | None:
    """Return the globals `fn` names, if they can be pickled (else None: not sent)."""
    used = {n: fn.__globals__[n] for n in global_names(fn.__code__) if n in fn.__globals__}
    try:
        dumps(used)
    except Exception:  # noqa: BLE001 - the receiving side will need the module itself
        return None
    return used


def device_by_id(device_id: int) -> Any:
    """Return this process's JAX device with id `device_id` (a global id in a job)."""
    import jax

    return next(d for d in jax.devices() if d.id == device_id)


def is_device(obj: Any) -> bool:
    """Return True for a JAX device (`jaxlib`'s `Device`: not picklable before JAX 0.4.31)."""
    kind = type(obj)
    return kind.__module__.startswith("jaxlib") and kind.__name__.endswith("Device")


def mesh_from(description: dict[str, Any]) -> Any:
    """Return the mesh `contexts.describe_mesh` described, on this process's devices."""
    from .contexts import build_mesh

    return build_mesh(description)


def is_mesh(obj: Any) -> bool:
    """Return True for a concrete `jax.sharding.Mesh` (its pickled form differs by release)."""
    kind = type(obj)
    return kind.__name__ == "Mesh" and kind.__module__.startswith("jax")


class Pickler(pickle.Pickler):
    """A pickler that copies local functions and lambdas by value, modules by name, JAX devices
    by id and meshes by description: what one JAX release pickles, another can read."""

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, types.ModuleType):
            return importlib.import_module, (obj.__name__,)
        if is_device(obj) and isinstance(getattr(obj, "id", None), int):
            return device_by_id, (obj.id,)
        if is_mesh(obj):
            from .contexts import describe_mesh

            description = describe_mesh(obj)
            if description is not None:
                return mesh_from, (description,)
        if not by_value(obj):
            return NotImplemented
        closure = None
        if obj.__closure__ is not None:
            closure = tuple(cell_value(c) for c in obj.__closure__)
        names = (obj.__name__, obj.__qualname__)
        args = (marshal.dumps(obj.__code__), obj.__module__, names, obj.__defaults__)
        attrs = dict(obj.__dict__)
        return rebuild_function, (*args, obj.__kwdefaults__, closure, attrs, used_globals(obj))


def dumps(value: Any) -> bytes:
    """Return `value` pickled, local functions and lambdas by value."""
    buffer = io.BytesIO()
    Pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(value)
    return buffer.getvalue()
