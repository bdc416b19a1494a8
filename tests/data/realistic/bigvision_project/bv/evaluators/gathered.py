"""As big_vision's uvim evaluators (psnr, nyu_depth): a step stored on self, all_gather'd."""

import jax
import jax.numpy as jnp
import numpy as np

from bv import input_pipeline


class Evaluator:
    """Mean per-example score of predictions gathered from every device."""

    def __init__(self, predict_fn, steps):
        def predict(params, batch):
            logits, _ = predict_fn(params, batch["image"])
            score = jnp.max(jax.nn.sigmoid(logits), axis=-1)
            return jax.lax.all_gather({"score": score}, axis_name="data", axis=0)

        self.predict_fn = jax.pmap(predict, axis_name="data")
        self.batches = list(input_pipeline.process_batches(11, steps, 16, 6, 5))

    def run(self, params):
        scores = []
        for batch in input_pipeline.start_input_pipeline(self.batches):
            out = self.predict_fn(params, batch)
            # Gathered from all devices: (devices, devices, per_device) on each device.
            scores.append(np.asarray(out["score"][0]).reshape(-1))
        yield ("score", float(np.mean(np.concatenate(scores))))
