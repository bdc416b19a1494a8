"""Inputs recorded while the user's command runs on the original copy, replayed on both sides.

The project has a package with four unsafe sites and a script that calls them, one of them under
a `with mesh:` whose mesh is a local variable of the script (rebuilt from the recording).
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest
from verify_cases import HEADER, tree_digest

from jaxmigrate.model import Safety, Site, Status
from jaxmigrate.verify import VerifyConfig, VerifyRequest, verify

pytestmark = [pytest.mark.jax, pytest.mark.one_jax]  # not again on JAX 0.12 (.ci/run)

MODEL = HEADER + textwrap.dedent("""
    from jax.experimental.pjit import pjit

    gmesh = Mesh(np.array(jax.devices()), ("x",))


    @partial(jax.pmap, axis_name="i")  # SITE step
    def step(x):
        return x - x.mean() + lax.psum(x, "i")


    @partial(jax.pmap, axis_name="i", in_axes=({"w": None, "b": 0}, 0))  # SITE update
    def update(params, x):
        return {"w": params["w"] * x.sum(), "b": params["b"] + lax.pmean(x, "i")}


    def fn(a):
        return jnp.sin(a) * 2


    f = pjit(fn, in_shardings=P("x"), out_shardings=P("x"))  # SITE f


    def scale(x):
        return jax.pmap(lambda v: v * 3)(x) + 1  # SITE scale
    """)
REWRITTEN = HEADER + textwrap.dedent("""
    gmesh = Mesh(np.array(jax.devices()), ("x",))
    mesh = Mesh(np.array(jax.devices()[:8]), ("i",))


    def _step(x):
        x = jnp.squeeze(x, 0)
        return jnp.expand_dims(x - x.mean() + lax.psum(x, "i"), 0)


    step = jax.jit(jax.shard_map(_step, mesh=mesh, in_specs=P("i"), out_specs=P("i")))


    def _update(params, x):
        b, x = jnp.squeeze(params["b"], 0), jnp.squeeze(x, 0)
        out = {"w": params["w"] * x.sum(), "b": b + lax.pmean(x, "i")}
        return jax.tree.map(lambda o: jnp.expand_dims(o, 0), out)


    update = jax.jit(jax.shard_map(_update, mesh=mesh, in_specs=({"w": P(), "b": P("i")}, P("i")),
                                   out_specs=P("i")))


    def fn(a):
        return jnp.sin(a) * 2


    f = jax.jit(fn, in_shardings=SPEC, out_shardings=SPEC)


    def scale(x):
        body = lambda v: jnp.expand_dims(jnp.squeeze(v, 0) * 3, 0)
        return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=P("i")))(x) + 1
    """)
SCRIPT = textwrap.dedent("""
    import jax
    import numpy as np
    from jax.sharding import Mesh

    from pkg import model


    def main():
        mesh = Mesh(np.array(jax.devices()), ("x",))
        x = np.arange(32, dtype=np.float32).reshape(8, 4)
        for i in range(5):
            model.step(x + i)
        params = {"w": np.ones(4, np.float32), "b": np.zeros((8, 4), np.float32)}
        model.update(params, x)
        with mesh:
            model.f(x)
        model.scale(x)


    main()
    """)
NAMED = "NamedSharding(gmesh, P('x'))"
SITE_NAMES = {"step": "pmap", "update": "pmap", "f": "pjit", "scale": "pmap"}


def sites(text: str) -> tuple[Site, ...]:
    found = []
    for line, source in enumerate(text.splitlines(), 1):
        if "# SITE " in source:
            name = source.split("# SITE ")[1]
            found.append(Site("JM200", SITE_NAMES[name], line, 1, Safety.UNSAFE, name, key=name))
    return tuple(found)


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("recorded") / "project"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "model.py").write_text(MODEL)
    (root / "run_steps.py").write_text(SCRIPT)
    return root


def run(project: Path, spec: str, **config: object) -> dict[str, object]:
    request = VerifyRequest("pkg/model.py", MODEL, REWRITTEN.replace("SPEC", spec), sites(MODEL))
    settings = {"timeout": 60.0, "jobs": 1} | config
    verdicts = verify([request], VerifyConfig(root=project, **settings))  # type: ignore[arg-type]
    return {key: verdict for (_, key), verdict in verdicts.items()}


@pytest.fixture(scope="module")
def recorded(project: Path) -> dict:
    before = tree_digest(project)
    verdicts = run(project, NAMED, verify_with=f"{sys.executable} run_steps.py")
    assert tree_digest(project) == before
    return verdicts


@pytest.mark.parametrize("key", ["step", "update", "f", "scale"])
def test_recorded_calls_verify_every_site(recorded: dict, key: str) -> None:
    verdict = recorded[key]
    assert verdict.status is Status.VERIFIED, verdict
    assert verdict.details["input_source"] == "recorded"
    assert "recorded call" in verdict.reason


def test_the_first_calls_are_recorded_and_replayed(recorded: dict) -> None:
    assert recorded["step"].details["calls"] == 3
    assert recorded["update"].details["input_shapes"] == [
        "float32[8, 4]",
        "float32[4]",
        "float32[8, 4]",
    ]


def test_a_call_under_a_local_mesh_is_replayed_under_it(recorded: dict) -> None:
    assert recorded["f"].details["contexts"] == ["entered `mesh`"]


def test_bare_specs_fail_under_the_recorded_legacy_mesh(project: Path) -> None:
    verdicts = run(project, "P('x')", verify_with=f"{sys.executable} run_steps.py")
    assert verdicts["f"].status is Status.FAILED
    assert "jit requires a non-empty mesh" in verdicts["f"].reason


def test_without_inputs_only_synthesizable_sites_verify(project: Path) -> None:
    verdicts = run(project, NAMED, synthesize=False)
    for key in ("step", "update", "f", "scale"):
        assert verdicts[key].status is Status.UNVERIFIED
        assert "--verify-with" in verdicts[key].reason
