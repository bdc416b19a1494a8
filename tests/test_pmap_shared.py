"""One `shard_map_per_device` per code base: a module of the user's package, imported where needed.

Real `jaxmigrate` runs over a real package on disk: the helper module is created once (shown in
a dry run, counted, written with the files that import it), the rewritten modules import it and
run as before on an 8-device CPU mesh, and a second run changes nothing.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from clitools import jm
from conftest import jax_env

from jaxmigrate.model import Options
from jaxmigrate.pipeline.engine import migrate_source
from jaxmigrate.pipeline.project import Project
from jaxmigrate.toolkit.passes import Home

STEP = """\
import functools

import jax
import numpy as np


@functools.partial(jax.pmap, axis_name="i", donate_argnums=(0,))
def step(w, x):
    return w - 0.1 * jax.lax.pmean(x * w, "i")


def main():
    w = np.ones((8, 3), np.float32)
    x = np.arange(24, dtype=np.float32).reshape(8, 3)
    return np.asarray(step(w, x))
"""

SCALE = """\
import jax
import numpy as np

scale = jax.pmap(lambda x: x * jax.lax.axis_index("j"), axis_name="j")


def main():
    return np.asarray(scale(np.ones((8, 2), np.float32)))
"""

IMPORT = "from pkg._pmap_compat import shard_map_per_device"


@pytest.fixture
def project(tmp_path: Path) -> Path:
    for folder in ("pkg", "pkg/sub"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "__init__.py").write_text("")
    (tmp_path / "pkg" / "train.py").write_text(STEP)
    (tmp_path / "pkg" / "sub" / "scale.py").write_text(SCALE)
    (tmp_path / "script").mkdir()
    (tmp_path / "script" / "run.py").write_text(SCALE)
    return tmp_path


def home_of(path: Path, text: str = "") -> Home | None:
    return Project().home(path, text)


def code_of(helper: Path) -> str:
    """Return a helper module's code, without its docstring (which says why it is there)."""
    return helper.read_text().split('"""\n', 1)[1]


def test_home_is_the_top_package_or_the_scripts_folder(project: Path) -> None:
    home = home_of(project / "pkg" / "sub" / "scale.py")
    assert home is not None and home.package == "pkg"
    assert Path(home.directory) == project / "pkg"
    script = home_of(project / "script" / "run.py")
    assert script is not None and script.package is None
    assert Path(script.directory) == project / "script"
    assert home_of(project / "nb.ipynb") is None


def test_a_namespace_folder_in_a_package_shares_the_package_helper(project: Path) -> None:
    """big_vision's `evaluators/proj/image_text/` has no `__init__.py` but its files import
    `big_vision`: one helper for the package, not one per folder; a script folder whose files
    import their siblings by bare name keeps its own."""
    deep = project / "pkg" / "proj" / "image_text"
    deep.mkdir(parents=True)
    (deep / "helpers.py").write_text("")
    (deep / "model.py").write_text("from pkg import sub\nimport helpers\n" + SCALE)
    home = home_of(deep / "model.py", (deep / "model.py").read_text())
    assert home is not None and home.package == "pkg"
    assert Path(home.directory) == project / "pkg"
    (deep / "run.py").write_text("import helpers\n" + SCALE)
    alone = home_of(deep / "run.py", (deep / "run.py").read_text())
    assert alone is not None and alone.package is None
    assert Path(alone.directory) == deep


def test_without_a_home_the_helper_stays_in_the_file() -> None:
    result = migrate_source(STEP, options=Options(unsafe_fixes=True))
    assert "def shard_map_per_device(" in result.code and not result.files


def test_dry_run_shows_the_shared_module_and_writes_nothing(project: Path) -> None:
    proc = jm("run", "--dry-run", "--unsafe-fixes", "--no-verify", "--no-cache", ".", cwd=project)
    assert proc.returncode == 0, proc.stderr
    assert "+++ pkg/_pmap_compat.py" in proc.stdout or "pkg/_pmap_compat.py" in proc.stdout
    assert proc.stdout.count("+def shard_map_per_device(") == 2  # pkg's and the script's
    assert not (project / "pkg" / "_pmap_compat.py").exists()


@pytest.mark.jax
def test_one_helper_per_package_imported_and_running(project: Path) -> None:
    proc = jm("run", "--unsafe-fixes", "--no-verify", "--no-cache", ".", cwd=project)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    shared = project / "pkg" / "_pmap_compat.py"
    assert "def shard_map_per_device(" in shared.read_text()
    for module in ("pkg/train.py", "pkg/sub/scale.py"):
        text = (project / module).read_text()
        assert IMPORT in text and "def shard_map_per_device(" not in text, module
    script = (project / "script" / "run.py").read_text()
    assert "from _pmap_compat import shard_map_per_device" in script
    beside = project / "script" / "_pmap_compat.py"
    assert code_of(beside) == code_of(shared) and "beside" in beside.read_text()
    before = {p: p.read_text() for p in project.rglob("*.py")}
    again = jm("run", "--unsafe-fixes", "--no-verify", "--no-cache", ".", cwd=project)
    assert again.returncode == 0 and "+" not in "".join(
        line[:1] for line in again.stdout.splitlines()
    )
    assert {p: p.read_text() for p in project.rglob("*.py")} == before
    check = (
        "import numpy as np, pkg.train, pkg.sub.scale;"
        "w = pkg.train.main(); s = pkg.sub.scale.main();"
        "x = np.arange(24, dtype=np.float32).reshape(8, 3);"
        "assert np.allclose(w, 1 - 0.1 * x.mean(0)), w;"
        "assert np.allclose(s, np.arange(8)[:, None] * np.ones((8, 2))), s"
    )
    ran = subprocess.run(
        [sys.executable, "-c", check],
        cwd=project,
        env=jax_env(8),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    script_run = subprocess.run(
        [sys.executable, "-c", "import run; print(run.main().sum())"],
        cwd=project / "script",
        env=jax_env(8),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert script_run.returncode == 0 and float(script_run.stdout) == 56.0, script_run.stderr


def test_a_foreign_module_of_that_name_is_never_replaced(project: Path) -> None:
    foreign = project / "pkg" / "_pmap_compat.py"
    foreign.write_text("VALUE = 1\n")
    proc = jm("run", "--unsafe-fixes", "--no-verify", "--no-cache", "pkg", cwd=project)
    assert proc.returncode != 0
    assert foreign.read_text() == "VALUE = 1\n"
    assert (project / "pkg" / "train.py").read_text() == STEP  # not written without its helper


def test_a_folder_whose_name_is_no_identifier_is_no_package(tmp_path: Path) -> None:
    """algorithmic-efficiency's checkout holds an `__init__.py`: `from algorithmic-efficiency
    import ...` would not parse, so the top package is the one inside it."""
    root = tmp_path / "algorithmic-efficiency"
    (root / "algoperf").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "algoperf" / "__init__.py").write_text("")
    (root / "algoperf" / "workload.py").write_text(SCALE)
    home = home_of(root / "algoperf" / "workload.py", SCALE)
    assert home is not None and home.package == "algoperf"


def test_code_that_does_not_parse_is_never_written() -> None:
    from jaxmigrate.pipeline.engine import Migration
    from jaxmigrate.pipeline.files import _unparsable

    good = Migration("x = 1\n", (), ())
    assert _unparsable("a.py", good) is None
    bad = Migration("from algorithmic-efficiency._pmap_compat import f\n", (), ())
    assert "does not parse" in (_unparsable("a.py", bad) or "")
