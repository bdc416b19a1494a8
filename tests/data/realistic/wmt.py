"""Modeled on flax/examples/wmt/train.py: dropout keys split per device and passed by keyword,
donate_argnums, psum'd weighted metrics with a denominator, evaluate() taking the pmapped step,
a prediction step with static_broadcasted_argnums and host-side `tohost` flattening, a
`DynamicScale` averaging the grads (`axis_name=`), and `translate_and_calculate_bleu` taking the
cache step and the prediction step, flattening the batch it split with `tohost`."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import jax_utils
from flax import linen as nn
from flax.training import common_utils, train_state
from flax.training import dynamic_scale as dynamic_scale_lib

VOCAB = 11


class TinyLM(nn.Module):
    @nn.compact
    def __call__(self, tokens, train):
        x = nn.Embed(VOCAB, 8)(tokens)
        x = nn.Dense(16)(x)
        x = nn.Dropout(0.1, deterministic=not train)(x)
        return nn.Dense(VOCAB)(nn.relu(x))


class TrainState(train_state.TrainState):
    dynamic_scale: dynamic_scale_lib.DynamicScale


def compute_weighted_cross_entropy(logits, targets, weights):
    onehot = common_utils.onehot(targets, VOCAB)
    loss = -jnp.sum(onehot * nn.log_softmax(logits), axis=-1)
    loss = loss * weights
    return loss.sum(), weights.sum()


def compute_weighted_accuracy(logits, targets, weights):
    loss = jnp.equal(jnp.argmax(logits, axis=-1), targets) * weights
    return loss.sum(), weights.sum()


def compute_metrics(logits, labels, weights):
    loss, weight_sum = compute_weighted_cross_entropy(logits, labels, weights)
    acc, _ = compute_weighted_accuracy(logits, labels, weights)
    metrics = {"loss": loss, "accuracy": acc, "denominator": weight_sum}
    metrics = jax.lax.psum(metrics, axis_name="batch")
    return metrics


def train_step(state, batch, learning_rate_fn, dropout_rng=None):
    inputs, targets = batch["inputs"], batch["targets"]
    weights = jnp.where(targets > 0, 1, 0).astype(jnp.float32)
    dropout_rng = jax.random.fold_in(dropout_rng, state.step)

    def loss_fn(params):
        logits = state.apply_fn(
            {"params": params}, inputs, train=True, rngs={"dropout": dropout_rng}
        )
        loss, weight_sum = compute_weighted_cross_entropy(logits, targets, weights)
        mean_loss = loss / weight_sum
        return mean_loss, logits

    step = state.step
    lr = learning_rate_fn(step)
    if state.dynamic_scale:
        grad_fn = state.dynamic_scale.value_and_grad(loss_fn, has_aux=True, axis_name="batch")
        dynamic_scale, is_fin, (_, logits), grads = grad_fn(state.params)
        state = state.replace(dynamic_scale=dynamic_scale)
    else:
        grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
        (_, logits), grads = grad_fn(state.params)
        grads = jax.lax.pmean(grads, "batch")
    new_state = state.apply_gradients(grads=grads)
    metrics = compute_metrics(logits, targets, weights)
    metrics["learning_rate"] = lr
    if state.dynamic_scale:
        select_fn = functools.partial(jnp.where, is_fin)
        new_state = new_state.replace(
            opt_state=jax.tree.map(select_fn, new_state.opt_state, state.opt_state),
            params=jax.tree.map(select_fn, new_state.params, state.params),
        )
        metrics["loss_scale"] = dynamic_scale.scale * metrics["denominator"]
    return new_state, metrics


def eval_step(params, batch, apply_fn):
    inputs, targets = batch["inputs"], batch["targets"]
    weights = jnp.where(targets > 0, 1.0, 0.0)
    logits = apply_fn({"params": params}, inputs, train=False)
    return compute_metrics(logits, targets, weights)


def initialize_cache(inputs, width):
    return {"bias": jnp.zeros((inputs.shape[1], width), jnp.float32), "index": jnp.int32(0)}


def predict_step(inputs, params, cache, temperature, top, apply_fn):
    logits = apply_fn({"params": params}, inputs, train=False) / temperature
    logits = logits + cache["bias"][None, :, :1] + cache["index"]
    return jax.lax.top_k(logits, top)[1]


def tohost(x):
    n_device, n_batch, *remaining_dims = x.shape
    return np.array(x).reshape((n_device * n_batch,) + tuple(remaining_dims))


def evaluate(*, p_eval_step, params, eval_ds, num_eval_steps):
    eval_metrics = []
    for _, eval_batch in zip(range(num_eval_steps), eval_ds):
        eval_batch = common_utils.shard(eval_batch)
        metrics = p_eval_step(params, eval_batch)
        eval_metrics.append(metrics)
    eval_metrics = common_utils.get_metrics(eval_metrics)
    eval_metrics_sums = jax.tree.map(jnp.sum, eval_metrics)
    eval_denominator = eval_metrics_sums.pop("denominator")
    eval_summary = jax.tree.map(lambda x: x / eval_denominator, eval_metrics_sums)
    return eval_summary


def translate_and_calculate_bleu(*, p_pred_step, p_init_cache, params, predict_ds):
    n_devices = jax.local_device_count()
    sources, predictions = [], []
    for pred_batch in predict_ds:
        cur_pred_batch_size = pred_batch["inputs"].shape[0]
        if cur_pred_batch_size % n_devices:
            padded_size = int(np.ceil(cur_pred_batch_size / n_devices) * n_devices)
            pred_batch = jax.tree.map(lambda x: pad_examples(x, padded_size), pred_batch)
        pred_batch = common_utils.shard(pred_batch)
        cache = p_init_cache(pred_batch["inputs"])
        predicted = p_pred_step(pred_batch["inputs"], params, cache, 0.7, 2)
        predicted = tohost(predicted)
        inputs = tohost(pred_batch["inputs"])
        for i, s in enumerate(predicted[:cur_pred_batch_size]):
            sources.append(inputs[i])
            predictions.append(s)
    return np.stack(sources), np.stack(predictions)


def pad_examples(x, desired_batch_size):
    batch_pad = desired_batch_size - x.shape[0]
    return np.concatenate([x, np.tile(x[-1], (batch_pad, 1))])


def make_ds(seed, n, batch_size, length=6):
    rng = np.random.default_rng(seed)
    for _ in range(n):
        tokens = rng.integers(0, VOCAB, size=(batch_size, length)).astype(np.int32)
        yield {"inputs": tokens, "targets": np.roll(tokens, -1, axis=1)}


def main():
    rng = jax.random.PRNGKey(0)
    rng, init_rng = jax.random.split(rng)
    model = TinyLM()
    params = model.init(init_rng, jnp.ones((1, 6), jnp.int32), train=False)["params"]
    learning_rate_fn = optax.warmup_cosine_decay_schedule(0.0, 0.05, 2, 8)
    state = TrainState.create(
        apply_fn=model.apply,
        params=params,
        tx=optax.adamw(learning_rate_fn, weight_decay=0.01),
        dynamic_scale=dynamic_scale_lib.DynamicScale(),
    )
    state = jax_utils.replicate(state)
    del params

    p_train_step = jax.pmap(
        functools.partial(train_step, learning_rate_fn=learning_rate_fn),
        axis_name="batch",
        donate_argnums=(0,),
    )
    p_eval_step = jax.pmap(functools.partial(eval_step, apply_fn=model.apply), axis_name="batch")
    p_init_cache = jax.pmap(functools.partial(initialize_cache, width=3), axis_name="batch")
    p_pred_step = jax.pmap(
        functools.partial(predict_step, apply_fn=model.apply),
        axis_name="batch",
        static_broadcasted_argnums=(3, 4),
    )

    dropout_rngs = jax.random.split(rng, jax.local_device_count())
    del rng

    train_iter = make_ds(0, 5, 32)
    train_metrics = []
    for step in range(5):
        batch = common_utils.shard(jax.tree.map(np.asarray, next(train_iter)))
        state, metrics = p_train_step(state, batch, dropout_rng=dropout_rngs)
        train_metrics.append(metrics)

    train_metrics = common_utils.get_metrics(train_metrics)
    lr = train_metrics.pop("learning_rate").mean()
    metrics_sums = jax.tree.map(jnp.sum, train_metrics)
    denominator = metrics_sums.pop("denominator")
    summary = jax.tree.map(lambda x: x / denominator, metrics_sums)
    summary["learning_rate"] = lr

    eval_results = evaluate(
        p_eval_step=p_eval_step,
        params=state.params,
        eval_ds=make_ds(1, 2, 16),
        num_eval_steps=2,
    )

    sources, predicted = translate_and_calculate_bleu(
        p_pred_step=p_pred_step,
        p_init_cache=p_init_cache,
        params=state.params,
        predict_ds=make_ds(2, 2, 16),
    )

    params = jax.device_get(jax_utils.unreplicate(state.params))
    out = {"params": params, "train": summary, "eval": eval_results}
    out |= {"predicted": predicted, "sources": sources}
    out = jax.device_get(out)
    print({k: float(np.sum([np.sum(x) for x in jax.tree.leaves(v)])) for k, v in out.items()})
    return out


if __name__ == "__main__":
    main()
