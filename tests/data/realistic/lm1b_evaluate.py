"""Modeled on flax/examples/lm1b/train.py (2023): the steps are made in `train_and_evaluate`, which
replicates the state once and passes the eval and predict steps to `evaluate(p_eval_step=...)` and
`generate_prediction(p_pred_step=...)`: those shard their own batches, gather the metrics with
`get_metrics` and flatten the predictions with `tohost`. Each process reads its own rows of
every global batch (one process: all of them)."""

import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
from flax import jax_utils
from flax.training import common_utils


def train_step(params, batch, lr):
    def loss_fn(p):
        return jnp.mean((jnp.tanh(batch["x"] @ p["w"]) - batch["y"]) ** 2)

    loss, grads = jax.value_and_grad(loss_fn)(params)
    grads = jax.lax.pmean(grads, "batch")
    params = jax.tree.map(lambda p, g: p - lr * g, params, grads)
    return params, {"loss": jax.lax.pmean(loss, "batch")}


def eval_step(params, batch):
    error = jnp.abs(jnp.tanh(batch["x"] @ params["w"]) - batch["y"])
    metrics = {"error": jnp.sum(error), "denominator": jnp.float32(error.size)}
    return jax.lax.psum(metrics, "batch")


def predict_step(params, x):
    return jnp.argmax(x @ params["w"], axis=-1)


def tohost(x):
    n_device, n_batch, *remaining_dims = x.shape
    return np.array(x).reshape((n_device * n_batch,) + tuple(remaining_dims))


def local(x):
    """This process's rows of a global batch."""
    rows = len(x) // jax.process_count()
    return x[jax.process_index() * rows :][:rows]


def evaluate(*, p_eval_step, params, eval_ds, num_eval_steps):
    eval_metrics = []
    for _, eval_batch in zip(range(num_eval_steps), eval_ds):
        eval_batch = common_utils.shard(jax.tree.map(local, eval_batch))
        metrics = p_eval_step(params, eval_batch)
        eval_metrics.append(metrics)
    eval_metrics = common_utils.get_metrics(eval_metrics)
    eval_metrics_sums = jax.tree.map(jnp.sum, eval_metrics)
    eval_denominator = eval_metrics_sums.pop("denominator")
    return jax.tree.map(lambda x: x / eval_denominator, eval_metrics_sums)


def generate_prediction(*, p_pred_step, params, prompts):
    predictions = []
    for pred_batch in prompts:
        pred_batch = common_utils.shard(local(pred_batch))
        predicted = p_pred_step(params, pred_batch)
        predictions += tohost(predicted).tolist()
    return predictions


def train_and_evaluate(steps=4):
    rng = np.random.default_rng(0)
    params = {"w": rng.normal(size=(4, 3)).astype(np.float32)}
    data = [
        {
            "x": rng.normal(size=(32, 4)).astype(np.float32),
            "y": rng.normal(size=(32, 3)).astype(np.float32),
        }
        for _ in range(steps + 2)
    ]
    params = jax_utils.replicate(params)
    p_train_step = jax.pmap(
        functools.partial(train_step, lr=0.1), axis_name="batch", donate_argnums=(0,)
    )
    p_eval_step = jax.pmap(eval_step, axis_name="batch")
    p_pred_step = jax.pmap(predict_step, axis_name="batch")
    train_metrics = []
    for batch in data[:steps]:
        batch = common_utils.shard(jax.tree.map(local, batch))
        params, metrics = p_train_step(params, batch)
        train_metrics.append(metrics)
    train_metrics = common_utils.get_metrics(train_metrics)
    eval_results = evaluate(
        p_eval_step=p_eval_step, params=params, eval_ds=data[steps:], num_eval_steps=2
    )
    predictions = generate_prediction(
        p_pred_step=p_pred_step, params=params, prompts=[d["x"] for d in data[steps:]]
    )
    return jax_utils.unreplicate(params), train_metrics, eval_results, predictions


def main():
    params, train_metrics, eval_results, predictions = train_and_evaluate()
    sums = [float(np.sum(params["w"])), *map(float, train_metrics["loss"])]
    sums.append(float(eval_results["error"]))
    print(jax.process_index(), json.dumps(predictions), " ".join(f"{s:.6f}" for s in sums))
    return params, train_metrics, eval_results, np.asarray(predictions)


if __name__ == "__main__":
    main()
