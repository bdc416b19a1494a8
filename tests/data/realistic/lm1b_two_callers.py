"""Modeled on flax/examples/lm1b (pmap era) and sst2: a module-level pmapped eval step called
from the training loop (periodic eval) and from a final evaluation function; per-example
predictions from a pmapped predict step flattened on the host with reshape(-1)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import jax_utils
from flax import linen as nn
from flax.training import common_utils, train_state


class Classifier(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.Dense(10)(x)
        x = nn.tanh(x)
        return nn.Dense(2)(x)


def train_step(state, batch):
    def loss_fn(params):
        logits = state.apply_fn({"params": params}, batch["x"])
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean()

    loss, grads = jax.value_and_grad(loss_fn)(state.params)
    grads = jax.lax.pmean(grads, axis_name="batch")
    state = state.apply_gradients(grads=grads)
    return state, jax.lax.pmean(loss, axis_name="batch")


def eval_step(params, batch, apply_fn):
    logits = apply_fn({"params": params}, batch["x"])
    correct = jnp.sum(jnp.argmax(logits, -1) == batch["y"])
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).sum()
    return jax.lax.psum({"correct": correct, "loss": loss, "count": batch["x"].shape[0]}, "batch")


def predict_step(params, x, apply_fn):
    logits = apply_fn({"params": params}, x)
    return jnp.argmax(logits, -1), jax.nn.softmax(logits)[:, 1]


model = Classifier()
p_eval_step = jax.pmap(functools.partial(eval_step, apply_fn=model.apply), axis_name="batch")
p_predict_step = jax.pmap(functools.partial(predict_step, apply_fn=model.apply), axis_name="batch")


def make_batches(seed, n, size):
    rng = np.random.default_rng(seed)
    w = np.array([1.0, -2.0, 0.5, 0.0, 1.5], np.float32)
    out = []
    for _ in range(n):
        x = rng.normal(size=(size, 5)).astype(np.float32)
        out.append({"x": x, "y": (x @ w > 0).astype(np.int32)})
    return out


def evaluate_metrics(params, batches):
    totals = None
    for batch in batches:
        metrics = p_eval_step(params, common_utils.shard(batch))
        metrics = jax.tree.map(lambda x: x[0], metrics)
        totals = metrics if totals is None else jax.tree.map(np.add, totals, metrics)
    return {
        "accuracy": totals["correct"] / totals["count"],
        "loss": totals["loss"] / totals["count"],
    }


def train_and_evaluate():
    params = model.init(jax.random.PRNGKey(3), jnp.ones((1, 5)))["params"]
    state = train_state.TrainState.create(apply_fn=model.apply, params=params, tx=optax.adam(0.05))
    state = jax_utils.replicate(state)
    p_train_step = jax.pmap(train_step, axis_name="batch", donate_argnums=(0,))

    eval_batches = make_batches(1, 2, 16)
    history = []
    for step, batch in enumerate(make_batches(0, 6, 32)):
        state, loss = p_train_step(state, common_utils.shard(batch))
        if step % 3 == 2:
            # Periodic evaluation inline in the training loop.
            correct = 0
            count = 0
            for eval_batch in eval_batches:
                metrics = p_eval_step(state.params, common_utils.shard(eval_batch))
                correct += int(metrics["correct"][0])
                count += int(metrics["count"][0])
            history.append({"step": step, "loss": float(loss[0]), "eval_acc": correct / count})
    return state, history


def main():
    state, history = train_and_evaluate()
    final = evaluate_metrics(state.params, make_batches(2, 2, 16))

    test = make_batches(3, 1, 24)[0]
    labels, probs = p_predict_step(state.params, common_utils.shard(test["x"]))
    labels = np.asarray(labels).reshape(-1)
    probs = jax.device_get(probs).reshape(-1)

    params = jax.device_get(jax_utils.unreplicate(state).params)
    out = {"params": params, "history": history, "final": final, "labels": labels, "probs": probs}
    print(float(sum(np.sum(x) for x in jax.tree.leaves(params))), history, final, labels.tolist())
    return out


if __name__ == "__main__":
    main()
