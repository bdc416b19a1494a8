"""Realistic pmap programs through the CLI: the program-level form, the same numbers, no device axis.

`tests/data/realistic/` holds training and evaluation programs written the way the public pmap
code bases write them (big_vision's trainer and classification evaluator, a plain-dict step with
`in_axes=(0, None)`-style arguments and a psum of per-device mean gradients, a multi-host trainer
feeding each process's own slice of the batch, flax lm1b's and wmt's steps passed to
`evaluate(p_eval_step=...)`). Each is migrated by `jaxmigrate run --no-verify
--unsafe-fixes` in a copy; the original's and the migrated `main()` then run side by side on 8
simulated CPU devices and every leaf of their results must agree, and the migrated source must
keep no device axis (`replicate`, `shard(`, `[0]` readbacks of step results, the per-device
helper). The multi-host programs' migrated forms also run as 2-process JAX jobs: every process
must get the weights the 1-process original gets, and flatten its own examples' predictions.
Three more programs (AlgoPerf, flax lm1b-style, HF run_clm_flax) still take mixed
forms: only their numbers are checked.

Two rewrites that were wrong (a donated argument whose replication was deleted donated the
program's own array: read again later it raised 'Array has been deleted'; replicated twice,
'donate the same buffer twice') keep the original's numbers now that a donated replicated
argument is passed as a copy.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from clitools import jm
from conftest import jax_env
from multihost import run_job

pytestmark = pytest.mark.jax

DATA = Path(__file__).resolve().parent / "data" / "realistic"
PROGRAMS = [
    "bigvision_train",
    "bigvision_eval",
    "dict_params_in_axes",
    "multihost_local_data",
    "multihost_predictions",
    "lm1b_evaluate",
    "wmt",
]

# What a device axis left behind looks like in a migrated program.
LEFT = {
    "replicate": re.compile(r"\b(?:un)?replicate\("),
    "shard": re.compile(r"\bcommon_utils\.shard\(|\bshard_prng_key\("),
    "per-device helper": re.compile(r"_pmap_compat|shard_map_per_device"),
    "pmap": re.compile(r"\bjax\.pmap\b"),
    "per-device reshape": re.compile(r"reshape\(\(?\s*(?:n\b|jax\.local_device_count\(\))"),
    # (not a key: the body takes its own, `dropout_rng[0]`, in the lambda around it)
    "[0] readback": re.compile(r"(?<!shape)(?<!rng)\[0\]"),
}

# Runs each program's original and migrated `main()` in one process and compares the results.
SIDE_BY_SIDE = textwrap.dedent(
    """
    import json, runpy, sys
    import jax
    import numpy as np

    def leaves(tree):
        flat = jax.tree_util.tree_flatten_with_path(jax.device_get(tree))[0]
        return {jax.tree_util.keystr(k): np.asarray(v) for k, v in flat}

    report = {}
    for name in sys.argv[3:]:
        before = leaves(runpy.run_path(f"{sys.argv[1]}/{name}.py", run_name="before")["main"]())
        sys.path.insert(0, sys.argv[2])
        after = leaves(runpy.run_path(f"{sys.argv[2]}/{name}.py", run_name="after")["main"]())
        sys.path.pop(0)
        bad = sorted(set(before) ^ set(after))
        for key in sorted(set(before) & set(after)):
            x, y = before[key], after[key]
            same = x.shape == y.shape and (
                np.allclose(x, y, rtol=1e-5, atol=1e-6) if x.dtype.kind in "fc"
                else np.array_equal(x, y)
            )
            if not same:
                bad.append(f"{key}: {np.ravel(x)[:3]} -> {np.ravel(y)[:3]}")
        report[name] = {"leaves": len(before), "differ": bad}
    print(json.dumps(report))
    """
)


def side_by_side(before: Path, after: Path, names: list[str]) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", SIDE_BY_SIDE, str(before), str(after), *names],
        env=jax_env(8),
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def migrate(tmp_path: Path, sources: dict[str, str]) -> tuple[Path, Path, list[dict]]:
    """Write `sources` into before/ and after/, migrate after/ without verification."""
    before, after = tmp_path / "before", tmp_path / "after"
    for folder in (before, after):
        folder.mkdir()
        for name, text in sources.items():
            (folder / f"{name}.py").write_text(text)
    report = tmp_path / "report.json"
    proc = jm(
        *["run", "--no-verify", "--unsafe-fixes", "--report", str(report), "--format", "json", "."],
        cwd=after,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    sites = [s for f in json.loads(report.read_text())["files"] for s in f["sites"]]
    return before, after, sites


@pytest.fixture(scope="module")
def migrated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, list[dict]]:
    sources = {name: (DATA / f"{name}.py").read_text() for name in PROGRAMS}
    return migrate(tmp_path_factory.mktemp("realistic"), sources)


def test_every_program_takes_the_program_level_form_and_keeps_no_device_axis(
    migrated: tuple[Path, Path, list[dict]],
) -> None:
    _, after, sites = migrated
    for name in PROGRAMS:
        mine = [s for s in sites if s["path"] == f"{name}.py"]
        steps = [s for s in mine if "`jax.pmap` ->" in s["message"]]
        assert steps, name
        for step in steps:
            assert "(program-level)" in step["message"], (name, step["message"])
        assert all(s["applied"] for s in mine), name
        lines = (after / f"{name}.py").read_text().splitlines()
        first = next(i for i, line in enumerate(lines) if line.startswith(("import ", "from ")))
        left = [
            f"{what}: {line.strip()}"
            for line in lines[first:]  # past the docstring
            for what, pattern in LEFT.items()
            if pattern.search(line.split("#", 1)[0])
        ]
        assert not left, (name, left)
    assert not (after / "_pmap_compat.py").exists()


def test_every_migrated_program_gives_the_original_numbers(
    migrated: tuple[Path, Path, list[dict]],
) -> None:
    before, after, _ = migrated
    report = side_by_side(before, after, PROGRAMS)
    for name in PROGRAMS:
        assert report[name]["leaves"] >= 2, report[name]
        assert report[name]["differ"] == [], (name, report[name]["differ"])


# Programs whose flows still stop the program-level form somewhere (AlgoPerf's static workload
# and in_axes None; flax lm1b-style steps called from two functions; HF transformers'
# run_clm_flax with steps nested in main and per-device keys in the state): whatever form each
# site takes, the numbers must stay the original's.
MIXED = ["algoperf", "lm1b_two_callers", "hf_clm"]


def test_programs_of_mixed_forms_keep_the_original_numbers(tmp_path: Path) -> None:
    sources = {name: (DATA / f"{name}.py").read_text() for name in MIXED}
    before, after, sites = migrate(tmp_path, sources)
    for name in MIXED:
        assert any(s["path"] == f"{name}.py" and s["applied"] for s in sites), name
    report = side_by_side(before, after, MIXED)
    for name in MIXED:
        assert report[name]["leaves"] >= 4, report[name]
        assert report[name]["differ"] == [], (name, report[name]["differ"])


def numbers(text: str) -> list[float]:
    """The floats a program printed on its last line, after the process index."""
    line = text.strip().splitlines()[-1].split(" ", 1)[1]
    return [float(v) for v in re.findall(r"-?\d+\.\d+(?:e-?\d+)?", line)]


def test_the_migrated_multihost_trainer_gives_every_process_the_single_process_weights(
    migrated: tuple[Path, Path, list[dict]],
) -> None:
    before, after, _ = migrated
    name = "multihost_local_data.py"
    single = subprocess.run(
        [sys.executable, name],
        cwd=before,
        env=jax_env(8),
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert single.returncode == 0, single.stderr[-2000:]
    expected = numbers(single.stdout)
    assert len(expected) == 6  # two weight sums, four losses
    job = run_job(after / name, processes=2, devices=8, timeout=300, cwd=after).check()
    for index, stdout in enumerate(job.stdouts):
        out = stdout.strip().splitlines()[-1]  # gloo logs its connections before
        assert out.startswith(f"{index} "), out
        got = numbers(out)
        assert len(got) == len(expected), out
        for x, y in zip(got, expected, strict=True):
            assert abs(x - y) <= 1e-4 * max(1.0, abs(y)), (index, got, expected)


DONATED_ALIAS = """
import jax
import jax.numpy as jnp
import numpy as np
from flax import jax_utils
from flax.training import common_utils


def train_step(params, batch):
    grads = jax.grad(lambda p: jnp.mean((batch["x"] @ p["w"]) ** 2))(params)
    return jax.tree.map(lambda p, g: p - 0.1 * g, params, jax.lax.pmean(grads, "batch"))


def main():
    init_params = {"w": jnp.ones((3, 2), jnp.float32)}
    params = jax_utils.replicate(init_params)
    p_train_step = jax.pmap(train_step, axis_name="batch", donate_argnums=(0,))
    for i in range(2):
        x = np.arange(48, dtype=np.float32).reshape(16, 3) * i
        params = p_train_step(params, common_utils.shard({"x": x}))
    params = jax_utils.unreplicate(params)
    delta = jax.tree.map(lambda a, b: a - b, params, init_params)  # reads init_params again
    return params, delta
"""

TWO_REPLICAS_DONATED = """
import jax
import jax.numpy as jnp
import numpy as np
from flax import jax_utils
from flax.training import common_utils


def train_step(params, ema, batch):
    grads = jax.grad(lambda p: jnp.mean((batch["x"] @ p["w"]) ** 2))(params)
    params = jax.tree.map(lambda p, g: p - 0.01 * g, params, jax.lax.pmean(grads, "batch"))
    ema = jax.tree.map(lambda e, p: 0.9 * e + 0.1 * p, ema, params)
    return params, ema


def main():
    params = {"w": jnp.ones((3, 2), jnp.float32)}
    params_repl = jax_utils.replicate(params)
    ema_repl = jax_utils.replicate(params)
    p_train_step = jax.pmap(train_step, axis_name="batch", donate_argnums=(0, 1))
    for i in range(2):
        x = np.arange(48, dtype=np.float32).reshape(16, 3) * i
        params_repl, ema_repl = p_train_step(params_repl, ema_repl, common_utils.shard({"x": x}))
    return jax_utils.unreplicate(params_repl), jax_utils.unreplicate(ema_repl)
"""


@pytest.mark.parametrize("source", [DONATED_ALIAS, TWO_REPLICAS_DONATED], ids=["alias", "twice"])
def test_a_donated_replicated_argument_keeps_the_original_numbers(
    tmp_path: Path, source: str
) -> None:
    before, after, _ = migrate(tmp_path, {"donated": source})
    report = side_by_side(before, after, ["donated"])
    assert report["donated"]["differ"] == []


def test_steps_passed_to_defs_of_the_module_run_as_a_two_process_job(
    migrated: tuple[Path, Path, list[dict]],
) -> None:
    """flax lm1b's `evaluate(p_eval_step=...)` and `generate_prediction(p_pred_step=...)`,
    followed into those defs: each process of a 2-process job gets the 1-process original's
    weights, losses and eval error, and its own rows' predictions."""
    before, after, _ = migrated
    name = "lm1b_evaluate.py"
    single = subprocess.run(
        [sys.executable, name],
        cwd=before,
        env=jax_env(8),
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert single.returncode == 0, single.stderr[-2000:]
    line = single.stdout.strip().splitlines()[-1]
    everything = json.loads(line.split(" ", 1)[1].rsplit("] ", 1)[0] + "]")
    expected = [float(v) for v in line.rsplit("] ", 1)[1].split()]
    assert len(everything) == 64 and len(expected) == 6
    job = run_job(after / name, processes=2, devices=8, timeout=300, cwd=after).check()
    for index, stdout in enumerate(job.stdouts):
        out = stdout.strip().splitlines()[-1]
        assert out.startswith(f"{index} "), out
        mine, sums = out.split(" ", 1)[1].rsplit("] ", 1)
        rows = [everything[32 * b + 16 * index :][:16] for b in range(2)]
        assert json.loads(mine + "]") == rows[0] + rows[1], out
        got = [float(v) for v in sums.split()]
        for x, y in zip(got, expected, strict=True):
            assert abs(x - y) <= 1e-5 * max(1.0, abs(y)), (index, got, expected)


def test_the_migrated_multihost_predictions_are_each_process_own_examples(
    migrated: tuple[Path, Path, list[dict]],
) -> None:
    """Each process flattens the predictions of its own examples, as under pmap (a global array
    spanning both processes would raise on `np.asarray`)."""
    before, after, _ = migrated
    name = "multihost_predictions.py"
    single = subprocess.run(
        [sys.executable, name],
        cwd=before,
        env=jax_env(8),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert single.returncode == 0, single.stderr[-2000:]
    preds, _, total = single.stdout.strip().splitlines()[-1].split(" ", 1)[1].rpartition(" ")
    everything = json.loads(preds)
    assert len(everything) == 32 and len(set(everything)) == 2
    job = run_job(after / name, processes=2, devices=8, timeout=300, cwd=after).check()
    for index, stdout in enumerate(job.stdouts):
        line = stdout.strip().splitlines()[-1]
        mine, _, their_total = line.split(" ", 1)[1].rpartition(" ")
        assert line.startswith(f"{index} "), line
        assert json.loads(mine) == everything[16 * index : 16 * (index + 1)], line
        assert float(their_total) == float(total), line


# JAX's spmd_mnist example: the step is made and called in `if __name__ == "__main__":` and fed
# by a generator yielding per-device batches (a split spelled `images.reshape(shape_prefix +
# images.shape[1:])`, `shape_prefix = (num_devices, batch_size_per_device)`). The migrated
# generator yields flat batches, each becoming this process's part of a global batch.
SCRIPTS = ["spmd_mnist", "spmd_mnist_multihost"]

# The example as a multi-process job runs it: each process takes its own slice of every batch and
# splits it over its local devices, and says which process printed the weights.
MULTIHOST = [
    ("jax.device_count()", "jax.local_device_count()"),
    (
        "        batch_idx = perm[i * batch_size:(i + 1) * batch_size]\n",
        (
            "        batch_idx = perm[i * batch_size:(i + 1) * batch_size]\n"
            "        per_process = len(batch_idx) // jax.process_count()\n"
            "        start = jax.process_index() * per_process\n"
            "        batch_idx = batch_idx[start:start + per_process]\n"
        ),
    ),
    ('print("weights", ', 'print(jax.process_index(), "weights", '),
]


def spmd_mnist_sources() -> dict[str, str]:
    """The reduced example, and its multi-process form derived from it."""
    text = (DATA / "spmd_mnist.py").read_text()
    multihost = text
    for old, new in MULTIHOST:
        assert multihost.count(old) == 1, old
        multihost = multihost.replace(old, new)
    return dict(zip(SCRIPTS, (text, multihost), strict=True))


def printed(folder: Path, name: str) -> list[str]:
    """The lines a script prints on 8 devices, without the ones giving a duration."""
    proc = subprocess.run(
        [sys.executable, f"{name}.py"],
        cwd=folder,
        env=jax_env(8),
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return [line for line in proc.stdout.splitlines() if " sec" not in line]


def test_a_main_block_fed_by_a_generator_takes_the_program_level_form(tmp_path: Path) -> None:
    before, after, sites = migrate(tmp_path, spmd_mnist_sources())
    original: dict[str, list[str]] = {}
    for name in SCRIPTS:
        steps = [s for s in sites if s["path"] == f"{name}.py" and "`jax.pmap` ->" in s["message"]]
        assert [("(program-level)" in s["message"], s["applied"]) for s in steps] == [(True, True)]
        text = (after / f"{name}.py").read_text().split('"""', 2)[2]
        migrated = "\n".join(line.split("#", 1)[0] for line in text.splitlines())
        for gone in ("pmap", "shape_prefix + ", "broadcast_to", "x[0]"):
            assert gone not in migrated, (name, gone)
        original[name] = printed(before, name)
        assert printed(after, name) == original[name]
        assert len(original[name]) == 5  # two epochs' accuracies, the weights
    single = original["spmd_mnist_multihost"][-1]
    job = run_job(
        after / "spmd_mnist_multihost.py", processes=2, devices=8, timeout=300, cwd=after
    ).check()
    for index, stdout in enumerate(job.stdouts):
        line = stdout.strip().splitlines()[-1]  # the sums, up to the order gloo adds in
        assert line.startswith(f"{index} weights "), line
        got, expected = numbers(line), numbers(single)
        assert len(got) == len(expected) == 6, (line, single)
        for x, y in zip(got, expected, strict=True):
            assert abs(x - y) <= 1e-5 * max(1.0, abs(y)), (index, line, single)


# big_vision's own structure (2023): train.py's update_fn gets its batches from
# input_pipeline.start_input_pipeline (another module), the evaluators take the trainer's
# replicated params in `run` (a cached factory's step, a step stored on self), and utils.sync()
# calls its pmap where it makes it. The trainer takes the program-level form: the batches are
# converted where the step takes them (`global_batch`), the evaluators, whose steps stay
# faithful, get the params' copies per device (`device_copies`). Every other step says which
# value blocks it (the same codes and values as the real big_vision sites), and the program
# gives the original's numbers.
BIGVISION_PROGRAM = "bv/train.py"
BIGVISION_BLOCKED = {
    BIGVISION_PROGRAM: "`jax.pmap` -> `jax.jit(jax.shard_map(...))` over the flat data "
    "(program-level)",
    "bv/evaluators/classification.py": "[PL301] the step is returned by `get_eval_fn`, and the "
    "step stored in `self.eval_fn` is called in `Evaluator.run`: argument 1 of the step comes "
    "from elsewhere (`params`, a parameter of `run`",
    "bv/evaluators/gathered.py": "[PL301] the step stored in `self.predict_fn` is called in "
    "`Evaluator.run`: argument 1 of the step comes from elsewhere (`params`, a parameter of `run`",
    "bv/utils.py": '[PL103] the step is called where it is made, `jax.pmap(_sync, "i")(x)`: made '
    "there as "
    "`jax.jit(jax.shard_map(...))`, it would be compiled again at every call of `sync`",
}


def test_big_vision_structured_program_names_each_blocking_value_and_keeps_its_numbers(
    tmp_path: Path,
) -> None:
    project = DATA / "bigvision_project"
    before, after = tmp_path / "before", tmp_path / "after"
    shutil.copytree(project, before)
    shutil.copytree(project, after)
    report = tmp_path / "report.json"
    command = ["run", "--no-verify", "--unsafe-fixes", "--report", str(report), "--format", "json"]
    proc = jm(*command, ".", cwd=after, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    sites = [
        (f["path"], s)
        for f in json.loads(report.read_text())["files"]
        for s in f["sites"]
        if s["message"].startswith("`jax.pmap` ->")
    ]
    assert sorted(path for path, _ in sites) == sorted(BIGVISION_BLOCKED), sites
    for path, site in sites:
        assert site["applied"] and BIGVISION_BLOCKED[path] in site["message"], (path, site)
    code = [p.read_text() for p in (after / "bv").rglob("*.py") if p.name != "_pmap_compat.py"]
    assert "jax.pmap(" not in "".join(code) and "partial(jax.pmap" not in "".join(code)
    train = (after / BIGVISION_PROGRAM).read_text()
    assert "evaluator.run(device_copies(params_repl))" in train
    assert "global_batch(batch" in train and "shard_map_per_device" not in train

    single = subprocess.run(
        [sys.executable, "run_train.py"],
        cwd=before,
        env=jax_env(8),
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert single.returncode == 0, single.stderr[-2000:]
    expected = numbers(single.stdout)
    assert len(expected) == 12  # 4 losses and norms, 3 eval values, the weights' sum
    migrated = subprocess.run(
        [sys.executable, "run_train.py"],
        cwd=after,
        env=jax_env(8),
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert migrated.returncode == 0, migrated.stderr[-2000:]
    outputs = [migrated.stdout]
    job = run_job(after / "run_train.py", processes=2, devices=8, timeout=400, cwd=after).check()
    outputs += job.stdouts  # each process feeds its own rows of every global batch
    for out in outputs:
        got = numbers(out)
        assert len(got) == len(expected), out
        for x, y in zip(got, expected, strict=True):
            assert abs(x - y) <= 1e-4 * max(1.0, abs(y)), (got, expected)
