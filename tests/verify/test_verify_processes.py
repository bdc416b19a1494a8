"""`--processes N`: verification as an N-process JAX job (issue 13, multi-process verification).

The acceptance case: a 2-process pmap data-parallel train step in a git repository. Against it,
`jaxmigrate verify --against REV --processes 2` fails the single-host-only rewrite (its mesh is
the first n of jax.devices(): process 0 averages over its own devices, process 1 cannot read its
result) and verifies a correct global-array migration; the migrated program, run as a 2-process
job, gives every process the numpy oracle's weights.
"""

from __future__ import annotations

import json
import shutil
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from clitools import git, jm
from multihost import run_job

from jaxmigrate.config import load_config
from jaxmigrate.model import Safety, Site, Status
from jaxmigrate.verify.child.protocol import Compared, Failed, Mismatch, Ran
from jaxmigrate.verify.config import Verdict, VerifyConfig, VerifyRequest
from jaxmigrate.verify.planner import plan_all
from jaxmigrate.verify.pool import Reply, combine
from jaxmigrate.verify.processes import DeviceSplitError, processes_hint
from jaxmigrate.verify.session import with_processes_hint

DATA = Path(__file__).resolve().parent.parent / "data" / "multihost"


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A git repository whose HEAD holds the pmap program, train.py."""
    shutil.copyfile(DATA / "train_pmap.py", tmp_path / "train.py")
    git(tmp_path, "init", "-q")
    git(tmp_path, "add", "train.py")
    git(tmp_path, "commit", "-qm", "pmap")
    return tmp_path


def verify_against(root: Path, *extra: str) -> tuple[int, dict, str]:
    """Run `jaxmigrate verify --against HEAD --processes 2`; return code, the site, stdout."""
    report = root.parent / "report.json"
    proc = jm(
        *("verify", "--against", "HEAD", "--processes", "2", *extra),
        *("--verify-with", "python train.py", "--report", str(report)),
        cwd=root,
        timeout=600,
    )
    assert report.exists(), proc.stderr
    (site,) = json.loads(report.read_text())["files"][0]["sites"]
    return proc.returncode, site, proc.stdout


def oracle_weights(steps: int = 3, devices: int = 8) -> np.ndarray:
    """The weights of train.py's loop, by numpy: the gradient averaged over all devices."""
    w = np.zeros(3, np.float64)
    for step in range(steps):
        rng = np.random.default_rng(step)
        x = rng.standard_normal((devices, 2, 3)).astype(np.float32).astype(np.float64)
        y = rng.standard_normal((devices, 2)).astype(np.float32).astype(np.float64)
        grads = [2 * x[d].T @ (x[d] @ w - y[d]) / len(y[d]) for d in range(devices)]
        w = w - 0.1 * np.mean(grads, axis=0)
    return w


def weights(stdout: str) -> np.ndarray:
    line = next(line for line in stdout.splitlines() if line.startswith("weights "))
    return np.array(json.loads(line.removeprefix("weights ")))


@pytest.mark.jax
def test_a_single_host_only_rewrite_fails_on_two_processes(repo: Path) -> None:
    shutil.copyfile(DATA / "train_single_host.py", repo / "train.py")
    code, site, stdout = verify_against(repo)
    assert code == 1 and site["status"] == "failed", site
    reason = site["details"]["verification"]
    # process 1's result lives on process 0's devices; process 0's mean misses process 1's
    assert "non-addressable" in reason and "[process 1 of 2; process 0: outputs differ]" in reason
    assert site["details"]["input_source"] == "recorded"
    assert site["details"]["input_shapes"] == ["float32[4, 3]", "float32[4, 2, 3]", "float32[4, 2]"]
    assert "process 1 of 2" in stdout


@pytest.mark.jax
def test_a_global_array_migration_verifies_and_gives_every_process_the_oracle(
    repo: Path,
) -> None:
    shutil.copyfile(DATA / "train_global.py", repo / "train.py")
    code, site, _ = verify_against(repo)
    assert code == 0 and site["status"] == "verified", site
    assert site["details"]["calls"] == 3 and site["details"]["input_source"] == "recorded"
    job = run_job(repo / "train.py", processes=2, devices=8, cwd=repo).check()
    for out in job.stdouts:
        np.testing.assert_allclose(weights(out), oracle_weights(), rtol=1e-5, atol=1e-6)


@pytest.mark.jax
def test_each_process_gets_its_own_synthesized_data(repo: Path) -> None:
    # With identical data in every process, a mean over one process's devices equals the mean
    # over all of them: only per-process inputs expose a rewrite that never leaves its process.
    shutil.copyfile(DATA / "train_local_mesh.py", repo / "train.py")
    proc = jm("verify", "--against", "HEAD", "--processes", "2", cwd=repo, timeout=600)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "[unsafe, failed]" in proc.stdout
    assert (
        "outputs differ" in proc.stdout
        and "[process 0 of 2; process 1: outputs differ]" in proc.stdout
    )
    assert "synthesized" not in proc.stdout  # the reason is the difference, not the inputs


def test_devices_must_split_evenly_between_processes(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text("x = 1\n")
    for command in (["run", "m.py"], ["verify", "--against", "HEAD"]):
        proc = jm(*command, "--devices", "8", "--processes", "3", cwd=tmp_path)
        assert proc.returncode == 2, proc.stderr
        assert "--devices 8 cannot be split evenly between 3 processes" in proc.stderr
    with pytest.raises(DeviceSplitError):
        VerifyConfig(tmp_path, devices=6, processes=4)


def test_processes_is_read_from_pyproject(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text("[tool.jaxmigrate]\nprocesses = 2\n")
    assert load_config(tmp_path / "pyproject.toml").processes == 2


@pytest.mark.parametrize(
    ("code", "api"),
    [
        ("if jax.process_index() == 0:\n    log(x)\n", "jax.process_index"),
        ("n = jax.process_count()\n", "jax.process_count"),
        ("jax.distributed.initialize()\n", "jax.distributed"),
    ],
)
def test_multi_process_code_gets_the_processes_hint(code: str, api: str) -> None:
    hint = processes_hint(code, processes=1)
    assert f"the code calls {api}" in hint and "--processes 2" in hint
    assert processes_hint(code, processes=2) == ""
    assert processes_hint("torch.distributed.init()\nprocess = 1\n", processes=1) == ""


def test_one_process_that_disagrees_fails_the_site() -> None:
    agree = Compared(equal=True, calls=2, max_abs_err=0.0, max_rel_err=1e-7)
    worse = replace(agree, max_abs_err=1e-6)
    assert combine("candidate", [agree, worse]) == Reply(worse, processes=2)
    differs = Compared(equal=False, mismatch=Mismatch(path="[0]", why="values differ"))
    out = combine("candidate", [agree, differs])
    assert isinstance(out.message, Compared) and out.process == 1
    assert out.message.mismatch == Mismatch(path="[0]", why="values differ [process 1 of 2]")
    raised = Failed(stage="call", error="RuntimeError: boom")
    out = combine("candidate", [differs, raised, agree])
    assert out == Reply(
        Failed(
            stage="call", error="RuntimeError: boom [process 1 of 3; process 0: outputs differ]"
        ),
        process=1,
        processes=3,
    )
    assert combine("original", [agree]) == Reply(agree)
    # a process that fell back on another reference ran other code than its peers
    ran = [
        Ran(reference="original", source="run", calls=1),
        Ran(reference="vmap-oracle", source="run", calls=1),
    ]
    out = combine("original", ran)
    assert isinstance(out.message, Failed) and "process 1: vmap-oracle" in out.message.error


def test_the_processes_hint_reaches_the_verdict(tmp_path: Path) -> None:
    text = "import jax\n\n\ndef step(x):\n    return x * jax.process_index()\n"
    site = Site("JM000", "hand-migration", 5, 5, Safety.UNSAFE, "changed", key="changed:step")
    (plan,), _ = plan_all([VerifyRequest("m.py", text, text, (site,))], tmp_path)
    verdict = Verdict(Status.VERIFIED, "agrees with the original on 1 recorded call(s)")
    out = with_processes_hint(verdict, plan, VerifyConfig(tmp_path))
    assert out.reason == (
        "agrees with the original on 1 recorded call(s); the code calls jax.process_index: "
        "verify it as a multi-process job too (--processes 2)"
    )
    assert out.details["processes_hint"]
    assert with_processes_hint(verdict, plan, VerifyConfig(tmp_path, processes=2)) is verdict


SCALE = "import jax.numpy as jnp\n\n\ndef scale(x):\n    return jnp.asarray(x) * 2\n"
SPAWNER = """\
import subprocess
import sys

import jax
import jax.numpy as jnp

from pkg.scale import scale

# A launcher's child: an ordinary single process on this process's 4 devices, outside the job.
code = "import jax; print(jax.process_count(), jax.local_device_count())"
child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
assert child.returncode == 0 and child.stdout.split() == ["1", "4"], (child.stdout, child.stderr)
assert jax.process_count() == 2  # the command itself is one of the job's processes
scale(jnp.arange(4.0) + jax.process_index())
"""


@pytest.mark.jax
def test_the_commands_own_subprocesses_do_not_join_the_job(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "scale.py").write_text(SCALE)
    (tmp_path / "spawner.py").write_text(SPAWNER)
    site = Site("JM000", "hand-migration", 5, 5, Safety.UNSAFE, "changed", key="changed:scale")
    candidate = SCALE.replace("jnp.asarray(x) * 2", "jnp.asarray(x) + jnp.asarray(x)")
    request = VerifyRequest("pkg/scale.py", SCALE, candidate, (site,))
    config = VerifyConfig(
        tmp_path, timeout=120.0, jobs=1, processes=2, verify_with=f"{sys.executable} spawner.py"
    )
    from jaxmigrate.verify import verify

    verdict = verify([request], config)[("pkg/scale.py", "changed:scale")]
    assert "verify_with_error" not in verdict.details, verdict.details["verify_with_error"]
    assert verdict.status is Status.VERIFIED, (verdict.reason, verdict.details)
    assert verdict.details["input_source"] == "recorded"
