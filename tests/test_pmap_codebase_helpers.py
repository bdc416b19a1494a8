"""A big_vision-shaped trainer whose step reads helpers of another module of its code base.

`bv/train.py` is big_vision's `train.py` in small: its params are made on the host by
`jax.jit(..., backend="cpu")` (committed to one device), its step calls `u.mixup(rng, ...)` of
`bv/utils.py` (the key it returns is split from the replicated key alone), it waits with
`u.chrono.pause(wait_for=(params_repl, opt_repl))` and with a `Chrono` of its own, logs
`for name, value in measurements.items(): value[0]`, and passes `params_repl` to
`evaluator.run(...)` of `bv/evaluator.py`, whose own pmap the analysis does not follow.

`jaxmigrate run` takes the program-level form for the trainer's step: the helpers of `utils.py`
are read where they are defined (`FileState.modules`), the host-made params are copied to the host
(`jax.device_get`, where deleting the replication would hand `jax.jit` a value committed to one
device), and the evaluator gets the copies per device it had under pmap (`device_copies`). The
original and the migrated program print the same numbers, on one process and as a 2-process job.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from clitools import jm
from programs import run_one, run_two, same

pytestmark = pytest.mark.jax

UTILS = '''\
import jax
import jax.numpy as jnp


class Chrono:
    def __init__(self):
        self.paused = 0

    def pause(self, wait_for=()):
        assert self.paused == 0, "Don't pause twice."
        jax.block_until_ready(wait_for)
        self.paused = 1

    def resume(self):
        self.paused = 0


chrono = Chrono()


def mixup(rng, *things, p=0.1, fold_in=None, n=2, **more_things):
    """big_vision's mixup: a new key, the things mixed."""
    rng, rng_m = jax.random.split(rng, 2)
    if fold_in == "device":
        rng_m = jax.random.fold_in(rng_m, jax.lax.axis_index("batch"))
    alpha = jax.random.dirichlet(rng_m, jnp.array([p] * n), (1,))
    alpha = -jnp.sort(-alpha, axis=-1)

    def mix(batch):
        if batch is None:
            return None
        return sum(alpha[:, i] * jnp.roll(batch, i, axis=0) for i in range(n))

    return rng, map(mix, things), {k: mix(v) for k, v in more_things.items()}
'''

EVALUATOR = """\
import functools

import jax
import jax.numpy as jnp
import numpy as np


class Evaluator:
    def __init__(self, xs):
        self.xs = xs

        @functools.partial(jax.pmap, axis_name="batch")
        def eval_fn(params, x):
            return jax.lax.psum(jnp.sum(jnp.tanh(x @ params["w"])), "batch")

        self.eval_fn = eval_fn

    def run(self, params):
        n = jax.local_device_count()
        total = self.eval_fn(params, self.xs.reshape(n, -1, self.xs.shape[-1]))
        yield "score", float(np.asarray(total)[0])
"""

TRAIN = """\
import functools
import json

import flax
import jax
import jax.numpy as jnp
import numpy as np

import bv.utils as u
from bv.evaluator import Evaluator


def batches(xs, ys):
    n = jax.local_device_count()
    for x, y in zip(xs, ys):
        yield {"image": x.reshape(n, -1, x.shape[-1]), "labels": y.reshape(n, -1, y.shape[-1])}


def main():
    rng = np.random.default_rng(0)
    xs = rng.normal(size=(3, 64, 4)).astype(np.float32)
    ys = rng.normal(size=(3, 64, 2)).astype(np.float32)
    rows = 64 // jax.process_count()
    mine = slice(jax.process_index() * rows, (jax.process_index() + 1) * rows)
    train_iter = batches(xs[:, mine], ys[:, mine])
    evaluator = Evaluator(xs[0, mine])
    chrono = u.Chrono()

    @functools.partial(jax.jit, backend="cpu")
    def init(key):
        return {"w": jax.random.normal(key, (4, 2)) * 0.1}

    params_cpu = init(jax.random.PRNGKey(0))
    opt_cpu = jax.jit(lambda p: jax.tree.map(jnp.zeros_like, p), backend="cpu")(params_cpu)

    @functools.partial(jax.pmap, axis_name="batch", donate_argnums=(0, 1))
    def update_fn(params, opt, rng, images, labels):
        measurements = {}
        rng, (images, labels), _ = u.mixup(rng, images, labels, p=0.2)
        rng, rng_model = jax.random.split(rng, 2)
        noise = jax.random.normal(rng_model, ())

        def loss_fn(params):
            return jnp.mean((jnp.tanh(images @ params["w"]) - labels) ** 2) * (1.0 + 0.01 * noise)

        l, grads = jax.value_and_grad(loss_fn)(params)
        l, grads = jax.lax.pmean((l, grads), axis_name="batch")
        opt = jax.tree.map(lambda m, g: 0.9 * m + g, opt, grads)
        params = jax.tree.map(lambda p, m: p - 0.1 * m, params, opt)
        measurements["l2_grads"] = jnp.sqrt(sum(jnp.vdot(g, g) for g in jax.tree.leaves(grads)))
        return params, opt, rng, l, measurements

    params_repl = flax.jax_utils.replicate(params_cpu)
    opt_repl = flax.jax_utils.replicate(opt_cpu)
    rngs_loop = flax.jax_utils.replicate(jax.random.PRNGKey(1))

    log = {"loss": [], "l2_grads": [], "score": []}
    for step, batch in zip(range(1, 4), train_iter):
        params_repl, opt_repl, rngs_loop, loss_value, measurements = update_fn(
            params_repl, opt_repl, rngs_loop, batch["image"], batch["labels"])
        log["loss"].append(float(loss_value[0]))
        for name, value in measurements.items():
            log[name].append(float(value[0]))
        u.chrono.pause(wait_for=(params_repl, opt_repl))
        params_cpu = jax.tree.map(lambda x: np.array(x[0]), params_repl)
        u.chrono.resume()
        chrono.pause(wait_for=params_repl)
        for key, value in evaluator.run(params_repl):
            log[key].append(value)
        chrono.resume()
    log["w"] = np.asarray(params_cpu["w"]).tolist()
    print("RESULT", json.dumps(log), flush=True)


if __name__ == "__main__":
    main()
"""


def project(root: Path) -> Path:
    (root / "pyproject.toml").write_text('[project]\nname = "bv"\n')
    package = root / "bv"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "utils.py").write_text(UTILS)
    (package / "evaluator.py").write_text(EVALUATOR)
    (package / "train.py").write_text(TRAIN)
    return root


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The original program's numbers, then the migrated one's, on 1 and 2 processes."""
    original = project(tmp_path_factory.mktemp("bv-original"))
    migrated = project(tmp_path_factory.mktemp("bv-migrated"))
    proc = jm("run", "--unsafe-fixes", "--no-verify", "--no-cache", ".", cwd=migrated)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return {
        "messages": proc.stdout + proc.stderr,
        "train": (migrated / "bv" / "train.py").read_text(),
        "original": (run_one(original, "bv.train"), run_two(original, "bv.train")),
        "migrated": (run_one(migrated, "bv.train"), run_two(migrated, "bv.train")),
    }


def test_the_trainer_takes_the_program_level_form_past_its_code_base_helpers(runs: dict) -> None:
    code = runs["train"]
    assert "partial(jax.pmap" not in code and "_pmap_compat" not in code
    assert "replicate(" not in code and "[0]" not in code
    assert "jax.jit(jax.shard_map" in code or "jax.shard_map," in code
    # the host-made (committed) values are handed to the step from the host
    assert "params_repl = jax.device_get(params_cpu)" in code
    assert "opt_repl = jax.device_get(opt_cpu)" in code
    # the evaluator, whose pmap is not followed, gets the copies per device it had
    assert "evaluator.run(device_copies(params_repl))" in code
    assert "def device_copies(tree):" in code
    # the waits and the mixup's key read nothing of a layout: no copies made for them
    assert "u.chrono.pause(wait_for=(params_repl, opt_repl))" in code
    assert "chrono.pause(wait_for=params_repl)" in code
    assert "`params_repl` is passed to `evaluator.run(...)`" in runs["messages"]


def test_the_migrated_trainer_gives_the_original_numbers_on_one_process(runs: dict) -> None:
    same(runs["migrated"][0], runs["original"][0], "one process")


def test_the_migrated_trainer_gives_the_original_numbers_as_a_two_process_job(runs: dict) -> None:
    for process, (got, want) in enumerate(zip(runs["migrated"][1], runs["original"][1])):
        same(got, want, f"process {process}")
    same(runs["original"][1][0], runs["original"][0], "the job against one process")
