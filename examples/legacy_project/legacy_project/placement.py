"""Putting arrays on devices with the removed replicate/shard helpers."""

import jax
import numpy as np


def main():
    devices = jax.local_devices()
    table = np.arange(6.0, dtype=np.float32)
    replicated = jax.device_put_replicated(table, devices)
    shards = [np.full((3,), i, np.float32) for i in range(len(devices))]
    sharded = jax.device_put_sharded(shards, devices)
    return replicated, sharded


if __name__ == "__main__":
    print(main())
