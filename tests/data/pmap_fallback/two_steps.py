import jax
import jax.numpy as jnp
import numpy as np


def step(params, x):
    loss = jax.lax.pmean(jnp.mean(x) * jnp.sum(params), axis_name="batch")
    return params * 0.5, loss


def good():
    n = jax.local_device_count()
    w = np.ones((3,), np.float32)
    p_step = jax.pmap(step, axis_name="batch")
    params = jnp.broadcast_to(w, (n,) + w.shape)
    x = np.arange(8 * 4, dtype=np.float32)
    x = x.reshape((n, -1) + x.shape[1:])
    params, loss = p_step(params, x)
    return params[0], loss[0]


def aliased():
    n = jax.local_device_count()
    w = HOST["aliased"]
    p_step = jax.pmap(step, axis_name="batch")
    params = jnp.broadcast_to(w, (n,) + w.shape)
    HOST["aliased"] += 1.0  # the host copy moves on; the replicas keep the value they had
    x = np.arange(8 * 4, dtype=np.float32)
    x = x.reshape((n, -1) + x.shape[1:])
    params, loss = p_step(params, x)
    return params[0], loss[0], w


def logged():
    # Returns nothing: only the step's calls, compared through layout adapters, show the
    # difference.
    n = jax.local_device_count()
    w = HOST["logged"]
    p_step = jax.pmap(step, axis_name="batch")
    params = jnp.broadcast_to(w, (n,) + w.shape)
    HOST["logged"] += 1.0
    x = np.arange(8 * 4, dtype=np.float32)
    x = x.reshape((n, -1) + x.shape[1:])
    params, loss = p_step(params, x)
    print(params[0], loss[0])


# The host copies `aliased` and `logged` replicate, then update in place through this dict: the
# analysis follows the names a step is given, not every reference to their values.
HOST = {"aliased": np.ones((3,), np.float32), "logged": np.ones((3,), np.float32)}
