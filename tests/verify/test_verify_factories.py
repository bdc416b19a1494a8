"""Factories: a target that returns the jitted function it builds is verified through it.

The factory's own output is a function (compared by qualified name only); the calls the program
makes of the returned function are recorded and replayed on the function each side's factory
returns. The original uses pjit's removed `in_axis_resources`, so it cannot run on the installed
JAX: the recording goes through the `pjit-in-shardings` reference, so the site still gets inputs.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from jaxmigrate.model import Safety, Site, Status
from jaxmigrate.verify import VerifyConfig, VerifyRequest, verify

pytestmark = pytest.mark.jax

FACTORY = textwrap.dedent("""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.experimental.pjit import pjit
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    gmesh = Mesh(np.array(jax.devices()), ("x",))


    def make_step(scale):
        def body(x):
            return jnp.sin(x) * scale

        return pjit(body, in_axis_resources=P("x"), out_axis_resources=P("x"))  # SITE
    """)
REWRITE = FACTORY.replace(
    'pjit(body, in_axis_resources=P("x"), out_axis_resources=P("x"))  # SITE',
    "jax.jit(body, in_shardings=SPEC, out_shardings=SPEC)",
)
SCRIPT = textwrap.dedent("""
    import jax
    import numpy as np
    from jax.sharding import Mesh

    from pkg import factory

    mesh = Mesh(np.array(jax.devices()), ("x",))
    step = factory.make_step(2.0)
    with mesh:
        for i in range(2):
            step(np.arange(32, dtype=np.float32).reshape(8, 4) + i)
    """)
NAMED = 'NamedSharding(gmesh, P("x"))'


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("factory") / "project"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "factory.py").write_text(FACTORY)
    (root / "run.py").write_text(SCRIPT)
    return root


def run(project: Path, candidate: str, **config: object):
    line = next(i for i, t in enumerate(FACTORY.splitlines(), 1) if "# SITE" in t)
    site = Site("JM300", "pjit", line, 1, Safety.UNSAFE, "pjit", key="site")
    request = VerifyRequest("pkg/factory.py", FACTORY, candidate, (site,))
    settings = {"timeout": 60.0, "jobs": 1} | config
    return verify([request], VerifyConfig(root=project, **settings))[("pkg/factory.py", "site")]  # type: ignore[arg-type]


def test_calls_of_the_returned_function_are_recorded_and_replayed(project: Path) -> None:
    verdict = run(project, REWRITE.replace("SPEC", NAMED), verify_with=f"{sys.executable} run.py")
    assert verdict.status is Status.VERIFIED, (verdict.reason, verdict.details)
    assert verdict.details["reference"] == "pjit-in-shardings"
    assert verdict.details["input_source"] == "recorded"
    assert verdict.details["returned_calls"] == 2
    assert "and 2 call(s) of the function it returns" in verdict.reason


def test_a_wrong_returned_function_fails(project: Path) -> None:
    wrong = REWRITE.replace("SPEC", NAMED).replace("jnp.sin(x)", "jnp.cos(x)")
    verdict = run(project, wrong, verify_with=f"{sys.executable} run.py")
    assert verdict.status is Status.FAILED, verdict
    assert "of call 1 of the function the target returned: values differ" in verdict.reason


def test_without_a_recording_a_function_needing_the_mesh_is_not_verified(project: Path) -> None:
    # The returned function's bare specs need the program's `with mesh:`, which only a
    # recording knows: its factory's output is a function, compared by name only.
    verdict = run(project, REWRITE.replace("SPEC", NAMED))
    assert verdict.status is Status.UNVERIFIED, verdict
    assert "hold no values to compare" in verdict.reason
