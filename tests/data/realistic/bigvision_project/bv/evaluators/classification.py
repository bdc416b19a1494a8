"""As big_vision/evaluators/classification.py: a cached factory's pmapped eval function."""

from functools import lru_cache, partial

import jax
import jax.numpy as jnp
import numpy as np

import bv.utils as u
from bv import input_pipeline


# To avoid re-compiling the function for every new instance of the same
# evaluator on a different dataset!
@lru_cache(None)
def get_eval_fn(predict_fn, loss_name):
    """Produces eval function, also applies pmap."""

    @partial(jax.pmap, axis_name="batch")
    def _eval_fn(params, batch, labels, mask):
        logits, *_ = predict_fn(params, **batch)
        mask *= labels.max(axis=1)
        losses = getattr(u, loss_name)(logits=logits, labels=labels, reduction=False)
        loss = jax.lax.psum(losses * mask, axis_name="batch")
        top1_idx = jnp.argmax(logits, axis=1)
        top1_correct = jnp.take_along_axis(labels, top1_idx[:, None], axis=1)[:, 0]
        ncorrect = jax.lax.psum(top1_correct * mask, axis_name="batch")
        n = jax.lax.psum(mask, axis_name="batch")
        return ncorrect, loss, n

    return _eval_fn


class Evaluator:
    """Classification evaluator."""

    def __init__(self, predict_fn, steps, loss_name="sigmoid_xent"):
        batches = input_pipeline.process_batches(7, steps, 16, 6, 5)
        self.data = [dict(b, _mask=np.ones(len(b["labels"]), np.float32)) for b in batches]
        self.steps = steps
        self.eval_fn = get_eval_fn(predict_fn, loss_name)

    def run(self, params):
        """Computes all metrics."""
        data_iter = input_pipeline.start_input_pipeline([dict(b) for b in self.data])
        ncorrect, loss, nseen = 0, 0, 0
        for _, batch in zip(range(self.steps), data_iter):
            labels, mask = batch.pop("labels"), batch.pop("_mask")
            batch_ncorrect, batch_losses, batch_n = self.eval_fn(params, batch, labels, mask)
            ncorrect += np.sum(np.array(batch_ncorrect[0]))
            loss += np.sum(np.array(batch_losses[0]))
            nseen += np.sum(np.array(batch_n[0]))
        yield ("prec@1", ncorrect / nseen)
        yield ("loss", loss / nseen)
