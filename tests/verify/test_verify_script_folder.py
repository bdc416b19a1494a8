"""A code base in a folder of the repository, run as a script from that folder.

`jaxmigrate run .` in flax's `examples/imagenet` takes the repository as the tree; the command
`python drive.py` imports `train` from the script's folder, and the recorded calls hold a
`train.TrainState`. The worker comparing the two runs' calls must find `train` where the command
did (it said "worker error: ModuleNotFoundError: No module named 'train'", the sites unverified).
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from jaxmigrate.model import Safety, Site, Status
from jaxmigrate.verify import VerifyConfig, VerifyRequest, verify

pytestmark = pytest.mark.jax

MODEL = textwrap.dedent("""
    import dataclasses

    import jax
    import numpy as np
    from jax import lax
    from jax.sharding import Mesh, PartitionSpec as P


    @jax.tree_util.register_dataclass
    @dataclasses.dataclass
    class State:
        w: jax.Array


    class Trainer:
        def __init__(self):
            self.step = jax.pmap(self._step, axis_name="i")  # SITE

        def _step(self, state):
            return State(w=state.w + lax.psum(state.w, "i"))
    """)
REWRITE = MODEL.replace(
    'jax.pmap(self._step, axis_name="i")  # SITE',
    'jax.jit(jax.shard_map(self._step, mesh=Mesh(np.array(jax.devices()), ("i",)), '
    'in_specs=P("i"), out_specs=P("i")))',
)
DRIVE = textwrap.dedent("""
    import numpy as np

    from model import State, Trainer

    trainer = Trainer()
    for i in range(2):
        print(trainer.step(State(w=np.ones((8, 2), np.float32) * i)).w.sum())
    """)


def test_a_bound_site_of_a_script_folder_verifies(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    app = root / "examples" / "app"
    app.mkdir(parents=True)
    (app / "model.py").write_text(MODEL)
    (app / "drive.py").write_text(DRIVE)
    line = next(i for i, t in enumerate(MODEL.splitlines(), 1) if "# SITE" in t)
    site = Site("JM202", "pmap", line, 1, Safety.UNSAFE, "pmap", key="site0")
    request = VerifyRequest("examples/app/model.py", MODEL, REWRITE, (site,))
    config = VerifyConfig(
        root=root, workdir=app, verify_with=f"{sys.executable} drive.py", timeout=60.0, jobs=1
    )
    verdict = verify([request], config)[("examples/app/model.py", "site0")]
    assert verdict.status is Status.VERIFIED, (verdict.reason, verdict.details)
    assert "made the same 2 call(s) of it on both trees" in verdict.reason
