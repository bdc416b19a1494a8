"""The result cache: `jaxmigrate check` over a synthetic repository, cold and warm.

    python benchmarks/cache.py [--files 2000] [--jobs 1] [--keep DIR]

Writes a synthetic tree (modern JAX modules, modules still on the legacy APIs, modules that only
look legacy to the text prefilter, and notebooks) into a temporary folder, then times, each in
a fresh process as a user runs it:
  1. `jaxmigrate check .` with an empty cache (cold: every file migrated, entries written);
  2. the same again (warm: every file answered by its cache entry);
  3. `jaxmigrate check --no-cache .` (the engine alone, for comparison);
  4. `jaxmigrate check` on one small file (the fixed cost: interpreter and imports);
and prints wall times, the warm time per thousand files with and without the fixed cost, and
checks that all three runs printed the same JSON report. The goal is a warm check of an unchanged
repository in well under a second per thousand files.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _checkout import require_checkout

MODERN = '''"""Model block {i}."""
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P


def init_{i}(key, width={w}):
    k1, k2 = jax.random.split(key)
    return {{"w": jax.random.normal(k1, (width, width)), "b": jnp.zeros(width)}}


@jax.jit
def apply_{i}(params, x):
    y = x @ params["w"] + params["b"]
    return jax.nn.gelu(y)


def loss_{i}(params, x, y):
    pred = apply_{i}(params, x)
    return jnp.mean((pred - y) ** 2)


def shard(x, mesh):
    return jax.device_put(x, NamedSharding(mesh, P("data")))
'''
LOOKALIKE = '''"""Mentions the legacy names without using them (the prefilter must look closer)."""
import jax
from jax.sharding import PartitionSpec as P

# pmap and pjit were replaced; this module uses jax.shard_map, as experimental code did before.
NOTE_{i} = "pmap, pjit and experimental shard_map are gone from module {i}"


def step_{i}(mesh, f, x):
    g = jax.shard_map(f, mesh=mesh, in_specs=P("x"), out_specs=P("x"))
    return jax.jit(g)(x)
'''
LEGACY = '''"""A training step still on the legacy APIs ({i})."""
from functools import partial

import jax
import jax.numpy as jnp
from jax.experimental import PartitionSpec as P
from jax.experimental.maps import Mesh
from jax.experimental.pjit import pjit


@partial(jax.pmap, axis_name="batch")
def train_step_{i}(params, x):
    grads = jax.grad(lambda p: jnp.sum(p * x))(params)
    return params - 0.1 * jax.lax.pmean(grads, "batch")


def sharded_{i}(devices, x):
    mesh = Mesh(devices, ("data",))
    with mesh:
        f = pjit(lambda v: v * 2, in_axis_resources=P("data"), out_axis_resources=P("data"))
        return f(x)
'''


def notebook(i: int) -> str:
    cells = [
        {"cell_type": "markdown", "metadata": {}, "source": [f"# Experiment {i}\n"]},
        {
            "cell_type": "code",
            "execution_count": 1,
            "metadata": {},
            "outputs": [],
            "source": ["%matplotlib inline\n", "import jax\n", "import jax.numpy as jnp"],
        },
        {
            "cell_type": "code",
            "execution_count": 2,
            "metadata": {},
            "outputs": [{"name": "stdout", "output_type": "stream", "text": ["8\n"]}],
            "source": ["f = jax.pmap(lambda x: x * 2)\n", "print(jax.device_count())"],
        },
    ]
    document = {
        "cells": cells,
        "metadata": {"kernelspec": {"language": "python", "name": "python3"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    return json.dumps(document, indent=1) + "\n"


def make_tree(root: Path, files: int) -> dict[str, int]:
    """Write the synthetic repository; return how many files of each kind it has."""
    kinds = {"modern": 0, "lookalike": 0, "legacy": 0, "notebook": 0}
    for i in range(files):
        package = root / f"pkg{i // 100:02d}"
        package.mkdir(parents=True, exist_ok=True)
        slot = i % 20
        if slot < 13:
            kind, name, text = "modern", f"block_{i}.py", MODERN.format(i=i, w=16 + i % 64)
        elif slot < 16:
            kind, name, text = "lookalike", f"notes_{i}.py", LOOKALIKE.format(i=i)
        elif slot < 19:
            kind, name, text = "legacy", f"train_{i}.py", LEGACY.format(i=i)
        else:
            kind, name, text = "notebook", f"experiment_{i}.ipynb", notebook(i)
        (package / name).write_text(text, encoding="utf-8")
        kinds[kind] += 1
    (root / "pyproject.toml").write_text("[project]\nname = 'synthetic'\n", encoding="utf-8")
    return kinds


def check(root: Path, *extra: str) -> tuple[float, int, str]:
    """Run `jaxmigrate check` in `root`; return wall seconds, exit code and the JSON report."""
    cmd = [sys.executable, "-m", "jaxmigrate", "check", "--format", "json", *extra, "."]
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - start
    if proc.returncode not in (0, 1):
        sys.exit(f"jaxmigrate failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    return elapsed, proc.returncode, proc.stdout


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--keep", type=Path, help="write the tree here and keep it")
    args = parser.parse_args()
    require_checkout()
    base = args.keep or Path(tempfile.mkdtemp(prefix="jaxmigrate-cache-bench-"))
    try:
        root = base / "repo"
        kinds = make_tree(root, args.files)
        jobs = [f"--jobs={args.jobs}"]
        cold, rc, cold_report = check(root, *jobs)
        warm, _, warm_report = check(root, *jobs)
        bare, _, bare_report = check(root, *jobs, "--no-cache")
        small = base / "small"
        small.mkdir(exist_ok=True)
        (small / "one.py").write_text("import jax\n", encoding="utf-8")
        fixed = min(check(small)[0] for _ in range(3))
    finally:
        if args.keep is None:
            shutil.rmtree(base, ignore_errors=True)
    same = (
        json.loads(cold_report)["files"]
        == json.loads(warm_report)["files"]
        == json.loads(bare_report)["files"]
    )
    per_k = 1000 / args.files
    print(f"tree: {args.files} files {kinds}, --jobs {args.jobs}, check exit {rc}")
    print(f"cold (empty cache)     : {cold:6.2f} s  ({cold * per_k:.2f} s per 1000 files)")
    print(f"warm (every file hit)  : {warm:6.2f} s  ({warm * per_k:.2f} s per 1000 files)")
    print(f"--no-cache             : {bare:6.2f} s  ({bare * per_k:.2f} s per 1000 files)")
    print(f"fixed cost (one file)  : {fixed:6.2f} s  (interpreter, imports)")
    print(
        f"warm beyond fixed cost : {warm - fixed:6.2f} s  "
        f"({(warm - fixed) * per_k:.2f} s per 1000 files); speed-up over cold {cold / warm:.1f}x"
    )
    print(f"same report cold / warm / no-cache: {same}")
    if not same:
        sys.exit(1)


if __name__ == "__main__":
    main()
