"""The pmap rewrite on a multi-process JAX job: each process gets the weights pmap gave it.

A data-parallel train step (pmap + `lax.pmean` of the gradients) runs as a real 2-process job on
this machine (`jax.distributed` on localhost, gloo collectives, 4 CPU devices per process), each
process feeding its own devices' slices of the global batch, as on a TPU pod. Before and after
the rewrite, every process must hold the numpy oracle's weights: pmap's collectives span every
device of the job, so a rewrite that reduced over one process's devices would be 2x off.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from jaxmigrate.model import Options
from jaxmigrate.pipeline.engine import migrate_source
from jaxmigrate.verify.processes import Coordinator, with_devices

pytestmark = pytest.mark.jax

PROCESSES, LOCAL_DEVICES, STEPS, LR = 2, 4, 3, 0.1

PROGRAM = """\
import json
import sys

import jax

jax.config.update("jax_cpu_collectives_implementation", "gloo")
process, port, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
jax.distributed.initialize(f"localhost:{port}", num_processes=2, process_id=process)

import jax.numpy as jnp
import numpy as np


def loss_fn(w, x, y):
    return jnp.mean((jnp.tanh(x @ w) - y) ** 2)


def step(w, x, y, lr):
    loss, grads = jax.value_and_grad(loss_fn)(w, x, y)
    grads = jax.lax.pmean(grads, axis_name="batch")
    return w - lr * grads, jax.lax.pmean(loss, "batch")


train_step = jax.pmap(step, axis_name="batch", in_axes=(0, 0, 0, None), donate_argnums=(0,))

rng = np.random.default_rng(0)
w0 = rng.normal(size=(4, 2)).astype(np.float32)
xs = rng.normal(size=(8, 16, 4)).astype(np.float32)
ys = rng.normal(size=(8, 16, 2)).astype(np.float32)
n = jax.local_device_count()
mine = slice(process * n, (process + 1) * n)  # this process's devices' slices
w = np.broadcast_to(w0, (n, 4, 2))
for _ in range(3):
    w, loss = train_step(w, xs[mine], ys[mine], 0.1)
w = np.asarray(w)
with open(out, "w") as handle:
    json.dump({"shape": list(w.shape), "w": w.tolist(), "loss": np.asarray(loss).tolist()}, handle)
"""


LOOP = """\
import json
import sys

import jax

jax.config.update("jax_cpu_collectives_implementation", "gloo")
process, port, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
jax.distributed.initialize(f"localhost:{port}", num_processes=2, process_id=process)

import jax.numpy as jnp
import numpy as np


def loss_fn(w, x, y):
    return jnp.mean((jnp.tanh(x @ w) - y) ** 2)


def step(w, x, y):
    loss, grads = jax.value_and_grad(loss_fn)(w, x, y)
    grads = jax.lax.pmean(grads, axis_name="batch")
    return w - 0.1 * grads, jax.lax.pmean(loss, "batch")


def main():
    rng = np.random.default_rng(0)
    w = rng.normal(size=(4, 2)).astype(np.float32)
    xs = rng.normal(size=(8 * 16, 4)).astype(np.float32)
    ys = rng.normal(size=(8 * 16, 2)).astype(np.float32)
    n = jax.local_device_count()
    mine = slice(process * n * 16, (process + 1) * n * 16)  # this process's rows of the batch
    p_step = jax.pmap(step, axis_name="batch", donate_argnums=(0,))
    w = jnp.broadcast_to(w, (n,) + w.shape)
    for _ in range(3):
        x = xs[mine]
        y = ys[mine]
        x = x.reshape((n, -1) + x.shape[1:])
        y = y.reshape((n, -1) + y.shape[1:])
        w, loss = p_step(w, x, y)
    w = w[0]
    return w


w = np.asarray(main())
with open(out, "w") as handle:
    json.dump({"shape": list(w.shape), "w": w.tolist()}, handle)
"""


def oracle() -> np.ndarray:
    """Return the weights after the steps, by numpy: gradients of the mean over the global batch."""
    rng = np.random.default_rng(0)
    w = rng.normal(size=(4, 2)).astype(np.float64)
    x = rng.normal(size=(8, 16, 4)).astype(np.float32).reshape(-1, 4).astype(np.float64)
    y = rng.normal(size=(8, 16, 2)).astype(np.float32).reshape(-1, 2).astype(np.float64)
    for _ in range(STEPS):
        t = np.tanh(x @ w)
        w = w - LR * x.T @ (2 * (t - y) * (1 - t**2)) / y.size
    return w


def run_job(script: Path, tmp: Path) -> list[dict]:
    """Run `script` as a 2-process JAX job; return what each process wrote."""
    env = with_devices(os.environ, LOCAL_DEVICES)
    env["JAX_PLATFORMS"] = "cpu"
    with Coordinator() as held:  # its port held until the job ends
        return _run(script, tmp, env, held.address.rsplit(":", 1)[1])


def _run(script: Path, tmp: Path, env: dict[str, str], port: str) -> list[dict]:
    outs = [tmp / f"{script.stem}.{i}.json" for i in range(PROCESSES)]
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(i), port, str(outs[i])],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(PROCESSES)
    ]
    logs = []
    for proc in procs:
        try:
            logs.append(proc.communicate(timeout=300)[0])
        except subprocess.TimeoutExpired:
            for other in procs:
                other.kill()
            raise
    for proc, log in zip(procs, logs):
        assert proc.returncode == 0, log[-4000:]
    return [json.loads(out.read_text()) for out in outs]


def check(results: list[dict]) -> None:
    expected = oracle()
    for process, result in enumerate(results):
        assert result["shape"] == [LOCAL_DEVICES, 4, 2], process
        for row in np.asarray(result["w"]):  # every local device holds the same weights
            np.testing.assert_allclose(row, expected, rtol=1e-4, atol=1e-5, err_msg=str(process))


def test_pmap_train_step_is_right_on_every_process(tmp_path: Path) -> None:
    original = tmp_path / "original.py"
    original.write_text(PROGRAM)
    check(run_job(original, tmp_path))  # the oracle is pmap's own answer


def test_rewritten_train_step_is_right_on_every_process(tmp_path: Path) -> None:
    code = migrate_source(PROGRAM, options=Options(unsafe_fixes=True)).code
    assert "jax.pmap(" not in code and "shard_map_per_device(" in code
    migrated = tmp_path / "migrated.py"
    migrated.write_text(code)
    check(run_job(migrated, tmp_path))


def check_loop(results: list[dict]) -> None:
    expected = oracle()
    for process, result in enumerate(results):
        assert result["shape"] == [4, 2], process
        np.testing.assert_allclose(
            np.asarray(result["w"]), expected, rtol=1e-4, atol=1e-5, err_msg=str(process)
        )


def test_program_level_loop_is_right_on_every_process(tmp_path: Path) -> None:
    original = tmp_path / "loop_original.py"
    original.write_text(LOOP)
    check_loop(run_job(original, tmp_path))
    result = migrate_source(LOOP, options=Options(unsafe_fixes=True))
    assert any(s.group and "program-level" in s.message for s in result.sites), result.sites
    assert "jax.make_array_from_process_local_data(" in result.code
    assert "w = w[0]" not in result.code and "shard_map_per_device" not in result.code
    migrated = tmp_path / "loop_migrated.py"
    migrated.write_text(result.code)
    check_loop(run_job(migrated, tmp_path))


DECORATED = """\
import functools
import json
import sys

import jax

jax.config.update("jax_cpu_collectives_implementation", "gloo")
process, port, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
jax.distributed.initialize(f"localhost:{port}", num_processes=2, process_id=process)

import jax.numpy as jnp
import numpy as np


def loss_fn(w, x, y):
    return jnp.mean((jnp.tanh(x @ w) - y) ** 2)


@functools.partial(jax.pmap, axis_name="batch", donate_argnums=(0,))
def train_step(w, x, y):
    loss, grads = jax.value_and_grad(loss_fn)(w, x, y)
    grads = jax.lax.pmean(grads, axis_name="batch")
    return w - 0.1 * grads, jax.lax.pmean(loss, "batch")


def main():
    rng = np.random.default_rng(0)
    w = rng.normal(size=(4, 2)).astype(np.float32)
    xs = rng.normal(size=(8 * 16, 4)).astype(np.float32)
    ys = rng.normal(size=(8 * 16, 2)).astype(np.float32)
    n = jax.local_device_count()
    mine = slice(process * n * 16, (process + 1) * n * 16)  # this process's rows of the batch
    w = jnp.broadcast_to(w, (n,) + w.shape)
    for _ in range(3):
        x = xs[mine]
        y = ys[mine]
        x = x.reshape((n, -1) + x.shape[1:])
        y = y.reshape((n, -1) + y.shape[1:])
        w, loss = train_step(w, x, y)
    w = w[0]
    return w


w = np.asarray(main())
with open(out, "w") as handle:
    json.dump({"shape": list(w.shape), "w": w.tolist()}, handle)
"""


def test_program_level_decorated_step_is_right_on_every_process(tmp_path: Path) -> None:
    """A pmap-decorated step of the module: jit over shard_map with no mesh, the mesh of every
    device of the job set with `jax.set_mesh` in `main`, each process's rows made global."""
    original = tmp_path / "decorated_original.py"
    original.write_text(DECORATED)
    check_loop(run_job(original, tmp_path))
    result = migrate_source(DECORATED, options=Options(unsafe_fixes=True))
    assert any(s.group and "program-level" in s.message for s in result.sites), result.sites
    assert "@functools.partial(jax.jit, donate_argnums=(0,))" in result.code
    assert "jax.set_mesh(mesh)" in result.code and "mesh=" not in result.code
    assert "w = w[0]" not in result.code and "shard_map_per_device" not in result.code
    migrated = tmp_path / "decorated_migrated.py"
    migrated.write_text(result.code)
    check_loop(run_job(migrated, tmp_path))


# JAX's spmd_mnist example and big_vision's trainers: the step a pmap decorator makes of a def
# inside `main()`, keyword arguments (flax's `dropout_rng=`) passed to it.
LOCAL_DECORATED = "import functools\n" + LOOP.replace(
    '    p_step = jax.pmap(step, axis_name="batch", donate_argnums=(0,))\n',
    '    @functools.partial(jax.pmap, axis_name="batch", donate_argnums=(0,))\n'
    "    def p_step(w, x, y=None):\n"
    "        loss, grads = jax.value_and_grad(loss_fn)(w, x, y)\n"
    '        grads = jax.lax.pmean(grads, axis_name="batch")\n'
    '        return w - 0.1 * grads, jax.lax.pmean(loss, "batch")\n\n',
).replace("w, loss = p_step(w, x, y)", "w, loss = p_step(w, x, y=y)")


def test_program_level_step_decorated_in_main_is_right_on_every_process(tmp_path: Path) -> None:
    """The mesh made just before the def, the decorators `jax.jit` over `jax.shard_map` on it,
    the keyword argument passed by position, each process's rows made global."""
    original = tmp_path / "local_original.py"
    original.write_text(LOCAL_DECORATED)
    check_loop(run_job(original, tmp_path))
    result = migrate_source(LOCAL_DECORATED, options=Options(unsafe_fixes=True))
    assert any(s.group and "program-level" in s.message for s in result.sites), result.sites
    assert "@functools.partial(jax.jit, donate_argnums=(0,))" in result.code
    assert "w, loss = p_step(w, x, y)" in result.code and "jax.tree.map(jnp.copy, w)" in result.code
    assert "w = w[0]" not in result.code and "shard_map_per_device" not in result.code
    migrated = tmp_path / "local_migrated.py"
    migrated.write_text(result.code)
    check_loop(run_job(migrated, tmp_path))


PREDICT = """\
import json
import sys

import jax

jax.config.update("jax_cpu_collectives_implementation", "gloo")
process, port, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
jax.distributed.initialize(f"localhost:{port}", num_processes=2, process_id=process)

import jax.numpy as jnp
import numpy as np


@jax.pmap
def predict(w, x):
    return jnp.tanh(x @ w)


def evaluate(w, x):
    n = jax.local_device_count()
    w = jnp.broadcast_to(w, (n,) + w.shape)
    x = x.reshape((n, -1) + x.shape[1:])
    out = predict(w, x)
    return out.reshape(-1)


def main():
    rng = np.random.default_rng(0)
    w = rng.normal(size=(4,)).astype(np.float32)
    xs = rng.normal(size=(8 * 2, 4)).astype(np.float32)
    n = jax.local_device_count()
    mine = xs[process * n * 2 : (process + 1) * n * 2]  # this process's rows
    return evaluate(w, mine)


p = np.asarray(main())
with open(out, "w") as handle:
    json.dump({"p": p.tolist()}, handle)
"""


def test_program_level_flattened_results_are_each_process_own(tmp_path: Path) -> None:
    """A pmap-decorated step called in `evaluate`: the mesh is set around the call there, each
    process's rows become its part of the global batch, and each reads back its own rows of the
    per-example predictions (`global_array_to_host_local_array`), as pmap gave them."""
    rng = np.random.default_rng(0)
    w = rng.normal(size=(4,)).astype(np.float32)
    xs = rng.normal(size=(8 * 2, 4)).astype(np.float32)
    expected = np.tanh(xs @ w).reshape(PROCESSES, -1)
    result = migrate_source(PREDICT, options=Options(unsafe_fixes=True))
    assert "with jax.set_mesh(mesh):" in result.code
    assert "x.reshape(" not in result.code  # the split goes; the flattening is the program's
    assert result.code.count(".reshape(") == 1, result.code
    for name, code in (("predict_original", PREDICT), ("predict_migrated", result.code)):
        script = tmp_path / f"{name}.py"
        script.write_text(code)
        for process, out in enumerate(run_job(script, tmp_path)):
            np.testing.assert_allclose(out["p"], expected[process], rtol=1e-5, err_msg=name)


@pytest.mark.parametrize(
    "readback",
    [
        "w = jax.device_get(jax.tree.map(lambda v: v[0], w))",  # p09's device_get(unreplicate(.))
        "w = jax.tree.map(lambda v: np.array(v[0]), w)",  # big_vision's params_cpu
    ],
)
def test_program_level_readbacks_to_the_host_are_right_on_every_process(
    tmp_path: Path, readback: str
) -> None:
    """The weights fetched to the host after the loop: the readback deleted, the fetch of the
    replicated global array kept, and every process reads the job's weights."""
    source = LOOP.replace("    w = w[0]\n", f"    {readback}\n")
    assert source != LOOP
    result = migrate_source(source, options=Options(unsafe_fixes=True))
    assert "shard_map_per_device" not in result.code and "[0]" not in result.code
    migrated = tmp_path / "readback_migrated.py"
    migrated.write_text(result.code)
    check_loop(run_job(migrated, tmp_path))


TOHOST = """
def tohost(x):
    n_device, n_batch, *remaining_dims = x.shape
    return np.array(x).reshape((n_device * n_batch,) + tuple(remaining_dims))


def evaluate(w, x):"""


def test_program_level_tohost_reads_each_process_own_rows(tmp_path: Path) -> None:
    """flax wmt's `tohost` flattening the predictions: each process reads its own rows."""
    source = PREDICT.replace("\n\ndef evaluate(w, x):", TOHOST).replace(
        "return out.reshape(-1)", "return tohost(out)"
    )
    assert "tohost(out)" in source and "def tohost" in source
    rng = np.random.default_rng(0)
    w = rng.normal(size=(4,)).astype(np.float32)
    xs = rng.normal(size=(8 * 2, 4)).astype(np.float32)
    expected = np.tanh(xs @ w).reshape(PROCESSES, -1)
    result = migrate_source(source, options=Options(unsafe_fixes=True))
    assert "shard_map_per_device" not in result.code and "tohost(out)" not in result.code
    script = tmp_path / "tohost_migrated.py"
    script.write_text(result.code)
    for process, out in enumerate(run_job(script, tmp_path)):
        np.testing.assert_allclose(out["p"], expected[process], rtol=1e-5)


def test_program_level_tohost_of_the_split_batch_reads_each_process_own_rows(
    tmp_path: Path,
) -> None:
    """flax wmt's `inputs = tohost(pred_batch["inputs"])`, the batch it split for the step read
    back flattened: each process reads its own rows of the global batch."""
    source = PREDICT.replace("\n\ndef evaluate(w, x):", TOHOST).replace(
        "return out.reshape(-1)", "return tohost(out) + tohost(x).sum(axis=-1)"
    )
    rng = np.random.default_rng(0)
    w = rng.normal(size=(4,)).astype(np.float32)
    xs = rng.normal(size=(8 * 2, 4)).astype(np.float32)
    expected = (np.tanh(xs @ w) + xs.sum(axis=-1)).reshape(PROCESSES, -1)
    result = migrate_source(source, options=Options(unsafe_fixes=True))
    assert "shard_map_per_device" not in result.code and "tohost(x).sum" not in result.code
    script = tmp_path / "tohost_batch_migrated.py"
    script.write_text(result.code)
    for process, out in enumerate(run_job(script, tmp_path)):
        np.testing.assert_allclose(out["p"], expected[process], rtol=1e-5)
