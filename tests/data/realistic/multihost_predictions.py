"""Multi-host predictions: each process predicts on its own examples (process_index slices) and
flattens its per-example predictions on the host; a psum of the logits is the same everywhere."""

import jax
import jax.numpy as jnp
import numpy as np
from flax import jax_utils
from flax.training import common_utils


def predict(params, x):
    logits = x @ params["w"]
    return jnp.argmax(logits, -1), jax.lax.psum(jnp.sum(logits), "batch")


def main():
    params = jax_utils.replicate({"w": np.arange(6, dtype=np.float32).reshape(3, 2) - 2.5})
    p_predict = jax.pmap(predict, axis_name="batch")
    per_process = 32 // jax.process_count()
    start = jax.process_index() * per_process
    x = (np.arange(96, dtype=np.float32).reshape(32, 3) - 40)[start : start + per_process]
    preds, total = p_predict(params, common_utils.shard(x))
    preds = np.asarray(preds).reshape(-1)
    print(jax.process_index(), preds.tolist(), float(total[0]))
    return preds, float(total[0])


if __name__ == "__main__":
    main()
