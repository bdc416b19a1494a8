"""Modeled on AlgoPerf's pmap submissions and workloads: a module-level pmapped train step with
in_axes=(None, None, 0, ...), static_broadcasted_argnums=(0, 1), donate_argnums, psum of summed
loss and n_valid_examples, per-device rngs, loss[0]/grad_norm[0] logging; an eval step with
in_axes=None params and a psum of counts read with x[0] / num_examples."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import jax_utils
from jax import lax


class MnistWorkload:
    num_classes = 3

    def model_fn(self, params, batch, model_state, rng, train):
        x = batch["inputs"]
        h = jax.nn.relu(x @ params["dense1"]["kernel"] + params["dense1"]["bias"])
        if train:
            keep = jax.random.bernoulli(rng, 0.9, h.shape)
            h = jnp.where(keep, h / 0.9, 0.0)
        logits = h @ params["dense2"]["kernel"] + params["dense2"]["bias"]
        return logits, model_state

    def loss_fn(self, label_batch, logits_batch, mask_batch=None, label_smoothing=0.0):
        one_hot = jax.nn.one_hot(label_batch, self.num_classes)
        smoothed = optax.smooth_labels(one_hot, label_smoothing)
        per_example = optax.softmax_cross_entropy(logits_batch, smoothed)
        if mask_batch is None:
            mask_batch = jnp.ones_like(per_example)
        summed = (per_example * mask_batch).sum()
        return {"summed": summed, "n_valid_examples": mask_batch.sum(), "per_example": per_example}

    def _eval_model(self, params, batch, model_state, rng):
        logits, _ = self.model_fn(params, batch, model_state, rng, train=False)
        weights = batch.get("weights")
        if weights is None:
            weights = jnp.ones(len(logits))
        accuracy = jnp.sum((jnp.argmax(logits, axis=-1) == batch["targets"]) * weights)
        summed = self.loss_fn(batch["targets"], logits, weights)["summed"]
        metrics = {"accuracy": accuracy, "loss": summed}
        metrics = lax.psum(metrics, axis_name="batch")
        return metrics


_eval_model_pmapped = jax.pmap(
    lambda workload, params, batch, model_state, rng: workload._eval_model(
        params, batch, model_state, rng
    ),
    axis_name="batch",
    in_axes=(None, 0, 0, 0, 0),
    static_broadcasted_argnums=(0,),
)


@functools.partial(
    jax.pmap,
    axis_name="batch",
    in_axes=(None, None, 0, 0, 0, 0, 0, None, None),
    static_broadcasted_argnums=(0, 1),
    donate_argnums=(2, 3, 4),
)
def pmapped_train_step(
    workload,
    opt_update_fn,
    model_state,
    optimizer_state,
    current_param_container,
    batch,
    rng,
    grad_clip,
    label_smoothing,
):
    def _loss_fn(params):
        logits, new_model_state = workload.model_fn(params, batch, model_state, rng, train=True)
        loss_dict = workload.loss_fn(
            label_batch=batch["targets"],
            logits_batch=logits,
            mask_batch=batch.get("weights"),
            label_smoothing=label_smoothing,
        )
        return loss_dict["summed"], (loss_dict["n_valid_examples"], new_model_state)

    grad_fn = jax.value_and_grad(_loss_fn, has_aux=True)
    (summed_loss, (n_valid_examples, new_model_state)), grad = grad_fn(current_param_container)
    # Get correct global mean loss and grad.
    (summed_loss, n_valid_examples, grad) = lax.psum(
        (summed_loss, n_valid_examples, grad), axis_name="batch"
    )
    loss = summed_loss / n_valid_examples
    grad = jax.tree.map(lambda x: x / n_valid_examples, grad)
    grad_norm = jnp.sqrt(sum(jnp.sum(g**2) for g in jax.tree.leaves(grad)))
    scaled_grad = jax.tree.map(lambda x: x * jnp.minimum(1.0, grad_clip / (grad_norm + 1e-6)), grad)
    updates, new_optimizer_state = opt_update_fn(
        scaled_grad, optimizer_state, current_param_container
    )
    updated_params = optax.apply_updates(current_param_container, updates)
    return new_optimizer_state, updated_params, new_model_state, loss, grad_norm


def shard_and_maybe_pad_np(batch, global_batch_size):
    local_device_count = jax.local_device_count()

    def _prepare(x):
        return x.reshape((local_device_count, -1, *x.shape[1:]))

    return jax.tree.map(_prepare, batch)


def main():
    workload = MnistWorkload()
    rng = np.random.RandomState(0)
    params = {
        "dense1": {
            "kernel": rng.randn(5, 16).astype(np.float32) * 0.3,
            "bias": np.zeros(16, np.float32),
        },
        "dense2": {
            "kernel": rng.randn(16, 3).astype(np.float32) * 0.3,
            "bias": np.zeros(3, np.float32),
        },
    }
    model_state = {"count": np.zeros((), np.int32)}
    opt_init_fn, opt_update_fn = optax.adamw(1e-2, b1=0.9, b2=0.99, weight_decay=1e-3)
    optimizer_state = opt_init_fn(params)
    optimizer_state = jax_utils.replicate(optimizer_state)
    params = jax_utils.replicate(params)
    model_state = jax_utils.replicate(model_state)

    key = jax.random.PRNGKey(1)
    logs = []
    for global_step in range(6):
        key, step_key = jax.random.split(key)
        x = rng.randn(48, 5).astype(np.float32)
        batch = {"inputs": x, "targets": rng.randint(0, 3, size=48)}
        batch = shard_and_maybe_pad_np(batch, 48)
        per_device_rngs = jax.random.split(step_key, jax.local_device_count())
        outputs = pmapped_train_step(
            workload,
            opt_update_fn,
            model_state,
            optimizer_state,
            params,
            batch,
            per_device_rngs,
            1.0,
            0.1,
        )
        optimizer_state, params, model_state, loss, grad_norm = outputs
        if global_step % 2 == 0:
            logs.append({"loss": float(loss[0]), "grad_norm": float(grad_norm[0])})

    num_examples = 0
    total_metrics = {"accuracy": 0.0, "loss": 0.0}
    eval_rng = jax.random.PRNGKey(7)
    for _ in range(3):
        x = rng.randn(24, 5).astype(np.float32)
        batch = shard_and_maybe_pad_np({"inputs": x, "targets": rng.randint(0, 3, size=24)}, 24)
        per_device_model_rngs = jax.random.split(eval_rng, jax.local_device_count())
        batch_metrics = _eval_model_pmapped(
            workload, params, batch, model_state, per_device_model_rngs
        )
        total_metrics = {k: v + batch_metrics[k] for k, v in total_metrics.items()}
        num_examples += 24
    eval_results = jax.tree.map(lambda x: float(x[0] / num_examples), total_metrics)

    params = jax.device_get(jax_utils.unreplicate(params))
    out = {"params": params, "logs": logs, "eval": eval_results}
    print(float(sum(np.sum(x) for x in jax.tree.leaves(params))), logs, eval_results)
    return out


if __name__ == "__main__":
    main()
