"""A `main()` unit verifies a module-level callable only if it calls it.

`@functools.partial(jax.pmap, axis_name="batch") def step(batch)` takes a dict, which cannot be
synthesized: the site is verified through the unit `main()`, which calls `step` only when an
environment variable is set and takes a `vmap` path otherwise. A run down the `vmap` path agrees
on both sides whatever the rewrite did: it must leave the site `unverified`, saying that `main`
never called `step`; the reach check caught this for an inline pmap, never for a decorated one.
"""

from __future__ import annotations

import ast
import json
import textwrap
from pathlib import Path

import pytest
from clitools import cli_env, jm

from jaxmigrate.model import Safety, Site
from jaxmigrate.verify import VerifyRequest
from jaxmigrate.verify.planner import plan_all, reach_spans

pytestmark = pytest.mark.one_jax  # not again on JAX 0.12 (.ci/run)

PROGRAM = textwrap.dedent("""\
    import functools
    import os

    import jax
    import jax.numpy as jnp


    @functools.partial(jax.pmap, axis_name="batch")
    def step(batch):
        return jax.lax.psum(batch["x"], "batch") * batch["w"]


    def main():
        batch = {"x": jnp.arange(16.0).reshape(8, 2), "w": jnp.ones((8, 2))}
        if os.environ.get("USE_PMAP"):
            return step(batch)
        return jax.vmap(lambda b: b["x"] * b["w"])(batch)
    """)


def run(tmp_path: Path, **env: str) -> tuple[dict, str]:
    (tmp_path / "prog.py").write_text(PROGRAM)
    report = tmp_path / "report.json"
    proc = jm(
        "run", ".", "--report", str(report), "--format", "json", cwd=tmp_path, env=cli_env(**env)
    )
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    files = json.loads(report.read_text())["files"]
    (site,) = next(f["sites"] for f in files if f["path"] == "prog.py")
    return site, (tmp_path / "prog.py").read_text()


@pytest.mark.jax
def test_a_unit_that_never_calls_the_decorated_pmap_verifies_nothing(tmp_path: Path) -> None:
    site, written = run(tmp_path)
    assert (site["code"], site["status"], site["applied"]) == ("JM202", "unverified", False)
    reason = site["details"]["verification"]
    assert "call(s) of `main` never called `step` (its function's line 10 never ran)" in reason
    assert written == PROGRAM


@pytest.mark.jax
def test_a_unit_that_calls_the_decorated_pmap_verifies_it(tmp_path: Path) -> None:
    site, written = run(tmp_path, USE_PMAP="1")
    assert (site["code"], site["status"], site["applied"]) == ("JM202", "verified", True), site
    assert "when `main()` runs" in site["details"]["verification"]
    assert written != PROGRAM


MAPPED = textwrap.dedent("""\
    import jax
    from other import imported


    def body(x):
        return x * 2


    def shared(x):
        return x + 1


    step = jax.pmap(body)
    lam = jax.pmap(
        lambda x: x * 3
    )
    far = jax.pmap(imported)
    both = jax.pmap(shared)


    def main():
        return step(1), lam(1), far(1), both(1), shared(1)
    """)


def test_what_a_unit_must_run_for_each_kind_of_module_level_callable(tmp_path: Path) -> None:
    tree = ast.parse(MAPPED)
    lines = {
        t.id: node.lineno
        for node in tree.body
        if isinstance(node, ast.Assign)
        for t in node.targets
        if isinstance(t, ast.Name)
    }
    sites = tuple(
        Site("JM202", "pmap", line, 0, Safety.UNSAFE, "pmap", key=name)
        for name, line in lines.items()
    )
    plans, _ = plan_all([VerifyRequest("m.py", MAPPED, MAPPED, sites)], tmp_path)
    (unit,) = [p for p in plans if p.target.qualname == "main"]
    assert reach_spans(unit) == [
        # a lambda runs on the assignment's lines
        {"spans": [[lines["lam"], lines["lam"] + 2]], "name": "lam"},
        # a function of the file that only `step` maps: its body
        {"spans": [[6, 6]], "name": "step"},
        # `far` maps an imported function, `both` one `main` also calls: nothing to watch
    ]
