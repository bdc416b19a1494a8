"""What the terminal says about verification, as a user runs `jaxmigrate` (issue 13, point 6)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import clitools
import pytest

from jaxmigrate.model import Bucket, FileResult, Safety, Site, Status
from jaxmigrate.ui.report import text_report

pytestmark = [pytest.mark.jax, pytest.mark.one_jax]  # not again on JAX 0.12 (.ci/run)

# `batch["x"]` cannot be synthesized: without a recording the site has no inputs.
TRAIN = textwrap.dedent("""
    import jax


    def double(x):
        return x * 2


    def train(batch):
        return jax.pmap(double)(batch["x"])
    """)


def jm(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return clitools.jm(*args, cwd=cwd, columns=250)


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("messages")
    (root / "test").mkdir()
    (root / "test" / "test_train.py").write_text("def test_nothing():\n    pass\n")
    (root / "train.py").write_text(TRAIN)
    return root


def test_the_hint_names_the_projects_own_test_folder(project: Path) -> None:
    proc = jm("run", "--dry-run", "train.py", cwd=project)
    assert 'pass --verify-with "pytest test/"' in proc.stdout, proc.stdout
    assert "pytest tests/" not in proc.stdout


def test_a_failing_verify_with_command_is_reported_in_the_terminal(project: Path) -> None:
    command = f"{sys.executable} -c 'import no_such_module_here'"
    proc = jm("run", "--dry-run", "--verify-with", command, "train.py", cwd=project)
    assert "warning: --verify-with" in proc.stderr, proc.stderr
    assert "exited with status 1" in proc.stderr
    assert "ModuleNotFoundError: No module named 'no_such_module_here'" in proc.stderr
    # The command was given: the hints say it made no call, and never to pass it.
    assert "pass --verify-with" not in proc.stdout, proc.stdout
    assert "made no call of it" in proc.stdout
    assert "--verify-with CMD (record real inputs)" not in proc.stdout


ORIGINAL = textwrap.dedent("""
    import jax
    import jax.numpy as jnp

    SHAPE = tuple((8, 3))


    def double(x):
        return x * 2


    def right():
        return jax.pmap(double)(jnp.ones(SHAPE))


    def wrong():
        return jax.pmap(double)(jnp.arange(24.0).reshape(SHAPE))
    """)
MIGRATED = (
    ORIGINAL.replace("SHAPE = tuple((8, 3))", "SHAPE = tuple((8, 3, 1))[:2]")
    .replace("jax.pmap(double)(jnp.ones(SHAPE))", "double(jnp.ones(SHAPE))")
    .replace("jax.pmap(double)(jnp.arange(24.0).reshape(SHAPE))", "double(jnp.ones(SHAPE))")
)


@pytest.fixture(scope="module")
def against(tmp_path_factory: pytest.TempPathFactory) -> subprocess.CompletedProcess[str]:
    root = tmp_path_factory.mktemp("against")
    (root / "step.py").write_text(ORIGINAL)
    for args in (["init", "-q"], ["add", "step.py"], ["commit", "-qm", "legacy"]):
        subprocess.run(
            ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=root, check=True
        )
    (root / "step.py").write_text(MIGRATED)
    return jm("verify", "--against", "HEAD", cwd=root)


def test_verify_against_prints_each_reason_once(against: subprocess.CompletedProcess) -> None:
    # `right()` takes no arguments: it is run as it is, and the reason says so, once
    assert against.stdout.count("agrees with the original when `right()` runs") == 1, against.stdout


def test_a_failed_reason_shows_path_shapes_and_error(against: subprocess.CompletedProcess) -> None:
    assert against.returncode == 1, against.stdout + against.stderr
    assert (
        "outputs differ at output (float32[8, 3]) of call 1: values differ: max abs err 44"
        in against.stdout
    ), against.stdout


def test_a_non_callable_attribute_is_not_an_original_that_cannot_run(
    against: subprocess.CompletedProcess,
) -> None:
    assert "`SHAPE` is a tuple, not a function" in against.stdout, against.stdout
    assert "the original cannot run" not in against.stdout


def test_run_text_output_shows_why_a_site_failed() -> None:
    why = "outputs differ at output['w'] (float32[8, 4]) of call 1: values differ: max abs err 0.5"
    site = Site(
        "JM202",
        "pmap",
        3,
        1,
        Safety.UNSAFE,
        "pmap -> shard_map",
        "k",
        status=Status.FAILED,
        reason="failed verification",
        details={"verification": why},
    )
    text = text_report(
        [FileResult("a.py", Bucket.UNCHANGED, (site,))], dry_run=False, show_diff=False
    )
    pending = text.split("Not applied (1)")[1]
    assert why in pending, text
