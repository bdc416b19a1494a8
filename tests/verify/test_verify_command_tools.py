"""The `--verify-with` command runs with the interpreter jaxmigrate was given (`--python`).

A virtualenv made with `--system-site-packages` has no `pytest` script of its own: the word
`pytest` found another interpreter's, which could not import the packages installed in the
virtualenv (dm-haiku's tests: "No module named 'tabulate'", every site unverified).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from jaxmigrate.verify import VerifyConfig
from jaxmigrate.verify.child.protocol import encode
from jaxmigrate.verify.recording import recording_plan, run_command
from jaxmigrate.verify.workspace import workspace


def venv_seeing_these_packages(folder: Path) -> Path:
    """Make a venv without pip or scripts whose interpreter imports what this one imports."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True)
    python = folder / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    paths = [p for p in sys.path if p and Path(p).is_dir()]
    (Path(purelib) / "_these_packages.pth").write_text("\n".join(paths) + "\n")
    return python


TEST = """
import os
import sys


def test_interpreter():
    assert sys.executable == os.environ["WANTED_PYTHON"]
"""


def test_pytest_runs_under_the_given_interpreter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "test_one.py").write_text(TEST)
    # the given interpreter, in a folder without a `pytest` script: a venv of its own that
    # sees this interpreter's packages (pytest among them) through a .pth file. (A bare symlink
    # to `sys.executable` is the base interpreter when the tests run in a venv, whose base may
    # have no pytest: Python 3.12 here.)
    python = venv_seeing_these_packages(tmp_path / "venv")
    # and another `pytest` on the PATH, that is not the given interpreter's
    other = tmp_path / "other"
    other.mkdir()
    (other / "pytest").write_text("#!/bin/sh\necho 'not the interpreter given' >&2\nexit 7\n")
    (other / "pytest").chmod(0o755)
    monkeypatch.setenv("PATH", f"{other}:{Path(sys.executable).parent}:/usr/bin:/bin")
    monkeypatch.setenv("WANTED_PYTHON", str(python))
    config = VerifyConfig(root=project, python=str(python), devices=1)
    with workspace(project, {}, {}) as ws:
        plan = ws.base / "plan.json"
        plan.write_text(encode(recording_plan([], ws, 3)))
        note = run_command("pytest -q -p no:cacheprovider test_one.py", ws, config, plan)
        assert note == "", note
        log = (ws.logs / "verify-with.stdout").read_text()  # its standard output
    assert "1 passed" in log


def test_a_pytest_of_the_interpreter_itself_is_used(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    bindir = tmp_path / "venv" / "bin"
    bindir.mkdir(parents=True)
    (bindir / "python").symlink_to(sys.executable)
    (bindir / "pytest").write_text("#!/bin/sh\necho its own pytest\n")
    (bindir / "pytest").chmod(0o755)
    config = VerifyConfig(root=project, python=str(bindir / "python"), devices=1)
    with workspace(project, {}, {}) as ws:
        plan = ws.base / "plan.json"
        plan.write_text(encode(recording_plan([], ws, 3)))
        assert run_command("pytest", ws, config, plan) == ""
        assert "its own pytest" in (ws.logs / "verify-with.stdout").read_text()
