# Per-example predictions read flattened on the host (`P("batch")` results): the step calls are
# compared through the layout adapters (blocks joined), and the program-level form is kept.
import jax
import jax.numpy as jnp
import numpy as np


def predict(params, batch):
    logits = batch @ params["w"] + params["b"]
    return jnp.argmax(logits, axis=-1), jax.nn.softmax(logits)


def main():
    n = jax.local_device_count()
    rng = np.random.default_rng(4)
    params = {"w": rng.normal(size=(5, 3)), "b": np.zeros(3)}
    params = jax.tree.map(lambda x: jnp.broadcast_to(x, (n,) + x.shape), params)
    p_predict = jax.pmap(predict, axis_name="batch")
    labels, probs = [], []
    for _ in range(2):
        x = rng.normal(size=(8 * 3, 5)).astype(np.float32)
        x = x.reshape((n, -1) + x.shape[1:])
        label, prob = p_predict(params, x)
        labels.append(label.reshape(-1))
        probs.append(prob.reshape((-1,) + prob.shape[2:]))
    return jnp.concatenate(labels), jnp.concatenate(probs)
