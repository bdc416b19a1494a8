"""A program-level step a factory makes and returns, called under the mesh its caller sets.

big_vision's evaluators get their step from `get_eval_fn(...)` (an `lru_cache`d factory) and
call it in `Evaluator.run`, which the trainers reach by name. The factory is the site's target:
the worker replays it, then the function it returned on the calls the command made of it. Two
things kept the right rewrite from being verified, and the step fell back to the faithful form
(PL603): the replay ran outside the `with jax.set_mesh(mesh):` the rewrite put around the loop
in `run` ("The context mesh cannot be empty"), and the recorded calls, stacked as pmap took them,
were passed to the rewrite's `jax.jit` step as they were.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from clitools import jm
from conftest import jax_env

from jaxmigrate.verify.child.source import enclosing_withs, local_bindings
from jaxmigrate.verify.messages import Source

EVALUATOR = textwrap.dedent('''\
    """An evaluator made by name, as big_vision's are."""
    from functools import lru_cache, partial

    import jax
    import numpy as np

    import pkg.pipe as pipe


    @lru_cache(None)
    def get_eval_fn(scale):
        """The eval step, pmapped."""
        @partial(jax.pmap, axis_name="batch")
        def _eval_fn(params, batch):
            y = batch["x"] @ params["w"] * scale
            return jax.lax.psum(y.sum(), "batch"), jax.lax.psum(y.shape[0], "batch")
        return _eval_fn


    class Evaluator:

        def __init__(self, steps):
            self.eval_fn = get_eval_fn(2.0)
            self.steps = steps

        def run(self, params):
            total, seen = 0.0, 0
            for batch in pipe.iterate(self.steps):
                s, n = self.eval_fn(params, batch)
                total += float(np.array(s[0]))
                seen += int(np.array(n[0]))
            yield ("mean", total / seen)
    ''')
PIPE = textwrap.dedent("""\
    import jax
    import numpy as np


    def iterate(n):
        rng = np.random.default_rng(0)
        d = jax.local_device_count()
        for _ in range(n):
            x = rng.normal(size=(d * 4, 3)).astype(np.float32)
            yield {"x": x.reshape(d, 4, 3)}
    """)
TRAIN = textwrap.dedent("""\
    import importlib

    import flax.jax_utils
    import numpy as np


    def main():
        params = {"w": np.arange(3, dtype=np.float32)}
        params_repl = flax.jax_utils.replicate(params)
        evaluator = importlib.import_module("pkg.evaluators.cls").Evaluator(3)
        for name, value in evaluator.run(params_repl):
            print(name, f"{value:.5f}")
    """)
CONFIG = textwrap.dedent("""\
    [tool.jaxmigrate]
    pmap-replicated = ["Evaluator.run(params)"]
    closed-code-base = true
    """)
COMMAND = f"{sys.executable} drive.py"


def project(root: Path) -> Path:
    files = {
        "pkg/__init__.py": "",
        "pkg/evaluators/__init__.py": "",
        "pkg/pipe.py": PIPE,
        "pkg/evaluators/cls.py": EVALUATOR,
        "pkg/train.py": TRAIN,
        "drive.py": "from pkg import train\n\ntrain.main()\n",
        "pyproject.toml": CONFIG,
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def shown(root: Path) -> str:
    env = jax_env(8)
    proc = subprocess.run(
        [sys.executable, "drive.py"], cwd=root, capture_output=True, text=True, env=env, check=False
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.mark.jax
def test_a_step_a_factory_returns_is_verified_under_the_mesh_its_caller_sets(
    tmp_path: Path,
) -> None:
    root = project(tmp_path)
    before = shown(root)
    assert before.startswith("mean ")
    args = ("run", "--verify-with", COMMAND, "--target-jax", "0.8", "--select", "pmap")
    # as a 2-process job, the replay of the returned step is not compared in the flat layout
    # (each process holds its own blocks): it decides nothing, and the command's calls judge it
    job = jm(*args, "--dry-run", "--processes", "2", "pkg/evaluators/cls.py", cwd=root)
    assert job.returncode == 0, job.stdout + job.stderr
    assert job.stdout.count("[unsafe, verified]") == 6, job.stdout
    assert "made the same 3 call(s) of it on both trees" in job.stdout, job.stdout
    proc = jm(*args, "pkg/evaluators/cls.py", cwd=root)
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert "PL603" not in out and "failed verification" not in out, out
    # the step (replayed through the factory, under `run`'s mesh) and the five edits of `run`
    assert out.count("[unsafe, verified]") == 6, out
    assert "(program-level)" in out, out
    written = (root / "pkg" / "evaluators" / "cls.py").read_text()
    assert "partial(jax.pmap" not in written and "with jax.set_mesh(mesh):" in written, written
    assert shown(root) == before


def test_the_rewrites_mesh_is_found_around_the_call_and_rebuilt_from_its_locals() -> None:
    """The original has no `with` around the step's call; the rewrite puts one around the loop,
    its mesh a local of `run`. The call's line in the original (a frame the recorder saw) is
    found in the rewrite, inside that `with`, and the mesh's assignment comes with it."""
    rewrite = EVALUATOR.replace(
        "        total, seen = 0.0, 0\n        for batch",
        "        total, seen = 0.0, 0\n"
        '        mesh = jax.sharding.Mesh(jax.devices(), ("batch",))\n'
        "        with jax.set_mesh(mesh):\n"
        "          for batch",
    ).replace("self.eval_fn(params, batch)", "self.eval_fn(params, global_batch(batch))")
    source = Source(EVALUATOR, rewrite)
    call = next(i for i, line in enumerate(EVALUATOR.splitlines(), 1) if "self.eval_fn(" in line)
    mapped = source.counterpart(call)
    assert mapped is not None and "global_batch(batch)" in rewrite.splitlines()[mapped - 1]
    tree = ast.parse(rewrite)
    (found,) = enclosing_withs(tree, rewrite, mapped)
    assert found.exprs == ("jax.set_mesh(mesh)",)
    bindings = local_bindings(tree, rewrite, found.line)
    assert bindings == [["mesh", 'jax.sharding.Mesh(jax.devices(), ("batch",))']]
    # a name bound twice (by `=`, or by a loop) is not rebuilt: the recorded mesh stands in
    for other in ("mesh = mesh", "for mesh in [mesh]:\n            pass"):
        twice = rewrite.replace(
            "        with jax.set_mesh", f"        {other}\n        with jax.set_mesh"
        )
        mapped = Source(EVALUATOR, twice).counterpart(call)
        assert mapped is not None
        (again,) = enclosing_withs(ast.parse(twice), twice, mapped)
        assert local_bindings(ast.parse(twice), twice, again.line) == [], other


def printed(script: str) -> list[str]:
    """Run `script` in a fresh Python on 8 CPU devices; return the words it printed."""
    env = jax_env(8)
    ran = subprocess.run(
        [sys.executable, "-c", script],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert ran.returncode == 0, ran.stderr[-2000:]
    return ran.stdout.split()


ADAPTERS = textwrap.dedent("""\
    import jax
    import numpy as np
    from jax.sharding import PartitionSpec as P

    from jaxmigrate.verify.child.layouts import LAYOUT, checked, flat_in, flat_out

    def body(w, x):
        return jax.lax.psum((x @ w).sum(), "b")

    def wrong_body(w, x):
        return (x @ w).sum()  # not summed over the devices: device 0's share read as the whole

    layout = {"args": ["replicated", "batch"], "keywords": [], "replicated": [0],
              "results": [0], "varying": [False], "tuple": False, "line": 1}
    original = flat_out(checked(jax.pmap(body, axis_name="b"), layout, "step", []))
    mesh = jax.sharding.Mesh(jax.devices(), ("b",))
    n = jax.local_device_count()
    w = np.stack([np.arange(3, dtype=np.float32)] * n)
    x = np.arange(n * 2 * 3, dtype=np.float32).reshape(n, 2, 3)
    for made in (body, wrong_body):
        step = jax.jit(jax.shard_map(made, mesh=mesh, in_specs=(P(), P("b")), out_specs=P(),
                                     check_vma=False))
        setattr(step, LAYOUT, layout)  # what `capturing` marks the rewrite's step with
        print(float(original(w, x)) == float(flat_in(step)(w, x)))
    """)


@pytest.mark.jax
def test_a_returned_steps_calls_are_compared_in_the_flat_layout() -> None:
    assert printed(ADAPTERS) == ["True", "False"]


STATIC = textwrap.dedent("""\
    import jax
    import numpy as np
    from jax.sharding import PartitionSpec as P

    from jaxmigrate.verify.child.layouts import LAYOUT, checked, flat_in, flat_out

    def body(w, x, scale, *flexi):
        return jax.lax.psum((x @ w).sum() * scale * sum(flexi), "b")

    layout = {"args": ["replicated", "batch", "static"], "keywords": [], "replicated": [0],
              "results": [0], "varying": [False], "tuple": False, "line": 1,
              "static_tail": True}
    pmapped = jax.pmap(body, axis_name="b", static_broadcasted_argnums=(2, 3, 4))
    original = flat_out(checked(pmapped, layout, "step", []))
    mesh = jax.sharding.Mesh(jax.devices(), ("b",))
    n = jax.local_device_count()
    w = np.stack([np.arange(3, dtype=np.float32)] * n)
    x = np.arange(n * 2 * 3, dtype=np.float32).reshape(n, 2, 3)
    step = jax.jit(
        jax.shard_map(body, mesh=mesh, in_specs=(P(), P("b"), None) + (None,) * 2,
                      out_specs=P(), check_vma=False),
        static_argnums=(2, 3, 4),
    )
    setattr(step, LAYOUT, layout)
    print(float(original(w, x, 2, 1, 3)) == float(flat_in(step)(w, x, 2, 1, 3)))
    """)


@pytest.mark.jax
def test_a_returned_steps_static_arguments_stay_as_they_are() -> None:
    """A static argument (`static_broadcasted_argnums`, and a static `*args` tail) reaches the
    rewrite's `jax.jit(..., static_argnums=...)` step as the Python value it is: read to the
    host as an array, `jax.jit` would refuse it ("Non-hashable static arguments")."""
    assert printed(STATIC) == ["True"]
