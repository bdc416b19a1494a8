"""A pmap data-parallel training step against jaxmigrate's rewrite of it, side by side.

    python benchmarks/pmap_step.py [--steps 200] [--reps 5]

The original module text below (a tanh-MLP step: `value_and_grad`, `pmean` of the gradients,
SGD, params and batch stacked over 8 devices, params donated) is rewritten at run time by
`jaxmigrate.pipeline.engine.migrate_source` (the pmap pass, unsafe fixes on), and both are executed in
this one process on a simulated 8-device CPU mesh. Each variant runs `--steps` chained steps
per rep (every step blocked: dispatching many collective steps ahead deadlocks a 2-core host),
reps interleaved; the median step time of each variant and their ratio are printed, after
checking that all reach the same parameters.

A third variant is the program-level form (`pmap-style = "idiomatic"`), as the pass emits it for
a training loop whose flow it sees: `jax.jit(jax.shard_map(body, mesh=..., in_specs=(P(),
P("batch")), out_specs=(P(), P()), check_vma=False), donate_argnums=(0,))` over a mesh of every
device, fed the params unstacked and the batch flat (the device axis gone).
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"  # before JAX starts
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

ORIGINAL = """
import functools

import jax
import jax.numpy as jnp


def loss_fn(params, batch):
    hidden = jnp.tanh(batch["x"] @ params["w1"] + params["b1"])
    return jnp.mean((hidden @ params["w2"] - batch["y"]) ** 2)


@functools.partial(jax.pmap, axis_name="batch", donate_argnums=(0,))
def train_step(params, batch):
    loss, grads = jax.value_and_grad(loss_fn)(params, batch)
    grads = jax.lax.pmean(grads, axis_name="batch")
    params = jax.tree.map(lambda p, g: p - 0.05 * g, params, grads)
    return params, jax.lax.pmean(loss, axis_name="batch")
"""


def rewritten() -> str:
    """Return the original module text as jaxmigrate rewrites it."""
    from jaxmigrate.model import Options
    from jaxmigrate.pipeline.engine import migrate_source

    result = migrate_source(ORIGINAL, options=Options(unsafe_fixes=True, select=("pmap",)))
    assert any(s.applied for s in result.sites), "the pmap site was not rewritten"
    return result.code


def load(source: str) -> Callable[..., Any]:
    """Return the `train_step` the module text defines."""
    namespace: dict[str, Any] = {"__name__": "benchmark_module"}
    exec(compile(source, "<benchmark>", "exec"), namespace)  # noqa: S102 - our own module text
    return namespace["train_step"]


def program_level() -> Callable[..., Any]:
    """Return the program-level form of the step (the body itself, unchanged, in shard_map)."""
    import jax
    from jax.sharding import PartitionSpec as P

    namespace: dict[str, Any] = {"__name__": "benchmark_body"}
    body = ORIGINAL.replace(
        '@functools.partial(jax.pmap, axis_name="batch", donate_argnums=(0,))\n', ""
    )
    exec(compile(body, "<benchmark-body>", "exec"), namespace)  # noqa: S102 - our own text
    mesh = jax.sharding.Mesh(jax.devices(), ("batch",))
    return jax.jit(
        jax.shard_map(
            namespace["train_step"],
            mesh=mesh,
            in_specs=(P(), P("batch")),
            out_specs=(P(), P()),
            check_vma=False,
        ),
        donate_argnums=(0,),
    )


def inputs(devices: int, batch: int, width: int) -> tuple[dict, dict]:
    """Return params replicated over `devices` (stacked, as pmap wants) and a sharded batch."""
    import numpy as np

    rng = np.random.default_rng(0)

    def stacked(a: np.ndarray) -> np.ndarray:
        return np.broadcast_to(a.astype(np.float32), (devices, *a.shape)).copy()

    params = {
        "w1": stacked(rng.normal(size=(width, width)) / np.sqrt(width)),
        "b1": stacked(np.zeros(width)),
        "w2": stacked(rng.normal(size=(width, width)) / np.sqrt(width)),
    }
    data = {
        "x": rng.normal(size=(devices, batch, width)).astype(np.float32),
        "y": rng.normal(size=(devices, batch, width)).astype(np.float32),
    }
    return params, data


def run(step: Callable[..., Any], params: dict, data: dict, steps: int) -> tuple[list[float], Any]:
    """Run `steps` chained, blocked steps; return each step's seconds and the final params."""
    import jax

    times = []
    for _ in range(steps):
        start = time.perf_counter()
        params, loss = step(params, data)
        jax.block_until_ready((params, loss))
        times.append(time.perf_counter() - start)
    return times, params


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--width", type=int, default=128)
    args = parser.parse_args()

    import jax
    import numpy as np

    program = "jit(shard_map) program-level"
    variants = {
        "pmap (original)": load(ORIGINAL),
        "jit(shard_map) (rewritten)": load(rewritten()),
        program: program_level(),
    }
    params0, data = inputs(jax.device_count(), args.batch, args.width)
    flat = {k: v.reshape(-1, *v.shape[2:]) for k, v in data.items()}  # the device axis gone
    state = {name: jax.tree.map(np.copy, params0) for name in variants}
    state[program] = jax.tree.map(lambda a: a[0].copy(), params0)
    feed = {name: flat if name == program else data for name in variants}
    for name, step in variants.items():  # compile and warm up, outside the timings
        _, state[name] = run(step, state[name], feed[name], 10)
    samples: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.reps):
        for name, step in variants.items():
            times, state[name] = run(step, state[name], feed[name], args.steps)
            samples[name] += times
    finals = [np.asarray(jax.device_get(state[name]["w1"])) for name in variants]
    np.testing.assert_allclose(finals[0], finals[1], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(finals[0][0], finals[2], rtol=1e-4, atol=1e-5)

    print(
        f"jax {jax.__version__}, {jax.device_count()} devices, batch {args.batch}/device, "
        f"width {args.width}, {args.reps} interleaved reps x {args.steps} blocked steps"
    )
    medians = {name: statistics.median(t) for name, t in samples.items()}
    for name, median in medians.items():
        print(f"  {name:30s} median {median * 1e6:8.1f} us/step")
    original, new, whole = medians.values()
    print(f"  ratio rewritten / original: {new / original:.3f} (below 1: the rewrite is faster)")
    print(f"  ratio program-level / original: {whole / original:.3f}")
    print(f"  final params agree (rtol 1e-4) after {10 + args.reps * args.steps} chained steps")


if __name__ == "__main__":
    main()
