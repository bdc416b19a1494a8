"""Replays start from the files as they were before the recording, or say why they cannot.

`train(workdir)` restores a checkpoint when one exists, as flax's `train_and_evaluate` does. The
recorded command writes one into the tree: a replay against that tree would restore it on both
sides and run zero steps, so a wrong rewrite would agree. The command runs in its own copy, so
the replays run the step and catch it. A command that works in a temporary directory deletes it
before the replays: the site is unverified, saying so, rather than "the original cannot run".
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from jaxmigrate.model import Safety, Site, Status
from jaxmigrate.verify import VerifyConfig, VerifyRequest, verify

pytestmark = pytest.mark.jax

TRAIN = textwrap.dedent("""
    import os

    import jax
    import jax.numpy as jnp
    import numpy as np


    def train(workdir):
        path = os.path.join(workdir, "ckpt.npy")
        if os.path.exists(path):  # restore: no step runs (and the result shows it)
            return jnp.asarray(np.load(path)) + 100
        out = jax.pmap(lambda x: x * 2)(jnp.ones((8, 2)))  # SITE
        np.save(path, np.asarray(out))
        return out
    """)
PMAP = "jax.pmap(lambda x: x * 2)(jnp.ones((8, 2)))  # SITE"
RIGHT = TRAIN.replace(PMAP, "jax.jit(lambda x: x * 2)(jnp.ones((8, 2)))")
WRONG = TRAIN.replace(PMAP, "jnp.ones((8, 2)) * 3")
IN_TREE = "import os\nfrom pkg.train import train\nos.makedirs('work')\ntrain('work')\n"
IN_TMP = (
    "import tempfile\nfrom pkg.train import train\n"
    "with tempfile.TemporaryDirectory() as d:\n    train(d)\n"
)


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("effects") / "project"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "train.py").write_text(TRAIN)
    (root / "in_tree.py").write_text(IN_TREE)
    (root / "in_tmp.py").write_text(IN_TMP)
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


def test_a_deleted_temporary_directory_is_named_as_the_reason(project: Path) -> None:
    verdict = run(project, "in_tmp.py")
    assert verdict.status is Status.UNVERIFIED, (verdict.reason, verdict.details)
    assert "needs files the recording did not leave" in verdict.reason
