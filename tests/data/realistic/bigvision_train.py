"""Modeled on big_vision/train.py (before its jit transition): a decorated update_fn with
donate_argnums, params/opt/rng replicated with flax_utils.replicate, per-device dropout keys made
with fold_in(axis_index), pmean of (loss, grads), measurements read with [0] for logging."""

from functools import partial

import flax
import flax.jax_utils as flax_utils
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import linen as nn


class ViTish(nn.Module):
    num_classes: int = 5

    @nn.compact
    def __call__(self, x, train=False):
        x = nn.Dense(12)(x)
        x = nn.gelu(x)
        x = nn.Dropout(0.1, deterministic=not train)(x)
        return nn.Dense(self.num_classes)(x)


def sigmoid_xent(*, logits, labels, reduction=True):
    log_p = jax.nn.log_sigmoid(logits)
    log_not_p = jax.nn.log_sigmoid(-logits)
    nll = -jnp.sum(labels * log_p + (1.0 - labels) * log_not_p, axis=-1)
    return jnp.mean(nll) if reduction else nll


model = ViTish()
tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-2))


@partial(jax.pmap, axis_name="batch", donate_argnums=(0, 1))
def update_fn(params, opt, rng, images, labels):
    """Update step."""
    measurements = {}

    # Get device-specific loss rng.
    rng, rng_model = jax.random.split(rng, 2)
    rng_model_local = jax.random.fold_in(rng_model, jax.lax.axis_index("batch"))

    def loss_fn(params, images, labels):
        logits = model.apply(
            {"params": flax.core.unfreeze(params)},
            images,
            train=True,
            rngs={"dropout": rng_model_local},
        )
        return sigmoid_xent(logits=logits, labels=labels)

    l, grads = jax.value_and_grad(loss_fn)(params, images, labels)
    l, grads = jax.lax.pmean((l, grads), axis_name="batch")
    updates, opt = tx.update(grads, opt, params)
    params = optax.apply_updates(params, updates)

    gs = jax.tree.leaves(grads)
    measurements["l2_grads"] = jnp.sqrt(sum([jnp.vdot(g, g) for g in gs]))
    ps = jax.tree.leaves(params)
    measurements["l2_params"] = jnp.sqrt(sum([jnp.vdot(p, p) for p in ps]))
    return params, opt, rng, l, measurements


def main():
    rng = jax.random.PRNGKey(42)
    rng, rng_init = jax.random.split(rng)
    params_cpu = model.init(rng_init, jnp.zeros((1, 6), jnp.float32))["params"]
    opt_cpu = jax.jit(tx.init)(params_cpu)

    rng, rng_loop = jax.random.split(rng, 2)
    rngs_loop = flax_utils.replicate(rng_loop)
    params_repl = flax_utils.replicate(params_cpu)
    opt_repl = flax_utils.replicate(opt_cpu)

    data = np.random.RandomState(0)
    log = []
    for step in range(1, 6):
        images = data.randn(32, 6).astype(np.float32)
        labels = np.eye(5, dtype=np.float32)[data.randint(0, 5, size=32)]
        batch = {
            "image": images.reshape(jax.local_device_count(), -1, 6),
            "labels": labels.reshape(jax.local_device_count(), -1, 5),
        }
        params_repl, opt_repl, rngs_loop, loss_value, measurements = update_fn(
            params_repl, opt_repl, rngs_loop, batch["image"], batch["labels"]
        )
        if step % 2 == 1:
            entry = {"training_loss": float(loss_value[0])}
            entry["l2_grads"] = float(measurements["l2_grads"][0])
            entry["l2_params"] = float(measurements["l2_params"][0])
            log.append(entry)

    params_cpu = jax.tree.map(lambda x: x[0], params_repl)
    out = {"params": params_cpu, "log": log}
    print(float(sum(np.sum(x) for x in jax.tree.leaves(params_cpu))), log)
    return out


if __name__ == "__main__":
    main()
