"""A function's recorded call that cannot be replayed falls back on the command as the unit.

flax's `train_and_evaluate(config, workdir)`, driven on synthetic data, is recorded inside
`tfds.testing.mock_data()`: replayed alone in a worker, outside that block, it reads the real
(empty) dataset and raises, so "the original cannot run". `train` below does the same with a
context of its own. The pmap made on the site's statement was recorded during the same command,
with its outputs: the command then runs on the rewritten tree too and the two runs' calls are
compared, as for a site in a class. A right rewrite verifies, a wrong one fails.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest
from clitools import jm

from jaxmigrate.model import Safety, Site, Status
from jaxmigrate.verify import VerifyConfig, VerifyRequest, verify

pytestmark = pytest.mark.jax

DATA = textwrap.dedent("""
    from contextlib import contextmanager

    import numpy as np

    ACTIVE = []


    @contextmanager
    def mocked():
        ACTIVE.append(True)
        yield
        ACTIVE.pop()


    def load():
        if not ACTIVE:
            raise KeyError("splits is empty: the dataset has not been generated")
        return np.arange(16, dtype=np.float32).reshape(8, 2)
    """)
TRAIN = textwrap.dedent("""
    import jax

    from pkg import data


    def train(steps=2):
        x = data.load()
        step = jax.pmap(lambda v: v * 2 + 1)  # SITE
        for _ in range(steps):
            x = step(x)
        return x
    """)
DRIVE = "from pkg import data\nfrom pkg.train import train\nwith data.mocked():\n    train()\n"
PMAP = "jax.pmap(lambda v: v * 2 + 1)  # SITE"
RIGHT = TRAIN.replace(PMAP, "jax.jit(jax.vmap(lambda v: v * 2 + 1))")
WRONG = TRAIN.replace(PMAP, "jax.jit(jax.vmap(lambda v: v * 2))")


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("units") / "project"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "data.py").write_text(DATA)
    (root / "pkg" / "train.py").write_text(TRAIN)
    (root / "drive.py").write_text(DRIVE)
    return root


def run(project: Path, candidate: str):
    line = next(i for i, t in enumerate(TRAIN.splitlines(), 1) if "# SITE" in t)
    site = Site("JM202", "pmap", line, 12, Safety.UNSAFE, "pmap", key="site")
    request = VerifyRequest("pkg/train.py", TRAIN, candidate, (site,))
    config = VerifyConfig(
        root=project, timeout=60.0, jobs=1, verify_with=f"{sys.executable} drive.py"
    )
    return verify([request], config)[("pkg/train.py", "site")]


def test_a_call_that_cannot_be_replayed_is_verified_by_the_command(project: Path) -> None:
    verdict = run(project, RIGHT)
    assert verdict.status is Status.VERIFIED, (verdict.reason, verdict.details)
    assert "made the same 2 call(s) of it on both trees" in verdict.reason
    assert verdict.details["unit"] == "verify-with"
    assert "the original cannot run: KeyError" in verdict.details["replay"]


def test_a_wrong_rewrite_fails_through_the_command(project: Path) -> None:
    verdict = run(project, WRONG)
    assert verdict.status is Status.FAILED, (verdict.reason, verdict.details)


MODEL = textwrap.dedent("""
    import jax


    class Model:
        def __init__(self):
            self.step = jax.pmap(lambda x: x * 2 + 1)

        def run(self, x):
            return self.step(x)
    """)
USE = "import numpy as np\nfrom pkg.model import Model\nModel().run(np.ones((8, 2), np.float32))\n"


def test_a_site_whose_rewrite_calls_the_projects_helper_module_is_recorded(
    tmp_path: Path,
) -> None:
    # The pmap rewrite imports `shard_map_per_device` from the `_pmap_compat.py` it writes: the
    # `jax.jit` there is made for the site's statement, and its calls are the site's.
    import json

    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "model.py").write_text(MODEL)
    (tmp_path / "use.py").write_text(USE)
    command = ["run", "--dry-run", "--no-cache"]
    forced = jm(*command, "--no-verify", "--unsafe-fixes", ".", cwd=tmp_path, timeout=900)
    assert "+++ b/pkg/_pmap_compat.py" in forced.stdout, forced.stdout  # the premise
    command += ["--verify-with", f"{sys.executable} use.py", "--report", "r.json", "."]
    proc = jm(*command, cwd=tmp_path, timeout=900)
    files = json.loads((tmp_path / "r.json").read_text())["files"]
    (site,) = [s for f in files for s in f["sites"] if s["code"] == "JM202"]
    assert site["status"] == "verified", (site, proc.stdout, proc.stderr)


CHECKPOINTING = textwrap.dedent("""
    import os

    import jax
    import numpy as np

    from pkg import data


    def train(workdir, steps=2):
        path = os.path.join(workdir, "ckpt.npz")
        x, start = data.load(), 0
        if os.path.exists(path):  # restore, then run only the steps left: none
            saved = np.load(path)
            x, start = saved["x"], int(saved["step"])
        step = jax.pmap(lambda v: v * 2 + 1)  # SITE
        for _ in range(start, steps):
            x = step(x)
        np.savez(path, x=np.asarray(x), step=steps)
        return x
    """)
DRIVE_IN = (
    "import sys\nfrom pkg import data\nfrom pkg.train import train\n"
    "with data.mocked():\n    train(sys.argv[1])\n"
)


def test_a_folder_the_command_names_starts_each_run_as_it_was(tmp_path: Path) -> None:
    # The command's workdir is outside the tree: the run on the rewritten tree would restore
    # the first run's checkpoint and make no call of the site.
    root = tmp_path / "project"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "data.py").write_text(DATA)
    (root / "pkg" / "train.py").write_text(CHECKPOINTING)
    (root / "drive.py").write_text(DRIVE_IN)
    workdir = tmp_path / "work"
    workdir.mkdir()
    line = next(i for i, t in enumerate(CHECKPOINTING.splitlines(), 1) if "# SITE" in t)
    site = Site("JM202", "pmap", line, 12, Safety.UNSAFE, "pmap", key="site")
    right = CHECKPOINTING.replace(PMAP, "jax.jit(jax.vmap(lambda v: v * 2 + 1))")
    request = VerifyRequest("pkg/train.py", CHECKPOINTING, right, (site,))
    command = f"{sys.executable} drive.py {workdir}"
    config = VerifyConfig(root=root, timeout=60.0, jobs=1, verify_with=command)
    verdict = verify([request], config)[("pkg/train.py", "site")]
    assert verdict.status is Status.VERIFIED, (verdict.reason, verdict.details)
    assert "made the same 2 call(s) of it on both trees" in verdict.reason


# A program-level step: the original's pmap takes stacked copies of `w` and the batch split over
# the devices, the rewrite's `jax.jit(jax.shard_map(...))` takes one `w` and the flat batch. Its
# calls, recorded during the command, compare in the flat layout (the original's brought to it
# through the site's `layout`): flax lm1b's three steps verified so, driven on mock data.
PROGRAM = textwrap.dedent("""
    import jax
    import numpy as np
    from jax.sharding import PartitionSpec as P

    from pkg import data


    def train(steps=2):
        x = data.load()
        n = jax.local_device_count()
        w = np.full((n,), 3.0, np.float32)
        step = jax.pmap(lambda w, x: x * w + 1, axis_name="i")  # SITE
        for _ in range(steps):
            x = step(w, x=x.reshape(n, -1, 2)).reshape(-1, 2)
        return x
    """)
FLAT = (
    '    mesh = jax.sharding.Mesh(jax.devices(), ("i",))\n'
    "    step = jax.jit(jax.shard_map({body}, mesh=mesh, in_specs=(P(), P('i')), "
    "out_specs=P('i')))  # SITE\n"
    "    for _ in range(steps):\n"
    "        x = step(w, x)\n"
)
LAYOUT = {
    "args": ["replicated", "batch"],
    "keywords": ["x"],
    "replicated": [0],
    "results": [],
    "varying": [True],
    "tuple": False,
    "script": False,
}


def program_level(body: str) -> str:
    head, _, _ = PROGRAM.partition("    step = jax.pmap")
    head = head.replace("np.full((n,), 3.0, np.float32)", "np.float32(3.0)")
    return head + FLAT.format(body=body) + "    return x\n"


def run_program(project: Path, candidate: str, original: str = PROGRAM, layout: dict | None = None):
    (project / "pkg" / "program.py").write_text(original)
    (project / "drive_program.py").write_text(
        "from pkg import data\nfrom pkg.program import train\nwith data.mocked():\n    train()\n"
    )
    line = next(i for i, t in enumerate(original.splitlines(), 1) if "# SITE" in t)
    details = {"layout": {"line": line, "end_line": line, **(layout or LAYOUT)}}
    site = Site(
        "JM202", "pmap", line, 12, Safety.UNSAFE, "pmap", key="site", group="g", details=details
    )
    request = VerifyRequest("pkg/program.py", original, candidate, (site,))
    command = f"{sys.executable} drive_program.py"
    config = VerifyConfig(root=project, timeout=60.0, jobs=1, verify_with=command)
    return verify([request], config)[("pkg/program.py", "site")]


def test_a_program_level_step_is_compared_in_the_flat_layout(project: Path) -> None:
    verdict = run_program(project, program_level("lambda w, x: x * w + 1"))
    assert verdict.status is Status.VERIFIED, (verdict.reason, verdict.details)
    assert "made the same 2 call(s) of it on both trees" in verdict.reason
    assert verdict.details["input_shapes"], verdict.details  # the flat batch: 8 rows of 2
    assert any("[8, 2]" in s for s in verdict.details["input_shapes"]), verdict.details


def test_a_wrong_program_level_step_fails_in_the_flat_layout(project: Path) -> None:
    verdict = run_program(project, program_level("lambda w, x: x * w"))
    assert verdict.status is Status.FAILED, (verdict.reason, verdict.details)


# A result fed back as replicated that is not: each device adds its own rows' sum. Device 0's
# copy alone would agree with the rewrite's one value; the copies differ, so the record keeps
# them stacked and the comparison fails, as a unit's layout check does.
FED_BACK = PROGRAM.replace(
    'jax.pmap(lambda w, x: x * w + 1, axis_name="i")',
    'jax.pmap(lambda w, x: w + x.sum(), axis_name="i")',
).replace("x = step(w, x=x.reshape(n, -1, 2)).reshape(-1, 2)", "w = step(w, x=x.reshape(n, -1, 2))")
FED_BACK_FLAT = (
    FED_BACK.partition("    step = jax.pmap")[0].replace(
        "np.full((n,), 3.0, np.float32)", "np.float32(3.0)"
    )
    + '    mesh = jax.sharding.Mesh(jax.devices(), ("i",))\n'
    "    step = jax.jit(jax.shard_map(lambda w, x: w + x.sum(), mesh=mesh, in_specs=(P(), P('i')), "
    "out_specs=P(), check_vma=False))  # SITE\n"
    "    for _ in range(steps):\n"
    "        w = step(w, x)\n"
    "    return x\n"
)


def test_a_result_taken_as_replicated_that_differs_between_devices_fails(project: Path) -> None:
    layout = {**LAYOUT, "results": [0], "varying": [False]}
    verdict = run_program(project, FED_BACK_FLAT, FED_BACK, layout)
    assert verdict.status is Status.FAILED, (verdict.reason, verdict.details)
    assert "call 1" in verdict.reason, verdict.reason


# The same program as a 2-process job (4 devices each): each process records its own part, the
# original's blocks of its devices and the rewrite's rows of its global arrays
# (`hostify.process_local`), and the n-th calls of each process pair up.
GLOBAL = (
    '    mesh = jax.sharding.Mesh(jax.devices(), ("i",))\n'
    '    rows = jax.sharding.NamedSharding(mesh, P("i"))\n'
    "    step = jax.jit(jax.shard_map({body}, mesh=mesh, in_specs=(P(), P('i')), "
    "out_specs=P('i')))  # SITE\n"
    "    for _ in range(steps):\n"
    "        y = step(w, jax.make_array_from_process_local_data(rows, x))\n"
    "        x = np.asarray(multihost_utils.global_array_to_host_local_array(y, mesh, P('i')))\n"
    "    return x\n"
)


def multi_process(body: str) -> str:
    head = program_level(body).partition("    mesh = jax.sharding.Mesh")[0]
    head = head.replace(
        "import jax\n", "import jax\nfrom jax.experimental import multihost_utils\n", 1
    )
    return head + GLOBAL.format(body=body)


@pytest.mark.parametrize(("body", "status"), [("x * w + 1", "verified"), ("x * w", "failed")])
def test_a_program_level_step_is_compared_per_process_on_two(
    project: Path, body: str, status: str
) -> None:
    (project / "pkg" / "program.py").write_text(PROGRAM)
    (project / "drive_program.py").write_text(
        "from pkg import data\nfrom pkg.program import train\nwith data.mocked():\n    train()\n"
    )
    line = next(i for i, t in enumerate(PROGRAM.splitlines(), 1) if "# SITE" in t)
    details = {"layout": {"line": line, "end_line": line, **LAYOUT}}
    site = Site(
        "JM202", "pmap", line, 12, Safety.UNSAFE, "pmap", key="site", group="g", details=details
    )
    candidate = multi_process(f"lambda w, x: {body}")
    request = VerifyRequest("pkg/program.py", PROGRAM, candidate, (site,))
    command = f"{sys.executable} drive_program.py"
    config = VerifyConfig(
        root=project, timeout=120.0, jobs=1, verify_with=command, devices=8, processes=2
    )
    verdict = verify([request], config)[("pkg/program.py", "site")]
    assert verdict.status.value == status, (verdict.reason, verdict.details)
