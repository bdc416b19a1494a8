"""The JAX the rewritten code must run on: `--target-jax`, `target-jax` in `[tool.jaxmigrate]`,
else the lower bound of the project's own `jax` pin, else the installed JAX. A rewrite that needs
a newer JAX than the target is not made, and the skip says why and where the target came from."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
from clitools import jm

from jaxmigrate.config import JaxPin, jax_pin

SCHEMA = json.loads((Path(__file__).parents[1] / "docs" / "report.schema.json").read_text())

SHARD_MAP = """\
from jax.experimental.shard_map import shard_map
from jax.sharding import PartitionSpec as P


def run(f, mesh, x):
    return shard_map(f, mesh=mesh, in_specs=P("x"), out_specs=P("x"))(x)
"""


@pytest.mark.parametrize(
    ("name", "text", "expected"),
    [
        (
            "pyproject.toml",
            '[project]\nname = "p"\ndependencies = ["numpy", "jax[cpu]>=0.6.2,<0.8"]\n',
            JaxPin("0.6.2", "jax[cpu]>=0.6.2,<0.8", "pyproject.toml"),
        ),
        ("requirements.txt", "numpy\njax==0.4.30  # the cluster's\n", None),
        ("setup.cfg", "[options]\ninstall_requires =\n    jax ~= 0.5.0\n", None),
        ("setup.py", 'setup(name="p", install_requires=["jaxlib>=0.4", "jax>=0.4.26"])\n', None),
    ],
)
def test_the_project_pin_is_read(tmp_path: Path, name: str, text: str, expected: object) -> None:
    (tmp_path / name).write_text(text)
    found = jax_pin(tmp_path)
    assert found is not None
    if expected is not None:
        assert found == expected
    assert found.where == name
    assert (
        found.version
        == {
            "pyproject.toml": "0.6.2",
            "requirements.txt": "0.4.30",
            "setup.cfg": "0.5.0",
            "setup.py": "0.4.26",
        }[name]
    )


@pytest.mark.parametrize(
    "text",
    [
        '[project]\nname = "p"\ndependencies = ["jax", "jaxlib>=0.4.1", "jax-triton>=0.1"]\n',
        '[project]\nname = "p"\ndependencies = ["jax<0.5"]\n',
        # an extra says what some users install, not what the code needs
        '[project]\nname = "p"\n[project.optional-dependencies]\ntpu = ["jax[tpu]>=0.4.6"]\n',
    ],
)
def test_no_lower_bound_is_no_pin(tmp_path: Path, text: str) -> None:
    (tmp_path / "pyproject.toml").write_text(text)
    assert jax_pin(tmp_path) is None


def skips(root: Path, *args: str) -> tuple[list[dict[str, object]], list[dict[str, object]]]:
    proc = jm("check", "--format", "json", *args, "run.py", cwd=root)
    assert proc.returncode in (0, 1), proc.stderr
    report = json.loads(proc.stdout)
    jsonschema.Draft202012Validator(SCHEMA).validate(report)
    (file,) = report["files"]
    return file["sites"], file["skips"]


def project(tmp_path: Path, pyproject: str) -> Path:
    (tmp_path / "pyproject.toml").write_text(pyproject)
    (tmp_path / "run.py").write_text(SHARD_MAP)
    return tmp_path


PINNED = '[project]\nname = "p"\ndependencies = ["jax>=0.6.2"]\n'


def test_the_project_pin_is_the_default_target(tmp_path: Path) -> None:
    root = project(tmp_path, PINNED)
    sites, skipped = skips(root)
    assert not any(s["code"] == "JM102" for s in sites), sites
    (skip,) = [s for s in skipped if s["code"] == "JM102"]
    assert skip["reason"] == (
        "the rewrite needs JAX >= 0.7, the target is 0.6 (the project's `jax>=0.6.2` in "
        "pyproject.toml; --target-jax or target-jax in [tool.jaxmigrate] sets another)"
    )
    assert skip["needs_jax"] == "0.7"


def test_the_terminal_says_the_target_once_and_counts_the_sites_left_alone(
    tmp_path: Path,
) -> None:
    """A project pinned below what a rewrite needs: each site's line says what it needs, and
    one line under the tables says where the target comes from and what migrates them (a real
    tree pinned so, flax's examples, printed the whole reason 40 times). The rule's row counts
    them as found, and left alone."""
    root = project(tmp_path, PINNED)
    (root / "more.py").write_text(SHARD_MAP)
    proc = jm("run", "--dry-run", "--no-verify", ".", cwd=root)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    skipped = [line for line in lines if "JM102" in line and "[skipped]" in line]
    assert len(skipped) == 2, proc.stdout
    for line in skipped:
        assert line.endswith("[skipped] the rewrite needs JAX >= 0.7, the target is 0.6"), line
    assert proc.stdout.count("pyproject.toml") == 1, proc.stdout
    assert (
        "Left alone (2): the rewrite needs JAX >= 0.7, the target is 0.6 (the project's "
        '`jax>=0.6.2` in pyproject.toml); `--target-jax 0.7` (or `target-jax = "0.7"` in '
        "[tool.jaxmigrate]) migrates them, once the project can require jax>=0.7"
    ) in " ".join(proc.stdout.split()), proc.stdout
    (row,) = [line for line in lines if line.lstrip().startswith("JM102")]
    assert [cell.strip() for cell in row.split("│")][2:] == ["2", "0", "", "2"], row


def test_the_flag_and_the_setting_win_over_the_pin(tmp_path: Path) -> None:
    root = project(tmp_path, PINNED)
    sites, _ = skips(root, "--target-jax", "0.7")
    assert any(s["code"] == "JM102" for s in sites)
    root.joinpath("pyproject.toml").write_text(PINNED + '[tool.jaxmigrate]\ntarget-jax = "0.7"\n')
    sites, _ = skips(root)
    assert any(s["code"] == "JM102" for s in sites)
    root.joinpath("pyproject.toml").write_text(PINNED + '[tool.jaxmigrate]\ntarget-jax = "0.5"\n')
    _, skipped = skips(root)
    (skip,) = [s for s in skipped if s["code"] == "JM102"]
    assert skip["reason"].startswith("the rewrite needs JAX >= 0.7, the target is 0.5 (target-jax")


def test_without_a_pin_the_installed_jax_is_the_target(tmp_path: Path) -> None:
    root = project(tmp_path, '[project]\nname = "p"\ndependencies = ["jax"]\n')
    sites, skipped = skips(root)
    assert any(s["code"] == "JM102" for s in sites), skipped
