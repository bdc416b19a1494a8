"""A site in a function or a method is verified also through the `main()` that uses it.

A site's own function is run on synthesized inputs; where they cannot be made (the shapes of a
matmul a synthesizer cannot guess) or the site is in a method (its class needs an instance),
the site stayed `unverified` though the module's `main()` runs it with its real inputs. The
unit runs it too now, and the site's statement is watched (a decorated method's: its body, since
the decorator runs when the class is made): a `main()` that never reaches it verifies nothing.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from clitools import cli_env, jm

from jaxmigrate.model import Safety, Site
from jaxmigrate.verify import VerifyRequest
from jaxmigrate.verify.planner import plan_all, reach_spans

pytestmark = pytest.mark.one_jax  # not again on JAX 0.12 (.ci/run)

# `fit` holds the step; a call of it alone cannot be synthesized: `w` must be (4, 2) to
# multiply the rows of `xs`, which no guess of its shapes makes
PROGRAM = textwrap.dedent("""\
    import functools
    import os

    import jax
    import jax.numpy as jnp
    import numpy as np


    def update(w, x):
        return w - 0.1 * jax.lax.pmean(x.T @ (x @ w), "i")


    def fit(w, xs):
        p_step = jax.pmap(update, "i")
        w = jnp.stack([w] * jax.local_device_count())
        for x in xs:
            w = p_step(w, x.reshape(jax.local_device_count(), -1, 4))
        return w[0]


    class Trainer:
        def fit(self, w, xs):
            p_step = jax.pmap(update, "i")
            w = jnp.stack([w] * jax.local_device_count())
            for x in xs:
                w = p_step(w, x.reshape(jax.local_device_count(), -1, 4))
            return w[0]


    class Scaler:
        @functools.partial(jax.pmap, axis_name="i", static_broadcasted_argnums=(0,))
        def total(self, x):
            return jax.lax.psum(x, "i")


    def main():
        rng = np.random.default_rng(0)
        w = rng.normal(size=(4, 2)).astype(np.float32)
        xs = [rng.normal(size=(16, 4)).astype(np.float32) for _ in range(2)]
        if os.environ.get("SKIP_FIT"):
            return w
        trainer = Trainer()
        fitted = fit(w, xs), fit(w, xs[:1]), trainer.fit(w, xs), trainer.fit(w, xs[:1])
        return fitted, Scaler().total(xs[0].reshape(jax.local_device_count(), -1))
    """)
FUNCTION_SITE, METHOD_SITE, DECORATED_SITE = 14, 23, 31


def test_a_function_and_a_method_are_planned_in_the_unit_using_them(tmp_path: Path) -> None:
    sites = tuple(
        Site("JM202", "pmap", line, 20, Safety.UNSAFE, "pmap", key=str(line))
        for line in (FUNCTION_SITE, METHOD_SITE, DECORATED_SITE)
    )
    plans, decided = plan_all([VerifyRequest("m.py", PROGRAM, PROGRAM, sites)], tmp_path)
    assert decided == {}  # the method's site is no longer `unverified` without a run
    by_target = {p.target.qualname: [s.line for s in p.sites] for p in plans}
    sites_of_main = [FUNCTION_SITE, METHOD_SITE, DECORATED_SITE]
    assert by_target == {"fit": [FUNCTION_SITE], "main": sites_of_main}
    (unit,) = [p for p in plans if p.target.qualname == "main"]
    # each site's statement is watched: a run of `main` that skips it shows nothing about it;
    # a decorated method is made with its class, and runs when its body does
    assert reach_spans(unit) == [
        [FUNCTION_SITE, FUNCTION_SITE],
        [METHOD_SITE, METHOD_SITE],
        {"spans": [[DECORATED_SITE + 2, DECORATED_SITE + 2]], "name": "Scaler.total"},
    ]


def run(tmp_path: Path, **env: str) -> tuple[dict[int, dict], str]:
    (tmp_path / "prog.py").write_text(PROGRAM)
    report = tmp_path / "report.json"
    proc = jm(
        "run", ".", "--report", str(report), "--format", "json", cwd=tmp_path, env=cli_env(**env)
    )
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    files = json.loads(report.read_text())["files"]
    sites = next(f["sites"] for f in files if f["path"] == "prog.py")
    return {s["line"]: s for s in sites}, (tmp_path / "prog.py").read_text()


@pytest.mark.jax
def test_a_function_and_a_method_main_runs_are_verified_by_it(tmp_path: Path) -> None:
    sites, written = run(tmp_path)
    assert sorted(sites) == [FUNCTION_SITE, METHOD_SITE, DECORATED_SITE]
    for site in sites.values():
        assert (site["code"], site["status"], site["applied"]) == ("JM202", "verified", True)
        assert "when `main()` runs" in site["details"]["verification"], site
    assert written != PROGRAM


@pytest.mark.jax
def test_a_main_that_never_runs_them_verifies_neither(tmp_path: Path) -> None:
    sites, written = run(tmp_path, SKIP_FIT="1")
    assert sorted(sites) == [FUNCTION_SITE, METHOD_SITE, DECORATED_SITE]
    body = DECORATED_SITE + 2
    said = (
        f"`main` never ran the site's lines {FUNCTION_SITE}, {METHOD_SITE} and never called "
        f"`Scaler.total` (its function's line {body} never ran)"
    )
    for site in sites.values():
        assert (site["status"], site["applied"]) == ("unverified", False), site
        assert said in site["details"]["verification"], site
    assert written == PROGRAM
