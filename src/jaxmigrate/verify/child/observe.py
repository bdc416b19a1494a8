"""What a call compiled and how its outputs are sharded: seen while the target runs.

Values agreeing is not enough: a rewrite can drop a sharding constraint (the program shards
differently on a pod, with the same values on CPU) or build a new `jax.jit` on every call (it
compiles each time where `jax.pmap` compiled once). While a target's calls run, every module
JAX hands to XLA is seen (`jax._src.compiler.compile_or_get_cached`, wrapped once per worker):
its name, a digest of its text, its sharding constraints (`sdy.sharding_constraint`,
`sdy.reshard`, GSPMD's `@Sharding` custom calls) and its collectives. After each call the
`jax.Array` leaves of the output give their shardings (a `NamedSharding`'s spec and mesh).

`Observed.summary()` is what travels in the worker's reply; the parent compares the two sides
(`verify/observed.py`). If the JAX internals are not there (another JAX version), nothing is
seen and nothing is compared: compiles and lowerings are then simply not reported.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

MESH = re.compile(r"sdy\.mesh @([\w.$-]+) = <(\[[^\]]*\])")
CONSTRAINT = re.compile(r"sdy\.(sharding_constraint|reshard) %[\w#]+ <@([\w.$-]+), (\[.*?\])>")
GSPMD = re.compile(r"custom_call @Sharding\(.*?mhlo\.sharding = \"([^\"]*)\"")
COLLECTIVE = re.compile(
    r"\b(?:stablehlo|sdy)\.(all_reduce|all_gather|reduce_scatter|all_to_all|"
    r"collective_permute|collective_broadcast|all_slice)\b"
)
MAX_SHARDINGS = 2000  # output leaves reported per attempt
_active: list[Observed] = []  # the observers of the calls running now (innermost last)
_installed: list[bool] = []


@dataclass
class Compiled:
    """One module compiled while a call ran."""

    name: str
    digest: str
    constraints: tuple[str, ...]
    collectives: tuple[str, ...]


@dataclass
class Observed:
    """What one attempt's calls compiled, and the shardings of their outputs."""

    compiled: list[Compiled] = field(default_factory=list)
    shardings: dict[str, str] = field(default_factory=dict)
    calls: int = 0

    def summary(self) -> dict[str, Any]:
        """Return what travels in the reply: compile counts, repeats, lowerings, shardings."""
        seen = Counter((c.name, c.digest) for c in self.compiled)
        repeated = Counter[str]()
        for (name, _), count in seen.items():
            if count > 1:
                repeated[name] += count - 1
        lowering: dict[str, dict[str, list[str]]] = {}
        for c in self.compiled:
            part = lowering.setdefault(c.name, {"constraints": [], "collectives": []})
            part["constraints"] = sorted({*part["constraints"], *c.constraints})
            part["collectives"] = sorted({*part["collectives"], *c.collectives})
        return {
            "compiles": len(self.compiled),
            "repeated": dict(repeated),
            "lowering": lowering,
            "shardings": self.shardings,
        }

    def add_output(self, output: Any) -> None:
        """Note the sharding of each `jax.Array` leaf of the next call's output.

        A dict whose keys JAX cannot sort is walked keyed (`hostify.keyed`), as the values
        are compared; an output JAX cannot walk at all is skipped (its values decide).
        """
        import jax

        from .hostify import keyed

        call, self.calls = self.calls, self.calls + 1
        try:
            try:
                pairs, _ = jax.tree_util.tree_flatten_with_path(output)
            except ValueError:  # a dict with keys of mixed types: keyed as the comparison is
                pairs, _ = jax.tree_util.tree_flatten_with_path(keyed(output))
        except Exception:  # noqa: BLE001 - what cannot be walked has no shardings to note
            return
        for path, leaf in pairs:
            if len(self.shardings) >= MAX_SHARDINGS:
                return
            if isinstance(leaf, jax.Array) and not isinstance(leaf, jax.core.Tracer):
                key = f"call {call + 1}: output{jax.tree_util.keystr(path)}"
                self.shardings[key] = sharding_text(leaf)


def sharding_text(x: Any) -> str:
    """Return how an array is sharded, in words the other process can compare."""
    sharding = getattr(x, "sharding", None)
    spec = getattr(sharding, "spec", None)
    mesh = getattr(sharding, "mesh", None)
    if spec is not None and mesh is not None:
        entries = list(spec)
        while entries and entries[-1] is None:  # P("x") and P("x", None) shard alike
            entries.pop()
        axes = ", ".join(f"{n}={s}" for n, s in dict(mesh.shape).items())
        inner = ", ".join(repr(e) for e in entries)
        return f"P({inner}) over mesh ({axes})"
    if sharding is not None and len(getattr(sharding, "device_set", ())) == 1:
        return "one device (unsharded)"
    return type(sharding).__name__


def features(text: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Return the sharding constraints and the collectives of a module's text."""
    meshes = dict(MESH.findall(text))
    constraints = [
        f"{op} {spec} on mesh {meshes.get(mesh, '@' + mesh)}"
        for op, mesh, spec in CONSTRAINT.findall(text)
    ]
    constraints += [f"Sharding {{{s}}}" for s in GSPMD.findall(text)]
    return tuple(sorted(set(constraints))), tuple(sorted(set(COLLECTIVE.findall(text))))


def _seen(computation: Any) -> None:
    if not _active:
        return
    try:
        name = str(computation.operation.attributes["sym_name"]).strip('"')
        text = computation.operation.get_asm(enable_debug_info=False)
    except Exception:  # noqa: BLE001 - an unreadable module is simply not seen
        return
    digest = hashlib.sha1(text.encode()).hexdigest()
    constraints, collectives = features(text)
    for observed in _active:
        observed.compiled.append(Compiled(name, digest, constraints, collectives))


def install() -> bool:
    """Wrap JAX's compile entry point once; return whether compiles can be seen."""
    if _installed:
        return _installed[0]
    try:
        from jax._src import compiler
    except ImportError:
        _installed.append(False)
        return False
    original = getattr(compiler, "compile_or_get_cached", None)
    if original is None:
        _installed.append(False)
        return False

    def compile_or_get_cached(backend: Any, computation: Any, *args: Any, **kwargs: Any) -> Any:
        _seen(computation)
        return original(backend, computation, *args, **kwargs)

    compiler.compile_or_get_cached = compile_or_get_cached
    _installed.append(True)
    return True


@contextmanager
def observing(observed: Observed | None) -> Iterator[None]:
    """Note what is compiled while the block runs into `observed` (None: nothing)."""
    if observed is None or not install():
        yield
        return
    _active.append(observed)
    try:
        yield
    finally:
        _active.remove(observed)
