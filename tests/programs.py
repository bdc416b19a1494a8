"""Run a package's program as a module, on one process and as a 2-process job, and compare the
numbers it prints (`RESULT {json}`): the original against the migrated code base."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
from conftest import jax_env
from multihost import JobResult, run_job


def result_of(stdout: str) -> dict:
    """The one `RESULT {json}` line a run printed, read."""
    (line,) = [line for line in stdout.splitlines() if line.startswith("RESULT ")]
    return json.loads(line.removeprefix("RESULT "))


def run_one(root: Path, module: str) -> dict:
    """`python -m module` in `root`, over 8 devices: what it printed."""
    command = [sys.executable, "-m", module]
    env = jax_env(8)
    proc = subprocess.run(command, check=False, cwd=root, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return result_of(proc.stdout)


def run_two(root: Path, module: str) -> list[dict]:
    """The module's file run as a 2-process job over 8 devices: what each process printed."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    script = root.joinpath(*module.split(".")).with_suffix(".py")
    job: JobResult = run_job(script, processes=2, devices=8, timeout=300, cwd=root, env=env)
    job.check()
    return [result_of(out) for out in job.stdouts]


def same(got: dict, want: dict, where: str) -> None:
    """The same keys, and the same numbers under each (to float32's tolerance)."""
    assert set(got) == set(want), where
    for key, value in want.items():
        np.testing.assert_allclose(
            np.asarray(got[key]), np.asarray(value), rtol=1e-5, atol=1e-6, err_msg=where
        )
