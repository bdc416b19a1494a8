"""Pickle travelling values, with local functions and lambdas copied by value.

Real inputs hold functions that `pickle` cannot name: a flax `TrainState` keeps its optimizer's
`init`/`update` closures (`chain.<locals>.init_fn`), a config holds a lambda. Such a function
travels as its code (marshal: both sides run the same interpreter), its closure's values, its
defaults, and the name of its module, whose namespace the receiving side gives it as globals.
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
) -> types.FunctionType:
    """Return the function `reduce_function` took apart, with `module`'s namespace as globals."""
    found = sys.modules.get(module) or importlib.import_module(module)
    cells = None
    if closure is not None:
        cells = tuple(types.CellType() if v == EMPTY else types.CellType(v) for v in closure)
    fn = types.FunctionType(marshal.loads(code), vars(found), names[0], defaults, cells)
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
        "<locals>" in fn.__qualname__ or fn.__name__ == "<lambda>"
    )


class Pickler(pickle.Pickler):
    """A pickler that copies local functions and lambdas by value."""

    def reducer_override(self, obj: Any) -> Any:
        if not by_value(obj):
            return NotImplemented
        closure = None
        if obj.__closure__ is not None:
            closure = tuple(cell_value(c) for c in obj.__closure__)
        names = (obj.__name__, obj.__qualname__)
        args = (marshal.dumps(obj.__code__), obj.__module__, names, obj.__defaults__)
        return rebuild_function, (*args, obj.__kwdefaults__, closure, dict(obj.__dict__))


def dumps(value: Any) -> bytes:
    """Return `value` pickled, local functions and lambdas by value."""
    buffer = io.BytesIO()
    Pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(value)
    return buffer.getvalue()
