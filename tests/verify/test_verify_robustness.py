"""The verifier's own robustness: no file stops the batch, nothing outlives the run.

Real `jaxmigrate run` subprocesses on real trees: a notebook with the README's legacy cells, symbolic
link loops and a link to a dataset outside the tree (issue 17, item 8).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from clitools import jm

pytestmark = pytest.mark.jax

EXAMPLE = Path(__file__).resolve().parents[2] / "examples/legacy_project/legacy_project/sharded.py"
README_CELLS = [
    """import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import PartitionSpec as P
from jax.experimental.maps import Mesh
from jax.experimental.pjit import pjit
""",
    "def layer(x, w):\n    return jnp.tanh(x @ w)\n",
    """devices = np.array(jax.devices()[:8]).reshape(4, 2)
mesh = Mesh(devices, ('data', 'model'))
x = np.ones((16, 8), np.float32)
w = np.full((8, 4), 0.5, np.float32)
with mesh:
    f = pjit(layer, in_axis_resources=(P('data', None), P(None, 'model')),
             out_axis_resources=P('data', 'model'))
    y = f(x, w)
print(y.sum())
""",
]


def notebook(cells: list[str]) -> str:
    document: dict[str, Any] = {
        "cells": [
            {
                "cell_type": "code",
                "execution_count": None,
                "metadata": {},
                "outputs": [],
                "source": cell,
            }
            for cell in cells
        ],
        "metadata": {"kernelspec": {"language": "python", "name": "python3"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    return json.dumps(document, indent=1) + "\n"


def report(path: Path) -> dict[str, dict[str, Any]]:
    """Return the report's files by their base name."""
    data = json.loads(path.read_text(encoding="utf-8"))
    return {Path(f["path"]).name: f for f in data["files"]}


def test_a_notebook_with_the_readme_cells_does_not_stop_the_batch(tmp_path: Path) -> None:
    tree = tmp_path / "project"
    tree.mkdir()
    (tree / "train.ipynb").write_text(notebook(README_CELLS), encoding="utf-8")
    shutil.copyfile(EXAMPLE, tree / "beside.py")
    proc = jm(
        "run",
        "--allow-dirty",
        "--format",
        "json",
        "--report",
        str(tmp_path / "r.json"),
        ".",
        cwd=tree,
    )
    assert "internal error" not in proc.stderr, proc.stderr
    assert proc.returncode in (0, 1), proc.stderr
    assert "jax.set_mesh(mesh)" in (tree / "beside.py").read_text(encoding="utf-8")
    files = report(tmp_path / "r.json")
    assert files["beside.py"]["bucket"] == "changed"
    sites = {s["code"]: s for s in files["train.ipynb"]["sites"]}
    assert sites["JM201"]["status"] == "unverified"
    assert "internal" not in sites["JM201"]["details"]["verification"]


def test_symlink_loops_and_a_dataset_outside_the_tree(tmp_path: Path) -> None:
    """Loops are skipped; a folder outside the tree is read where it is, never copied."""
    data = tmp_path / "dataset"
    data.mkdir()
    (data / "blob.bin").write_bytes(b"\x01" * (4 << 20))
    seen = tmp_path / "seen.txt"
    tree = tmp_path / "project"
    tree.mkdir()
    text = EXAMPLE.read_text(encoding="utf-8").replace(
        "def main():\n",
        "def main():\n"
        "    import os\n"
        "    blob = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'data', 'blob.bin')\n"
        f"    with open({str(seen)!r}, 'a') as log:\n"
        "        log.write(os.path.realpath(blob) + '\\n')\n",
    )
    (tree / "sharded.py").write_text(text, encoding="utf-8")
    os.symlink("self.py", tree / "self.py")
    os.symlink(".", tree / "loop")
    os.symlink(data, tree / "data")
    proc = jm(
        "run",
        "--allow-dirty",
        "--format",
        "json",
        "--report",
        str(tmp_path / "r.json"),
        ".",
        cwd=tree,
    )
    assert "internal error" not in proc.stderr, proc.stderr
    assert proc.returncode == 0, proc.stderr
    files = report(tmp_path / "r.json")
    assert files["self.py"]["bucket"] == "skipped"
    sites = {s["code"]: s for s in files["sharded.py"]["sites"]}
    assert sites["JM201"]["status"] == "verified", sites["JM201"]
    assert "jax.set_mesh(mesh)" in (tree / "sharded.py").read_text(encoding="utf-8")
    read = seen.read_text(encoding="utf-8").split()
    assert len(read) >= 2  # both sides ran main()
    assert set(read) == {str((data / "blob.bin").resolve())}  # the dataset itself, not a copy
