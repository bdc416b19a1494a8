"""Run one of big_vision's trainers (2023, before its jit transition) on mock CIFAR-10, then
print the metrics the run measured (the metric writer's file), numbers to 6 significant digits,
without durations and without the row's `step` (big_vision's writer reads it in a thread when the
row is written, so it may already be the next step's).

    python big_vision_drive.py [flexi] [WORKDIR]

- `train.py` (the default): a ViT-Ti/16 on 32x32 images, 4 steps of 16 images, a checkpoint and
  a classification evaluation every 2 steps, and an evaluation at the end;
- `flexi`, the FlexiViT trainer (`trainers/proj/flexi/train.py`): a FlexiViT-Ti whose sequence
  length is drawn per step from two (`seqhw` 2 or 4: patches of 16 or 8 pixels, every star
  argument of its update step static), the same steps, checkpoints and evaluations (of sequence
  length 4). It reads `xm_xp.id` and `xm_wu.id` (XManager's experiment and work unit, not
  defined in the open-source file): this run gives both the id -1, as a local run has.

Run from a big_vision checkout that holds `testdata/cifar10/3.0.2` (`tfds_metadata.py cifar10
testdata 64 train,test`). big_vision imports `tensorflow_addons` for its autoaugment ops, which
this run does not use and which has no release for today's TensorFlow: an empty module stands in.
"""

import importlib
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

PP = 'decode|resize(32)|value_range(-1, 1)|onehot(10, key="label", key_result="labels")|keep("image", "labels")'
LEFT_OUT = ("uptime", "step")  # a duration; a number big_vision's writer may read late
TRAINERS = {"train": "big_vision.train", "flexi": "big_vision.trainers.proj.flexi.train"}


def config(trainer: str) -> ml_collections.ConfigDict:
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
    c.optax_name = "scale_by_adam"
    c.lr = 0.001
    c.wd = 0.0001
    c.schedule = {"warmup_steps": 1, "decay_type": "cosine"}
    c.grad_clip_norm = 1.0
    val = {
        "type": "classification",
        "data": {"name": "cifar10", "split": "test"},
        "pp_fn": PP,
        "loss_name": "softmax_xent",
        "log_steps": 2,
        "batch_size": 16,
    }
    if trainer == "flexi":
        c.model_name = "proj.flexi.vit"
        c.model = {"variant": "Ti", "pool_type": "tok", "patch_size": (8, 8)}
        c.flexi = ml_collections.ConfigDict({"seqhw": {"v": (2, 4), "p": (1, 1)}})
        val["pred"] = "predict_seqhw=4"  # the predict function of one sequence length
    else:
        c.model_name = "vit"
        c.model = {"variant": "Ti/16", "pool_type": "gap", "posemb": "sincos2d"}
    c.evals = ml_collections.ConfigDict({"val": val})
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
    args = sys.argv[1:]
    trainer = args.pop(0) if args and args[0] in TRAINERS else "train"
    workdir = args[0] if args else tempfile.mkdtemp()
    train = importlib.import_module(TRAINERS[trainer])
    if trainer == "flexi":
        train.xm_xp = train.xm_wu = types.SimpleNamespace(id=-1)
    flags.FLAGS(["train", f"--workdir={workdir}"])
    flags.FLAGS.config = config(trainer)
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
