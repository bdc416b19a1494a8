"""A built wheel, installed into a fresh virtualenv, gives a working `jaxmigrate`."""

from __future__ import annotations

import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_wheel_installs_and_runs(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    build = subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--outdir", str(dist), str(ROOT)],
        capture_output=True,
        check=False,
        text=True,
        timeout=600,
    )
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    wheel = next(dist.glob("jaxmigrate-*.whl"))
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    py = env_dir / "bin" / "python"
    install = subprocess.run(
        [str(py), "-m", "pip", "install", "-q", str(wheel)],
        capture_output=True,
        check=False,
        text=True,
    )
    assert install.returncode == 0, install.stderr[-3000:]
    probe = subprocess.run(
        [str(py), "-c", "import jaxmigrate.codemods as c, jaxmigrate; print(c.__file__)"],
        capture_output=True,
        check=False,
        text=True,
        cwd=tmp_path,
    )
    assert probe.returncode == 0, probe.stderr
    assert str(env_dir) in probe.stdout, "imported from the source tree, not the wheel"
    rules = subprocess.run(
        [str(env_dir / "bin" / "jaxmigrate"), "rules"],
        capture_output=True,
        check=False,
        text=True,
        cwd=tmp_path,
    )
    assert rules.returncode == 0 and "JM202" in rules.stdout, rules.stderr
    example = ROOT / "examples" / "legacy_project"
    dry = subprocess.run(
        [str(env_dir / "bin" / "jaxmigrate"), "run", "--dry-run", "--no-verify", str(example)],
        capture_output=True,
        check=False,
        text=True,
        cwd=tmp_path,
    )
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert "JM101" in dry.stdout
