"""Run big_vision's FlexiViT trainer (`trainers/proj/flexi/train.py`, 2023, before its jit
transition) on mock CIFAR-10: a FlexiViT-Ti on 32x32 images whose sequence length is drawn per
step from two (`seqhw` 2 or 4: patches of 16 or 8 pixels, every star argument of its update step
static), 4 steps of 16 images, a checkpoint and a classification evaluation (of sequence length
4) every 2 steps and at the end; then print the metrics the run measured, as
`big_vision_drive.py` does.

    python big_vision_flexi_drive.py [WORKDIR]

The trainer reads `xm_xp.id` and `xm_wu.id` (XManager's experiment and work unit, not defined in
the open-source file): this run gives both the id -1, as a local run has.

Run from a big_vision checkout that holds `testdata/cifar10/3.0.2` (`tfds_metadata.py cifar10
testdata 64 train,test`). big_vision imports `tensorflow_addons` for its autoaugment ops, which
this run does not use and which has no release for today's TensorFlow: an empty module stands in.
"""

import json
import os
import sys
import tempfile
import types

import jax
import ml_collections
import tensorflow_datasets as tfds
from absl import flags

addons = types.ModuleType("tensorflow_addons")
addons.image = types.ModuleType("tensorflow_addons.image")  # type: ignore[attr-defined]
sys.modules.setdefault("tensorflow_addons", addons)
sys.modules.setdefault("tensorflow_addons.image", addons.image)  # type: ignore[attr-defined]

from big_vision.trainers.proj.flexi import train

local = types.SimpleNamespace(id=-1)
train.xm_xp = train.xm_wu = local  # type: ignore[attr-defined]

PP = 'decode|resize(32)|value_range(-1, 1)|onehot(10, key="label", key_result="labels")|keep("image", "labels")'
LEFT_OUT = ("uptime", "step")  # a duration; a number big_vision's writer may read late


def config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.seed = 0
    c.total_steps = 4
    c.num_classes = 10
    c.loss = "softmax_xent"
    c.input = ml_collections.ConfigDict(
        {"data": {"name": "cifar10", "split": "train"}, "batch_size": 16, "pp": PP}
    )
    c.input.shuffle_buffer_size = None
    c.log_training_steps = 1
    c.ckpt_steps = 2  # the checkpoint's readback of the parameters runs
    c.model_name = "proj.flexi.vit"
    c.model = {"variant": "Ti", "pool_type": "tok", "patch_size": (8, 8)}
    c.flexi = ml_collections.ConfigDict({"seqhw": {"v": (2, 4), "p": (1, 1)}})
    c.optax_name = "scale_by_adam"
    c.lr = 0.001
    c.wd = 0.0001
    c.schedule = {"warmup_steps": 1, "decay_type": "cosine"}
    c.grad_clip_norm = 1.0
    c.evals = ml_collections.ConfigDict(
        {
            "val": {
                "type": "classification",
                "pred": "predict_seqhw=4",  # the predict function of one sequence length
                "data": {"name": "cifar10", "split": "test"},
                "pp_fn": PP,
                "loss_name": "softmax_xent",
                "log_steps": 2,
                "batch_size": 16,
            }
        }
    )
    return c


def shown(row: dict) -> str:
    keep = sorted(
        (k, v)
        for k, v in row.items()
        if not k.startswith("z/")
        and "secs" not in k
        and "core" not in k
        and "img/sec" not in k
        and k not in LEFT_OUT
    )
    return " ".join(f"{k} {v:.6g}" if isinstance(v, float) else f"{k} {v}" for k, v in keep)


def main() -> None:
    workdir = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp()
    flags.FLAGS(["train", f"--workdir={workdir}"])
    flags.FLAGS.config = config()
    data = os.path.join(os.getcwd(), "testdata")
    with tfds.testing.mock_data(num_examples=64, data_dir=data):
        train.main([])
    if jax.process_index() != 0:  # big_vision's metric writer writes on process 0 alone
        print(f"process {jax.process_index()}: trained, metrics written by process 0")
        return
    metrics = os.path.join(workdir, "big_vision_metrics.txt")
    with open(metrics) as handle:
        for line in handle:
            print(shown(json.loads(line)))


if __name__ == "__main__":
    main()
