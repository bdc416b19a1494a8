"""The newest shapes of the program-level pmap form, proved on a real 2-process JAX job.

One program, two flax-style functions, each process feeding its own rows of every global batch
as on a TPU pod (tests/multihost.py: `jax.distributed` on localhost, gloo, 4 CPU devices each):

- `train_by_hand`: a step returning `pmean`-ed gradients, applied on the host
  (`w = w - 0.1 * grads`), its batch a tuple of splits (`shard((x, y))`), `loss[0]` read back;
- `train_and_evaluate`: a replicated flax `TrainState` fed back to its train step, a field of it
  passed to two more steps (`p_eval_step(state.params, batch)`), dict batches, a psum-of-counts
  evaluation read with `[0]` and summed on the host, per-device predictions flattened with
  `np.asarray(preds).reshape((-1,) + preds.shape[2:])`.

`jaxmigrate run` takes the program-level form for every site (no `_pmap_compat.py` helper, no
`replicate`/`shard`/`[0]` left), and before and after the migration every process gets the numpy
oracle's numbers: the weights and losses of the global batch, the hits counted over the whole job,
and the predictions of its own rows.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from clitools import jm
from multihost import JobResult, run_job

from jaxmigrate.model import Options
from jaxmigrate.pipeline.engine import migrate_source

pytestmark = pytest.mark.jax

PROCESSES, DEVICES, ROWS, STEPS, LR = 2, 8, 16, 3, 0.1  # ROWS per device and step

PROGRAM = """\
import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import jax_utils
from flax.training import common_utils, train_state


def grads_of(w, batch):
    x, y = batch
    loss, g = jax.value_and_grad(lambda v: jnp.mean((jnp.tanh(x @ v) - y) ** 2))(w)
    return jax.lax.pmean(g, "batch"), jax.lax.pmean(loss, "batch")


def train_step(state, batch):
    def loss_fn(params):
        return jnp.mean((jnp.tanh(batch["x"] @ params["w"]) - batch["y"]) ** 2)

    loss, grads = jax.value_and_grad(loss_fn)(state.params)
    grads = jax.lax.pmean(grads, axis_name="batch")
    return state.apply_gradients(grads=grads), jax.lax.pmean(loss, "batch")


def eval_step(params, batch):
    hits = jnp.sum(jnp.argmax(batch["x"] @ params["w"], axis=-1) == batch["label"])
    return jax.lax.psum(hits, axis_name="batch")


def predict(params, x):
    return jnp.tanh(x @ params["w"])


def data():
    \"\"\"The global batches of every step; this process feeds its own rows of each.\"\"\"
    rng = np.random.default_rng(0)
    w = rng.normal(size=(4, 2)).astype(np.float32)
    xs = rng.normal(size=(3, 8 * 16, 4)).astype(np.float32)
    ys = rng.normal(size=(3, 8 * 16, 2)).astype(np.float32)
    rows = 16 * jax.local_device_count()
    mine = slice(jax.process_index() * rows, (jax.process_index() + 1) * rows)
    return w, xs[:, mine], ys[:, mine]


def train_by_hand():
    w, xs, ys = data()
    w = jax_utils.replicate(w)
    p_grads = jax.pmap(grads_of, axis_name="batch")
    for i in range(3):
        x, y = xs[i], ys[i]
        grads, loss = p_grads(w, common_utils.shard((x, y)))
        w = w - 0.1 * grads
    return jax_utils.unreplicate(w), loss[0]


def train_and_evaluate():
    w, xs, ys = data()
    state = train_state.TrainState.create(apply_fn=None, params={"w": w}, tx=optax.sgd(0.1))
    state = jax_utils.replicate(state)
    p_train_step = jax.pmap(train_step, axis_name="batch", donate_argnums=(0,))
    p_eval_step = jax.pmap(eval_step, axis_name="batch")
    p_predict = jax.pmap(predict, axis_name="batch")
    for i in range(3):
        batch = common_utils.shard({"x": xs[i], "y": ys[i]})
        state, loss = p_train_step(state, batch)
    hits = 0
    for i in range(3):
        batch = common_utils.shard({"x": xs[i], "label": np.argmax(ys[i], axis=-1)})
        hits += p_eval_step(state.params, batch)[0]
    preds = p_predict(state.params, common_utils.shard(xs[0]))
    preds = np.asarray(preds).reshape((-1,) + preds.shape[2:])
    return jax_utils.unreplicate(state), loss[0], hits, preds


w, loss = train_by_hand()
state, state_loss, hits, preds = train_and_evaluate()
out = {
    "w": np.asarray(w).tolist(),
    "loss": float(loss),
    "state_w": np.asarray(state.params["w"]).tolist(),
    "step": int(state.step),
    "state_loss": float(state_loss),
    "hits": int(hits),
    "preds": np.asarray(preds).tolist(),
}
print("RESULT", json.dumps(out), flush=True)
"""


def oracle() -> list[dict]:
    """What each process must print, by numpy in float64 over the global batches."""
    rng = np.random.default_rng(0)
    w = rng.normal(size=(4, 2)).astype(np.float32).astype(np.float64)
    xs = rng.normal(size=(STEPS, DEVICES * ROWS, 4)).astype(np.float32).astype(np.float64)
    ys = rng.normal(size=(STEPS, DEVICES * ROWS, 2)).astype(np.float32).astype(np.float64)
    for x, y in zip(xs, ys):
        t = np.tanh(x @ w)
        loss = np.mean((t - y) ** 2)  # pmean of equal-sized devices' means: the global mean
        w = w - LR * x.T @ (2 * (t - y) * (1 - t**2)) / y.size
    margins = [np.abs(np.diff(x @ w, axis=-1)).min() for x in xs]
    assert min(margins) > 1e-3, margins  # no near tie for argmax to break differently in float32
    hits = sum(int(np.sum(np.argmax(x @ w, -1) == np.argmax(y, -1))) for x, y in zip(xs, ys))
    rows = len(xs[0]) // PROCESSES
    return [
        {
            "w": w,
            "loss": loss,
            "state_w": w,
            "step": STEPS,
            "state_loss": loss,
            "hits": hits,  # psum over every device of the job, not this process's
            "preds": np.tanh(xs[0][p * rows : (p + 1) * rows] @ w),  # this process's own rows
        }
        for p in range(PROCESSES)
    ]


def results(job: JobResult) -> list[dict]:
    job.check()
    found = []
    for out in job.stdouts:  # gloo writes its own lines to stdout
        (line,) = [line for line in out.splitlines() if line.startswith("RESULT ")]
        found.append(json.loads(line.removeprefix("RESULT ")))
    return found


def check(job: JobResult, name: str) -> None:
    got = results(job)
    assert len(got) == PROCESSES
    for process, (result, expected) in enumerate(zip(got, oracle())):
        where = f"{name}, process {process}"
        assert set(result) == set(expected), where
        for key, value in expected.items():
            if key in ("step", "hits"):
                assert result[key] == value, f"{where}: {key}"
            else:
                np.testing.assert_allclose(
                    np.asarray(result[key]), value, rtol=1e-4, atol=1e-5, err_msg=f"{where}: {key}"
                )


@pytest.fixture(scope="module")
def migrated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A project holding the program, after `jaxmigrate run` (unverified: proved by the job)."""
    root = tmp_path_factory.mktemp("program-multihost")
    (root / "pyproject.toml").write_text('[project]\nname = "trainer"\n')
    (root / "train.py").write_text(PROGRAM)
    proc = jm("run", "--unsafe-fixes", "--no-verify", "--no-cache", ".", cwd=root)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return root


def test_the_original_pmap_program_gives_every_process_the_oracle_numbers(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(PROGRAM)
    check(run_job(script, processes=PROCESSES, devices=DEVICES, timeout=300), "pmap")


def test_the_cli_takes_the_program_level_form_for_every_site(migrated: Path) -> None:
    code = (migrated / "train.py").read_text()
    assert sorted(p.name for p in migrated.iterdir()) == ["pyproject.toml", "train.py"]
    for gone in ("jax.pmap", "shard_map_per_device", "_pmap_compat", "replicate", "shard("):
        assert gone not in code, gone
    for gone in ("loss[0]", ")[0]", "reshape((-1,)", "jax_utils", "common_utils"):
        assert gone not in code, gone
    assert code.count("jax.jit(") == 4  # one per step
    assert code.count("jax.make_array_from_process_local_data(") == 4  # one per split
    assert "multihost_utils.global_array_to_host_local_array(" in code  # the predictions
    result = migrate_source(PROGRAM, options=Options(unsafe_fixes=True))
    assert result.code == code
    jm202 = [s for s in result.sites if s.code == "JM202"]
    assert jm202 and all(s.group and "not taken" not in s.message for s in jm202), jm202
    assert len({s.group for s in jm202}) == 2  # each function's steps and edits: one group


def test_the_migrated_program_gives_every_process_the_oracle_numbers(migrated: Path) -> None:
    script = migrated / "train.py"
    check(run_job(script, processes=PROCESSES, devices=DEVICES, timeout=300), "migrated")


SCORE = """\
import json

import jax
import jax.numpy as jnp
import numpy as np


@jax.pmap
def predict(w, x):
    return jnp.tanh(x @ w)


def score(w, x):
    n = jax.local_device_count()
    w = jnp.broadcast_to(w, (n,) + w.shape)
    x = x.reshape((n, -1) + x.shape[1:])
    out = predict(w, x)
    return out.reshape(-1).sum()


def main():
    rng = np.random.default_rng(0)
    w = rng.normal(size=(4,)).astype(np.float32)
    xs = rng.normal(size=(8 * 2, 4)).astype(np.float32)
    rows = 2 * jax.local_device_count()
    mine = xs[jax.process_index() * rows : (jax.process_index() + 1) * rows]
    return score(w, mine)


print("RESULT", json.dumps(float(main())), flush=True)
"""


@pytest.mark.parametrize("form", ["pmap", "migrated"])
def test_flattened_predictions_reduced_on_the_host_are_each_process_own(
    tmp_path: Path, form: str
) -> None:
    """A decorated step's per-example predictions, flattened and summed in the function that
    calls it: each process gets the sum over its own rows, as pmap gave it. Under the
    `jax.set_mesh` the migration opens, this process's part is read into numpy: a jax op on an
    array of one process's devices under a mesh of every process's raises ("Received
    incompatible devices for jitted computation"; it did before that fix)."""
    rng = np.random.default_rng(0)
    w = rng.normal(size=(4,)).astype(np.float32)
    xs = rng.normal(size=(8 * 2, 4)).astype(np.float32)
    expected = np.tanh(xs @ w).reshape(PROCESSES, -1).sum(axis=1)
    code = SCORE
    if form == "migrated":
        result = migrate_source(SCORE, options=Options(unsafe_fixes=True))
        assert all(s.group for s in result.sites if s.code == "JM202"), result.sites
        assert "shard_map_per_device" not in result.code and "with jax.set_mesh(" in result.code
        code = result.code
    script = tmp_path / "score.py"
    script.write_text(code)
    job = run_job(script, processes=PROCESSES, devices=DEVICES, timeout=300)
    assert job.ok, job.describe()
    for process, out in enumerate(job.stdouts):
        (line,) = [line for line in out.splitlines() if line.startswith("RESULT ")]
        got = json.loads(line.removeprefix("RESULT "))
        np.testing.assert_allclose(got, expected[process], rtol=1e-5, err_msg=str(process))


TABLE_ROWS = """\
import json

import jax
import jax.numpy as jnp
import numpy as np


def scale(w, b, x):
    return jnp.tanh(x @ w) + b


def main():
    n = jax.local_device_count()
    rng = np.random.default_rng(0)
    w = rng.normal(size=(4,)).astype(np.float32)
    b = np.float32(0.5)
    xs = rng.normal(size=(8 * 2, 4)).astype(np.float32)
    rows = 2 * n
    mine = xs[jax.process_index() * rows : (jax.process_index() + 1) * rows]
    p_scale = jax.pmap(scale)
    ws = jnp.tile(w[None], (n,) + (1,) * w.ndim)
    bs = jnp.repeat(b[None], n, axis=0)
    out = p_scale(ws, bs, mine.reshape((n, -1) + mine.shape[1:]))
    return np.asarray(out).reshape(-1)


print("RESULT", json.dumps(main().tolist()), flush=True)
"""


@pytest.mark.parametrize("form", ["pmap", "migrated"])
def test_tiled_replicas_over_an_unnamed_axis_hold_on_each_process(
    tmp_path: Path, form: str
) -> None:
    """Replicas made with `jnp.tile`/`jnp.repeat` (rows of the layout table) for a step whose
    mapped axis has no name (the migration names it): each process gets its own rows' results,
    as pmap gave them."""
    rng = np.random.default_rng(0)
    w = rng.normal(size=(4,)).astype(np.float32)
    xs = rng.normal(size=(8 * 2, 4)).astype(np.float32)
    expected = (np.tanh(xs @ w) + 0.5).reshape(PROCESSES, -1)
    code = TABLE_ROWS
    if form == "migrated":
        result = migrate_source(TABLE_ROWS, options=Options(unsafe_fixes=True))
        assert all(s.group for s in result.sites if s.code == "JM202"), result.sites
        for gone in ("shard_map_per_device", "jnp.tile", "jnp.repeat", "jax.pmap"):
            assert gone not in result.code, gone
        code = result.code
    script = tmp_path / "scale.py"
    script.write_text(code)
    job = run_job(script, processes=PROCESSES, devices=DEVICES, timeout=300)
    assert job.ok, job.describe()
    for process, out in enumerate(job.stdouts):
        (line,) = [line for line in out.splitlines() if line.startswith("RESULT ")]
        got = json.loads(line.removeprefix("RESULT "))
        np.testing.assert_allclose(got, expected[process], rtol=1e-5, err_msg=str(process))


# Every program fixture, run as a 2-process job: the migrated program must give every process
# the numbers the original pmap program gives it (a new fixture is in it with no list to edit).
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "pmap"
# Every case's original and migrated `main()`, one after the other, in one 2-process job (a job
# per file spent most of its time starting JAX and joining the job: 14 cases took 250 s).
# A `main()` that raises is reported for its own case; one that leaves the job unable to go on
# (a process stuck in a collective) fails every case with the job's output.
RUN_MAINS = """\
import json, runpy, sys, traceback
import jax
import numpy as np
for i, path in enumerate(sys.argv[1:]):
    try:
        result = runpy.run_path(path, run_name="fixture")["main"]()
        leaves = [np.asarray(x).tolist() for x in jax.tree.leaves(result)]
        print("RESULT", i, json.dumps(leaves), flush=True)
    except Exception:
        print("ERROR", i, json.dumps(traceback.format_exc()), flush=True)
"""
# Every program fixture with a `main()`, and these others: declines and a faithful form whose
# programs must agree on 2 processes too.
OTHER_CASES = [
    "static_star_args_tail",  # the faithful form, its star arguments all static
    # a jax array as the batch under `jax.set_mesh`: declined (PL601), the faithful form
    "decline_pl601_batch_made_by_jax_under_set_mesh",
    "decline_pl601_batch_bound_to_jax_array_before_set_mesh",  # read through `xs`, then `x`
    "decline_pl601_batch_bound_by_with_as_jax_array",  # `with ... as x`: taken, it raised here
]
# Program fixtures whose original is no multi-process program: it splits its batch over
# `jax.device_count()` (every device of the job) where pmap maps over this process's devices,
# and raises on 2 processes. Their case checks that it does, so the list stays true.
NOT_MULTIPROCESS = frozenset(
    {
        "program_helper_other_count_kept_faithful",
        "program_split_helpers",
        "program_tree_mapped_kept_faithful",
        "program_tuple_batch",
        "program_tuple_batch_multiline",
    }
)
CASES = (
    sorted(
        p.name.removesuffix(".py")
        for p in FIXTURES.glob("program_*.py")
        if not p.name.endswith(".expected.py") and "def main(" in p.read_text()
    )
    + OTHER_CASES
)


@pytest.fixture(scope="module")
def fixture_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[JobResult, list[dict]]:
    """The job running every case's two files, and what each process printed, by file name."""
    script = tmp_path_factory.mktemp("fixtures") / "run_mains.py"
    script.write_text(RUN_MAINS)
    paths = [str(FIXTURES / f"{c}{kind}.py") for c in CASES for kind in ("", ".expected")]
    job = run_job(script, processes=PROCESSES, devices=DEVICES, args=paths, timeout=900)
    printed = [
        {
            Path(paths[int(i)]).name: (kind, json.loads(text))
            for kind, i, text in (
                line.split(" ", 2)
                for line in out.splitlines()
                if line.startswith(("RESULT ", "ERROR "))
            )
        }
        for out in job.stdouts  # gloo writes its own lines to stdout
    ]
    return job, printed


@pytest.mark.parametrize("case", CASES)
def test_a_migrated_fixture_gives_every_process_the_original_numbers(
    fixture_runs: tuple[JobResult, list[dict]], case: str
) -> None:
    job, printed = fixture_runs
    assert job.ok and len(printed) == PROCESSES, job.describe()
    for process, shown in enumerate(printed):
        (kind, want), (also, got) = (shown[f"{case}{k}.py"] for k in ("", ".expected"))
        if case in NOT_MULTIPROCESS:  # the original itself fails on 2 processes
            assert kind == "ERROR" and "squeeze" in want, f"process {process}: {want}"
            continue
        assert kind == also == "RESULT", f"process {process}: {want if kind != 'RESULT' else got}"
        assert len(got) == len(want) >= 1, process
        for x, y in zip(got, want, strict=True):
            if isinstance(x, str) or isinstance(y, str):  # a line a program formats, as it is
                assert x == y, f"{case} {process}"
                continue
            np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6, err_msg=f"{case} {process}")


# Programs whose original calls the removed `jax.device_put_replicated`/`device_put_sharded`
# cannot run on the installed JAX: verification compares their program-level form with the
# original with its safe rewrites alone (JM104, JM105: `jax.device_put` of stacked copies, of
# stacked shards, of an array's rows; `test_pmap_program_verified.py`). Here that reference and
# the program-level form run as one 2-process job, each process feeding rows of its own: every
# process must get the reference's numbers (a rewrite reducing over one process's devices, or
# putting one process's rows where the other's belong, would not).
OWN_ROWS_MAIN = """

def main():
    n, me = jax.local_device_count(), jax.process_index()
    obs = np.arange(n * 2 * 3, dtype=np.float32).reshape(n * 2, 3) * (me + 1) / 10
    return train({"w": np.ones((3,), np.float32)}, obs)
"""
PYTREE_SHARDS_MAIN = """

def main():
    n, me = jax.local_device_count(), jax.process_index()
    rows = np.arange(n * 2 * 4, dtype=np.float32).reshape(n, 2, 4) * (me + 1)
    obs = np.arange(n * 3 * 4, dtype=np.float32).reshape(n * 3, 4) / (10 + me)
    return train(rows, obs, 3)
"""


def _safe_reference_sources() -> dict[str, str]:
    from test_pmap_program_verified import SAFE_REWRITES_PROGRAM, SPLITS

    sources = {}
    for name, split in sorted(SPLITS.items()):
        program = SAFE_REWRITES_PROGRAM.format(split=split)
        sources[name] = program[: program.index("\n\ndef main():")] + OWN_ROWS_MAIN
    pytrees = (FIXTURES / "program_device_put_sharded_pytrees.py").read_text()
    sources["sharded_pytrees"] = pytrees + PYTREE_SHARDS_MAIN
    return sources


SAFE_REFERENCE = _safe_reference_sources()


@pytest.fixture(scope="module")
def safe_reference_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[JobResult, list[dict]]:
    folder = tmp_path_factory.mktemp("safe_reference")
    paths = []
    for name, source in SAFE_REFERENCE.items():
        reference = migrate_source(source, options=Options(select=("JM104", "JM105"))).code
        migrated = migrate_source(source, options=Options(unsafe_fixes=True)).code
        for kind, code in (("reference", reference), ("migrated", migrated)):
            path = folder / f"{name}.{kind}.py"
            path.write_text(code)
            paths.append(str(path))
    script = folder / "run_mains.py"
    script.write_text(RUN_MAINS)
    job = run_job(script, processes=PROCESSES, devices=DEVICES, args=paths, timeout=600)
    printed = [
        {
            Path(paths[int(i)]).name: (kind, json.loads(text))
            for kind, i, text in (
                line.split(" ", 2)
                for line in out.splitlines()
                if line.startswith(("RESULT ", "ERROR "))
            )
        }
        for out in job.stdouts
    ]
    return job, printed


@pytest.mark.parametrize("case", sorted(SAFE_REFERENCE))
def test_a_program_level_form_verified_against_safe_rewrites_holds_on_every_process(
    safe_reference_runs: tuple[JobResult, list[dict]], case: str, tmp_path: Path
) -> None:
    source = SAFE_REFERENCE[case]
    migrated = migrate_source(source, options=Options(unsafe_fixes=True)).code
    assert "jax.shard_map(" in migrated and "shard_map_per_device" not in migrated, migrated
    for removed in ("jax.device_put(", "device_put_replicated(", "device_put_sharded(", "pmap("):
        assert removed not in migrated, migrated
    job, printed = safe_reference_runs
    assert job.ok and len(printed) == PROCESSES, job.describe()
    for process, shown in enumerate(printed):
        (kind, want), (also, got) = (shown[f"{case}.{k}.py"] for k in ("reference", "migrated"))
        assert kind == also == "RESULT", f"process {process}: {want if kind != 'RESULT' else got}"
        assert len(got) == len(want) >= 1, process
        for x, y in zip(got, want, strict=True):
            np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6, err_msg=f"{case} {process}")
