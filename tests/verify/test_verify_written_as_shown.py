"""What a verified run writes is the text its dry run showed and its sites describe.

Verification renders each file again (the candidate it runs, then the text it writes), and that
rendering used to read less of the code base than the first run did: no callers of the module,
no imported modules, no project style. Where a decision rests on the code base (a public class
or function that no other module uses), the dry run showed the program-level pmap form, the
sites said `verified`, and the file was written in the faithful form, with a helper module no
site had announced. Both runs now go through the engine's one entry (`verify/results.migrated`).
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path

import pytest
from clitools import cli_env, jm

pytestmark = [pytest.mark.jax, pytest.mark.one_jax]  # not again on JAX 0.12 (.ci/run)

FIXTURES = Path(__file__).parent.parent / "fixtures" / "pmap"
PROGRAM = FIXTURES / "program_pmap_decorated_method.py"


def public(text: str) -> str:
    """The fixture's class made public: its method is taken only when no other module of the code
    base names the class, which only a reading of the code base can tell."""
    return text.replace("_Trainer", "Trainer")


def test_the_verified_run_writes_the_text_the_dry_run_showed(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "trainer.py").write_text(public(PROGRAM.read_text()))
    (tree / "run.py").write_text("import trainer\n\ntrainer.main()\n")  # names only `main`
    env = cli_env()
    shown = jm("run", "--dry-run", "--no-cache", "--no-verify", "--unsafe-fixes", ".", cwd=tree)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    report = tmp_path / "report.json"
    args = ("run", "--no-cache", "--jobs", "1", "--report", str(report), ".")
    proc = jm(*args, cwd=tree, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr

    written = (tree / "trainer.py").read_text()
    expected = public((FIXTURES / "program_pmap_decorated_method.expected.py").read_text())
    assert written == expected, "".join(
        difflib.unified_diff(expected.splitlines(True), written.splitlines(True))
    )
    assert "program-level" in shown.stdout and "shard_map_per_device" not in shown.stdout
    assert sorted(p.name for p in tree.iterdir()) == ["run.py", "trainer.py"]  # no helper module
    (result,) = [f for f in json.loads(report.read_text())["files"] if f["path"].endswith("r.py")]
    statuses = {(s["line"], s["status"], s["applied"]) for s in result["sites"]}
    assert statuses == {(line, "verified", True) for line in (19, 30, 32, 33, 35, 36)}, statuses
    assert all("program-level" in s["message"] for s in result["sites"][:1])


CELLS = [
    ["import jax\n", "import numpy as np\n", "import trainer\n"],
    ["step = jax.pmap(lambda x: jax.lax.psum(x, 'i') * x, 'i')\n"],
    ["n = jax.local_device_count()\n", "print(step(np.arange(n * 3.0).reshape(n, 3)).sum())\n"],
]


def test_a_verified_notebook_imports_the_code_bases_helper_as_shown(tmp_path: Path) -> None:
    """A notebook importing its code base's main package imports the pmap helper from it: so the
    dry run says, and so it is verified and written (it was verified and written with the helper
    pasted into a cell, and no helper module)."""
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "trainer"\n')
    (tmp_path / "trainer").mkdir()
    (tmp_path / "trainer" / "__init__.py").write_text("")
    (tmp_path / "notebooks").mkdir()
    cells = [
        {"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [], "source": c}
        for c in CELLS
    ]
    document = {"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    notebook = tmp_path / "notebooks" / "train.ipynb"
    notebook.write_text(json.dumps(document))
    shown = jm("run", "--dry-run", "--no-cache", "--no-verify", "--unsafe-fixes", ".", cwd=tmp_path)
    assert "from trainer._pmap_compat import shard_map_per_device" in shown.stdout, shown.stdout
    report = tmp_path.parent / "report.json"
    args = ("run", "--no-cache", "--jobs", "1", "--report", str(report), ".")
    proc = jm(*args, cwd=tmp_path, env=cli_env())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    first = "".join(json.loads(notebook.read_text())["cells"][0]["source"])
    assert "from trainer._pmap_compat import shard_map_per_device" in first, first
    assert "def shard_map_per_device" not in notebook.read_text()
    assert "def shard_map_per_device" in (tmp_path / "trainer" / "_pmap_compat.py").read_text()
    (result,) = [f for f in json.loads(report.read_text())["files"] if f["path"].endswith("nb")]
    assert [(s["status"], s["applied"]) for s in result["sites"]] == [("verified", True)]
