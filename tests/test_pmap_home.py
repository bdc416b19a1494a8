"""At most one shared `_pmap_compat.py` per code base, importable from every file that uses it.

Real project trees in `tmp_path` (a package, a script folder, a tests folder, a namespace folder,
a package named `jax` inside another package, a checkout folder with a dash in its name), real
`jaxmigrate` runs, and the written code run by real Python: `python main.py`, `python -m pytest`,
`python -c "import pkg.mod"`, each as the project would run it. A code base with no package at
all keeps one module per script folder: no `sys.path` entry is shared by `python a/run.py` and
`python b/run.py`.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import clitools
import pytest
from conftest import jax_env

from jaxmigrate.pipeline.project import Project, imported

STEP = """\
import functools

import jax
import numpy as np


@functools.partial(jax.pmap, axis_name="i")
def step(w, x):
    return w - 0.1 * jax.lax.pmean(x * w, "i")


def main():
    w = np.ones((8, 3), np.float32)
    x = np.arange(24, dtype=np.float32).reshape(8, 3)
    return np.asarray(step(w, x))
"""

# The device index times 1 on every element: 2 * (0 + 1 + ... + 7) = 56 over an (8, 2) input.
SCALE = """\
import jax
import numpy as np

scale = jax.pmap(lambda x: x * jax.lax.axis_index("j"), axis_name="j")


def main():
    return np.asarray(scale(np.ones((8, 2), np.float32)))
"""

SCRIPT = """\
import data
import jax
import numpy as np

from mylib import train

double = jax.pmap(lambda x: 2 * x, axis_name="k")

if __name__ == "__main__":
    print(float(np.asarray(double(data.ones())).sum()), float(train.main().sum()))
"""

TEST = """\
import jax
import numpy as np

from mylib import train


def test_step_and_a_pmap_of_the_test():
    halve = jax.pmap(lambda x: x / 2, axis_name="t")
    assert float(np.asarray(halve(np.ones((8, 4), np.float32))).sum()) == 16.0
    assert np.allclose(train.main(), 1 - 0.1 * np.arange(24).reshape(8, 3).mean(0))
"""

MAIN_IMPORT = "from mylib._pmap_compat import shard_map_per_device"


def write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def code_base(tmp_path: Path) -> Path:
    """A checkout named `my-code` (an `__init__.py`, but no package name) of distribution
    `mylib`: its package, a namespace folder in it, a package `tools` beside it (holding a
    package named `jax`), a script folder and a tests folder, both without `__init__.py`."""
    pyproject = '[project]\nname = "mylib"\n\n[tool.pytest.ini_options]\npythonpath = ["."]\n'
    return write(
        tmp_path / "my-code",
        {
            "pyproject.toml": pyproject,
            "__init__.py": "",
            "mylib/__init__.py": "",
            "mylib/train.py": STEP,
            "mylib/proj/ns/scale.py": SCALE,
            "tools/__init__.py": "",
            "tools/jax/__init__.py": "",
            "tools/jax/run.py": SCALE,
            "scripts/train/main.py": SCRIPT,
            "scripts/train/data.py": "import numpy as np\n\n\ndef ones():\n"
            "    return np.ones((8, 2), np.float32)\n",
            "tests/test_step.py": TEST,
            "tests/unit/test_unit.py": TEST,
        },
    )


def jm(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run `jaxmigrate ARGS` forcing the unsafe sites through, unverified and uncached."""
    return clitools.jm(*args, "--unsafe-fixes", "--no-verify", "--no-cache", cwd=cwd)


def run(args: list[str], cwd: Path, **env: str) -> str:
    """Run `args` with JAX on 8 CPU devices; return its output, failing the test if it fails."""
    done = subprocess.run(
        args,
        cwd=cwd,
        env={**jax_env(8), **env},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def sources(root: Path) -> dict[Path, str]:
    return {p: p.read_text() for p in sorted(root.rglob("*.py"))}


def helpers(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("_pmap_compat.py"))


# Where the helper goes, file by file ------------------------------------------------------------
def test_every_file_of_the_code_base_shares_its_main_package(tmp_path: Path) -> None:
    root = code_base(tmp_path)
    project = Project()
    whys = {}
    for name in (
        "mylib/train.py",
        "mylib/proj/ns/scale.py",
        "tools/jax/run.py",
        "scripts/train/main.py",
        "tests/test_step.py",
        "tests/unit/test_unit.py",
    ):
        home = project.home(root / name, (root / name).read_text())
        assert home is not None and home.package == "mylib" and home.main, (name, home)
        assert Path(home.directory) == root / "mylib"
        whys[name] = home.why
    assert "imports `mylib`" in whys["tests/unit/test_unit.py"]
    assert "in package `tools`, beside `mylib`" in whys["tools/jax/run.py"]
    assert "is in `mylib`" in whys["mylib/proj/ns/scale.py"]


def test_a_script_folder_importing_nothing_of_its_code_base_keeps_its_own(tmp_path: Path) -> None:
    root = code_base(tmp_path)
    write(root, {"scripts/lone/run.py": SCALE, "mylib/tools/go.py": "import util\n" + SCALE})
    write(root, {"mylib/tools/util.py": ""})
    for name in ("scripts/lone/run.py", "mylib/tools/go.py"):
        home = Project().home(root / name, (root / name).read_text())
        assert home is not None and home.package is None and not home.main
        assert Path(home.directory) == (root / name).parent


@pytest.mark.parametrize(
    ("distribution", "packages", "main"),
    [
        ("algoperf", ["algoperf", "algorithms", "scoring", "tests"], "algoperf"),
        ("dm-haiku", ["examples", "haiku"], "haiku"),
        (None, ["docs", "examples", "jax"], "jax"),
        (None, ["big", "small", "tests"], "big"),  # the largest when nothing else decides
    ],
)
def test_the_main_package(
    tmp_path: Path, distribution: str | None, packages: list[str], main: str
) -> None:
    files = {f"{p}/__init__.py": "" for p in packages} | {"big/a.py": "", "big/b.py": ""}
    files["setup.py"] = f"setup(name='{distribution}')\n" if distribution else "setup()\n"
    write(tmp_path, files)
    found = Project().main_package(tmp_path)
    assert found is not None and found.name == main


def test_a_folder_named_like_jax_is_not_what_import_jax_means(tmp_path: Path) -> None:
    """AlgoPerf's `algorithms/.../lamb/jax/submission.py` imports JAX, not its own folder: with
    no main package around, its home is its top package `algorithms`, never `jax`."""
    write(tmp_path, {"algorithms/__init__.py": "", "algorithms/lamb/jax/__init__.py": ""})
    write(tmp_path, {"algorithms/lamb/__init__.py": "", "algorithms/lamb/jax/sub.py": SCALE})
    home = Project().home(tmp_path / "algorithms/lamb/jax/sub.py", SCALE)
    assert home is not None and home.package == "algorithms"


# The written code runs, and a second run changes nothing ------------------------------------------
@pytest.mark.jax
def test_one_helper_for_the_whole_code_base_and_every_kind_of_file_runs(tmp_path: Path) -> None:
    root = code_base(tmp_path)
    dry = jm("run", "--dry-run", ".", cwd=root)
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert dry.stdout.count("+def shard_map_per_device(") == 1
    first = jm("run", "--report", str(tmp_path / "report.json"), "--format", "json", ".", cwd=root)
    assert first.returncode == 0, first.stdout + first.stderr
    assert helpers(root) == ["mylib/_pmap_compat.py"]
    rewritten = [p for p, text in sources(root).items() if "shard_map_per_device" in text]
    assert len(rewritten) == 7  # the helper and the six files using it
    for path in rewritten:
        if path.name != "_pmap_compat.py":
            assert MAIN_IMPORT in path.read_text(), path
    messages = [
        site["message"]
        for file in json.loads((tmp_path / "report.json").read_text())["files"]
        for site in file["sites"]
        if file["path"].endswith("test_unit.py")
    ]
    assert any(
        "imported from `mylib._pmap_compat`: this file imports `mylib`" in m for m in messages
    )
    before = sources(root)
    again = jm("run", ".", cwd=root)
    assert again.returncode == 0 and sources(root) == before, again.stdout

    # `python main.py` from its folder, the code base on PYTHONPATH as its README would say
    out = run([sys.executable, "main.py"], root / "scripts" / "train", PYTHONPATH=str(root))
    doubled, trained = map(float, out.split())
    assert doubled == 32.0
    assert trained == pytest.approx(24 - 0.1 * 8 * sum(range(24)) / 8)
    # pytest from the root (pythonpath = ["."]): tests/ and tests/unit/ import the helper
    out = run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"], root)
    assert "2 passed" in out
    # the namespace module and the package named `jax` inside `tools`, imported by name
    check = (
        "import mylib.proj.ns.scale as s, tools.jax.run as r;print(s.main().sum(), r.main().sum())"
    )
    assert run([sys.executable, "-c", check], root).split() == ["56.0", "56.0"]


@pytest.mark.jax
def test_a_code_base_without_packages_keeps_one_helper_per_script_folder(tmp_path: Path) -> None:
    """Two script folders and a tests folder, none a package: `python a/run.py` has `a/` first on
    `sys.path`, `python b/run.py` has `b/`, pytest has `tests/`; nothing else is sure to be there,
    so each gets its own module, beside it, imported by its bare name."""
    main = SCALE + '\n\nif __name__ == "__main__":\n    print(main().sum())\n'
    test = SCALE + "\n\ndef test_scale():\n    assert main().sum() == 56.0\n"
    root = write(
        tmp_path / "scripts-only",
        {"pyproject.toml": "", "a/run.py": main, "b/run.py": main, "tests/test_run.py": test},
    )
    done = jm("run", ".", cwd=root)
    assert done.returncode == 0, done.stdout + done.stderr
    assert helpers(root) == ["a/_pmap_compat.py", "b/_pmap_compat.py", "tests/_pmap_compat.py"]
    for name in ("a/run.py", "b/run.py", "tests/test_run.py"):
        assert "from _pmap_compat import shard_map_per_device" in (root / name).read_text()
    before = sources(root)
    assert jm("run", ".", cwd=root).returncode == 0 and sources(root) == before
    for folder in ("a", "b"):
        assert float(run([sys.executable, "run.py"], root / folder)) == 56.0
    out = run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"], root)
    assert "1 passed" in out


def test_what_a_file_imports_by_absolute_name() -> None:
    text = (
        "import os, jax.numpy as jnp\n"
        "from . import sibling\n"
        "from .models import net\n"
        "from big_vision.utils import x\n"
        "def f():\n"
        "    import mylib\n"
        "s = 'import nothing'\n"
    )
    assert imported(text) == {"os", "jax", "big_vision", "mylib"}
