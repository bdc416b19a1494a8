"""A multi-host data-parallel trainer as TPU-pod users write it: each process reads its own shard
of the global batch (process_index), splits it over its local devices, replicates the state,
pmean's the gradients and reads the state back with unreplicate."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import jax_utils
from flax.training import common_utils


def loss_fn(params, batch):
    pred = jnp.tanh(batch["x"] @ params["w1"]) @ params["w2"]
    return jnp.mean((pred[:, 0] - batch["y"]) ** 2)


def train_step(params, opt_state, batch):
    loss, grads = jax.value_and_grad(loss_fn)(params, batch)
    grads = jax.lax.pmean(grads, axis_name="batch")
    loss = jax.lax.pmean(loss, axis_name="batch")
    updates, opt_state = tx.update(grads, opt_state, params)
    params = optax.apply_updates(params, updates)
    return params, opt_state, loss


tx = optax.sgd(0.1, momentum=0.9)


def global_batches(steps, global_batch):
    rng = np.random.default_rng(0)
    for _ in range(steps):
        x = rng.normal(size=(global_batch, 3)).astype(np.float32)
        yield {"x": x, "y": np.sin(x).sum(-1).astype(np.float32)}


def main():
    per_process = 32 // jax.process_count()
    start = jax.process_index() * per_process
    rng = np.random.default_rng(1)
    params = {
        "w1": rng.normal(size=(3, 8)).astype(np.float32) * 0.5,
        "w2": rng.normal(size=(8, 1)).astype(np.float32) * 0.5,
    }
    opt_state = tx.init(params)
    params = jax_utils.replicate(params)
    opt_state = jax_utils.replicate(opt_state)
    p_train_step = jax.pmap(train_step, axis_name="batch")

    losses = []
    for batch in global_batches(4, 32):
        local = jax.tree.map(lambda x: x[start : start + per_process], batch)
        params, opt_state, loss = p_train_step(params, opt_state, common_utils.shard(local))
        losses.append(float(jax.device_get(loss[0])))

    params = jax_utils.unreplicate(params)
    print(jax.process_index(), float(np.sum(params["w1"])), float(np.sum(params["w2"])), losses)
    return {"params": params, "losses": losses}


if __name__ == "__main__":
    main()
