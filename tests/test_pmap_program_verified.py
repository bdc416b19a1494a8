"""`jaxmigrate run`, verification on, writes every program-level fixture as its `.expected.py`,
each site `verified`.

The fixture tests check the rewrite's text; the realistic-program tests run `main()` before and
after `--unsafe-fixes`. Neither asked whether verification lets the program-level form through,
and at 13b7755 it did for 44 of the 68 program-level fixtures: a step made outside the function
calling it (at module level, stored on `self`) was also run alone, on pmap's stacked inputs
with no mesh set, and raised ("The context mesh cannot be empty"), as did a function whose mesh
its caller sets; a stored step's sites were "cannot be run alone: it needs an instance"; a step
made at import was never captured, so its calls compared as missing; a Python number passed
where pmap took stacked copies compared as a different type. Each group then fell back to the
faithful form (PL603) or stayed unwritten (`unverified`). A program-level group's sites are
now judged through the module's `main()` running the program (`verify/planner.py`).

Each fixture runs in a folder of its own: new code is laid out at the width of the file's
neighbours (`Project.style`), and what is written is what the dry run showed, so in one folder
of all the fixtures a file too short to tell its width takes the others'.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from clitools import jm

pytestmark = pytest.mark.jax

FIXTURES = Path(__file__).parent / "fixtures" / "pmap"
PROGRAMS = sorted(
    p
    for p in FIXTURES.glob("program_*.py")
    if not p.name.endswith(".expected.py") and "def main(" in p.read_text()
)


@pytest.mark.one_jax  # the corpus runs on JAX 0.12 too (test_fixtures.py); this, once
def test_every_program_fixture_is_written_verified(tmp_path: Path) -> None:
    for path in PROGRAMS:  # each in a folder of its own: laid out at its own width, as alone
        (tmp_path / path.stem).mkdir()
        shutil.copy(path, tmp_path / path.stem / path.name)
    report = tmp_path.parent / "report.json"
    # Verifies ~90 programs: 100-300 s on 2 cores, more while CI's other legs share them (the
    # default 300 s ran out on a slower machine); the timeout only guards against a hang.
    run = ("run", "--no-cache", "--jobs", "2", "--report", str(report), ".")
    proc = jm(*run, cwd=tmp_path, timeout=1200)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    files = {Path(f["path"]).name: f for f in json.loads(report.read_text())["files"]}
    program_level = 0
    for path in PROGRAMS:
        sites = [s for s in files[path.name]["sites"] if s["code"] == "JM202"]
        assert sites, path.name
        left = [(s["line"], s["status"], s["reason"]) for s in sites if not s["applied"]]
        assert not left and all(s["status"] == "verified" for s in sites), (path.name, left)
        assert not any("PL603" in s["message"] for s in sites), path.name
        if any("(program-level)" in s["message"] for s in sites):
            program_level += 1
            expected = (FIXTURES / f"{path.stem}.expected.py").read_text()
            if "def shard_map_per_device(" not in expected:  # the CLI imports it from beside
                assert (tmp_path / path.stem / path.name).read_text() == expected, path.name
    assert program_level == sum("kept_faithful" not in p.name for p in PROGRAMS) == 123


SAFE_REWRITES_PROGRAM = """\
import jax
import jax.numpy as jnp
import numpy as np


def epoch(state, batch):
    grad = jax.lax.pmean(jnp.mean(batch * state["w"], axis=0), axis_name="i")
    return {{"w": state["w"] - 0.1 * grad}}, jax.lax.psum(jnp.sum(batch), axis_name="i")


def train(state, obs):
    p_epoch = jax.pmap(epoch, axis_name="i")
    state = jax.device_put_replicated(state, jax.local_devices())
    {split}
    state, sums = p_epoch(state, batch)
    return jax.tree.map(lambda x: x[0], state), sums[0]


def main():
    state = {{"w": np.ones((3,), np.float32)}}
    return train(state, np.arange(8 * 2 * 3, dtype=np.float32).reshape(8 * 2, 3))
"""
SPLITS = {
    "reshaped": "batch = obs.reshape((jax.local_device_count(), -1) + obs.shape[1:])",
    "put_sharded": (
        "batch = jax.device_put_sharded(np.split(obs, jax.local_device_count()), "
        "jax.local_devices())"
    ),
    "put_sharded_list": (
        "n = jax.local_device_count()\n"
        "    shards = [obs[i * 2 : (i + 1) * 2] for i in range(n)]\n"
        "    batch = jax.device_put_sharded(shards, jax.local_devices())"
    ),
    "put_sharded_rows": (
        "x = np.asarray(obs).reshape((jax.local_device_count(), -1) + obs.shape[1:])\n"
        "    batch = jax.device_put_sharded(list(x), jax.local_devices())"
    ),
}


@pytest.mark.parametrize("split", sorted(SPLITS))
def test_a_program_whose_original_cannot_run_is_verified_against_its_safe_rewrites(
    tmp_path: Path, split: str
) -> None:
    """`jax.device_put_replicated`/`device_put_sharded` are gone from the installed JAX: the
    original raises, and the program-level form is compared with the original with its safe
    rewrites alone. The pmap rule reads those rewrites (`jax.device_put` of stacked copies, of
    stacked shards, of an array's rows) as the replication and the split they are. At 40f75a7
    the comparison failed on the program's own outputs (PL603): the original's failed attempt
    left its marker saying the step calls were recorded, so the rewrite's side recorded them
    too, against a reference that had not."""
    (tmp_path / "prog.py").write_text(SAFE_REWRITES_PROGRAM.format(split=SPLITS[split]))
    report = tmp_path / "report.json"
    proc = jm("run", "--no-cache", "--report", str(report), "prog.py", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (entry,) = json.loads(report.read_text())["files"]
    pmap = [s for s in entry["sites"] if s["code"] == "JM202"]
    assert pmap and all(s["status"] == "verified" and s["applied"] for s in pmap), pmap
    assert "(program-level)" in pmap[0]["message"], pmap[0]["message"]
    why = [s["details"]["verification"] for s in pmap]
    assert all("agrees with the safe-rewrites reference" in w for w in why), why
    written = (tmp_path / "prog.py").read_text()
    assert "pmap" not in written and "device_put" not in written, written
    if split == "put_sharded":  # an array split, then concatenated again: the array itself
        assert "make_array_from_process_local_data(batch_sharding, obs)" in written, written
    if split == "put_sharded_list":  # shards of any pytree: concatenated leaf by leaf
        assert "jax.tree.map(lambda *xs: jnp.concatenate(xs), *shards)" in written, written
