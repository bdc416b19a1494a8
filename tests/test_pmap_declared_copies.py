"""A project that declares the layout its callers pass across a boundary no analysis sees through.

big_vision's trainers pick each evaluator by the name in the config (`importlib`) and call
`evaluator.run(params_repl)`: the evaluator's `params` come from code the analysis of its module
cannot reach (PL301). `[tool.jaxmigrate] pmap-replicated = ["Evaluator.run(params)"]` says what
every caller passes there: equal copies of one value, one per local device (pmap's layout of a
replicated value). `bv/evaluators/mean.py`, big_vision's uvim `compute_mean` evaluator in small
(a decorated step called in the generator `run`, its batches split per device by the
evaluator's pipeline, a list of metrics read back at once), then takes the program-level form:
`params = from_device_copies(params)` at the entry of `run`, its callers unchanged. The trainer
takes it too and hands the evaluator the copies it had (`device_copies`).

`bv/evaluators/classification.py` is big_vision's classification evaluator in small: its step
is made by a public factory (`@lru_cache get_eval_fn`, a module of a package, so code outside
the code base might call it) and stored on `self`. `closed-code-base = true` says nothing
outside imports the code base's modules: its files are read for the uses they make of the
factory (the trainer's `importlib.import_module(f"bv.evaluators.{name}")` reads only
`.Evaluator`), and the step takes the program-level form too. The original and the migrated
program print the same numbers on one process and as a 2-process job.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from clitools import jm
from programs import run_one, run_two, same

from jaxmigrate.model import Options
from jaxmigrate.pipeline.engine import migrate_source

pytestmark = pytest.mark.jax

EVALUATOR = '''\
import functools

import jax
import jax.numpy as jnp
import numpy as np


@functools.partial(jax.pmap, static_broadcasted_argnums=0, axis_name="batch")
def _run_predict_fn(predict_fn, params, batch):
    """Sum per-example metrics weighted by `_mask`."""
    mask = batch["_mask"]
    metrics = predict_fn(params, batch)
    metrics = {**metrics, "_mask": mask}
    metrics = jax.tree.map(lambda x: jnp.inner(x, mask), metrics)
    return jax.lax.psum(metrics, axis_name="batch")


def pipeline(xs, ys):
    n = jax.local_device_count()
    for x, y in zip(xs, ys):
        mask = (np.abs(y) < 1.5).astype(np.float32)
        yield {"x": x.reshape(n, -1, x.shape[-1]), "y": y.reshape(n, -1), "_mask": mask.reshape(n, -1)}


class Evaluator:
    def __init__(self, predict_fn, xs, ys):
        self.data_iter = pipeline(xs, ys)
        self.steps = len(xs)
        self.predict_fn = predict_fn

    def run(self, params):
        """Computes all metrics."""
        metrics = []
        for _, batch in zip(range(self.steps), self.data_iter):
            batch_metrics = _run_predict_fn(self.predict_fn, params, batch)
            metrics.append(batch_metrics)

        # Transfer metrics from device 0 to host (blocking).
        metrics = jax.device_get(jax.tree.map(lambda x: x[0], metrics))

        metrics_sum = jax.tree.map(lambda *x: np.sum(x), *metrics)
        mask_sum = metrics_sum.pop("_mask")
        for key, value_sum in metrics_sum.items():
            yield (key, value_sum / mask_sum)
'''

TRAIN = """\
import functools
import importlib
import json

import jax
import jax.numpy as jnp
import numpy as np
from flax import jax_utils


def predict(params, batch):
    return {"err": jnp.abs(batch["x"] @ params["w"] - batch["y"])}


def batches(xs, ys):
    n = jax.local_device_count()
    for x, y in zip(xs, ys):
        yield {"x": x.reshape(n, -1, x.shape[-1]), "y": y.reshape(n, -1)}


def main():
    rng = np.random.default_rng(0)
    xs = rng.normal(size=(3, 64, 4)).astype(np.float32)
    ys = rng.normal(size=(3, 64)).astype(np.float32)
    rows = 64 // jax.process_count()
    mine = slice(jax.process_index() * rows, (jax.process_index() + 1) * rows)
    evaluators = []
    for name in ("mean", "classification"):
        module = importlib.import_module(f"bv.evaluators.{name}")  # by the name in the config
        evaluators.append((name, module.Evaluator(predict, xs[:, mine], ys[:, mine])))

    @functools.partial(jax.pmap, axis_name="batch")
    def update_fn(params, batch):
        def loss(p):
            return jnp.mean((batch["x"] @ p["w"] - batch["y"]) ** 2)

        grads = jax.lax.pmean(jax.grad(loss)(params), "batch")
        return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads)

    params_repl = jax_utils.replicate({"w": jnp.zeros((4,))})
    for batch in batches(xs[:, mine], ys[:, mine]):
        params_repl = update_fn(params_repl, batch)
    log = {}
    for name, evaluator in evaluators:
        for key, value in evaluator.run(params_repl):
            log[f"{name}/{key}"] = value
    log["w"] = np.asarray(jax_utils.unreplicate(params_repl)["w"]).tolist()
    print("RESULT", json.dumps({k: np.asarray(v).tolist() for k, v in log.items()}), flush=True)


if __name__ == "__main__":
    main()
"""

CLASSIFICATION = '''\
from functools import lru_cache, partial

import jax
import numpy as np


# To avoid re-compiling the function for every new instance of the same evaluator
@lru_cache(None)
def get_eval_fn(predict_fn):
    """Produces eval function, also applies pmap."""

    @partial(jax.pmap, axis_name="batch")
    def _eval_fn(params, batch, mask):
        err = predict_fn(params, batch)["err"]
        loss = jax.lax.psum(err * mask, axis_name="batch")
        n = jax.lax.psum(mask, axis_name="batch")
        return loss, n

    return _eval_fn


def pipeline(xs, ys):
    n = jax.local_device_count()
    for x, y in zip(xs, ys):
        mask = (np.abs(y) < 1.0).astype(np.float32)
        yield {"x": x.reshape(n, -1, x.shape[-1]), "y": y.reshape(n, -1), "_mask": mask.reshape(n, -1)}


class Evaluator:
    def __init__(self, predict_fn, xs, ys):
        self.data_iter = pipeline(xs, ys)
        self.steps = len(xs)
        self.eval_fn = get_eval_fn(predict_fn)

    def run(self, params):
        """Computes all metrics."""
        loss, nseen = 0, 0
        for _, batch in zip(range(self.steps), self.data_iter):
            mask = batch.pop("_mask")
            batch_losses, batch_n = self.eval_fn(params, batch, mask)
            # replicated: take the first device's copy to the host
            loss += np.sum(np.array(batch_losses[0]))
            nseen += np.sum(np.array(batch_n[0]))
        yield ("loss", loss / nseen)
'''

DECLARED = (
    '[tool.jaxmigrate]\npmap-replicated = ["Evaluator.run(params)"]\nclosed-code-base = true\n'
)


def project(root: Path) -> Path:
    (root / "pyproject.toml").write_text('[project]\nname = "bv"\n\n' + DECLARED)
    package = root / "bv"
    (package / "evaluators").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "evaluators" / "__init__.py").write_text("")
    (package / "evaluators" / "mean.py").write_text(EVALUATOR)
    (package / "evaluators" / "classification.py").write_text(CLASSIFICATION)
    (package / "train.py").write_text(TRAIN)
    return root


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The original program's numbers, then the migrated one's, on 1 and 2 processes."""
    original = project(tmp_path_factory.mktemp("declared-original"))
    migrated = project(tmp_path_factory.mktemp("declared-migrated"))
    proc = jm("run", "--unsafe-fixes", "--no-verify", "--no-cache", ".", cwd=migrated)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return {
        "messages": proc.stdout + proc.stderr,
        "evaluator": (migrated / "bv" / "evaluators" / "mean.py").read_text(),
        "classification": (migrated / "bv" / "evaluators" / "classification.py").read_text(),
        "train": (migrated / "bv" / "train.py").read_text(),
        "original": (run_one(original, "bv.train"), run_two(original, "bv.train")),
        "migrated": (run_one(migrated, "bv.train"), run_two(migrated, "bv.train")),
    }


def test_the_declared_evaluator_takes_the_program_level_form(runs: dict) -> None:
    code = runs["evaluator"]
    assert "partial(jax.pmap" not in code and "_pmap_compat" not in code
    assert "lambda x: x[0]" not in code  # the readback
    assert '"""Computes all metrics."""\n        params = from_device_copies(params)\n' in code
    assert "def from_device_copies(tree):" in code
    assert "metrics = jax.device_get(metrics)" in code
    assert "pmap-replicated`), -> one value at the entry of `run`" in runs["messages"]
    # the trainer hands it the copies per device it had under pmap
    assert "evaluator.run(device_copies(params_repl))" in runs["train"]


def test_the_public_factory_of_a_closed_code_base_takes_the_program_level_form(runs: dict) -> None:
    code = runs["classification"]
    assert "partial(jax.pmap" not in code and "_pmap_compat" not in code
    assert "@jax.jit\n    @partial(\n        jax.shard_map," in code  # still made by the factory
    assert "self.eval_fn = get_eval_fn(predict_fn)" in code  # stored as it was
    assert "params = from_device_copies(params)" in code
    assert "loss += np.sum(np.array(batch_losses))" in code  # the readback of device 0 gone
    assert "with jax.set_mesh(mesh):" in code


def test_a_code_base_not_closed_keeps_the_public_factory_faithful(tmp_path: Path) -> None:
    root = project(tmp_path)
    (root / "pyproject.toml").write_text(
        '[project]\nname = "bv"\n\n[tool.jaxmigrate]\npmap-replicated = ["Evaluator.run(params)"]\n'
    )
    proc = jm("run", "--dry-run", "--no-verify", "--no-cache", "bv/evaluators", cwd=root)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (
        "classification.py:12:5 JM202 pmap [unsafe, unverified] `jax.pmap` -> `jax.jit` of "
        "`shard_map_per_device`" in proc.stdout
    )
    assert (
        "[PL201] the step is returned by `get_eval_fn`, which is also called from outside the code "
        "base maybe (`bv.evaluators.classification` is in package `bv`); `[tool.jaxmigrate] "
        "closed-code-base = true` says no code there does" in proc.stdout
    )


def test_without_the_declaration_the_evaluator_says_what_blocks_it() -> None:
    result = migrate_source(EVALUATOR, options=Options(unsafe_fixes=True))
    assert "shard_map_per_device(" in result.code
    message = result.sites[0].message
    assert (
        "[PL301] argument 2 of the step comes from elsewhere (`params`, a parameter of `run`)"
        in message
    )
    assert message.endswith('`pmap-replicated = ["Evaluator.run(params)"]`'), "the entry to write"
    declared = Options(unsafe_fixes=True, pmap_replicated=("Evaluator.run(params)",))
    assert "params = from_device_copies(params)" in migrate_source(EVALUATOR, options=declared).code
    other = Options(unsafe_fixes=True, pmap_replicated=("Evaluator.evaluate(params)",))
    assert "shard_map_per_device(" in migrate_source(EVALUATOR, options=other).code


UPDATE = """\
import functools

import jax
import jax.numpy as jnp
import numpy as np


@functools.partial(jax.pmap, axis_name="batch")
def step(params, batch):
    grads = jax.lax.pmean(jax.grad(lambda p: jnp.mean((batch @ p) ** 2))(params), "batch")
    return params - 0.1 * grads


def update(params, seed):
    flat = np.random.default_rng(seed).normal(size=(32, 4)).astype(np.float32)
    batch = flat.reshape((jax.local_device_count(), -1) + flat.shape[1:])
    new = step(params, batch)
    return new
"""


def test_a_declared_def_returning_the_step_result_keeps_the_per_device_form() -> None:
    # The callers the entry speaks of pass copies and get the step's stacked result back: the
    # program-level form would hand them one value where they read copies, and they are not seen.
    declared = Options(unsafe_fixes=True, pmap_replicated=("update(params)",))
    result = migrate_source(UPDATE, options=declared)
    assert "shard_map_per_device" in result.code
    assert "from_device_copies" not in result.code
    assert (
        "[PL401] `new` is returned by `update` with its device axis, and `update`'s result is "
        "read by the callers `[tool.jaxmigrate] pmap-replicated` says pass it copies"
        in result.sites[0].message
    )


def test_no_entry_is_offered_where_it_would_not_take_the_form() -> None:
    # Undeclared, `update`'s PL301 does not end with a `pmap-replicated` entry to write: declared,
    # the site would be PL401 (above), so the message says why instead (AlgoPerf's
    # `update_params` returns the new parameters to its runner).
    (undeclared,) = [s.message for s in migrate_source(UPDATE, options=Options()).sites]
    assert "[PL301] argument 1 of the step comes from elsewhere (`params`" in undeclared
    assert "pmap-replicated = [" not in undeclared, undeclared
    assert undeclared.endswith(
        "; a `pmap-replicated` entry would not take it: `update` returns the step's results "
        "(`new`) to its callers, who hold them with a device axis (PL401)"
    ), undeclared
    # Read back before it is returned, the result is one value: the entry is offered, and takes it
    read = UPDATE.replace("    return new\n", "    return new[0]\n")
    (offered,) = [s.message for s in migrate_source(read, options=Options()).sites]
    assert offered.endswith('`pmap-replicated = ["update(params)"]`'), offered
    declared = Options(unsafe_fixes=True, pmap_replicated=("update(params)",))
    assert "(program-level)" in migrate_source(read, options=declared).sites[0].message


EVALUATE = """\
import functools

import jax
import jax.numpy as jnp
import numpy as np


@functools.partial(jax.pmap, axis_name="batch")
def evaluate_step(params, batch):
    return jax.lax.pmean(jnp.mean((batch @ params) ** 2), "batch")


def evaluate(params, seed):
    flat = np.random.default_rng(seed).normal(size=(32, 4)).astype(np.float32)
    batch = flat.reshape((jax.local_device_count(), -1) + flat.shape[1:])
    loss = evaluate_step(params, batch)
    return loss[0], params
"""


def test_a_declared_parameter_read_other_than_by_the_step_keeps_the_per_device_form() -> None:
    # `params` becomes one value at the entry of `evaluate`: every other read of it is followed
    # as a replicated value's is, and returning it would hand the caller one value for copies.
    declared = Options(unsafe_fixes=True, pmap_replicated=("evaluate(params)",))
    result = migrate_source(EVALUATE, options=declared)
    assert "from_device_copies" not in result.code
    assert (
        "[PL303] `params`, replicated for the step, is read other than passed to it: read in "
        "`return loss[0], params`" in result.sites[0].message
    )
    kept = EVALUATE.replace("return loss[0], params", "return loss[0]")
    assert "params = from_device_copies(params)" in migrate_source(kept, options=declared).code


def test_the_migrated_program_gives_the_original_numbers_on_one_process(runs: dict) -> None:
    same(runs["migrated"][0], runs["original"][0], "one process")


def test_the_migrated_program_gives_the_original_numbers_as_a_two_process_job(runs: dict) -> None:
    for process, (got, want) in enumerate(zip(runs["migrated"][1], runs["original"][1])):
        same(got, want, f"process {process}")
    same(runs["original"][1][0], runs["original"][0], "the job against one process")
