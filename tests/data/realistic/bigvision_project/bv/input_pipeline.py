"""As big_vision/input_pipeline.py: batches split per local device, run ahead."""

import collections
import functools
import itertools

import jax


def prefetch_iterator(it, n):
    """Runs iterator `it` ahead for `n` steps. Adapted from flax."""
    if not n:
        yield from it
        return
    queue = collections.deque()

    def enqueue(n_steps):  # Enqueues *up to* `n` elements from the iterator.
        for data in itertools.islice(it, n_steps):
            queue.append(data)

    enqueue(n)  # Fill up the buffer.
    while queue:
        yield queue.popleft()
        enqueue(1)


def shard_and_put(x, shard=True):
    if shard:  # big_vision: einops.rearrange(x, "(d l) ... -> d l ...", d=...)
        x = x.reshape((jax.local_device_count(), -1) + x.shape[1:])
    return x


def start_input_pipeline(data, n_prefetch=1, shard=True):
    fn = functools.partial(shard_and_put, shard=shard)
    it = (jax.tree_util.tree_map(fn, elem) for elem in iter(data))
    return prefetch_iterator(it, n_prefetch)


def process_batches(seed, steps, global_batch, dim, classes):
    """This process's rows of each global batch (as `num_examples_per_process`)."""
    import numpy as np

    rng = np.random.RandomState(seed)
    per = global_batch // jax.process_count()
    first = jax.process_index() * per
    for _ in range(steps):
        images = rng.randn(global_batch, dim).astype(np.float32)
        labels = np.eye(classes, dtype=np.float32)[rng.randint(0, classes, global_batch)]
        yield {"image": images[first : first + per], "labels": labels[first : first + per]}
