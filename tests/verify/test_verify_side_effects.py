"""Replays start from the files as they were before the recording, or say why they cannot.

`train(workdir)` restores a checkpoint when one exists and then runs only the steps left, as
flax's `train_and_evaluate` does. The recorded command writes one: a replay against it would
restore it on both sides and run zero steps, so a wrong rewrite would agree. In the tree, the
command runs in its own copy; outside it (a `tempfile.mkdtemp()` workdir, or a path on the
command line), the folder given to the call is copied as it was just before the call, and each
replay starts from that copy; a folder deleted afterwards (a `TemporaryDirectory`) is no longer
a problem either. A folder too large to copy leaves the site unverified, saying so.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from jaxmigrate.model import Safety, Site, Status
from jaxmigrate.verify import VerifyConfig, VerifyRequest, verify

pytestmark = [pytest.mark.jax, pytest.mark.one_jax]  # not again on JAX 0.12 (.ci/run)

TRAIN = textwrap.dedent("""
    import os

    import jax
    import jax.numpy as jnp
    import numpy as np


    def train(workdir, steps=2):
        path = os.path.join(workdir, "ckpt.npz")
        x, start = np.ones((8, 2), np.float32), 0
        if os.path.exists(path):  # restore, then run only the steps left: none
            saved = np.load(path)
            x, start = saved["x"], int(saved["step"])
        step = jax.pmap(lambda v: v * 2)  # SITE
        for _ in range(start, steps):
            x = step(x)
        np.savez(path, x=np.asarray(x), step=steps)
        return jnp.asarray(x)
    """)
PMAP = "jax.pmap(lambda v: v * 2)  # SITE"
RIGHT = TRAIN.replace(PMAP, "jax.jit(lambda v: v * 2)")
WRONG = TRAIN.replace(PMAP, "jax.jit(lambda v: v * 3)")
IN_TREE = "import os\nfrom pkg.train import train\nos.makedirs('work')\ntrain('work')\n"
IN_TMP = (
    "import tempfile\nfrom pkg.train import train\n"
    "with tempfile.TemporaryDirectory() as d:\n    train(d)\n"
)
MKDTEMP = "import tempfile\nfrom pkg.train import train\ntrain(tempfile.mkdtemp())\n"
ARGV = "import sys\nfrom pkg.train import train\ntrain(sys.argv[1])\n"


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("effects") / "project"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "train.py").write_text(TRAIN)
    (root / "in_tree.py").write_text(IN_TREE)
    (root / "in_tmp.py").write_text(IN_TMP)
    (root / "mkdtemp.py").write_text(MKDTEMP)
    (root / "argv.py").write_text(ARGV)
    return root


def run(project: Path, script: str, candidate: str = WRONG):
    line = next(i for i, t in enumerate(TRAIN.splitlines(), 1) if "# SITE" in t)
    site = Site("JM202", "pmap", line, 1, Safety.UNSAFE, "pmap", key="site")
    request = VerifyRequest("pkg/train.py", TRAIN, candidate, (site,))
    config = VerifyConfig(
        root=project, timeout=60.0, jobs=1, verify_with=f"{sys.executable} {script}"
    )
    return verify([request], config)[("pkg/train.py", "site")]


def test_a_replay_does_not_start_from_what_the_recording_wrote(project: Path) -> None:
    # Had the original side replayed on the recording's tree, it would restore (+100) and
    # the right rewrite, run on a clean tree, would "differ".
    verdict = run(project, "in_tree.py", RIGHT)
    assert verdict.status is Status.VERIFIED, (verdict.reason, verdict.details)
    wrong = run(project, "in_tree.py")
    assert wrong.status is Status.FAILED, (wrong.reason, wrong.details)
    assert not (project / "work").exists()


def test_a_folder_outside_the_tree_is_replayed_as_it_was_before_the_call(project: Path) -> None:
    # mkdtemp() is left behind holding the recording's checkpoint: replayed there, both sides
    # would restore it, run no step and agree, and the wrong rewrite would pass.
    wrong = run(project, "mkdtemp.py")
    assert wrong.status is Status.FAILED, (wrong.reason, wrong.details)
    right = run(project, "mkdtemp.py", RIGHT)
    assert right.status is Status.VERIFIED, (right.reason, right.details)


def test_a_workdir_on_the_command_line_is_not_changed_by_verification(
    project: Path, tmp_path: Path
) -> None:
    workdir = tmp_path / "workdir"
    workdir.mkdir()
    wrong = run(project, f"argv.py {workdir}")
    assert wrong.status is Status.FAILED, (wrong.reason, wrong.details)
    # the command wrote its checkpoint there; the replays ran on copies and left it as it was
    assert sorted(p.name for p in workdir.iterdir()) == ["ckpt.npz"]


def test_a_deleted_temporary_directory_no_longer_stops_the_replay(project: Path) -> None:
    wrong = run(project, "in_tmp.py")
    assert wrong.status is Status.FAILED, (wrong.reason, wrong.details)


def test_a_folder_too_large_to_keep_leaves_the_site_unverified(
    project: Path, tmp_path: Path
) -> None:
    workdir = tmp_path / "big"
    workdir.mkdir()
    with (workdir / "data.bin").open("wb") as handle:  # sparse: large, but no disk used
        handle.truncate(300 * 2**20)
    verdict = run(project, f"argv.py {workdir}")
    assert verdict.status is Status.UNVERIFIED, (verdict.reason, verdict.details)
    assert f"argument `0` is `{workdir}`, outside the project, which holds more than 256 MiB" in (
        verdict.reason
    )
