"""Modeled on HF transformers' examples/flax/language-modeling/run_clm_flax.py: bare `shard` and
`get_metrics` imports, per-device dropout keys made once with split(rng, local_device_count) and
carried from step to step as a result of the step, donate_argnums=(0,), metrics unreplicated
inside the loop at logging steps, psum'd eval metrics normalized on the host, and params read
with device_get(tree_map(lambda x: x[0], state.params)) at save steps."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import jax_utils, traverse_util
from flax import linen as nn
from flax.training import train_state
from flax.training.common_utils import get_metrics, onehot, shard, shard_prng_key

VOCAB = 13


class TinyCausalLM(nn.Module):
    @nn.compact
    def __call__(self, input_ids, deterministic=True):
        x = nn.Embed(VOCAB, 16)(input_ids)
        x = nn.Dense(16)(x)
        x = nn.Dropout(0.1)(x, deterministic=deterministic)
        return nn.Dense(VOCAB)(nn.gelu(x))


class TrainState(train_state.TrainState):
    dropout_rng: jnp.ndarray

    def replicate(self):
        return jax_utils.replicate(self).replace(dropout_rng=shard_prng_key(self.dropout_rng))


def data_loader(rng, input_ids, batch_size, shuffle=False):
    steps_per_epoch = len(input_ids) // batch_size
    if shuffle:
        batch_idx = np.random.default_rng(rng).permutation(len(input_ids))
    else:
        batch_idx = np.arange(len(input_ids))
    batch_idx = batch_idx[: steps_per_epoch * batch_size]
    batch_idx = batch_idx.reshape((steps_per_epoch, batch_size))
    for idx in batch_idx:
        batch = {"input_ids": input_ids[idx], "labels": input_ids[idx]}
        batch = shard(batch)
        yield batch


def main():
    rng = jax.random.PRNGKey(0)
    rng, dropout_rng = jax.random.split(rng)
    model = TinyCausalLM()
    params = model.init(rng, jnp.ones((1, 8), jnp.int32))["params"]
    linear_decay_lr_schedule_fn = optax.linear_schedule(
        init_value=0.05, end_value=0.0, transition_steps=8
    )

    def decay_mask_fn(params):
        flat_params = traverse_util.flatten_dict(params)
        flat_mask = {path: (path[-1] != "bias") for path in flat_params}
        return traverse_util.unflatten_dict(flat_mask)

    adamw = optax.adamw(
        learning_rate=linear_decay_lr_schedule_fn, weight_decay=0.01, mask=decay_mask_fn
    )
    state = TrainState.create(
        apply_fn=model.apply, params=params, tx=adamw, dropout_rng=dropout_rng
    )

    def loss_fn(logits, labels):
        shift_logits = logits[..., :-1, :]
        shift_labels = labels[..., 1:]
        loss = optax.softmax_cross_entropy(
            shift_logits, onehot(shift_labels, shift_logits.shape[-1])
        )
        return loss.mean()

    def train_step(state, batch):
        dropout_rng, new_dropout_rng = jax.random.split(state.dropout_rng)

        def compute_loss(params):
            labels = batch.pop("labels")
            logits = state.apply_fn(
                {"params": params},
                batch["input_ids"],
                deterministic=False,
                rngs={"dropout": dropout_rng},
            )
            loss = loss_fn(logits, labels)
            return loss

        grad_fn = jax.value_and_grad(compute_loss)
        loss, grad = grad_fn(state.params)
        grad = jax.lax.pmean(grad, "batch")
        new_state = state.apply_gradients(grads=grad, dropout_rng=new_dropout_rng)
        metrics = {"loss": loss, "learning_rate": linear_decay_lr_schedule_fn(state.step)}
        metrics = jax.lax.pmean(metrics, axis_name="batch")
        return new_state, metrics

    def eval_step(params, batch):
        labels = batch.pop("labels")
        logits = model.apply({"params": params}, batch["input_ids"], deterministic=True)
        loss = loss_fn(logits, labels)
        metrics = {"loss": loss}
        metrics = jax.lax.pmean(metrics, axis_name="batch")
        return metrics

    p_train_step = jax.pmap(train_step, "batch", donate_argnums=(0,))
    p_eval_step = jax.pmap(eval_step, "batch")
    state = state.replicate()

    data = np.random.default_rng(3).integers(0, VOCAB, size=(96, 8)).astype(np.int32)
    train_ids, eval_ids = data[:64], data[64:]
    history = []
    saved = None
    for epoch in range(2):
        train_metrics = []
        for step, batch in enumerate(data_loader(epoch, train_ids, 16, shuffle=True)):
            state, train_metric = p_train_step(state, batch)
            train_metrics.append(train_metric)
            cur_step = epoch * 4 + step
            if cur_step % 2 == 1:
                train_metric = jax_utils.unreplicate(train_metric)
                history.append(
                    (cur_step, float(train_metric["loss"]), float(train_metric["learning_rate"]))
                )
        eval_metrics = []
        for batch in data_loader(None, eval_ids, 16):
            metrics = p_eval_step(state.params, batch)
            eval_metrics.append(metrics)
        eval_metrics = get_metrics(eval_metrics)
        eval_metrics = jax.tree.map(jnp.mean, eval_metrics)
        history.append((epoch, float(eval_metrics["loss"])))
        saved = jax.device_get(jax.tree.map(lambda x: x[0], state.params))
    print(float(sum(np.sum(x) for x in jax.tree.leaves(saved))), history)
    return {"params": saved, "history": history}


if __name__ == "__main__":
    main()
