import jax
import jax.numpy as jnp
import numpy as np
from rank_shift import shifted


def step(w, x):
    loss = jax.lax.pmean(jnp.mean(x) * jnp.sum(w), axis_name="batch")
    return shifted(w), loss


def main():
    n = jax.local_device_count()
    w = np.ones((3,), np.float32)
    p_step = jax.pmap(step, axis_name="batch")
    w = jnp.broadcast_to(w, (n,) + w.shape)
    losses = []
    for i in range(2):
        x = np.arange(8 * 4, dtype=np.float32) + i
        x = x.reshape((n, -1) + x.shape[1:])
        w, loss = p_step(w, x)
        losses.append(loss[0])
    return w[0], losses
