"""Each request starts in the state a real program starts in, whatever the last one did.

A worker serves many units; a unit that calls `jax.set_mesh(mesh)` as a global setter, turns on
`jax_enable_x64`, `os.chdir`s, sets an environment variable or mutates a module of the project
would otherwise change the verdict of the next one. Before a request the process's state is
kept; after it, it is laid back and checked: the working directory, the environment,
`sys.path`, `sys.stdout`/`sys.stderr`, the project's modules (dropped, so the next request imports them afresh), numpy's
error and print settings, the warning filters, every JAX config state (flags, the meshes set by
`jax.set_mesh`, the legacy `with mesh:` resources). What cannot be laid back (a thread still
running the user's code, a state that does not take its old value) makes the worker start
again before the next request (`restart` in the reply). The global RNGs are seeded before every
call (`seed`), as the recorder seeds them.
"""

from __future__ import annotations

import contextlib
import os
import random
import sys
import threading
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np


def seed() -> None:
    """Seed the global RNGs as the recorder does: `random`, numpy's, TensorFlow's if loaded."""
    random.seed(0)
    np.random.seed(0)
    tf = sys.modules.get("tensorflow")
    set_seed = getattr(getattr(tf, "random", None), "set_seed", None)
    if callable(set_seed):
        with contextlib.suppress(Exception):  # a broken TensorFlow is the program's business
            set_seed(0)


STATE_METHODS = ("get_local", "set_local", "get_global", "set_global")
SCANNED: set[str] = set()  # the JAX modules whose states are in STATES
STATES: dict[int, Any] = {}


def config_states() -> list[Any]:
    """Return every JAX config state object (flags, mesh contexts) of the loaded JAX modules."""
    for name, module in list(sys.modules.items()):
        if name in SCANNED or module is None or not (name == "jax" or name.startswith("jax.")):
            continue
        SCANNED.add(name)  # a module's states are made when it is imported: scanned once
        for value in list(vars(module).values()):
            if not isinstance(value, type) and all(
                callable(getattr(value, m, None)) for m in STATE_METHODS
            ):
                STATES[id(value)] = value
    return list(STATES.values())


def legacy_resources() -> Any:
    """Return the holder of the legacy `with mesh:` resource environment, or None."""
    from jax._src import mesh

    return getattr(mesh, "thread_resources", None)


@dataclass
class State:
    cwd: str
    environ: dict[str, str]
    path: list[str]
    modules: set[str]
    numpy_err: Any
    numpy_print: Any
    filters: list[Any]
    flags: dict[str, Any]
    states: list[tuple[Any, Any, Any]]
    resources: Any
    threads: set[int]
    streams: tuple[Any, Any]


def snapshot() -> State:
    """Return the process's state, to be laid back with `restore`."""
    import jax

    holder = legacy_resources()
    return State(
        cwd=os.getcwd(),
        environ=dict(os.environ),
        path=list(sys.path),
        modules=set(sys.modules),
        numpy_err=np.geterr(),
        numpy_print=np.get_printoptions(),
        filters=list(warnings.filters),
        flags=dict(jax.config.values),
        states=[(s, s.get_global(), s.get_local()) for s in config_states()],
        resources=getattr(holder, "env", None),
        threads={t.ident or 0 for t in threading.enumerate()},
        streams=(sys.stdout, sys.stderr),
    )


def differs(a: Any, b: Any) -> bool:
    if a is b:
        return False
    try:
        return bool(a != b)
    except Exception:  # noqa: BLE001 - arrays and odd values: identity decides
        return True


def restore(state: State, root: str) -> str:
    """Lay `state` back; return why the process cannot be trusted for another request, or ''."""
    import jax

    problems = []
    try:
        os.chdir(state.cwd)
    except OSError as exc:
        problems.append(f"the working directory cannot be restored: {exc}")
    if dict(os.environ) != state.environ:
        os.environ.clear()
        os.environ.update(state.environ)
    sys.path[:] = state.path
    sys.stdout, sys.stderr = state.streams
    prefix = os.path.realpath(root) + os.sep
    for name in set(sys.modules) - state.modules:
        if _of_tree(sys.modules.get(name), prefix):
            sys.modules.pop(name, None)
    np.seterr(**state.numpy_err)
    np.set_printoptions(**state.numpy_print)
    warnings.filters[:] = state.filters  # type: ignore[index]
    current = jax.config.values  # a property that builds the dict: once
    for name, value in state.flags.items():
        if differs(current.get(name), value):
            try:
                jax.config.update(name, value)
            except Exception as exc:  # noqa: BLE001
                problems.append(f"JAX's `{name}` cannot be restored: {exc}")
    for obj, global_value, local_value in state.states:
        try:
            if obj.get_local() is not local_value:
                obj.set_local(local_value)
            if obj.get_global() is not global_value and differs(obj.get_global(), global_value):
                obj.set_global(global_value)
        except Exception as exc:  # noqa: BLE001
            problems.append(f"a JAX config state cannot be restored: {exc}")
    holder = legacy_resources()
    if holder is not None and getattr(holder, "env", None) is not state.resources:
        holder.env = state.resources
    problems += check(state)
    return "; ".join(problems)


def _of_tree(module: Any, prefix: str) -> bool:
    """Whether a module comes from the tree under `prefix`: its file, or, a namespace package
    (a folder without `__init__.py`: big_vision's `datasets`), a folder of its path. Such a
    package left behind when its parent is forgotten finds its parent in `sys.modules` no
    more: the next import under it raised `KeyError: 'big_vision'`."""
    file = getattr(module, "__file__", None)
    if file:
        return os.path.realpath(file).startswith(prefix)
    try:
        folders = list(getattr(module, "__path__", None) or [])
    except Exception:  # noqa: BLE001 - a namespace path whose parent is already gone
        return True
    return any(os.path.realpath(str(f)).startswith(prefix) for f in folders)


def check(state: State) -> list[str]:
    """Return what still differs from `state` after it was laid back."""
    import jax

    found = []
    current = jax.config.values
    changed = [k for k, v in state.flags.items() if differs(current.get(k), v)]
    if changed:
        found.append(f"JAX config {changed[:3]} still changed")
    if any(obj.get_local() is not local for obj, _, local in state.states):
        found.append("a JAX context (a mesh set by `jax.set_mesh`?) is still set")
    if os.getcwd() != state.cwd:
        found.append("the working directory is still changed")
    running = [
        t.name
        for t in threading.enumerate()
        if (t.ident or 0) not in state.threads and t.is_alive() and not t.daemon
    ]
    if running:
        found.append(f"thread(s) {running[:3]} it started are still running")
    return found
