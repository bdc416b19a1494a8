"""Notebook sites: the code cells, run in order as one script, are the recording command and unit.

A Colab-style notebook with a pmap train step (and a `%matplotlib inline` line) is verified and
written under the default policy; a hand migration that gets the collective wrong is `failed`
under `verify --against`, the right one `verified`; a notebook importing a package that is not
installed stays `unverified`, saying so, and is not written; one whose original imports what JAX
removed is recorded through its safe rewrites.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from clitools import git, jm

from jaxmigrate.verify.notebooks import command_for, program, script_path

IMPORTS = [
    "%matplotlib inline\n",
    "import functools\n",
    "import jax\n",
    "import jax.numpy as jnp\n",
    "import numpy as np\n",
    "from jax import lax",
]
TRAIN_STEP = [
    "@functools.partial(jax.pmap, axis_name='batch')\n",
    "def train_step(w, x):\n",
    "    g = jnp.mean(x, axis=0) * w\n",
    "    g = lax.pmean(g, 'batch')\n",
    "    return w - 0.1 * g\n",
]
LOOP = [
    "n = jax.local_device_count()\n",
    "w = jnp.ones((n, 4))\n",
    "x = jnp.arange(n * 2 * 4, dtype=jnp.float32).reshape(n, 2, 4)\n",
    "for _ in range(2):\n",
    "    w = train_step(w, x)\n",
    "print(w.shape)",
]


def by_hand(collective: str) -> list[str]:
    """Return the train step migrated by hand to shard_map, with `collective` over the batch."""
    return [
        "from jax.sharding import Mesh, PartitionSpec as P\n",
        "@jax.jit\n",
        "@functools.partial(jax.shard_map, mesh=Mesh(np.array(jax.devices()), ('batch',)),\n",
        "                   in_specs=P('batch'), out_specs=P('batch'))\n",
        "def train_step(w, x):\n",
        "    g = jnp.mean(x, axis=1) * w\n",
        f"    g = lax.{collective}(g, 'batch')\n",
        "    return w - 0.1 * g\n",
    ]


def notebook(*cells: list[str]) -> str:
    document: dict[str, Any] = {
        "cells": [
            {"cell_type": "markdown", "metadata": {}, "source": ["# Training on 8 devices"]},
            *(
                {
                    "cell_type": "code",
                    "execution_count": None,
                    "metadata": {},
                    "outputs": [],
                    "source": cell,
                }
                for cell in cells
            ),
        ],
        "metadata": {"kernelspec": {"language": "python", "name": "python3"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    return json.dumps(document, indent=1) + "\n"


def jaxmigrate(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return jm(*args, cwd=cwd, timeout=900)


def sites_of(report: Path) -> dict[str, dict[str, Any]]:
    files = json.loads(report.read_text())["files"]
    return {f["path"]: s for f in files for s in f["sites"]}


# The script a notebook becomes (no JAX) -------------------------------------------------------
def test_the_script_masks_ipython_lines_and_keeps_every_cell_at_its_line() -> None:
    built = program(notebook(IMPORTS, ["!pip install -q flax\n", "%%time\n", "y = 1"], LOOP))
    assert not built.problem
    lines = built.code.splitlines()
    assert built.starts == {1: 1, 2: 7, 3: 10}
    assert lines[0].startswith("pass  # jaxmigrate-ipython-")  # %matplotlib inline
    assert lines[6].startswith("pass  # jaxmigrate-ipython-")  # !pip install
    assert lines[9] == "n = jax.local_device_count()"
    assert built.locate(11) == (3, 2)


def test_a_cell_that_only_ipython_runs_makes_the_notebook_unrunnable() -> None:
    built = program(notebook(IMPORTS, ["%%bash\n", "ls"]))
    assert built.problem == "cell 2 is a %%bash cell, which cannot run outside IPython"


COLAB_CHECK = ["if 'google.colab' in str(get_ipython()):\n", "    print('in Colab')"]


def test_a_notebook_asking_get_ipython_gets_none_as_outside_ipython() -> None:
    built = program(notebook(IMPORTS, COLAB_CHECK, LOOP))
    assert not built.problem
    lines = built.code.splitlines()
    assert lines[0].startswith("get_ipython = lambda: None")
    assert built.starts == {1: 2, 2: 8, 3: 10}
    assert lines[9] == "n = jax.local_device_count()"
    assert built.locate(11) == (3, 2)
    namespace: dict[str, object] = {}
    exec(lines[0], namespace)  # noqa: S102 - the line the script starts with
    assert namespace["get_ipython"]() is None  # type: ignore[operator]


def test_the_script_runs_from_the_notebooks_folder() -> None:
    assert script_path("colab/train.ipynb") == "colab/train.ipynb.py"
    assert (
        command_for("colab/train.ipynb") == 'cd colab && exec "$JAXMIGRATE_PYTHON" train.ipynb.py'
    )


# Real JAX ----------------------------------------------------------------------------------------
@pytest.mark.jax
def test_run_verifies_and_writes_a_notebooks_pmap_train_step(tmp_path: Path) -> None:
    (tmp_path / "colab").mkdir()
    path = tmp_path / "colab" / "train.ipynb"
    path.write_text(notebook(IMPORTS, TRAIN_STEP, LOOP))
    skipped = jaxmigrate("run", "--no-verify", "--dry-run", ".", cwd=tmp_path)
    assert skipped.returncode == 0 and "executes" not in skipped.stderr, skipped.stderr
    proc = jaxmigrate("run", "--report", "out.json", "--format", "json", ".", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # the user is told, before it happens, that the notebook runs, and how to avoid it
    note = " ".join(proc.stderr.split())
    assert "note: verification executes 1 notebook(s) (colab/train.ipynb): their code cells" in note
    assert "Pass --no-verify to run nothing" in note
    site = sites_of(tmp_path / "out.json")["colab/train.ipynb"]
    assert (site["cell"], site["line"], site["status"], site["applied"]) == (2, 1, "verified", True)
    assert site["details"]["unit"] == "notebook" and site["details"]["calls"] == 2
    assert "made the same 2 call(s) of it on both trees" in site["details"]["verification"]
    cells = [c["source"] for c in json.loads(path.read_text())["cells"]]
    assert cells[1][0] == "%matplotlib inline\n"  # restored, not dropped
    assert "jax.pmap" not in "".join(cells[2]) and "shard_map_per_device" in "".join(cells[2])


@pytest.mark.jax
def test_a_colab_notebook_that_checks_get_ipython_verifies(tmp_path: Path) -> None:
    # flax's examples/imagenet/imagenet.ipynb: "NameError: name 'get_ipython' is not defined"
    path = tmp_path / "train.ipynb"
    path.write_text(notebook(IMPORTS, COLAB_CHECK, TRAIN_STEP, LOOP))
    report = tmp_path / "out.json"
    proc = jaxmigrate(
        "run", "--dry-run", "--report", str(report), "--format", "json", ".", cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    site = sites_of(report)["train.ipynb"]
    assert (site["cell"], site["line"], site["status"]) == (3, 1, "verified"), site["details"]


@pytest.mark.jax
def test_verify_against_catches_a_wrong_notebook_migration(tmp_path: Path) -> None:
    for name in ("right", "wrong"):
        (tmp_path / f"{name}.ipynb").write_text(notebook(IMPORTS, TRAIN_STEP, LOOP))
    git(tmp_path, "init", "-q")
    git(tmp_path, "add", ".")
    git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "legacy")
    # Per shard, the batch mean is over axis 1; the wrong one sums the gradients over devices.
    (tmp_path / "right.ipynb").write_text(notebook(IMPORTS, by_hand("pmean"), LOOP))
    (tmp_path / "wrong.ipynb").write_text(notebook(IMPORTS, by_hand("psum"), LOOP))
    proc = jaxmigrate("verify", "--against", "HEAD", "--report", "out.json", cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "wrong.ipynb[cell 2]:1:1 JM000 hand-migration [unsafe, failed]" in proc.stdout
    assert "right.ipynb[cell 2]:1:1 JM000 hand-migration [unsafe, verified]" in proc.stdout
    wrong = sites_of(tmp_path / "out.json")["wrong.ipynb"]
    assert (
        wrong["details"]["mismatch"]["path"] == "output"
        and "values differ" in wrong["details"]["verification"]
    )


@pytest.mark.jax
def test_a_notebook_that_cannot_run_here_stays_unverified_and_unwritten(tmp_path: Path) -> None:
    path = tmp_path / "train.ipynb"
    text = notebook([*IMPORTS, "\nimport not_installed_here"], TRAIN_STEP, LOOP)
    path.write_text(text)
    proc = jaxmigrate("run", "--report", "out.json", "--format", "json", ".", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    site = sites_of(tmp_path / "out.json")["train.ipynb"]
    assert (site["status"], site["applied"]) == ("unverified", False)
    reason = site["details"]["verification"]
    assert reason == (
        "the notebook cannot run here: "
        "ModuleNotFoundError: No module named 'not_installed_here' (cell 1, line 7)"
    )
    assert path.read_text() == text


@pytest.mark.jax
def test_a_notebook_with_a_removed_import_is_recorded_through_its_safe_rewrites(
    tmp_path: Path,
) -> None:
    path = tmp_path / "train.ipynb"
    removed = "\nfrom jax.experimental import PartitionSpec as P"  # gone from JAX: ImportError
    path.write_text(notebook([*IMPORTS, removed], TRAIN_STEP, LOOP))
    proc = jaxmigrate("run", "--report", "out.json", "--format", "json", ".", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    files = json.loads((tmp_path / "out.json").read_text())["files"]
    pmap = next(s for s in files[0]["sites"] if s["code"] == "JM202")
    assert (pmap["status"], pmap["applied"]) == ("verified", True)
    assert pmap["details"]["reference"] == "safe-rewrites"


@pytest.mark.jax
def test_a_program_made_in_the_cells_is_verified_by_running_them_as_one_script(
    tmp_path: Path,
) -> None:
    """`pmap_program_cells.ipynb` takes the program-level form in its cells: the recorded calls
    of its step change layout, so its cells run as one script, as a `.py` script's program
    does, the step's calls compared through the layout adapters; verified and written."""
    fixture = Path(__file__).resolve().parent.parent / "fixtures_notebooks"
    path = tmp_path / "colab" / "train.ipynb"
    path.parent.mkdir()
    path.write_bytes((fixture / "pmap_program_cells.ipynb").read_bytes())
    git(tmp_path, "init", "-q")
    git(tmp_path, "add", ".")
    git(tmp_path, "commit", "-qm", "pmap")
    proc = jaxmigrate("run", "--report", "out.json", "--format", "json", ".", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    sites = json.loads((tmp_path / "out.json").read_text())["files"][0]["sites"]
    assert len(sites) == 5 and "(program-level)" in sites[0]["message"]
    assert [s["cell"] for s in sites] == [3, 4, 5, 5, 6]
    for site in sites:
        assert site["status"] == "verified" and site["applied"], site
        reason = site["details"]["verification"]
        assert "when `colab/train.ipynb`'s code cells run in order" in reason, reason
    cells = "".join("".join(c["source"]) for c in json.loads(path.read_text())["cells"])
    assert "jax.pmap" not in cells and "replicate" not in cells and "shard(" not in cells
