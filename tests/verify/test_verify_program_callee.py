"""A program-level group whose state a function of the module saves: `save_checkpoint(state)`,
called by `train_and_evaluate`, which makes the steps, with a readback of device 0 deleted.

flax's imagenet example: `save_checkpoint` reads `int(state.step)` after its readback. Replayed
alone on the calls the original made (a state with its device axis), the rewritten function
raised ("only 0-dimensional arrays can be converted to Python scalars"), and the whole group
fell back to the faithful form (PL603) though the program computes the same. Such a function's
sites are now judged with the program (`Plan.program_host`): by what the `--verify-with`
command prints, once the group's steps verified by their calls; with nothing to judge them
they stay `unverified`, never `failed`. The state's step count, `0`, an array in the original
once replicated and a Python number in the rewrite, is the same input to the step (the runs did
not diverge: `compare(..., inputs=True)`).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from clitools import jm

pytestmark = [pytest.mark.jax, pytest.mark.one_jax]

FIXTURE = Path(__file__).parents[1] / "fixtures" / "pmap" / "program_save_checkpoint.py"
DRIVE = """\
import numpy as np

import train

train.READY.append(True)
saved, losses = [], []
train.train_and_evaluate(saved, losses)
for w, mean, first in saved:
    print(f"saved {np.asarray(w).sum():.6g} {np.asarray(mean).sum():.6g} {first:.6g}")
print("losses", " ".join(f"{float(x):.6g}" for x in losses))
"""
COMMAND = f"{sys.executable} drive.py"


def project(root: Path, drive: str = DRIVE) -> Path:
    """The fixture's program as a module without `main()`, driven by a script."""
    source = FIXTURE.read_text().partition("\ndef main():")[0]
    source = source.replace("_save_checkpoint", "save_checkpoint")
    source = source.replace("_train_and_evaluate", "train_and_evaluate")
    source = source.replace(
        '    saved.append((state.params["w"], state.batch_stats["mean"]))',
        '    first = float(state.params["w"][0, 0]) + int(state.step)\n'
        '    saved.append((state.params["w"], state.batch_stats["mean"], first))',
    )
    # a step count, a Python number the replication made an array of (flax's `TrainState`)
    source = source.replace("    batch_stats: dict\n", "    batch_stats: dict\n    step: int = 0\n")
    source = source.replace(
        'batch_stats=lax.pmean(new_stats, "batch"))',
        'batch_stats=lax.pmean(new_stats, "batch"), step=state.step + 1)',
    )
    replicated = "    state = jax.tree.map(lambda x: jnp.broadcast_to(x, (n,) + x.shape), state)\n"
    source = source.replace(replicated, "    state = jax_utils.replicate(state)\n")
    source = source.replace("from flax import struct\n", "from flax import jax_utils, struct\n")
    # a data source only the command opens, as flax imagenet's `tfds.testing.mock_data()`: a
    # call of `train_and_evaluate` replayed alone raises, and its steps are judged by their calls
    source = source.replace(
        "def train_and_evaluate(saved, losses):\n",
        "READY = []\n\n\ndef train_and_evaluate(saved, losses):\n"
        '    if not READY:\n        raise KeyError("the dataset has not been generated")\n',
    )
    assert "step=state.step + 1" in source and "jax_utils.replicate(state)" in source
    assert "if not READY" in source
    # its result unread, as `drive.py` reads none (a result returned with another layout is
    # compared by the function's replay: not this test's concern)
    source = source.replace(
        "            save_checkpoint(state, saved)\n    return state\n",
        "            save_checkpoint(state, saved)\n",
    )
    assert "first = float" in source and "    return state\n" not in source
    root.mkdir(parents=True)
    (root / "train.py").write_text(source)
    (root / "drive.py").write_text(drive)
    return root


def sites(root: Path, *extra: str) -> list[dict]:
    report = root.parent / f"{root.name}.json"
    run = ("run", "--no-cache", "--select", "pmap", "--report", str(report), "--format", "json")
    proc = jm(*run, *extra, "train.py", cwd=root, timeout=900)
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    files = json.loads(report.read_text())["files"]
    return next(f["sites"] for f in files if Path(f["path"]).name == "train.py")


def test_a_function_saving_the_programs_state_is_judged_with_the_program(
    tmp_path: Path,
) -> None:
    root = project(tmp_path / "p")
    found = sites(root, "--verify-with", COMMAND)
    steps = [s for s in found if "over the flat data (program-level)" in s["message"]]
    assert len(steps) == 2 and not any("PL603" in s["message"] for s in found), found
    assert all(s["status"] == "verified" and s["applied"] for s in found), found
    saved = next(s for s in found if "in `save_checkpoint`" in s["message"])
    assert "prints the same on both trees" in saved["details"]["verification"], saved
    assert "tree_map(lambda x: x[0]" not in (root / "train.py").read_text()
    # `sync_batch_stats` and its `cross_replica_mean`, read only where the group deletes: gone
    # with it, judged by the group's other sites (they run in no rewrite)
    deleted = [s for s in found if s["details"].get("deleted")]
    assert len(deleted) == 2, found
    assert all("runs in no rewrite" in s["details"]["verification"] for s in deleted), deleted
    assert "sync_batch_stats" not in (root / "train.py").read_text()


def test_with_nothing_printed_such_a_function_leaves_the_group_unverified(
    tmp_path: Path,
) -> None:
    root = project(tmp_path / "p", DRIVE.partition("for w, mean")[0])
    found = sites(root, "--verify-with", COMMAND, "--dry-run")
    saved = next(s for s in found if "in `save_checkpoint`" in s["message"])
    assert saved["status"] == "unverified", saved
    assert "cannot judge it alone" in saved["details"]["verification"], saved
    assert not any("PL603" in s["message"] for s in found), found
    steps = [s for s in found if "over the flat data (program-level)" in s["message"]]
    assert len(steps) == 2 and not any(s["applied"] for s in steps), found
    deleted = [s for s in found if s["details"].get("deleted")]
    assert len(deleted) == 2 and all(s["status"] == "unverified" for s in deleted), deleted
