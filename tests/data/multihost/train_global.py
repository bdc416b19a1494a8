"""A data-parallel training step, run as a multi-host job: one process per host."""

# A correct multi-host migration: a mesh over every device of the job; each process's local
# blocks become its part of global arrays, and results come back as its local blocks.

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import multihost_utils
from jax.sharding import PartitionSpec as P

LR = 0.1


def loss(w, x, y):
    return jnp.mean((x @ w - y) ** 2)


MESH = jax.make_mesh((jax.device_count(),), ("batch",))  # every device of the job


@jax.jit
@partial(jax.shard_map, mesh=MESH, in_specs=P("batch"), out_specs=P("batch"))
def global_step(w, x, y):
    g = jax.grad(loss)(w[0], x[0], y[0])
    return (w[0] - LR * lax.pmean(g, "batch"))[None]


def train_step(w, x, y):
    """Each process passes its local blocks; they are its part of the global arrays."""
    args = multihost_utils.host_local_array_to_global_array((w, x, y), MESH, P("batch"))
    return multihost_utils.global_array_to_host_local_array(global_step(*args), MESH, P("batch"))


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
