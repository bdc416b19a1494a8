"""A project holding the temporary directory is copied without the verifier's own workspace.

The tree copied for verification is the folder holding the package given (`examples/`, a
package, given alone: its parent), and that folder may hold the system's temporary directory
(`/tmp/examples` given: the root is `/tmp`). The copy walked into the workspace it was being
written into, and copied the copy into itself until the disk was full. A verifier's workspace,
this run's or another's beside it, is never part of the project.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from jaxmigrate.verify.lifetime import PREFIX
from jaxmigrate.verify.workspace import copy_project, workspace


def test_the_workspace_inside_the_root_is_not_copied(tmp_path: Path) -> None:
    project = tmp_path / "project"
    (project / "pkg").mkdir(parents=True)
    (project / "pkg" / "__init__.py").write_text("")
    (project / "pkg" / "train.py").write_text("x = 1\n")
    scratch = project / "tmp"
    scratch.mkdir()
    before, tempfile.tempdir = tempfile.tempdir, str(scratch)
    try:
        with workspace(project, {"pkg/train.py": "x = 1\n"}, {"pkg/train.py": "x = 2\n"}) as ws:
            assert ws.base.parent == scratch  # the workspace is inside the tree it copies
            for side, value in (("original", "1"), ("candidate", "2")):
                copy = ws.tree(side)
                assert (copy / "pkg" / "train.py").read_text() == f"x = {value}\n"
                assert sorted(p.name for p in (copy / "tmp").iterdir()) == []
    finally:
        tempfile.tempdir = before


def test_another_runs_workspace_is_not_copied(tmp_path: Path) -> None:
    project = tmp_path / "project"
    (project / f"{PREFIX}abc123" / "original").mkdir(parents=True)
    (project / f"{PREFIX}abc123" / "original" / "big.py").write_text("x = 1\n")
    (project / "train.py").write_text("x = 1\n")
    dest = tmp_path / "copy"
    copy_project(project, dest)
    assert sorted(p.name for p in dest.iterdir()) == ["train.py"]
