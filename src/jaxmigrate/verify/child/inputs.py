"""Where a site's inputs come from: recorded calls, declared examples, or synthesized arrays.

Every source yields `Call`s in travelling form (`hostify`): the original worker materializes
them once and writes them for the candidate worker, so both sides run on identical inputs.

Declared examples live in the module that defines the target::

    __jaxmigrate_examples__ = {
        "train_step": [(params, batch)],                 # one tuple of positional args per call
        "apply": [{"args": (x,), "kwargs": {"train": False}}],
    }

(the dict, or a function returning it, is read in the original's worker). Synthesized inputs are
float32 arrays (raw PRNG keys for parameters named like `key`/`rng`) whose mapped axes have the
mesh's size; the worker tries a few candidate shapes, each filtered with `jax.eval_shape` under
the call's mesh contexts before it is run.
"""

from __future__ import annotations

import inspect
import os
import pickle
import re
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np

from .hostify import to_host
from .protocol import ProtocolError, RecordedCall, decode_recorded_call
from .values import HostArray

Call = tuple[tuple[Any, ...], dict[str, Any]]
EXAMPLES = "__jaxmigrate_examples__"
PER_DEVICE_SHAPES: tuple[tuple[int, ...], ...] = ((4,), (4, 4), (), (2, 3, 4))
KEY_NAME = re.compile(r"(^|_)(key|rng|prng)s?($|_)", re.IGNORECASE)


def recorded(paths: list[str]) -> list[Call]:
    """Return the calls recorded in `paths` (pickles written by the recorder).

    A path argument outside the tree is pointed at its live copy (`outside`); NotKept if it
    could not be kept as it was.
    """
    from .outside import pointed

    calls = []
    for path in paths:
        add_import_paths(path)
        with open(path, "rb") as handle:
            call = pickle.load(handle)
        base = os.path.splitext(path)[0]
        meta = sidecar(path)
        calls.append(pointed(call, meta.outside if meta is not None else [], base))
    return calls


def sidecar(record: str) -> RecordedCall | None:
    """Return the sidecar of a recorded call (None if there is none); raise ProtocolError, naming
    the file, for one this protocol does not read (a recorder of another jaxmigrate)."""
    try:
        with open(os.path.splitext(record)[0] + ".json", encoding="utf-8") as handle:
            text = handle.read()
    except OSError:
        return None
    try:
        return decode_recorded_call(text)
    except ProtocolError as exc:
        raise ProtocolError(f"{os.path.basename(handle.name)}: {exc}") from None


def add_import_paths(record: str) -> None:
    """Add the tree's folders the recorded command imported from (its sidecar's `paths`)."""
    meta = sidecar(record)
    for rel in meta.paths if meta is not None else []:
        entry = os.path.join(os.getcwd(), rel)
        if entry not in sys.path:
            sys.path.append(entry)


def normalize_example(example: Any) -> Call:
    """Return one declared example as a call: a tuple of args, or {"args", "kwargs"}."""
    if isinstance(example, dict) and example and set(example) <= {"args", "kwargs"}:
        return tuple(example.get("args", ())), dict(example.get("kwargs", {}))
    if isinstance(example, tuple):
        return example, {}
    return (example,), {}


def declared(module: ModuleType, qualname: str) -> list[Call] | None:
    """Return the examples `module` declares for `qualname`, or None if it declares none."""
    table = getattr(module, EXAMPLES, None)
    if callable(table):
        table = table()
    if not isinstance(table, dict) or qualname not in table:
        return None
    entries = table[qualname]
    entries = entries() if callable(entries) else entries
    if not isinstance(entries, list):
        entries = [entries]
    return [to_host(normalize_example(e)) for e in entries]


def positional_params(fn: Callable[..., Any]) -> list[str] | None:
    """Return the names of the required positional parameters of `fn`, or None if unknown."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    names = [p.name for p in sig.parameters.values() if p.kind in kinds and p.default is p.empty]
    if any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in sig.parameters.values()):
        names = names or ["x"]
    return names


def axis_of(in_axes: Any, index: int) -> int | None | str:
    """Return the mapped axis of positional arg `index` (None: unmapped; "?": not an int)."""
    leaf = in_axes[index] if isinstance(in_axes, (tuple, list)) else in_axes
    if leaf is None or isinstance(leaf, int):
        return leaf
    return "?"


def make_value(name: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Return a float32 array of `shape`, or raw PRNG key data when `name` looks like a key."""
    if KEY_NAME.search(name):
        return rng.integers(0, 2**32, size=(*shape, 2), dtype=np.uint32)
    return rng.standard_normal(shape).astype(np.float32)


def mapped_value(
    name: str, per_device: tuple[int, ...], axis: int | None, size: int, rng: np.random.Generator
) -> np.ndarray | None:
    """Return an argument whose axis `axis` (None: none) is mapped over `size` devices."""
    if axis is None:
        return make_value(name, per_device, rng)
    stacked = np.stack([make_value(name, per_device, rng) for _ in range(size)])
    if not -stacked.ndim <= axis < stacked.ndim:
        return None
    return np.moveaxis(stacked, 0, axis)


def global_shapes(devices: int) -> tuple[tuple[int, ...], ...]:
    """Return candidate global shapes for arguments sharded over a mesh of `devices`."""
    return ((devices, 4), (devices,), (devices, 4, 4), (2 * devices, 4), (devices, devices))


def pmap_candidates(
    params: list[str], structure: dict[str, Any], devices: int, seed: int = 0
) -> list[Call]:
    """Return calls whose mapped axes have the pmap's size, one per per-device shape."""
    in_axes = structure.get("in_axes", 0)
    axes = [axis_of(in_axes, i) for i in range(len(params))]
    if "?" in axes:
        return []
    size = int(structure.get("axis_size") or devices)
    rng = np.random.default_rng(seed)
    calls: list[Call] = []
    for shape in PER_DEVICE_SHAPES:
        args = [mapped_value(n, shape, a, size, rng) for n, a in zip(params, axes)]  # type: ignore[arg-type]
        if all(a is not None for a in args):
            calls.append((tuple(args), {}))
    return calls


def synthesized(
    fn: Callable[..., Any], structure: dict[str, Any], devices: int, seed: int = 0
) -> list[Call]:
    """Return candidate calls for `fn`, best guess first (the worker probes each in turn).

    `devices` are the process's own; each process of a multi-process job has its own `seed`,
    so that its local data differ from its peers' (as a data-parallel program's batches do).
    """
    params = positional_params(fn)
    if params is None or structure.get("statics"):
        return []
    if not params:
        return [((), {})]
    if structure.get("kind") == "pmap":
        return pmap_candidates(params, structure, devices, seed)
    rng = np.random.default_rng(seed)
    return [(tuple(make_value(n, s, rng) for n in params), {}) for s in global_shapes(devices)]


def first_array(tree: Any) -> np.ndarray | None:
    """Return the first array leaf of a travelling tree of dicts, lists and tuples."""
    if isinstance(tree, HostArray):
        return tree.value
    if isinstance(tree, np.ndarray):
        return tree
    children = tree.values() if isinstance(tree, dict) else tree
    if isinstance(children, (list, tuple, type({}.values()))):
        for child in children:
            found = first_array(child)
            if found is not None:
                return found
    return None


def mapped_size(call: Call, structure: dict[str, Any]) -> int | None:
    """Return how many devices a pmap call maps over (the size of its first mapped axis)."""
    if structure.get("kind") != "pmap":
        return None
    for index, arg in enumerate(call[0]):
        axis = axis_of(structure.get("in_axes", 0), index)
        array = first_array(arg) if isinstance(axis, int) else None
        if array is not None and isinstance(axis, int) and -array.ndim <= axis < array.ndim:
            return int(array.shape[axis])
    return None
