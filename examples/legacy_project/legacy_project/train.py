"""Data-parallel training with pmap: the classic flax-example shape."""

import functools

import jax
import jax.numpy as jnp
import numpy as np


def loss_fn(params, batch):
    preds = jnp.tanh(batch["x"] @ params["w"] + params["b"])
    return jnp.mean((preds - batch["y"]) ** 2)


@functools.partial(jax.pmap, axis_name="batch", donate_argnums=(0,))
def train_step(params, batch):
    loss, grads = jax.value_and_grad(loss_fn)(params, batch)
    grads = jax.lax.pmean(grads, axis_name="batch")  # average over devices
    params = jax.tree.map(lambda p, g: p - 0.1 * g, params, grads)
    return params, jax.lax.pmean(loss, axis_name="batch")


def eval_step(params, batch):
    return jax.lax.psum(loss_fn(params, batch), "batch")


def replicate(tree, n):
    return jax.tree.map(lambda a: np.broadcast_to(a, (n, *a.shape)), tree)


def main(steps=2):
    n = jax.local_device_count()
    p_eval_step = jax.pmap(eval_step, "batch")
    rng = np.random.default_rng(0)
    params = replicate({"w": rng.normal(size=(4, 2)).astype(np.float32),
                        "b": np.zeros(2, np.float32)}, n)
    batch = {"x": rng.normal(size=(n, 16, 4)).astype(np.float32),
             "y": rng.normal(size=(n, 16, 2)).astype(np.float32)}
    for _ in range(steps):
        params, loss = train_step(params, batch)
    return params, loss, p_eval_step(params, batch)


if __name__ == "__main__":
    print(main())
