"""Reasons that blame the user's code for what the verifier did.

- A `main()` returning a dict with keys of mixed types ran, but JAX cannot sort its keys to
  flatten it: "the original cannot run: ValueError: Comparator raised exception ...". Such a
  dict is now compared key by key; an output nothing can flatten reads "the original runs, but
  what it returns cannot be compared".
- A program whose first line is `jax.distributed.initialize()`: the worker had started JAX, so
  the call raised "must be called before any JAX calls" and the original "could not run". The
  worker is a job of one process, formed before the program runs (as `--processes N` forms one
  of N): the program's own call does nothing.
- A notebook failing the same way on both trees read as if the rewritten cells had failed.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import numpy as np
import pytest
from clitools import jm

from jaxmigrate.model import Safety, Site, Status
from jaxmigrate.verify import VerifyConfig, VerifyRequest, verify

pytestmark = pytest.mark.one_jax  # not again on JAX 0.12 (.ci/run)

MIXED = textwrap.dedent("""\
    import jax
    import jax.numpy as jnp


    def main():
        y = jax.pmap(lambda x: x * 2)(jnp.arange(16.0).reshape(8, 2))
        return {"loss": y.sum(), 0: y, ("a", 1): y[0]}
    """)
PMAP = "jax.pmap(lambda x: x * 2)"
RIGHT = MIXED.replace(PMAP, "jax.jit(jax.vmap(lambda x: x * 2))")
WRONG = MIXED.replace(PMAP, "jax.jit(jax.vmap(lambda x: x * 3))")
UNFLATTENABLE = textwrap.dedent("""\
    import jax
    import jax.numpy as jnp


    class Box:
        def __init__(self, value):
            self.value = value


    def flatten(box):
        raise TypeError("Box cannot be flattened")


    jax.tree_util.register_pytree_node(Box, flatten, lambda aux, children: Box(*children))


    def main():
        return Box(jax.pmap(lambda x: x * 2)(jnp.arange(16.0).reshape(8, 2)))
    """)
AT_IMPORT = textwrap.dedent("""\
    import jax
    import jax.numpy as jnp

    jax.distributed.initialize()


    def main():
        return jax.pmap(lambda x: x * 2)(jnp.arange(16.0).reshape(8, 2))
    """)
IN_MAIN = textwrap.dedent("""\
    import jax
    import jax.numpy as jnp


    def main():
        jax.distributed.initialize()
        return jax.pmap(lambda x: x * 2)(jnp.arange(16.0).reshape(8, 2))
    """)


def request(path: str, original: str, candidate: str) -> VerifyRequest:
    line = next(i for i, t in enumerate(original.splitlines(), 1) if "jax.pmap(" in t)
    site = Site("JM202", "pmap", line, 0, Safety.UNSAFE, "pmap", key="site")
    return VerifyRequest(path, original, candidate, (site,))


@pytest.mark.jax
def test_the_original_is_not_blamed_for_what_the_worker_cannot_do(tmp_path: Path) -> None:
    cases = {
        "mixed_right.py": (MIXED, RIGHT),
        "mixed_wrong.py": (MIXED, WRONG),
        "unflattenable.py": (
            UNFLATTENABLE,
            UNFLATTENABLE.replace(PMAP, "jax.vmap(lambda x: x * 2)"),
        ),
        "at_import.py": (AT_IMPORT, AT_IMPORT.replace(PMAP, "jax.vmap(lambda x: x * 2)")),
        "in_main.py": (IN_MAIN, IN_MAIN.replace(PMAP, "jax.vmap(lambda x: x * 2)")),
    }
    for name, (original, _) in cases.items():
        (tmp_path / name).write_text(original)
    requests = [request(name, *texts) for name, texts in cases.items()]
    config = VerifyConfig(root=tmp_path, timeout=120.0, jobs=1)
    verdicts = {path: v for (path, _), v in verify(requests, config).items()}

    right = verdicts["mixed_right.py"]
    assert right.status is Status.VERIFIED, right.reason
    wrong = verdicts["mixed_wrong.py"]
    assert wrong.status is Status.FAILED, wrong.reason
    assert wrong.reason.startswith("outputs differ at output['int:0'] (float32[8, 2])")

    box = verdicts["unflattenable.py"]
    assert box.status is Status.UNVERIFIED
    assert box.reason.startswith(
        "the original runs, but what it returns cannot be compared: "
        "TypeError: Box cannot be flattened"
    ), box.reason

    for name in ("at_import.py", "in_main.py"):
        verdict = verdicts[name]
        assert verdict.status is Status.VERIFIED, (name, verdict.reason)
        assert "cannot run" not in verdict.reason
        assert "verify it as a multi-process job too (--processes 2)" in verdict.reason


def test_a_dict_with_keys_of_mixed_types_is_compared_key_by_key() -> None:
    from jaxmigrate.verify.child.compare import compare
    from jaxmigrate.verify.child.hostify import flatten_output

    one = flatten_output({0: np.ones(2), "loss": np.float32(1.0), None: [np.zeros(1)]})
    same = flatten_output({"loss": np.float32(1.0), None: [np.zeros(1)], 0: np.ones(2)})
    other = flatten_output({0: np.ones(2) * 2, "loss": np.float32(1.0), None: [np.zeros(1)]})
    assert compare(one, same) is None
    mismatch = compare(one, other)
    assert mismatch is not None and mismatch["path"] == "output['int:0']"


def notebook(*cells: str) -> str:
    return json.dumps(
        {
            "cells": [
                {"cell_type": "code", "metadata": {}, "source": c, "outputs": []}
                | {"execution_count": None}
                for c in cells
            ],
            "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3"}},
            "nbformat": 4,
            "nbformat_minor": 5,
        }
    )


@pytest.mark.jax
def test_a_notebook_failing_the_same_way_on_both_trees_says_so(tmp_path: Path) -> None:
    text = notebook(
        "import jax\nimport jax.numpy as jnp\nimport numpy as np",
        "step = jax.pmap(lambda x: x * 2)\ny = step(jnp.ones((8, 2)))\nprint(y.sum())",
        "data = np.load('missing.npy')",
    )
    (tmp_path / "train.ipynb").write_text(text)
    report = tmp_path / "report.json"
    proc = jm("run", ".", "--report", str(report), "--format", "json", cwd=tmp_path, timeout=900)
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    (site,) = json.loads(report.read_text())["files"][0]["sites"]
    assert (site["status"], site["applied"]) == ("unverified", False)
    reason = site["details"]["verification"]
    assert reason.startswith(
        "`train.ipynb (its code cells, in order)` fails the same way before and after the "
        "rewrite (FileNotFoundError: [Errno 2] No such file or directory: 'missing.npy')"
    ), reason
    assert "on the rewritten tree" not in reason
    assert (tmp_path / "train.ipynb").read_text() == text
