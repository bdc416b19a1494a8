"""Plain dict params never replicated: the step takes them with in_axes=(None, 0) and returns
updated params that pmap stacks; psum of per-device *mean* gradients (n x the global mean);
results read with jax.device_get(x)[0] and tree-mapped [0]."""

import jax
import jax.numpy as jnp
import numpy as np


def init_params(rng):
    return {
        "w": rng.normal(size=(4, 3)).astype(np.float32) * 0.2,
        "b": np.zeros(3, np.float32),
    }


def loss_fn(params, x, y):
    pred = x @ params["w"] + params["b"]
    return jnp.mean((pred - y) ** 2)


def update(params, batch, lr):
    x, y = batch
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    grads = jax.lax.psum(grads, "devices")
    loss = jax.lax.pmean(loss, "devices")
    new_params = jax.tree.map(lambda p, g: p - lr * g, params, grads)
    return new_params, loss


p_update = jax.pmap(update, axis_name="devices", in_axes=(None, 0, None))


def main():
    rng = np.random.default_rng(0)
    params = init_params(rng)
    n = jax.local_device_count()
    true_w = rng.normal(size=(4, 3)).astype(np.float32)
    losses = []
    for step in range(5):
        x = rng.normal(size=(40, 4)).astype(np.float32)
        y = x @ true_w
        batch = jax.tree.map(lambda v: v.reshape((n, -1) + v.shape[1:]), (x, y))
        new_params, loss = p_update(params, batch, 0.01)
        params = jax.tree.map(lambda p: p[0], new_params)
        losses.append(float(jax.device_get(loss)[0]))
    params = jax.device_get(params)
    print(float(np.sum(params["w"])), losses)
    return {"params": params, "losses": losses}


if __name__ == "__main__":
    main()
