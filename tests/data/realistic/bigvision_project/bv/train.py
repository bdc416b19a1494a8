"""As big_vision/train.py: pmapped update_fn in main, replicated state, evaluators, sync."""

import functools

import flax
import flax.jax_utils
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import linen as nn

import bv.utils as u
from bv import input_pipeline
from bv.evaluators import classification, gathered


class Model(nn.Module):
    num_classes: int = 5

    @nn.compact
    def __call__(self, x, train=False):
        x = nn.Dense(12)(x)
        x = nn.gelu(x)
        x = nn.Dropout(0.1, deterministic=not train)(x)
        x = nn.Dense(self.num_classes)(x)
        return x, {"pre_logits": x}


def main():
    model = Model()
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-2))
    total_steps = 4
    train_ds = input_pipeline.process_batches(0, total_steps, 32, 6, 5)
    train_iter = input_pipeline.start_input_pipeline(train_ds, 1)

    rng = jax.random.PRNGKey(42)
    rng, rng_init = jax.random.split(rng)
    params_cpu = model.init(rng_init, jnp.zeros((1, 6), jnp.float32))["params"]
    opt_cpu = jax.jit(tx.init)(params_cpu)

    @functools.partial(jax.pmap, axis_name="batch", donate_argnums=(0, 1))
    def update_fn(params, opt, rng, images, labels):
        """Update step."""
        measurements = {}

        # Get device-specific loss rng.
        rng, rng_model = jax.random.split(rng, 2)
        rng_model_local = jax.random.fold_in(rng_model, jax.lax.axis_index("batch"))

        def loss_fn(params, images, labels):
            logits, _ = model.apply(
                {"params": params}, images, train=True, rngs={"dropout": rng_model_local}
            )
            return u.sigmoid_xent(logits=logits, labels=labels)

        l, grads = jax.value_and_grad(loss_fn)(params, images, labels)
        l, grads = jax.lax.pmean((l, grads), axis_name="batch")
        updates, opt = tx.update(grads, opt, params)
        params = optax.apply_updates(params, updates)

        ps = jax.tree.leaves(params)
        measurements["l2_params"] = jnp.sqrt(sum([jnp.vdot(p, p) for p in ps]))
        return params, opt, rng, l, measurements

    def predict_fn(params, image):
        logits, out = model.apply({"params": params}, image)
        return logits, out

    evaluators = [
        ("val", classification.Evaluator(predict_fn, steps=2)),
        ("gathered", gathered.Evaluator(predict_fn, steps=2)),
    ]

    params_repl = flax.jax_utils.replicate(params_cpu)
    opt_repl = flax.jax_utils.replicate(opt_cpu)
    rng, rng_loop = jax.random.split(rng, 2)
    rngs_loop = flax.jax_utils.replicate(rng_loop)

    shown = []
    for step, batch in zip(range(1, total_steps + 1), train_iter):
        params_repl, opt_repl, rngs_loop, loss_value, measurements = update_fn(
            params_repl, opt_repl, rngs_loop, batch["image"], batch["labels"]
        )
        shown.append(float(loss_value[0]))
        shown.append(float(measurements["l2_params"][0]))

    for name, evaluator in evaluators:
        for key, value in evaluator.run(params_repl):
            shown.append(float(value))

    params_cpu = jax.tree.map(lambda x: np.array(x[0]), params_repl)
    shown.append(float(sum(np.sum(x) for x in jax.tree.leaves(params_cpu))))
    u.sync()
    print(jax.process_index(), " ".join(f"{v:.6f}" for v in shown))
    return shown
