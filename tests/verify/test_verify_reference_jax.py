"""The original on its own JAX: `--reference-jax` runs the original side on the JAX the code was
written for, the rewrite on the installed one, and compares them.

These modules cannot run on today's JAX (`device_put_replicated`, `host_callback` and
`jax.experimental.maps` are gone): without the flag they are verified against a reference
jaxmigrate builds; with it, against themselves on JAX 0.4.30 (wheels for Python 3.11 and 3.12,
numpy 2) or 0.4.13 (Python 3.11 only, `numpy<2`, `ml_dtypes<0.3`). The reference environments are
built once with pip under the cache folder (`verify.reference`) and reused by every later run;
without a reachable package index these tests are skipped, saying so.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path
from textwrap import dedent
from typing import Any

import pytest
from clitools import jm

from jaxmigrate.verify.reference import ReferenceError, ensure_reference

pytestmark = [pytest.mark.jax, pytest.mark.reference_jax]

INSTALLED = metadata.version("jax")


def reference(version: str) -> str:
    """Return the JAX `version` reference interpreter (built once, cached); skip the test when
    the package index cannot be reached to build it."""
    if version == "0.4.13" and sys.version_info >= (3, 12):
        pytest.skip("JAX 0.4.13 has wheels for Python 3.11 at most")
    try:
        return ensure_reference(version, sys.executable)
    except ReferenceError as exc:
        if index_reachable(version):
            raise
        pytest.skip(f"the package index is unreachable, so no JAX {version} reference: {exc}")


def index_reachable(version: str) -> bool:
    """Return True if pip can fetch `jax==version` (its wheel alone)."""
    with tempfile.TemporaryDirectory() as folder:
        done = subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", folder]
            + [f"jax=={version}"],
            capture_output=True,
            check=False,
        )
    return done.returncode == 0


def project(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "project"
    root.mkdir()
    for name, text in files.items():
        (root / name).write_text(dedent(text).lstrip())
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    return root


def sites(root: Path, *args: str) -> dict[str, dict[str, Any]]:
    """Run `jaxmigrate run --dry-run ARGS .` in `root`; return its sites by `CODE:line`."""
    proc = jm("run", "--dry-run", "--format", "json", *args, ".", cwd=root, timeout=900)
    assert proc.returncode in (0, 1), proc.stderr
    report = json.loads(proc.stdout)
    return {f"{s['code']}:{s['line']}": s for f in report["files"] for s in f["sites"]}


def reason(site: dict[str, Any]) -> str:
    return str(site["details"].get("verification", ""))


DEVICE_PUT_REPLICATED = """
import jax
import numpy as np


def main():
    x = np.arange(8, dtype=np.float32)
    y = jax.device_put_replicated(x, jax.devices())
    step = jax.pmap(lambda a: a * 2 + jax.lax.axis_index("i"), axis_name="i")
    return step(y)
"""


def test_device_put_replicated_is_verified_against_itself_on_jax_0_4_30(tmp_path: Path) -> None:
    python = reference("0.4.30")
    root = project(tmp_path, {"replicated.py": DEVICE_PUT_REPLICATED})
    found = sites(root, "--reference-jax", "0.4.30")
    step = found["JM202:8"]
    assert step["status"] == "verified", reason(step)
    assert step["details"]["reference"] == "original"  # the user's code itself, not a stand-in
    assert step["details"]["jax"] == {"original": "0.4.30", "candidate": INSTALLED}
    assert reason(step).startswith("agrees with the original when `main()` runs")
    assert f"(the original on JAX 0.4.30, the rewrite on JAX {INSTALLED})" in reason(step)
    # the same through --reference-python, and through [tool.jaxmigrate]
    (root / "pyproject.toml").write_text(f'[tool.jaxmigrate]\nreference-python = "{python}"\n')
    step = sites(root)["JM202:8"]
    assert step["status"] == "verified", reason(step)
    assert step["details"]["jax"]["original"] == "0.4.30"


def test_without_the_flag_the_removed_api_is_named_with_the_flag(tmp_path: Path) -> None:
    root = project(tmp_path, {"replicated.py": DEVICE_PUT_REPLICATED})
    step = sites(root)["JM202:8"]
    assert step["details"]["reference"] != "original"
    assert step["details"]["removed_api"] == "jax.device_put_replicated"
    assert f"the original itself cannot run on JAX {INSTALLED}" in reason(step)
    assert "pass --reference-jax 0.4.30" in reason(step)
    assert step["details"]["jax"] == {"original": INSTALLED, "candidate": INSTALLED}


HOST_CALLBACK = """
import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import host_callback as hcb

SEEN = []


def host_norm(x):
    return np.asarray(np.linalg.norm(x), np.float32)


def log_tap(x, transforms):
    SEEN.append(np.asarray(x).sum())


def main():
    def step(x):
        hcb.id_tap(log_tap, x)
        n = hcb.call(host_norm, x, result_shape=jax.ShapeDtypeStruct((), jnp.float32))
        return x / n

    out = jax.jit(step)(jnp.arange(1.0, 9.0))
    hcb.barrier_wait()
    return out, np.asarray(SEEN)
"""


def test_host_callback_module_is_verified_against_itself_on_jax_0_4_30(tmp_path: Path) -> None:
    reference("0.4.30")
    root = project(tmp_path, {"callbacks.py": HOST_CALLBACK})
    found = sites(root, "--reference-jax", "0.4.30")
    tap = next(s for s in found.values() if s["safety"] == "unsafe")
    assert tap["status"] == "verified", reason(tap)
    assert tap["details"]["reference"] == "original"
    assert tap["details"]["jax"] == {"original": "0.4.30", "candidate": INSTALLED}


TRAIN = """
import jax
import jax.numpy as jnp
import numpy as np


def loss(w, x, y):
    return jnp.mean((x @ w - y) ** 2)


def train_step(w, x, y):
    g = jax.grad(loss)(w, x, y)
    g = jax.lax.pmean(g, axis_name="batch")
    return w - 0.1 * g


p_train_step = jax.pmap(train_step, axis_name="batch")


def main():
    n = jax.local_device_count()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 4, 3)).astype(np.float32)
    y = rng.normal(size=(n, 4)).astype(np.float32)
    w = jax.device_put_replicated(np.ones(3, np.float32), jax.local_devices())
    for _ in range(3):
        w = p_train_step(w, x, y)
    return w
"""


def test_pmap_train_step_is_verified_against_itself_on_jax_0_4_30(tmp_path: Path) -> None:
    reference("0.4.30")
    root = project(tmp_path, {"train.py": TRAIN})
    step = sites(root, "--reference-jax", "0.4.30")["JM202:16"]
    assert step["status"] == "verified", reason(step)
    assert step["details"]["reference"] == "original"
    assert step["details"]["jax"] == {"original": "0.4.30", "candidate": INSTALLED}


def test_a_wrong_hand_migration_is_failed_against_the_original_on_jax_0_4_30(
    tmp_path: Path,
) -> None:
    reference("0.4.30")
    root = project(tmp_path, {"train.py": TRAIN})
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(root)]
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "legacy"], check=True)
    # migrated by hand, wrongly: the gradient is no longer averaged over the batch shards
    wrong = (
        dedent(TRAIN)
        .replace('    g = jax.lax.pmean(g, axis_name="batch")\n', "")
        .replace(
            "jax.device_put_replicated(np.ones(3, np.float32), jax.local_devices())",
            "jnp.stack([np.ones(3, np.float32)] * n)",
        )
    )
    (root / "train.py").write_text(wrong.lstrip())
    proc = jm(
        "verify",
        "--against",
        "HEAD",
        "--reference-jax",
        "0.4.30",
        "--report",
        str(tmp_path / "report.json"),
        cwd=root,
        timeout=900,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    failed = [s for f in report["files"] for s in f["sites"] if s["status"] == "failed"]
    assert failed, proc.stdout
    (main,) = [s for s in failed if s["details"]["target"] == "train.py::main"]
    assert main["details"]["jax"] == {"original": "0.4.30", "candidate": INSTALLED}
    assert main["details"]["reference"] == "original"
    assert "outputs differ" in reason(main), reason(main)


PJIT_0_4_13 = """
import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.pjit import pjit
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P


def layer(x, w):
    return jnp.tanh(x @ w)


def main():
    devices = np.array(jax.devices()).reshape(4, 2)
    mesh = Mesh(devices, ("data", "model"))
    x = np.arange(128, dtype=np.float32).reshape(16, 8) / 100
    w = np.full((8, 4), 0.5, np.float32)
    with mesh:
        f = pjit(layer, in_axis_resources=(P("data", None), P(None, "model")),
                 out_axis_resources=P("data", "model"))
        return f(x, w)
"""


def test_pjit_with_mesh_is_verified_against_itself_on_jax_0_4_13(tmp_path: Path) -> None:
    reference("0.4.13")
    root = project(tmp_path, {"sharded.py": PJIT_0_4_13})
    mesh = sites(root, "--reference-jax", "0.4.13")["JM201:18"]
    assert mesh["status"] == "verified", reason(mesh)
    assert mesh["details"]["reference"] == "original"
    assert mesh["details"]["jax"] == {"original": "0.4.13", "candidate": INSTALLED}


RECORDED_0_4_13 = {
    "sharded.py": """
        import jax.numpy as jnp
        from jax.experimental.pjit import pjit
        from jax.sharding import PartitionSpec as P


        def layer(x, w):
            return jnp.tanh(x @ w)


        def apply(mesh, x, w):
            with mesh:
                f = pjit(layer, in_axis_resources=(P("data", None), P(None, "model")),
                         out_axis_resources=P("data", "model"))
                return f(x, w)
    """,
    "run_it.py": """
        import jax
        import numpy as np
        from jax.sharding import Mesh

        import sharded

        mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))
        x = np.arange(128, dtype=np.float32).reshape(16, 8) / 100
        print(sharded.apply(mesh, x, np.full((8, 4), 0.5, np.float32)).sum())
    """,
}


def test_calls_recorded_on_jax_0_4_13_replay_on_the_installed_jax(tmp_path: Path) -> None:
    """The command runs on the reference too; its calls (a Mesh argument: JAX 0.4.13 cannot
    pickle its devices, and today's JAX cannot unpickle 0.4.13's Mesh) replay on both sides."""
    reference("0.4.13")
    root = project(tmp_path, RECORDED_0_4_13)
    found = sites(root, "--reference-jax", "0.4.13", "--verify-with", "python run_it.py")
    mesh = found["JM201:11"]
    assert mesh["status"] == "verified", reason(mesh)
    assert mesh["details"]["input_source"] == "recorded"
    assert mesh["details"]["input_shapes"][0] == "Mesh"
    assert mesh["details"]["jax"] == {"original": "0.4.13", "candidate": INSTALLED}


# Notebooks: the original's cells run on the reference JAX too ----------------------------------
NOTEBOOK_STEP = """
import functools
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
# cell
@functools.partial(jax.pmap, axis_name='batch')
def train_step(w, x):
    g = jnp.mean(x, axis=0) * w
    g = lax.pmean(g, 'batch')
    return w - 0.1 * g
# cell
n = jax.local_device_count()
w = jax.device_put_replicated(jnp.ones(4), jax.local_devices())
x = jnp.arange(n * 2 * 4, dtype=jnp.float32).reshape(n, 2, 4)
for _ in range(2):
    w = train_step(w, x)
print(w.shape)
"""


def by_hand_step(collective: str) -> str:
    """Return the notebook migrated by hand to shard_map, `collective` over the batch."""
    step = """
from jax.sharding import Mesh, PartitionSpec as P
@jax.jit
@functools.partial(jax.shard_map, mesh=Mesh(np.array(jax.devices()), ('batch',)),
                   in_specs=P('batch'), out_specs=P('batch'))
def train_step(w, x):
    g = jnp.mean(x, axis=1) * w
    g = lax.COLLECTIVE(g, 'batch')
    return w - 0.1 * g
"""
    imports, _, rest = NOTEBOOK_STEP.partition("# cell")
    _, _, loop = rest.partition("# cell")
    loop = loop.replace(
        "jax.device_put_replicated(jnp.ones(4), jax.local_devices())", "jnp.ones((n, 4))"
    )
    return "# cell".join([imports, step.replace("COLLECTIVE", collective), loop])


def notebook(text: str) -> str:
    """Return a notebook whose code cells are `text`'s parts between `# cell` lines."""
    cells = [
        {
            "cell_type": "code",
            "execution_count": None,
            "metadata": {},
            "outputs": [],
            "source": part.strip("\n").splitlines(keepends=True),
        }
        for part in text.split("# cell\n")
    ]
    document = {"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    return json.dumps(document, indent=1) + "\n"


def test_a_notebook_is_verified_against_its_cells_run_on_jax_0_4_30(tmp_path: Path) -> None:
    reference("0.4.30")
    root = project(tmp_path, {"train.ipynb": notebook(NOTEBOOK_STEP)})
    proc = jm("run", "--dry-run", "--format", "json", "--reference-jax", "0.4.30", ".", cwd=root)
    assert proc.returncode in (0, 1), proc.stderr
    (step,) = [
        s
        for f in json.loads(proc.stdout)["files"]
        for s in f["sites"]
        if s["code"] == "JM202" and s["cell"] == 2
    ]
    assert step["status"] == "verified", reason(step)
    # the cells themselves, on the JAX they were written for: not their safe rewrites here
    assert step["details"]["reference"] == "original", step["details"]
    assert step["details"]["unit"] == "notebook"
    assert step["details"]["jax"] == {"original": "0.4.30", "candidate": INSTALLED}
    assert f"(the original on JAX 0.4.30, the rewrite on JAX {INSTALLED})" in reason(step)


def test_a_wrong_hand_migration_of_a_notebook_is_failed_against_it_on_jax_0_4_30(
    tmp_path: Path,
) -> None:
    reference("0.4.30")
    legacy = notebook(NOTEBOOK_STEP)
    root = project(tmp_path, {"right.ipynb": legacy, "wrong.ipynb": legacy})
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(root)]
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "legacy"], check=True)
    # the wrong one sums the gradients over the devices instead of averaging them
    (root / "right.ipynb").write_text(notebook(by_hand_step("pmean")))
    (root / "wrong.ipynb").write_text(notebook(by_hand_step("psum")))
    report = tmp_path / "report.json"
    args = ["--against", "HEAD", "--reference-jax", "0.4.30", "--report", str(report)]
    proc = jm("verify", *args, cwd=root, timeout=900)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    found = {
        (f["path"], s["details"]["target"].split("::")[-1]): s
        for f in json.loads(report.read_text())["files"]
        for s in f["sites"]
    }
    wrong, right = found[("wrong.ipynb", "train_step")], found[("right.ipynb", "train_step")]
    assert wrong["status"] == "failed", reason(wrong)
    assert "values differ" in reason(wrong), reason(wrong)
    assert right["status"] == "verified", reason(right)
    for site in (wrong, right):
        assert site["details"]["jax"] == {"original": "0.4.30", "candidate": INSTALLED}
        assert site["details"]["reference"] == "original"
