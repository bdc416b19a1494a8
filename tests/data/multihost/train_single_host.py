"""A data-parallel training step, run as a multi-host job: one process per host."""

# jaxmigrate's pmap rewrite as of 0.10 (frozen): its mesh is the first n of jax.devices(),
# so on a multi-process job it covers process 0's devices only. Wrong on 2 processes.

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import PartitionSpec as P


def shard_map_per_device(f, *, axis_name, in_specs, out_specs, devices=None, backend=None):
    """Shard-map `f` like `jax.pmap`: one call per device, on that device's slice."""
    names = axis_name if isinstance(axis_name, tuple) else (axis_name,)
    specs = (in_specs, P(*names))  # pmap maps keyword arguments over their leading axis

    def at_mapped_axes(specs, tree, fn):  # fn(leaf, axes) on each leaf its spec maps
        def under(spec, subtree):
            axes = tuple(tuple(spec).index(n) for n in names if n in (spec or ()))
            return jax.tree.map(lambda x: fn(x, axes), subtree) if axes else subtree

        return jax.tree.map(under, specs, tree, is_leaf=lambda s: s is None)

    def per_device(args, kwargs):
        args, kwargs = at_mapped_axes(specs, (args, kwargs), jax.lax.squeeze)
        return at_mapped_axes(out_specs, f(*args, **kwargs), jax.lax.expand_dims)

    def on_devices(*args, **kwargs):  # runs when jax.jit traces: devices are found then
        sizes = []
        at_mapped_axes(specs, (args, kwargs), lambda x, ax: sizes.append([x.shape[a] for a in ax]))
        pool = jax.devices(backend) if devices is None else devices
        shape = sizes[0]  # pmap's mesh: the first devices, as many as the mapped size
        mesh = jax.sharding.Mesh(np.reshape(pool[: np.prod(shape)], shape), names)
        # check_vma=False as in pmap: True would sum the gradients of replicated values
        return jax.shard_map(
            per_device, mesh=mesh, in_specs=specs, out_specs=out_specs, check_vma=False
        )(args, kwargs)

    return on_devices


LR = 0.1


def loss(w, x, y):
    return jnp.mean((x @ w - y) ** 2)


@jax.jit
@partial(shard_map_per_device, axis_name="batch", in_specs=P("batch"), out_specs=P("batch"))
def train_step(w, x, y):
    g = jax.grad(loss)(w, x, y)
    return w - LR * lax.pmean(g, "batch")


def local_batch(step):
    """This process's rows of the global batch of `step`: one (2, 3) block per local device."""
    rng = np.random.default_rng(step)
    x = rng.standard_normal((jax.device_count(), 2, 3)).astype(np.float32)
    y = rng.standard_normal((jax.device_count(), 2)).astype(np.float32)
    n = jax.local_device_count()
    lo = jax.process_index() * n
    return x[lo : lo + n], y[lo : lo + n]


def main():
    jax.distributed.initialize()
    w = np.zeros((jax.local_device_count(), 3), np.float32)
    for step in range(3):
        w = train_step(w, *local_batch(step))
    print("weights", np.asarray(w)[0].tolist())


if __name__ == "__main__":
    main()
