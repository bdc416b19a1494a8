"""Data-parallel training with pmap: the classic flax-example shape."""

import jax
import jax.numpy as jnp
import numpy as np


def loss_fn(params, batch):
    preds = jnp.tanh(batch["x"] @ params["w"] + params["b"])
    return jnp.mean((preds - batch["y"]) ** 2)


def train_step(params, batch):
    loss, grads = jax.value_and_grad(loss_fn)(params, batch)
    grads = jax.lax.pmean(grads, axis_name="batch")  # average over devices
    params = jax.tree.map(lambda p, g: p - 0.1 * g, params, grads)
    return params, jax.lax.pmean(loss, axis_name="batch")


def eval_step(params, batch):
    return jax.lax.psum(loss_fn(params, batch), "batch")


def _replicate(tree, n):  # one copy per device
    return jax.tree.map(lambda a: np.broadcast_to(a, (n, *a.shape)), tree)


def _shard(tree, n):  # one slice of the batch per device
    return jax.tree.map(lambda a: a.reshape((n, -1) + a.shape[1:]), tree)


def _unreplicate(tree):  # device 0's copy
    return jax.tree.map(lambda a: a[0], tree)


def main(steps=2):
    n = jax.local_device_count()
    p_train_step = jax.pmap(train_step, axis_name="batch", donate_argnums=(0,))
    p_eval_step = jax.pmap(eval_step, "batch")
    rng = np.random.default_rng(0)
    params = {"w": rng.normal(size=(4, 2)).astype(np.float32), "b": np.zeros(2, np.float32)}
    params = _replicate(params, n)
    x = rng.normal(size=(n * 16, 4)).astype(np.float32)
    y = rng.normal(size=(n * 16, 2)).astype(np.float32)
    batch = _shard({"x": x, "y": y}, n)
    for _ in range(steps):
        params, loss = p_train_step(params, batch)
    return _unreplicate(params), loss[0], _unreplicate(p_eval_step(params, batch))


if __name__ == "__main__":
    print(main())
