"""flax imagenet's `train_and_evaluate`, 2 steps and 1 evaluation on synthetic data, printing
every scalar it writes and, in place of its checkpoint, the sum of each leaf of the state."""

import os
import sys
import tempfile

import input_pipeline
import jax
import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds
import train
from configs import default

# tf.data's random crop and flip, in a parallel map, draw in a different order in every run, so
# two runs would see different batches: train on the eval preprocessing (a center crop) instead
input_pipeline.preprocess_for_train = input_pipeline.preprocess_for_eval
tf.config.experimental.set_visible_devices([], "GPU")


class PrintWriter:
    def write_scalars(self, step, scalars):
        for k in sorted(k for k in scalars if "per_second" not in k):  # a time, not a number
            print("step", step, k, repr(float(np.asarray(scalars[k]))))

    def write_hparams(self, *a, **k):
        pass

    def flush(self):
        pass

    def close(self):
        pass


train.metric_writers.create_default_writer = lambda *a, **k: PrintWriter()


def print_state(workdir, state, step, keep=3):
    """In place of saving the checkpoint: the sum of each leaf of the state (device 0's copy)."""
    leaves = {"params": state.params, "batch_stats": state.batch_stats}
    for path, leaf in jax.tree_util.tree_leaves_with_path(leaves):
        x = leaf.addressable_data(0) if isinstance(leaf, jax.Array) else leaf
        print(
            "saved", step, jax.tree_util.keystr(path), repr(float(np.asarray(x, np.float64).sum()))
        )


train.checkpoints.save_checkpoint_multiprocess = print_state

config = default.get_config()
config.model = "_ResNet1"
config.batch_size = 8 * jax.process_count()  # one image per simulated device of 8
config.num_epochs = 1
config.num_train_steps = 2
config.steps_per_eval = 1
config.log_every_steps = 1
config.shuffle_buffer_size = 8
config.prefetch = 1
config.profile = False

args = [a for a in sys.argv[1:] if not a.startswith("--")]
workdir = args[0] if args else tempfile.mkdtemp()
metadata = os.path.join(os.path.dirname(os.path.abspath(__file__)), "testdata", "metadata")
# 16 examples per split and process: 2 steps of 8 are one epoch, so the evaluation runs too
with tfds.testing.mock_data(num_examples=16 * jax.process_count(), data_dir=metadata):
    train.train_and_evaluate(config=config, workdir=workdir)
