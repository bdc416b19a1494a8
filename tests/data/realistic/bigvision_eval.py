"""Modeled on big_vision/evaluators/classification.py (pmap era): psum'd per-example losses,
correct counts and seen counts with a padding mask, read back with [0] and summed on the host."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import jax_utils as flax_utils


def predict_fn(params, images):
    h = jnp.tanh(images @ params["w1"] + params["b1"])
    return h @ params["w2"], {}


def softmax_xent(*, logits, labels, reduction=True):
    log_p = jax.nn.log_softmax(logits)
    nll = -jnp.sum(labels * log_p, axis=-1)
    return jnp.mean(nll) if reduction else nll


def pad_batch(images, labels, batch_size):
    n = images.shape[0]
    mask = np.concatenate([np.ones(n, np.float32), np.zeros(batch_size - n, np.float32)])
    pad = batch_size - n
    images = np.concatenate([images, np.zeros((pad,) + images.shape[1:], images.dtype)])
    labels = np.concatenate([labels, np.zeros((pad,) + labels.shape[1:], labels.dtype)])
    return {"image": images, "labels": labels, "_mask": mask}


@functools.partial(jax.pmap, axis_name="batch")
def eval_fn(params, images, labels, mask):
    logits, *_ = predict_fn(params, images)
    losses = softmax_xent(logits=logits, labels=labels, reduction=False)
    loss = jax.lax.psum(losses * mask, axis_name="batch")
    top1_idx = jnp.argmax(logits, axis=1)
    top1_correct = jnp.take_along_axis(labels, top1_idx[:, None], axis=1)[:, 0]
    ncorrect = jax.lax.psum(top1_correct * mask, axis_name="batch")
    n = jax.lax.psum(mask, axis_name="batch")
    return ncorrect, loss, n


def evaluate(params, dataset, batch_size):
    ncorrect, loss, nseen = 0, 0, 0
    params_repl = flax_utils.replicate(params)
    n = jax.local_device_count()
    for images, labels in dataset:
        batch = jax.tree.map(
            lambda x: x.reshape((n, -1) + x.shape[1:]), pad_batch(images, labels, batch_size)
        )
        batch_ncorrect, batch_losses, batch_n = eval_fn(
            params_repl, batch["image"], batch["labels"], batch["_mask"]
        )
        # All results are a replicated array shaped as batch size.
        ncorrect += np.sum(np.array(batch_ncorrect[0]))
        loss += np.sum(np.array(batch_losses[0]))
        nseen += np.sum(np.array(batch_n[0]))
    return {"prec@1": ncorrect / nseen, "loss": loss / nseen, "nseen": nseen}


def main():
    rng = np.random.RandomState(0)
    params = {
        "w1": rng.randn(6, 16).astype(np.float32) * 0.5,
        "b1": np.zeros(16, np.float32),
        "w2": rng.randn(16, 4).astype(np.float32) * 0.5,
    }
    dataset = []
    for size in (32, 32, 20):
        images = rng.randn(size, 6).astype(np.float32)
        labels = np.eye(4, dtype=np.float32)[rng.randint(0, 4, size=size)]
        dataset.append((images, labels))
    out = evaluate(params, dataset, batch_size=32)
    print(out)
    return out


if __name__ == "__main__":
    main()
