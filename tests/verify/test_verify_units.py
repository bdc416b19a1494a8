"""A site in a function that takes no arguments (a `main()`, a training program) is verified by
running that function on both sides: there is nothing to synthesize, and its host code (`int`,
`float`, `print`) would fail a trace, so it is not probed with `jax.eval_shape` first."""

from __future__ import annotations

import ast
import json
import textwrap
from pathlib import Path
from typing import Any

import pytest
from clitools import git, jm

from jaxmigrate.model import Status
from jaxmigrate.verify import VerifyConfig, verify_against
from jaxmigrate.verify.config import Verdict
from jaxmigrate.verify.session import combined
from jaxmigrate.verify.targets import unit_of

pytestmark = [pytest.mark.jax, pytest.mark.one_jax]  # not again on JAX 0.12 (.ci/run)

PROGRAM = textwrap.dedent("""
    import jax
    import jax.numpy as jnp
    import numpy as np


    def scale(x):
        return jax.lax.psum(x, "i") * 0.5


    def train(num_steps=3):
        n = jax.local_device_count()
        x = np.arange(n * 2, dtype=np.float32).reshape(n, 2)
        total = 0.0
        step = jax.pmap(scale, axis_name="i")
        for _ in range(num_steps):
            x = step(x)
            total += float(x[0, 0])  # a host read: cannot be traced
        return total
    """)


def dry_run_sites(root: Path) -> list[dict[str, Any]]:
    """Run `jaxmigrate run --dry-run` (verification on) in `root`; return the report's sites."""
    report = root / "report.json"
    proc = jm(
        "run", "--dry-run", "--report", str(report), "--format", "json", ".", cwd=root, timeout=900
    )
    assert proc.returncode in (0, 1), proc.stderr
    return [s for f in json.loads(report.read_text())["files"] for s in f["sites"]]


def test_a_training_function_without_arguments_is_run_and_its_pmap_verified(
    tmp_path: Path,
) -> None:
    (tmp_path / "train.py").write_text(PROGRAM)
    (site,) = dry_run_sites(tmp_path)
    assert site["code"] == "JM202"
    assert site["status"] == "verified", site["details"]
    assert site["details"]["target"] == "train.py::train"


def test_a_wrong_edit_of_such_a_function_fails(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(PROGRAM)
    git(tmp_path, "init", "-q")
    git(tmp_path, "add", "train.py")
    git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "legacy")
    (tmp_path / "train.py").write_text(PROGRAM.replace("total = 0.0", "total = 1.0"))
    verdicts = verify_against("HEAD", [], VerifyConfig(root=tmp_path, timeout=120.0, jobs=1))
    changed = [v for key, v in verdicts.items() if key[0] == "train.py"]
    assert changed and all(v.status is Status.FAILED for v in changed), verdicts
    assert any("differ" in v.reason for v in changed)


MODULE_STEP = textwrap.dedent("""
    import jax
    import numpy as np


    def step(params, batch):
        grads = jax.lax.pmean(batch["x"] * params, "i")
        return params - 0.1 * grads


    p_step = jax.pmap(step, axis_name="i")


    def main():
        n = jax.local_device_count()
        params = np.ones((n, 3), np.float32)
        for k in range(2):
            batch = {"x": np.full((n, 3), k + 1.0, np.float32) * np.arange(n)[:, None]}
            params = p_step(params, batch)
        return params
    """)


def test_a_module_level_step_fed_dicts_is_verified_through_the_main_using_it(
    tmp_path: Path,
) -> None:
    """`p_step`'s own inputs cannot be synthesized (its body indexes a dict), so alone it stays
    unverified; `main()` uses it and takes no arguments: running it on both sides verifies it."""
    (tmp_path / "train.py").write_text(MODULE_STEP)
    (site,) = dry_run_sites(tmp_path)
    assert site["status"] == "verified", site["details"]
    assert site["details"]["target"] == "train.py::main"


def test_the_unit_of_a_callable_is_a_function_without_arguments_that_reaches_it() -> None:
    tree = ast.parse(
        textwrap.dedent("""
            def evaluate(params, rng=None):
                return p_eval(params)

            def loop(steps=3):
                return evaluate(1)

            def run(config):
                return p_eval(config)

            def main():
                return loop()
            """)
    )
    assert unit_of(tree, "p_eval") == "main"
    assert unit_of(tree, "p_other") is None
    no_main = ast.parse("def loop(steps=3):\n    return p_eval(1)\n\ndef run(c):\n    p_eval(c)\n")
    assert unit_of(no_main, "p_eval") == "loop"


def test_a_site_verified_by_two_plans_fails_if_either_fails() -> None:
    ok, bad, none = (
        Verdict(Status.VERIFIED, "agrees"),
        Verdict(Status.FAILED, "values differ"),
        Verdict(Status.UNVERIFIED, "no inputs"),
    )
    assert combined(ok, bad) is bad and combined(bad, ok) is bad
    assert combined(none, ok) is ok
    assert combined(none, bad) is bad
    both = combined(none, Verdict(Status.UNVERIFIED, "timed out"))
    assert both.status is Status.UNVERIFIED and both.reason == "no inputs; timed out"
