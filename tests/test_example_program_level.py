"""The bundled example's pmap program takes the program-level form, verified as a 2-process job,
and prints the same numbers before and after, on one process and on two.

`examples/legacy_project/legacy_project/train.py` makes a train and an eval step, replicates
and splits with its own helpers (`_replicate(tree, n)`, `_shard(tree, n)`, read through their
summaries) and reads the eval step's result in the `return` (`_unreplicate(p_eval_step(...))`).
Before summaries and readbacks in expressions, both steps stayed faithful (PL301, PL206).
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from clitools import jm
from multihost import run_job

pytestmark = pytest.mark.jax

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "legacy_project"
PRINT = """\
import sys
sys.path.insert(0, ".")
import numpy as np
np.set_printoptions(precision=6)
from legacy_project.train import main
params, loss, evaluated = main()
numbers = (np.asarray(params["w"]), np.asarray(params["b"]), np.asarray(loss), np.asarray(evaluated))
print("<numbers>", *numbers, "</numbers>", flush=True)
"""


def test_the_example_takes_the_program_level_form_and_keeps_its_numbers(tmp_path: Path) -> None:
    before, after = tmp_path / "before", tmp_path / "after"
    shutil.copytree(EXAMPLE, before)
    shutil.copytree(EXAMPLE, after)
    proc = jm("run", "--processes", "2", "--select", "JM202", "legacy_project/train.py", cwd=after)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    sites = [
        line for line in proc.stdout.splitlines() if line.startswith("legacy_project/train.py")
    ]
    assert len(sites) == 7 and all("[unsafe, verified]" in s for s in sites), proc.stdout
    assert sum("(program-level)" in s for s in sites) == 2, proc.stdout
    migrated = (after / "legacy_project" / "train.py").read_text()
    for gone in ("jax.pmap", "def _replicate", "def _shard", "def _unreplicate", "[0]"):
        assert gone not in migrated, migrated
    assert "jax.jit(\n        jax.shard_map(" in migrated
    for tree in (before, after):
        (tree / "show.py").write_text(PRINT)
    for processes in (1, 2):
        shown = [
            [
                _numbers(out)
                for out in run_job(
                    tree / "show.py", processes=processes, devices=8, cwd=tree, timeout=240
                )
                .check()
                .stdouts
            ]
            for tree in (before, after)
        ]
        assert shown[0] == shown[1], shown
        assert len(set(shown[0])) == 1  # every process prints the same numbers


def test_the_faithful_form_of_a_file_named_in_its_package_imports_its_helper(
    tmp_path: Path,
) -> None:
    """`legacy_project/train.py` named alone, in no git tree and beside no pyproject: the tree
    verification copies is the folder holding the package, not the package's folder. Seen in
    CI, where the program-level form failed once under load and its fallback, the faithful form,
    imports `legacy_project._pmap_compat`: copied from `legacy_project/`, the package could not
    be imported ("No module named 'legacy_project'") and the fallback failed too."""
    shutil.copytree(EXAMPLE, tmp_path / "example")
    proc = jm(
        "run",
        "--dry-run",
        "--processes",
        "2",
        "--select",
        "JM202",
        "--pmap-style",
        "faithful",
        "legacy_project/train.py",
        cwd=tmp_path / "example",
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    sites = [
        line for line in proc.stdout.splitlines() if line.startswith("legacy_project/train.py")
    ]
    assert len(sites) == 2 and all("[unsafe, verified]" in s for s in sites), proc.stdout
    assert all("shard_map_per_device" in s for s in sites), proc.stdout
    assert "from legacy_project._pmap_compat import shard_map_per_device" in proc.stdout


NUMBERS = re.compile(r"<numbers>(.*?)</numbers>", re.DOTALL)


def _numbers(stdout: str) -> str:
    """What the program printed between its markers: gloo writes its connection messages in
    pieces (`[Gloo] Rank `, `1 is connected to 3`, ` peer ranks. ...`) straight to the same
    descriptor, on lines of their own or not, so only the marked text is read."""
    found = NUMBERS.findall(stdout)
    assert len(found) == 1, stdout
    return found[0].strip()
