"""The reach check counts the lines JAX runs for a call: at trace time and on callback threads.

The seed case (a `pure_callback` inside a `jax.shard_map` leaving a mesh axis automatic) in a
function under `jax.jit` was left unverified by the default `jaxmigrate run`: the worker probed
the synthesized inputs with `jax.eval_shape`, which traced the function outside the watch, and
the call then reused that trace without running a line ("never ran the site's lines 19-21").
A `pure_callback` body runs on XLA's threads, which `sys.settrace` never saw. A function the
module only runs as `step = jax.jit(forward)` was called unjitted, where the nested
`jax.shard_map` of the rewrite (no `mesh=`, it takes the trace's) cannot run: `failed`.

Each variant is a file of one project, run through the command line, as a user does.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from clitools import jm

pytestmark = pytest.mark.jax

HEAD = """\
import functools

import jax
import numpy as np
from jax.sharding import Mesh, PartitionSpec as P

mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))


def host_fn(x):
    return np.asarray(x) * 2


def body(x):
    y = jax.pure_callback(host_fn, jax.ShapeDtypeStruct(x.shape, x.dtype), x)
    return y + 1

"""
SHARD_MAP = 'jax.shard_map(\n        body, mesh=mesh, in_specs=P("data"), out_specs=P("data"), axis_names={"data"}\n    )(x)'
VARIANTS = {
    # the seed case: the README's example, decorated with @jax.jit
    "seed.py": HEAD + f"\n@jax.jit\ndef step(x):\n    return {SHARD_MAP}\n",
    # a function the module only runs through `jax.jit(forward)`
    "jit_call.py": HEAD
    + f"\ndef forward(x):\n    return {SHARD_MAP}\n\n\nstep = jax.jit(forward)\n",
    # `functools.partial(jax.jit, static_argnums=...)`, with a default for the static argument
    "jit_static.py": HEAD
    + "\n@functools.partial(jax.jit, static_argnums=(1,))\n"
    + f"def step(x, scale=2):\n    y = {SHARD_MAP}\n    return y * scale\n",
    # a program calling the jitted step twice: the second call reuses the first's trace
    "jit_main.py": HEAD
    + f"\n@jax.jit\ndef step(x):\n    return {SHARD_MAP}\n\n\n"
    + "def main():\n    x = np.arange(16, dtype=np.float32).reshape(8, 2)\n"
    + "    step(x)\n    return step(x)\n",
}
# not lenient: under jit, a call that never traces the site's branch shows nothing
BRANCH = (
    HEAD
    + "\n@functools.partial(jax.jit, static_argnums=(1,))\ndef step(x, use_host=False):\n"
    + "    if use_host:\n        return "
    + SHARD_MAP.replace("\n", "\n    ")
    + "\n    return x * 2\n"
)
# a site that only runs in a host callback, on XLA's threads
THREAD = """\
import jax
import numpy as np
from jax.sharding import Mesh, PartitionSpec as P

devices = np.array(jax.devices())
mesh = Mesh(devices.reshape(4, 2), ("data", "model"))
flat = Mesh(devices, ("i",))


def main():
    def host(v):
        with mesh:
            return np.asarray(v) * 2

    def per_shard(x):
        return jax.pure_callback(host, jax.ShapeDtypeStruct(x.shape, x.dtype), x)

    f = jax.jit(jax.shard_map(per_shard, mesh=flat, in_specs=P("i"), out_specs=P("i")))
    return f(np.arange(16, dtype=np.float32).reshape(8, 2))
"""


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, list[dict]]]:
    root = tmp_path_factory.mktemp("reach_jit")
    for name, text in {**VARIANTS, "branch.py": BRANCH, "callback_thread.py": THREAD}.items():
        (root / name).write_text(text)
    report = root / "report.json"
    proc = jm("run", ".", "--report", str(report), "--format", "json", cwd=root, timeout=900)
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    files = json.loads(report.read_text())["files"]
    return root, {f["path"]: f["sites"] for f in files}


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_a_partial_auto_callback_under_jit_is_verified_and_written(
    ran: tuple[Path, dict[str, list[dict]]], name: str
) -> None:
    root, sites = ran
    found = [(s["code"], s["status"], s["applied"]) for s in sites[name]]
    assert found == [("JM203", "verified", True)], sites[name]
    assert sites[name][0]["details"]["reference"] == "widened-shard-map"
    written = (root / name).read_text()
    assert written != VARIANTS[name]
    assert 'axis_names={"model"}' in written and "check_vma=False" in written


def test_a_jitted_call_that_never_traces_the_site_verifies_nothing(
    ran: tuple[Path, dict[str, list[dict]]],
) -> None:
    root, sites = ran
    (site,) = sites["branch.py"]
    assert (site["code"], site["status"], site["applied"]) == ("JM203", "unverified", False)
    assert "call(s) of `step` never ran the site's lines" in site["details"]["verification"]
    assert (root / "branch.py").read_text() == BRANCH


def test_a_site_run_by_a_host_callback_is_reached(
    ran: tuple[Path, dict[str, list[dict]]],
) -> None:
    root, sites = ran
    (site,) = sites["callback_thread.py"]
    assert (site["code"], site["status"], site["applied"]) == ("JM201", "verified", True), site
    assert "jax.set_mesh(mesh)" in (root / "callback_thread.py").read_text()
