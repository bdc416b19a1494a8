"""Two training steps, two evaluations and two predictions of flax's `examples/lm1b`
`train_and_evaluate` on mock data (flax's own `train_test.py` settings, sized for 8 devices),
printing what the program logs: each metric, to 6 significant digits, and the samples.

Deterministic: `tf.data` shuffles with the global seed and deterministic ops. Run as
`python drive.py [WORKDIR] [--no-checkpoints]` in a copy of `examples/lm1b` holding
`testdata/metadata` (`tfds_metadata.py lm1b testdata/metadata 128 train,test`). On 2
processes the original cannot save its checkpoint with today's flax and orbax ("Cannot
serialize host local jax.Array ... in multi-host setting"): `--no-checkpoints` there.
"""

import pathlib
import sys
import tempfile

import tensorflow as tf
import tensorflow_datasets as tfds
import train
from clu import metric_writers
from configs import default


class Printed(metric_writers.MetricWriter):
    """A metric writer that prints, so that a run shows its numbers."""

    def write_scalars(self, step, scalars):
        for key in sorted(scalars):
            print(f"step {step} {key} {float(scalars[key]):.6g}", flush=True)

    def write_texts(self, step, texts):
        for key in sorted(texts):
            print(f"step {step} {key} {texts[key]!r}", flush=True)

    def write_summaries(self, *args, **kwargs):
        pass

    def write_images(self, *args, **kwargs):
        pass

    def write_videos(self, *args, **kwargs):
        pass

    def write_audios(self, *args, **kwargs):
        pass

    def write_histograms(self, *args, **kwargs):
        pass

    def write_hparams(self, *args, **kwargs):
        pass

    def flush(self):
        pass

    def close(self):
        pass


metric_writers.create_default_writer = lambda *args, **kwargs: Printed()
tf.config.experimental.set_visible_devices([], "GPU")
tf.random.set_seed(0)
tf.config.experimental.enable_op_determinism()

config = default.get_config()
config.max_corpus_chars = 1000
config.vocab_size = 32
config.per_device_batch_size = 2
config.eval_per_device_batch_size = 2
config.num_train_steps = 2
config.num_eval_steps = 1
config.num_predict_steps = 1
config.num_layers = 1
config.qkv_dim = 128
config.emb_dim = 128
config.mlp_dim = 512
config.num_heads = 2
config.max_target_length = 32
config.max_eval_target_length = 32
config.max_predict_length = 32
config.eval_every_steps = 2
config.checkpoint_every_steps = 1000  # the last step saves: its readback runs
config.save_checkpoints = "--no-checkpoints" not in sys.argv
args = [a for a in sys.argv[1:] if a != "--no-checkpoints"]
workdir = args[0] if args else tempfile.mkdtemp()
data_dir = str(pathlib.Path(__file__).parent / "testdata" / "metadata")
with tfds.testing.mock_data(num_examples=128, data_dir=data_dir):
    train.train_and_evaluate(config, workdir)
