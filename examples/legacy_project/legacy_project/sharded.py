"""Model-parallel matmul with pjit under a legacy `with mesh:` context."""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import PartitionSpec as P
from jax.experimental.maps import Mesh
from jax.experimental.pjit import pjit


def layer(x, w):
    return jnp.tanh(x @ w)


def main():
    devices = np.array(jax.devices()[:8]).reshape(4, 2)
    mesh = Mesh(devices, ("data", "model"))
    x = np.ones((16, 8), np.float32)
    w = np.full((8, 4), 0.5, np.float32)
    with mesh:
        f = pjit(layer, in_axis_resources=(P("data", None), P(None, "model")),
                 out_axis_resources=P("data", "model"))
        return f(x, w)


if __name__ == "__main__":
    print(main())
