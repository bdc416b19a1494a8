"""Two training steps and one evaluation of `train_and_evaluate` on synthetic ImageNet data."""

import os
import sys
import tempfile

import input_pipeline
import tensorflow as tf
import tensorflow_datasets as tfds
import train
from configs import default

# tf.data's random crop and flip, in a parallel map, draw in a different order in every run, so
# two runs would see different batches: train on the eval preprocessing (a center crop) instead
input_pipeline.preprocess_for_train = input_pipeline.preprocess_for_eval

tf.config.experimental.set_visible_devices([], "GPU")

config = default.get_config()
config.model = "_ResNet1"
config.batch_size = 8  # one image per simulated device
config.num_epochs = 1
config.num_train_steps = 2
config.steps_per_eval = 1
config.log_every_steps = 1
config.shuffle_buffer_size = 8
config.prefetch = 1
config.profile = False

workdir = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp()
# 16 examples per split: 2 steps of 8 are one epoch, so the evaluation runs too
metadata = os.path.join(os.path.dirname(os.path.abspath(__file__)), "testdata", "metadata")
with tfds.testing.mock_data(num_examples=16, data_dir=metadata):
    train.train_and_evaluate(config=config, workdir=workdir)
print("trained 2 steps in", workdir)
