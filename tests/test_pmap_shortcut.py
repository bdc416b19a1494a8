"""A code base mapping its functions through a shortcut for `jax.pmap`, as ferminet does.

`qmc/constants.py` binds `pmap = functools.partial(jax.pmap, axis_name=PMAP_AXIS_NAME)`;
`qmc/train.py` maps its step with `constants.pmap(train_step, donate_argnums=(0,))`, and two
helpers with `@functools.partial(constants.pmap)` and `@constants.pmap`; `qmc/density.py` calls
the shortcut without importing `jax`, `qmc/sampler.py` imports it by its name, not the constant
its keyword names (both left as they are, and said). No `jax.pmap` is written at those calls: the rule reads each
as the `jax.pmap(...)` call it makes (`codemods/pmap/_shortcut.py`), the axis by the name of the
constant the code base spells it with. The step takes the program-level form, the helpers, whose
results are read with their device axis, the per-device one; where nothing is applied, the calls
are written as they were. The migrated program gives the original's numbers, on one process and
as a 2-process job.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from clitools import jm
from programs import run_one, run_two, same

CONSTANTS = """\
import functools

import jax

PMAP_AXIS_NAME = "qmc_pmap_axis"

# Shortcut for jax.pmap over PMAP_AXIS_NAME.
pmap = functools.partial(jax.pmap, axis_name=PMAP_AXIS_NAME)
"""

DENSITY = """\
import functools

from jax import numpy as jnp

from qmc import constants


def make_density_step():
    @functools.partial(constants.pmap)
    def density(x):
        return jnp.mean(x, axis=0)

    return density
"""

SAMPLER = """\
import jax

from qmc.constants import pmap


@pmap
def walk(x):
    return x + jax.lax.axis_index("qmc_pmap_axis")
"""

TRAIN = """\
import functools
import json

import jax
import jax.numpy as jnp
import numpy as np

from qmc import constants


def loss_fn(params, batch):
    return jnp.mean((jnp.tanh(batch @ params["w"]) - 0.5) ** 2)


def train_step(params, batch):
    loss, grads = jax.value_and_grad(loss_fn)(params, batch)
    grads = jax.lax.pmean(grads, axis_name=constants.PMAP_AXIS_NAME)
    params = jax.tree.map(lambda p, g: p - 0.1 * g, params, grads)
    return params, jax.lax.pmean(loss, axis_name=constants.PMAP_AXIS_NAME)


def main():
    n = jax.local_device_count()
    rng = np.random.default_rng(0)
    params = {"w": rng.normal(size=(4, 2)).astype(np.float32)}
    step = constants.pmap(train_step, donate_argnums=(0,))
    params = jax.tree.map(lambda x: jnp.broadcast_to(x, (n,) + x.shape), params)
    losses = []
    for _ in range(3):
        batch = rng.normal(size=(8 * 16, 4)).astype(np.float32)
        params, loss = step(params, batch.reshape((n, -1) + batch.shape[1:]))
        losses.append(float(loss[0]))

    @functools.partial(constants.pmap)
    def spread(x):
        return x - jax.lax.pmean(x, constants.PMAP_AXIS_NAME)

    @constants.pmap
    def doubled(x):
        return 2 * x

    local = np.arange(n * 3, dtype=np.float32).reshape(n, 3) + jax.process_index()
    result = {
        "losses": losses,
        "w": np.asarray(params["w"][0]).tolist(),
        "spread": np.asarray(spread(local)).tolist(),
        "doubled": np.asarray(doubled(local)).tolist(),
    }
    print("RESULT", json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
"""


def project(root: Path) -> Path:
    (root / "pyproject.toml").write_text('[project]\nname = "qmc"\n')
    package = root / "qmc"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "constants.py").write_text(CONSTANTS)
    (package / "density.py").write_text(DENSITY)
    (package / "sampler.py").write_text(SAMPLER)
    (package / "train.py").write_text(TRAIN)
    return root


def texts(root: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted((root / "qmc").glob("*.py"))}


def test_every_call_through_the_shortcut_is_a_site(tmp_path: Path) -> None:
    root = project(tmp_path)
    proc = jm("run", "--dry-run", "--no-verify", "--no-cache", ".", cwd=root)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = {
        line.split(" JM202 ")[0]: line
        for line in proc.stdout.splitlines()
        if line.startswith("qmc/") and " JM202 " in line
    }
    shortcut, density, step = "qmc/constants.py:8:26", "qmc/density.py:9:5", "qmc/train.py:26:12"
    helpers = ("qmc/train.py:34:5", "qmc/train.py:38:5")  # `spread`, `doubled`
    sampler = "qmc/sampler.py:6:1"
    assert {shortcut, density, step, sampler, *helpers} <= set(lines), proc.stdout
    assert "its keywords name `PMAP_AXIS_NAME` of `qmc.constants`" in lines[sampler]
    assert "`pmap`, a shortcut for it, is read as the `jax.pmap(...)`" in lines[shortcut]
    assert "this module does not import `jax`" in lines[density]
    assert "(program-level)" in lines[step] and "P(constants.PMAP_AXIS_NAME)" in lines[step]
    for helper in helpers:
        assert "[PL401]" in lines[helper], lines[helper]


def test_calls_through_the_shortcut_left_unapplied_are_written_as_they_were(
    tmp_path: Path,
) -> None:
    root = project(tmp_path)
    before = texts(root)
    proc = jm("run", "--no-verify", "--no-cache", ".", cwd=root)  # unsafe: none applied
    assert "unsafe and not verified" in proc.stdout, proc.stdout + proc.stderr
    assert texts(root) == before


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The original program's numbers, then the migrated one's (verified by `main()`), on 1
    and 2 processes."""
    original = project(tmp_path_factory.mktemp("qmc-original"))
    migrated = project(tmp_path_factory.mktemp("qmc-migrated"))
    proc = jm("run", "--no-cache", "--verify-with", "python -m qmc.train", ".", cwd=migrated)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return {
        "report": proc.stdout,
        "files": texts(migrated),
        "original": (run_one(original, "qmc.train"), run_two(original, "qmc.train")),
        "migrated": (run_one(migrated, "qmc.train"), run_two(migrated, "qmc.train")),
    }


@pytest.mark.jax
def test_the_step_takes_the_program_level_form_and_the_helpers_the_per_device_one(
    runs: dict,
) -> None:
    train = runs["files"]["train.py"]
    assert "constants.pmap" not in train and "jax.pmap" not in train
    assert "broadcast_to" not in train and "[0]" not in train
    assert "jax.sharding.Mesh(jax.devices(), (constants.PMAP_AXIS_NAME,))" in train
    assert train.count("shard_map_per_device,") == 2  # `spread`, `doubled`
    assert runs["files"]["constants.py"] == CONSTANTS  # the shortcut stays
    assert runs["files"]["density.py"] == DENSITY
    statuses = [line for line in runs["report"].splitlines() if "qmc/train.py:" in line]
    assert len(statuses) >= 3 and all("[unsafe, verified]" in s for s in statuses), statuses


@pytest.mark.jax
def test_the_migrated_program_gives_the_original_numbers_on_one_process(runs: dict) -> None:
    same(runs["migrated"][0], runs["original"][0], "one process")


@pytest.mark.jax
def test_the_migrated_program_gives_the_original_numbers_as_a_two_process_job(
    runs: dict,
) -> None:
    for process, (got, want) in enumerate(zip(runs["migrated"][1], runs["original"][1])):
        same(got, want, f"process {process}")
