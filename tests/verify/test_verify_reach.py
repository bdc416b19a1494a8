"""A call of the function around a site verifies the site only if it runs the site's lines.

`simulate(x, method)` holds a pmap in one branch, as numpyro's `vsbc_diagnostic` does for
`chain_method="parallel"`. A recorded call with `method="sequential"` takes the other branch:
both sides agree whatever the rewrite did, so it must leave the site `unverified`, saying why,
never `verified`. A call down the pmap branch verifies a right rewrite and fails a wrong one.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from jaxmigrate.model import Safety, Site, Status
from jaxmigrate.verify import VerifyConfig, VerifyRequest, verify

pytestmark = [pytest.mark.jax, pytest.mark.one_jax]  # not again on JAX 0.12 (.ci/run)

SIM = textwrap.dedent("""
    import jax
    import jax.numpy as jnp


    def simulate(x, method="sequential"):
        if method == "parallel":
            return jax.pmap(lambda v: v * 2)(x)  # SITE
        return jax.lax.map(lambda v: v * 2, x)
    """)
PMAP = "jax.pmap(lambda v: v * 2)(x)  # SITE"
RIGHT = SIM.replace(PMAP, "jax.jit(jax.vmap(lambda v: v * 2))(x)")
WRONG = SIM.replace(PMAP, "x * 3")
SEQUENTIAL = "import jax.numpy as jnp\nfrom pkg.sim import simulate\nsimulate(jnp.ones((8, 2)))\n"
# three calls down the other branch first: only calls that run the site are recorded
PARALLEL = (
    "import jax.numpy as jnp\nfrom pkg.sim import simulate\n"
    "for i in range(3):\n    simulate(jnp.ones((8, 2)) + i)\n"
    "simulate(jnp.ones((8, 2)), method='parallel')\n"
)


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("reach") / "project"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "sim.py").write_text(SIM)
    (root / "sequential.py").write_text(SEQUENTIAL)
    (root / "parallel.py").write_text(PARALLEL)
    return root


def run(project: Path, script: str | None, candidate: str):
    line = next(i for i, t in enumerate(SIM.splitlines(), 1) if "# SITE" in t)
    site = Site("JM202", "pmap", line, 20, Safety.UNSAFE, "pmap", key="site")
    request = VerifyRequest("pkg/sim.py", SIM, candidate, (site,))
    command = f"{sys.executable} {script}" if script else None
    config = VerifyConfig(root=project, timeout=60.0, jobs=1, verify_with=command)
    return verify([request], config)[("pkg/sim.py", "site")]


def test_a_call_down_another_branch_verifies_nothing(project: Path) -> None:
    verdict = run(project, "sequential.py", WRONG)
    assert verdict.status is Status.UNVERIFIED, (verdict.reason, verdict.details)
    assert "never ran the site's line 8" in verdict.reason
    assert "point --verify-with at tests that call `simulate`" in verdict.reason


def test_synthesized_inputs_that_miss_the_branch_verify_nothing(project: Path) -> None:
    verdict = run(project, None, WRONG)
    assert verdict.status is Status.UNVERIFIED, (verdict.reason, verdict.details)
    assert "synthesized call(s) of `simulate` never ran" in verdict.reason


def test_a_call_down_the_site_branch_is_judged(project: Path) -> None:
    right = run(project, "parallel.py", RIGHT)
    assert right.status is Status.VERIFIED, (right.reason, right.details)
    assert right.details["calls"] == 1 and right.details["input_source"] == "recorded"
    wrong = run(project, "parallel.py", WRONG)
    assert wrong.status is Status.FAILED, (wrong.reason, wrong.details)


TESTS = textwrap.dedent("""
    import jax.numpy as jnp

    from pkg.sim import simulate


    def test_sequential():
        assert simulate(jnp.ones((8, 2))).shape == (8, 2)


    def test_parallel():
        assert simulate(jnp.ones((8, 2)), method="parallel").shape == (8, 2)


    def test_unrelated():
        assert True
    """)


def test_the_projects_tests_record_a_function_the_command_never_called(
    project: Path, tmp_path: Path
) -> None:
    # numpyro: the MCMC tests given to --verify-with never call `vsbc_diagnostic`; its tests do
    root = tmp_path / "project"
    (root / "pkg").mkdir(parents=True)
    (root / "tests").mkdir()
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "sim.py").write_text(SIM)
    (root / "tests" / "test_sim.py").write_text(TESTS)
    (root / "other.py").write_text("print('calls nothing')\n")
    right = run(root, "other.py", RIGHT)
    assert right.status is Status.VERIFIED, (right.reason, right.details)
    assert right.details["calls"] == 1  # test_sequential's call does not run the site
    assert (
        "(inputs recorded by the project's tests that call `simulate`, tests/test_sim.py "
        f"(2 tests): `{sys.executable} other.py` made no call of it)"
    ) in right.reason
    wrong = run(root, "other.py", WRONG)
    assert wrong.status is Status.FAILED, (wrong.reason, wrong.details)


UNIT = textwrap.dedent("""
    import jax
    import jax.numpy as jnp

    step = jax.pmap(lambda v: v * 2)  # SITE


    def main():
        return step(jnp.ones((8, 2)))
    """)


def test_a_unit_using_a_module_level_site_must_call_it(tmp_path: Path) -> None:
    # `main` verified as the unit of `step` (whose line runs at import, never in `main`) does
    # not wait for that line, but for a call of `step`: its lambda runs when `step` is traced;
    # a site in the function's body must be run
    from jaxmigrate.verify.planner import plan_all, reach_spans
    from jaxmigrate.verify.targets import Kind

    line = next(i for i, t in enumerate(UNIT.splitlines(), 1) if "# SITE" in t)
    site = Site("JM202", "pmap", line, 8, Safety.UNSAFE, "pmap", key="site")
    plans, _ = plan_all([VerifyRequest("m.py", UNIT, UNIT, (site,))], tmp_path)
    assert [p.target.qualname for p in plans] == ["step", "main"]  # the planner adds the unit
    unit = plans[1]
    assert unit.target.kind is Kind.FUNCTION
    assert reach_spans(unit) == [{"spans": [[line, line]], "name": "step"}]
    inner = Site("JM202", "pmap", 8, 20, Safety.UNSAFE, "pmap", key="s")
    (sim,), _ = plan_all([VerifyRequest("pkg/sim.py", SIM, SIM, (inner,))], tmp_path)
    assert sim.target.kind is Kind.FUNCTION and reach_spans(sim) == [[8, 8]]


HELPER_PROGRAM = textwrap.dedent("""
    import jax
    import numpy as np
    from flax import jax_utils
    from flax.training import common_utils


    def update(w, x):
        return w + jax.lax.pmean(x.sum(), "batch")


    def evaluate(*, p_eval, w, x):
        batch = common_utils.shard(x)
        result = p_eval(w, batch)
        return float(jax_utils.unreplicate(result))


    def main(steps=2, evaluating=EVALUATING):
        x = np.arange(32, dtype=np.float32).reshape(16, 2)
        w = jax_utils.replicate(np.float32(3.0))
        p_update = jax.pmap(update, axis_name="batch")
        p_eval = jax.pmap(lambda w, x: update(w, x) * 2, axis_name="batch")
        for i in range(steps):
            w = p_update(w, common_utils.shard(x))
            print(f"step {i} w {float(jax_utils.unreplicate(w)):.6g}")
        if evaluating:
            print(f"eval {evaluate(p_eval=p_eval, w=w, x=x):.6g}")
    """)


@pytest.mark.parametrize("evaluating", [False, True])
def test_a_groups_site_in_a_helper_the_unit_never_calls_is_not_verified(
    tmp_path: Path, evaluating: bool
) -> None:
    """`main()`, the unit of a program-level group, holds edits in `evaluate` too (its split and
    readback). A run of `main()` that never calls `evaluate` agrees whatever those edits do:
    before, they were `verified` with the rest; now the run must run them."""
    from clitools import jm

    (tmp_path / "prog.py").write_text(HELPER_PROGRAM.replace("EVALUATING", str(evaluating)))
    proc = jm("run", "--dry-run", "--no-cache", "--target-jax", "0.8", "prog.py", cwd=tmp_path)
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    evaluate_sites = [line for line in proc.stdout.splitlines() if line.startswith("prog.py:1")]
    assert len(evaluate_sites) == 2, proc.stdout  # the split and the readback, lines 13 and 15
    if evaluating:
        assert proc.stdout.count("[unsafe, verified]") == 7, proc.stdout
    else:
        assert all("[unsafe, unverified]" in line for line in evaluate_sites), proc.stdout
        assert "never ran the site's lines 13, 15" in proc.stdout, proc.stdout
        assert "[unsafe, verified]" not in proc.stdout, proc.stdout


UNCALLED_PROGRAM = textwrap.dedent("""
    import jax
    import numpy as np
    from flax import jax_utils
    from flax.training import common_utils


    def update(w, x):
        return w + jax.lax.pmean(x.sum(), "batch")


    def main(steps=2, tuning=TUNING):
        x = np.arange(32, dtype=np.float32).reshape(16, 2)
        w = jax_utils.replicate(np.float32(3.0))
        p_update = jax.pmap(update, axis_name="batch")
        p_tune = jax.pmap(lambda w, x: update(w, x) / 2, axis_name="batch")
        for i in range(steps):
            w = p_update(w, common_utils.shard(x))
        held_out = common_utils.shard(x + 1)
        if tuning:
            w = p_tune(w, held_out)
        print(f"final w {float(jax_utils.unreplicate(w)):.6g}")
    """)


@pytest.mark.parametrize("tuning", [False, True])
def test_a_program_level_step_the_unit_never_calls_is_not_verified(
    tmp_path: Path, tuning: bool
) -> None:
    """`p_tune` is made in `main()` but called only `if tuning:`, on a line that holds no
    site: every site's line runs, and the run agrees, yet nothing `p_tune`'s rewrite computes
    was compared. Before, the group was `verified`; now the run must call each of its steps."""
    from clitools import jm

    (tmp_path / "prog.py").write_text(UNCALLED_PROGRAM.replace("TUNING", str(tuning)))
    proc = jm("run", "--dry-run", "--no-cache", "--target-jax", "0.8", "prog.py", cwd=tmp_path)
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    sites = [line for line in proc.stdout.splitlines() if line.startswith("prog.py:")]
    assert len(sites) == 6, proc.stdout
    if tuning:
        assert all("[unsafe, verified]" in line for line in sites), proc.stdout
    else:
        assert all("[unsafe, unverified]" in line for line in sites), proc.stdout
        line = next(i for i, t in enumerate(UNCALLED_PROGRAM.splitlines(), 1) if "p_tune =" in t)
        why = f"the run of `main()` never called the program-level step made on line(s) {line},"
        assert why in proc.stdout, proc.stdout
