"""Synthetic MNIST for JAX's `examples/spmd_mnist_classifier_fromscratch.py`: copied over
`examples/datasets.py`, 1,024 training and 256 test images drawn with a fixed seed."""

import numpy as np


def mnist():
    rng = np.random.RandomState(0)
    train_images = rng.rand(1024, 784).astype(np.float32)
    test_images = rng.rand(256, 784).astype(np.float32)
    train_labels = np.eye(10, dtype=np.float32)[rng.randint(0, 10, 1024)]
    test_labels = np.eye(10, dtype=np.float32)[rng.randint(0, 10, 256)]
    return train_images, train_labels, test_images, test_labels
