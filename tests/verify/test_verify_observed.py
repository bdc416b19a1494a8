"""What values cannot show: compile counts, sharding constraints and output shardings.

A rewrite whose outputs agree can still compile on every call where the original compiled once
(the faithful pmap helper built a new `jax.jit` per call: brax's `PmapWrapper`, big_vision's
`sync()`), or drop a sharding constraint (t5x's wrapper reads the legacy mesh, which
`jax.set_mesh` leaves empty): both are `failed`, naming what changed.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from clitools import jm
from verify_cases import Case, module, verify_cases

from codemods.pmap._faithful import shared_source
from jaxmigrate.model import Status

# A pmap made inside the function that calls it (brax `training/pmap.py`, big_vision `sync()`),
# called 5 times: `jax.pmap` traces and compiles once.
SYNC = """\
import jax
import jax.numpy as jnp


def step(x):
    return jax.lax.psum(x, "i")


def sync(x):
    return jax.pmap(step, axis_name="i")(x)  # SITE


__jaxmigrate_examples__ = {"sync": [(jnp.arange(24.0).reshape(8, 3) + k,) for k in range(5)]}
"""

# The faithful helper as it was: a new `jax.jit` on every call of the helper.
PER_CALL_JIT = """\
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P


def shard_map_per_device(f, *, axis_name, in_specs, out_specs):
    def per_device(x):
        return jnp.expand_dims(f(jnp.squeeze(x, 0)), 0)

    def on_devices(x):
        mesh = jax.sharding.Mesh(np.array(jax.devices()[: x.shape[0]]), (axis_name,))
        return jax.shard_map(
            per_device, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False
        )(x)

    return jax.jit(on_devices)


def step(x):
    return jax.lax.psum(x, "i")


def sync(x):
    return shard_map_per_device(step, axis_name="i", in_specs=P("i"), out_specs=P("i"))(x)


__jaxmigrate_examples__ = {"sync": [(jnp.arange(24.0).reshape(8, 3) + k,) for k in range(5)]}
"""

# t5x's `with_sharding_constraint` without its CPU guard: it reads the legacy mesh context.
T5X_LIKE = """\
from jax.interpreters import pxla

mesh = Mesh(np.array(jax.devices()[:8]), ("i",))


def constrain(x):
    if pxla.thread_resources.env.physical_mesh.empty:
        return x
    return jax.lax.with_sharding_constraint(x, P("i"))


@jax.jit
def step(x):
    return constrain(x * 2) + 1


def run(x):
{body}
"""
BARE = """\
mesh = Mesh(np.array(jax.devices()[:8]), ("i",))


@jax.jit
def step(x):
    return jax.lax.with_sharding_constraint(x * 2, P("i")) + 1


def run(x):
{body}
"""
# pjit's `out_shardings` dropped: the values agree, the output is no longer sharded.
PJIT = """\
from jax.experimental.pjit import pjit

mesh = Mesh(np.array(jax.devices()[:8]), ("i",))


def fn(x):
    return x * 2


{define}


def run(x):
    return f(x)
"""
# No sharding asked: on one device under `with mesh:`, replicated over the mesh under
# `jax.set_mesh` (its intended placement, same values).
PLAIN_JIT = """\
mesh = Mesh(np.array(jax.devices()[:8]), ("i",))


@jax.jit
def step(x):
    return x * 2 + 1


def run(x):
{body}
"""
# An output sharding the user asked for (`out_shardings=`): its spec must not change.
ASKED = """\
mesh = Mesh(np.array(jax.devices()[:8]), ("i",))
step = jax.jit(lambda x: x * 2, out_shardings=NamedSharding(mesh, P({spec})))


def run(x):
{body}
"""
WITH_MESH = "    with mesh:  # SITE\n        return step(x)"
SET_MESH = "    with jax.set_mesh(mesh):\n        return step(x)"

CASES = [
    Case(
        "helper_per_call_jit",
        SYNC,
        PER_CALL_JIT,
        Status.FAILED,
        "compiles `jit_on_devices` 5 times",
    ),
    Case(
        "helper_cached",
        SYNC,
        SYNC.replace(
            'jax.pmap(step, axis_name="i")(x)  # SITE',
            'shard_map_per_device(step, axis_name="i", in_specs=P("i"), out_specs=P("i"))(x)',
        ).replace(
            "import jax.numpy as jnp\n", "import jax.numpy as jnp\n" + "\n" + shared_source()
        ),
        Status.VERIFIED,
    ),
    Case(
        "set_mesh_drops_constraint",
        module(T5X_LIKE.format(body=WITH_MESH)),
        module(T5X_LIKE.format(body=SET_MESH)),
        Status.FAILED,
        "lowers without the sharding constraint",
        site_name="with-mesh",
    ),
    Case(
        "pjit_out_shardings_dropped",
        module(
            PJIT.format(define='f = pjit(fn, out_shardings=NamedSharding(mesh, P("i")))  # SITE')
        ),
        module(PJIT.format(define="f = jax.jit(fn)")),
        Status.FAILED,
        "the sharding of call 1: output changed: P('i') over mesh (i=8) in the original, "
        "one device (unsharded) in the rewrite",
        site_name="pjit",
    ),
    Case(
        "set_mesh_keeps_bare_constraint",
        module(BARE.format(body=WITH_MESH)),
        module(BARE.format(body=SET_MESH)),
        Status.VERIFIED,
        site_name="with-mesh",
    ),
    Case(
        "set_mesh_replicates_unsharded_output",
        module(PLAIN_JIT.format(body=WITH_MESH)),
        module(PLAIN_JIT.format(body=SET_MESH)),
        Status.VERIFIED,
        site_name="with-mesh",
    ),
    Case(
        "set_mesh_changes_asked_sharding",
        module(ASKED.format(spec='"i"', body=WITH_MESH)),
        module(ASKED.format(spec="", body=SET_MESH)),
        Status.FAILED,
        "the sharding of call 1: output changed: P('i') over mesh (i=8) in the original, "
        "P() over mesh (i=8) in the rewrite",
        site_name="with-mesh",
    ),
]


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return verify_cases(CASES, tmp_path_factory.mktemp("observed") / "project")


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_case(case: Case, verdicts: dict) -> None:
    verdict = verdicts[case.name]
    assert verdict.status is case.expect, f"{verdict.reason}\n{verdict.details}"
    assert case.reason in verdict.reason, verdict.reason


def test_a_jit_per_call_is_named_with_both_counts(verdicts: dict) -> None:
    verdict = verdicts["helper_per_call_jit"]
    assert verdict.reason == (
        "the rewrite compiles `jit_on_devices` 5 times on the same code where the original "
        "compiled nothing twice (a new `jax.jit` on every call?)"
    ), verdict.reason
    compiles = verdict.details["compiles"]
    assert compiles["rewrite"] - compiles["original"] >= 4, compiles


def test_the_cached_helper_compiles_as_often_as_pmap(verdicts: dict) -> None:
    # no more often: pmap's total also counts the `_multi_slice` its stacked output is read with
    compiles = verdicts["helper_cached"].details["compiles"]
    assert compiles["rewrite"] <= compiles["original"], compiles


def test_a_dropped_constraint_is_named(verdicts: dict) -> None:
    reason = verdicts["set_mesh_drops_constraint"].reason
    assert reason == (
        "the rewrite's `jit_step` lowers without the sharding constraint "
        '`sharding_constraint [{"i"}, {}] on mesh ["i"=8]` of the original\'s'
    ), reason


def test_brax_style_pmap_is_written_compiling_once(tmp_path: Path) -> None:
    """Through the CLI: the pmap made in `sync` becomes the faithful helper, verified on 5 calls
    with as many compiles as `jax.pmap`, and written."""
    (tmp_path / "sync.py").write_text(SYNC.replace("  # SITE", ""))
    report = tmp_path / "report.json"
    proc = jm("run", "--report", str(report), "--format", "json", ".", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    sites = [s for f in json.loads(report.read_text())["files"] for s in f["sites"]]
    assert [s["status"] for s in sites] == ["verified"], sites
    assert sites[0]["details"]["calls"] == 5
    compiles = sites[0]["details"]["compiles"]
    assert compiles["rewrite"] == compiles["original"], compiles
    assert "shard_map_per_device" in (tmp_path / "sync.py").read_text()
    helper = textwrap.dedent((tmp_path / "_pmap_compat.py").read_text())
    assert "weakref.WeakKeyDictionary()" in helper


def test_set_mesh_replicating_an_unsharded_output_is_said(verdicts: dict) -> None:
    details = verdicts["set_mesh_replicates_unsharded_output"].details
    assert "on one device in the original are replicated over the mesh" in details.get(
        "placement", ""
    ), details
