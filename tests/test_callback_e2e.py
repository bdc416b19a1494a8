"""The error report that started the project, end to end: `jaxmigrate run` (verification on by
default) rewrites a `pure_callback` inside a partial-manual shard_map, verifies it against the
widened reference, writes it, and the written program runs on an 8-device CPU mesh."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
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
    cli_env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    proc = run(
        [
            sys.executable,
            "-m",
            "jaxmigrate",
            "run",
            ".",
            "--report",
            str(report),
            "--format",
            "json",
        ],
        tmp_path,
        cli_env,
    )
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
