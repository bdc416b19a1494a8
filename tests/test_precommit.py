""".pre-commit-hooks.yaml: a valid manifest whose entries are real commands that behave as a
check hook and a safe-fix hook must (run here the way pre-commit runs them: the installed
console script, the staged file names appended)."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml
from test_cli import LEGACY, MIGRATED

ROOT = Path(__file__).resolve().parent.parent
MANIFEST = yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())
HOOKS = {hook["id"]: hook for hook in MANIFEST}
# the keys pre-commit accepts in a hook manifest (pre_commit/clientlib.py, MANIFEST_HOOK_DICT)
KNOWN_KEYS = {
    "id", "name", "entry", "language", "alias", "files", "exclude", "types", "types_or",
    "exclude_types", "additional_dependencies", "args", "always_run", "fail_fast",
    "pass_filenames", "description", "language_version", "log_file", "require_serial", "stages",
    "verbose", "minimum_pre_commit_version",
}  # fmt: skip
PMAP = "import jax\n\nstep = jax.pmap(lambda x: x * 2)\n"
NOTEBOOK = ROOT / "tests" / "fixtures_notebooks" / "jupyterlab.ipynb"


def test_manifest_is_valid() -> None:
    assert isinstance(MANIFEST, list) and set(HOOKS) == {"jaxmigrate-check", "jaxmigrate"}
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    for hook in MANIFEST:
        assert {"id", "name", "entry", "language"} <= set(hook) <= KNOWN_KEYS, hook
        assert hook["language"] == "python"  # pre-commit pip-installs this repository
        assert set(hook["types_or"]) == {"python", "jupyter"}
        assert shlex.split(hook["entry"])[0] in scripts


def console_script() -> str:
    beside = Path(sys.executable).parent / "jaxmigrate"
    found = str(beside) if beside.exists() else shutil.which("jaxmigrate")
    assert found, "the jaxmigrate console script is not installed (pip install -e .)"
    return found


def run_hook(hook_id: str, files: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    argv = shlex.split(HOOKS[hook_id]["entry"])
    env = {**os.environ, "NO_COLOR": "1", "COLUMNS": "200"}
    return subprocess.run(
        [console_script(), *argv[1:], *files],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=False,
        env=env,
        timeout=300,
    )


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A git repository with files staged for a commit, as pre-commit sees it."""
    (tmp_path / "legacy.py").write_text(LEGACY)
    (tmp_path / "step.py").write_text(PMAP)
    (tmp_path / "clean.py").write_text("import jax\n")
    shutil.copy(NOTEBOOK, tmp_path / "nb.ipynb")
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], cwd=tmp_path, check=True)
    subprocess.run([*git, "add", "."], cwd=tmp_path, check=True)
    return tmp_path


def test_check_hook(repo: Path) -> None:
    before = {p.name: p.read_bytes() for p in repo.iterdir() if p.is_file()}
    proc = run_hook("jaxmigrate-check", ["legacy.py", "clean.py", "nb.ipynb"], repo)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "legacy.py:1:35 JM101" in proc.stdout and "nb.ipynb[cell 2]" in proc.stdout
    assert {p.name: p.read_bytes() for p in repo.iterdir() if p.is_file()} == before
    assert run_hook("jaxmigrate-check", ["clean.py"], repo).returncode == 0


def test_fix_hook_applies_safe_rewrites_only(repo: Path) -> None:
    proc = run_hook("jaxmigrate", ["legacy.py", "step.py", "nb.ipynb"], repo)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (repo / "legacy.py").read_text() == MIGRATED  # staged, yet written
    assert (repo / "step.py").read_text() == PMAP  # unsafe: listed, not applied
    assert "step.py:3:8 JM202" in proc.stdout and "not applied" in proc.stdout
    notebook = (repo / "nb.ipynb").read_text()
    assert "jax.sharding import Mesh" in notebook and "with mesh:" in notebook
    again = run_hook("jaxmigrate", ["legacy.py", "step.py", "nb.ipynb"], repo)
    assert again.returncode == 0 and (repo / "legacy.py").read_text() == MIGRATED
