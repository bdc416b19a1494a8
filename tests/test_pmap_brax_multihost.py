"""A brax-style trainer (agents/ppo, apg: `train()` as a whole program) migrated to the
program-level pmap form and proved on a real 2-process JAX job (tests/multihost.py).

The shapes brax writes: the mapped axis named by a module constant (`_PMAP_AXIS_NAME`), the step's
body a def nested in `train()` rebound by its own pmap (`training_epoch = jax.pmap(training_epoch,
...)`), the state replicated (brax: `jax.device_put_replicated`, which JAX 0.10 no longer runs, so
`flax.jax_utils.replicate` here) and read back as `jax.tree_util.tree_map(lambda x: x[0], ...)` (brax's `_unpmap`). Each process feeds its
own rows of every global batch. `jaxmigrate run --select pmap` leaves no device axis; every
process prints the same numbers before and after.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from clitools import jm
from multihost import JobResult, run_job

pytestmark = pytest.mark.jax

PROCESSES, DEVICES = 2, 8

PROGRAM = """\
import json

import jax
import jax.numpy as jnp
import numpy as np
from flax import jax_utils

_PMAP_AXIS_NAME = "i"


def train():
    rng = np.random.default_rng(0)
    w = rng.normal(size=(4,)).astype(np.float32)
    xs = rng.normal(size=(3, 8 * 16, 4)).astype(np.float32)
    rows = 16 * jax.local_device_count()
    mine = slice(jax.process_index() * rows, (jax.process_index() + 1) * rows)
    xs = xs[:, mine]

    def training_epoch(w, obs):
        grads = jax.lax.pmean(jnp.mean(obs, 0) * w, axis_name=_PMAP_AXIS_NAME)
        loss = jax.lax.pmean(jnp.mean(jnp.tanh(obs @ w)), axis_name=_PMAP_AXIS_NAME)
        return w - 0.1 * grads, loss

    training_epoch = jax.pmap(training_epoch, axis_name=_PMAP_AXIS_NAME)
    w = jax_utils.replicate(w)  # brax: jax.device_put_replicated (gone from JAX 0.10)
    losses = []
    for i in range(3):
        obs = xs[i]
        obs = obs.reshape((jax.local_device_count(), -1) + obs.shape[1:])
        w, loss = training_epoch(w, obs)
        losses.append(loss[0])
    return jax.tree_util.tree_map(lambda x: x[0], w), losses


w, losses = train()
out = {"w": np.asarray(w).tolist(), "losses": [float(v) for v in losses]}
print("RESULT", json.dumps(out), flush=True)
"""


def results(job: JobResult) -> list[dict]:
    job.check()
    found = []
    for out in job.stdouts:  # gloo writes its own lines to stdout
        (line,) = [line for line in out.splitlines() if line.startswith("RESULT ")]
        found.append(json.loads(line.removeprefix("RESULT ")))
    return found


def test_the_brax_style_trainer_gives_the_same_numbers_after_the_program_level_form(
    tmp_path: Path,
) -> None:
    before = tmp_path / "before" / "train.py"
    before.parent.mkdir()
    before.write_text(PROGRAM)
    root = tmp_path / "after"
    root.mkdir()
    (root / "pyproject.toml").write_text('[project]\nname = "trainer"\n')
    (root / "train.py").write_text(PROGRAM)
    proc = jm(
        "run", "--unsafe-fixes", "--no-verify", "--no-cache", "--select", "pmap", ".", cwd=root
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    code = (root / "train.py").read_text()
    assert sorted(p.name for p in root.iterdir()) == ["pyproject.toml", "train.py"]
    for gone in ("jax.pmap", "shard_map_per_device", "replicate", "jax_utils", "[0]", "reshape("):
        assert gone not in code, gone
    assert "P(_PMAP_AXIS_NAME)" in code and "jax.make_array_from_process_local_data(" in code
    old = results(run_job(before, processes=PROCESSES, devices=DEVICES, timeout=300))
    new = results(run_job(root / "train.py", processes=PROCESSES, devices=DEVICES, timeout=300))
    assert len(old) == len(new) == PROCESSES
    for process, (a, b) in enumerate(zip(old, new, strict=True)):
        for key in ("w", "losses"):
            np.testing.assert_allclose(
                np.asarray(b[key]),
                np.asarray(a[key]),
                rtol=1e-5,
                atol=1e-6,
                err_msg=f"process {process}: {key}",
            )
    assert old[0] == old[1]  # the replicated state and the pmean-ed losses: one job's numbers
