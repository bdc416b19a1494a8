"""The error report that started the project, end to end: `jaxmigrate run` (verification on by
default) rewrites a `pure_callback` inside a partial-manual shard_map, verifies it against the
widened reference, writes it, and the written program runs on an 8-device CPU mesh."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from clitools import jm
from conftest import jax_env

REPORTED = """\
import jax
import numpy as np
from jax.sharding import Mesh, PartitionSpec as P

mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))


def host_fn(x):
    return np.asarray(x) * 2


def body(x):
    y = jax.pure_callback(host_fn, jax.ShapeDtypeStruct(x.shape, x.dtype), x)
    return y + 1


step = jax.jit(
    jax.shard_map(body, mesh=mesh, in_specs=P("data"), out_specs=P("data"), axis_names={"data"})
)

if __name__ == "__main__":
    print(float(np.asarray(step(np.arange(16, dtype=np.float32).reshape(8, 2))).sum()))
"""


def run(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        args, cwd=cwd, env=env, capture_output=True, text=True, check=False, timeout=600
    )


@pytest.mark.jax
def test_reported_example_is_rewritten_verified_and_runs(tmp_path: Path) -> None:
    program = tmp_path / "model.py"
    program.write_text(REPORTED)
    env = jax_env(8)
    before = run([sys.executable, str(program)], tmp_path, env)
    assert before.returncode != 0
    assert "all mesh axes are partitioned manually" in before.stderr

    report = tmp_path / "report.json"
    proc = jm("run", ".", "--report", str(report), "--format", "json", cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    sites = [s for f in json.loads(report.read_text())["files"] for s in f["sites"]]
    assert [(s["code"], s["status"], s["applied"]) for s in sites] == [("JM203", "verified", True)]
    details = sites[0]["details"]
    assert details["reference"] == "widened-shard-map"
    assert details["target"] == "model.py::step"

    written = program.read_text()
    assert written != REPORTED
    assert 'axis_names={"model"}' in written and "check_vma=False" in written
    after = run([sys.executable, str(program)], tmp_path, env)
    assert after.returncode == 0, after.stderr[-3000:]
    assert float(after.stdout.strip().splitlines()[-1]) == 2 * 120 + 16


ORDERED = """\
import jax
import numpy as np
from jax.experimental import io_callback
from jax.sharding import Mesh, PartitionSpec as P

mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))
SEEN = []


def log_and_double(v):
    SEEN.append(float(np.asarray(v).sum()))
    return np.asarray(v) * 2


def body(v):
    return io_callback(log_and_double, jax.ShapeDtypeStruct(v.shape, v.dtype), v, ordered=True)


def logged(x):
    SEEN.clear()
    step = jax.jit(
        jax.shard_map(body, mesh=mesh, in_specs=P("data"), out_specs=P("data"), axis_names={"data"})
    )
    out = jax.block_until_ready(step(x))
    jax.effects_barrier()
    return out, sorted(SEEN)


if __name__ == "__main__":
    out, seen = logged(np.arange(16, dtype=np.float32).reshape(8, 2))
    print(len(seen), float(np.asarray(out).sum()))
"""


def sites_of(report: Path) -> list[dict]:
    return [s for f in json.loads(report.read_text())["files"] for s in f["sites"]]


@pytest.mark.jax
def test_ordered_io_callback_is_gated_and_verified_with_its_side_effects(tmp_path: Path) -> None:
    """`logged` returns the host calls it saw: the site verifies because the widened reference
    runs an io_callback once per manual shard, as the gate does."""
    program = tmp_path / "model.py"
    program.write_text(ORDERED)
    report = tmp_path / "report.json"
    proc = jm("run", ".", "--report", str(report), "--format", "json", cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    sites = sites_of(report)
    assert [(s["code"], s["status"], s["applied"]) for s in sites] == [("JM203", "verified", True)]
    assert sites[0]["details"]["target"] == "model.py::logged"
    assert sites[0]["details"]["reference"] == "widened-shard-map"
    written = program.read_text()
    assert "axis_names" not in written and 'axis_index("model") == 0' in written
    after = run([sys.executable, str(program)], tmp_path, jax_env(8))
    assert after.returncode == 0, after.stderr[-3000:]
    calls, total = after.stdout.strip().splitlines()[-1].split()
    assert int(calls) == 4  # once per 'data' shard
    assert float(total) == 2 * 120


@pytest.mark.jax
def test_widening_alone_repeats_the_side_effect_and_fails(tmp_path: Path) -> None:
    """A hand migration that only widens the shard_map calls the host twice per shard: the
    verifier's reference counts once per manual shard, so `verify --against` fails it."""
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    program = tmp_path / "model.py"
    program.write_text(ORDERED)
    for cmd in (["init", "-q"], ["add", "model.py"], ["commit", "-qm", "before"]):
        subprocess.run([*git, *cmd], cwd=tmp_path, check=True, capture_output=True)
    program.write_text(ORDERED.replace(', axis_names={"data"})', ")"))
    report = tmp_path / "report.json"
    proc = jm("verify", "--against", "HEAD", "--report", str(report), cwd=tmp_path, timeout=600)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    [site] = sites_of(report)
    assert site["status"] == "failed"
    assert site["details"]["reference"] == "widened-shard-map"
    # the list of host calls: 8 (two per shard) where the reference made 4
    why = site["details"]["mismatch"]["why"]
    assert "builtins.list of 8 children, expected 4" in why, why
