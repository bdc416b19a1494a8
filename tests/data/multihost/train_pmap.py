"""A data-parallel training step, run as a multi-host job: one process per host."""

# The original: a pmap data-parallel train step; its pmean spans every device of the job.

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

LR = 0.1


def loss(w, x, y):
    return jnp.mean((x @ w - y) ** 2)


@partial(jax.pmap, axis_name="batch")
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
