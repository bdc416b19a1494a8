"""`--verify-project-tests/--no-verify-project-tests` (`verify-project-tests` in pyproject).

Under `--verify-with`, a function the command never called is recorded through the project's own
tests that name it (`verify.discover`). That runs up to 40 of the user's tests, which may be slow,
need data, or touch services: the switch turns it off. `simulate`'s pmap runs only on
`method="parallel"`, which only `tests/test_sim.py` passes: with the switch on (the default, or
the flag over a `false` in pyproject) the site is verified on the tests' call; with it off (the
key, or the flag) the command's no call and the synthesized ones that miss the branch leave it
`unverified`, and the tests never run.
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from clitools import jm

from jaxmigrate.cli.common import resolve_settings
from jaxmigrate.config import ConfigError, find_pyproject, load_config

pytestmark = pytest.mark.one_jax  # not again on JAX 0.12 (.ci/run)

SIM = textwrap.dedent("""
    import jax


    def simulate(x, method="sequential"):
        if method == "parallel":
            return jax.pmap(lambda v: v * 2)(x)
        return jax.lax.map(lambda v: v * 2, x)
    """)
TESTS = textwrap.dedent("""
    import pathlib

    import jax.numpy as jnp

    from pkg.sim import simulate


    def test_parallel():
        pathlib.Path("PROJECT_TESTS_RAN").touch()  # in the verifier's copy, never the tree
        assert simulate(jnp.ones((8, 2)), method="parallel").shape == (8, 2)
    """)


def make_project(root: Path, table: str = "") -> Path:
    (root / "pkg").mkdir(parents=True)
    (root / "tests").mkdir()
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "sim.py").write_text(SIM)
    (root / "tests" / "test_sim.py").write_text(TESTS)
    (root / "other.py").write_text("print('calls nothing')\n")
    (root / "pyproject.toml").write_text(f'[project]\nname = "sim"\n\n[tool.jaxmigrate]\n{table}')
    return root


def verdict(root: Path, *flags: str) -> dict[str, Any]:
    """Run `jaxmigrate run --dry-run --verify-with "python other.py"`; return the pmap site."""
    report = root.parent / f"{root.name}.json"
    proc = jm(
        *("run", "--dry-run", "--no-cache", "--timeout", "120", *flags),
        *("--verify-with", f"{sys.executable} other.py"),
        *("--report", str(report), "--format", "json", "."),
        cwd=root,
        timeout=900,
    )
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    (site,) = [s for f in json.loads(report.read_text())["files"] for s in f["sites"]]
    assert site["code"] == "JM202", site
    assert not (root / "PROJECT_TESTS_RAN").exists()  # the tree is only read
    return site


@pytest.mark.jax
@pytest.mark.parametrize(
    ("table", "flags"),
    [("", ()), ("verify-project-tests = false\n", ("--verify-project-tests",))],
    ids=["default", "flag-over-config"],
)
def test_on_the_projects_tests_record_what_the_command_never_called(
    tmp_path: Path, table: str, flags: tuple[str, ...]
) -> None:
    site = verdict(make_project(tmp_path / "on", table), *flags)
    details = site["details"]
    assert site["status"] == "verified", site
    assert details["input_source"] == "recorded" and details["calls"] == 1, site
    assert details["recorded_by"] == "tests/test_sim.py (1 test)", site
    assert "inputs recorded by the project's tests that call `simulate`" in details["verification"]


@pytest.mark.jax
@pytest.mark.parametrize(
    ("table", "flags"),
    [("verify-project-tests = false\n", ()), ("", ("--no-verify-project-tests",))],
    ids=["config", "flag"],
)
def test_off_only_the_command_is_recorded(
    tmp_path: Path, table: str, flags: tuple[str, ...]
) -> None:
    site = verdict(make_project(tmp_path / "off", table), *flags)
    details = site["details"]
    assert site["status"] == "unverified", site
    assert "recorded_by" not in details and "project's tests" not in details["verification"], site
    assert "never ran" in details["verification"], site  # synthesized calls miss the pmap branch


def test_the_key_and_the_flags_resolve_to_one_setting(tmp_path: Path) -> None:
    root = make_project(tmp_path / "p", "verify-project-tests = false\n")
    config = load_config(find_pyproject([root]))
    assert config.verify_project_tests is False
    unset = ("select", "ignore", "exclude", "jobs", "target_jax", "unsafe_fixes")
    common: dict[str, Any] = dict.fromkeys(unset)
    for flag, expected in ((None, False), (True, True), (False, False)):
        settings = resolve_settings([root], no_verify=False, project_tests=flag, **common)
        assert settings.project_tests is expected, flag
        assert settings.verify_config().project_tests is expected, flag
    (root / "pyproject.toml").write_text('[tool.jaxmigrate]\nverify-project-tests = "no"\n')
    with pytest.raises(ConfigError, match="verify-project-tests must be a bool"):
        load_config(root / "pyproject.toml")
    (root / "pyproject.toml").write_text("[tool.jaxmigrate]\n")
    bare = resolve_settings([root], no_verify=False, project_tests=None, **common)
    assert bare.project_tests is True


@pytest.mark.parametrize("command", ["run", "verify"])
def test_both_verifying_commands_take_the_flag(tmp_path: Path, command: str) -> None:
    proc = jm(command, "--help", cwd=tmp_path, columns=250)
    assert proc.returncode == 0, proc.stderr
    assert "--verify-project-tests" in proc.stdout and "--no-verify-project-tests" in proc.stdout
