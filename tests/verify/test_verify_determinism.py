"""Randomness (issue 17, item 4): the global RNGs are seeded alike on both sides, and the
original of a unit runs twice; if it disagrees with itself, or raises only once, nothing can be
compared with it and the site is `unverified`, never `verified` by luck nor `failed`."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest
from clitools import jm

pytestmark = [pytest.mark.jax, pytest.mark.one_jax]  # not again on JAX 0.12 (.ci/run)

HEADER = textwrap.dedent("""
    import builtins

    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh


    @jax.jit
    def double(x):
        return x * 2.0
    """)

# numpy's global RNG, unseeded: a right rewrite, `failed` when the sides drew differently
UNSEEDED = HEADER + textwrap.dedent("""

    def main():
        mesh = Mesh(np.array(jax.devices()), ("data",))
        x = np.random.rand(8, 4).astype(np.float32)
        with mesh:
            y = double(x)
        print(float(y.sum()))
        return y
    """)
# fresh entropy every run: no seed makes two runs agree
RANDOM = HEADER + textwrap.dedent("""

    def main():
        mesh = Mesh(np.array(jax.devices()), ("data",))
        x = np.random.default_rng().random((8, 4)).astype(np.float32)
        with mesh:
            y = double(x)
        return y
    """)
# prints a value drawn from the clock, and returns nothing
CLOCKED = HEADER + textwrap.dedent("""

    def main():
        import time

        mesh = Mesh(np.array(jax.devices()), ("data",))
        key = jax.random.PRNGKey(time.time_ns() % 1_000_003)
        with mesh:
            y = double(jax.random.normal(key, (8, 4)))
        print(float(y.sum()))
    """)
# raises the first time a process runs it, not after (as a flaky program does, now and then);
# the pmap's reference (`jax.vmap`) used to stand in for the original that had raised
FLAKY = HEADER + textwrap.dedent("""

    def main():
        runs = getattr(builtins, "_flaky_runs", 0)
        builtins._flaky_runs = runs + 1
        if runs == 0:
            raise RuntimeError("connection reset")
        x = np.arange(32, dtype=np.float32).reshape(8, 4)
        return jax.pmap(lambda v: jax.lax.psum(v, "i"), axis_name="i")(x)
    """)


def run_sites(root: Path) -> dict[str, dict[str, Any]]:
    report = root.parent / f"{root.name}.report.json"
    proc = jm("run", "--report", str(report), "--format", "json", ".", cwd=root, timeout=900)
    assert proc.returncode in (0, 1), proc.stderr
    files = json.loads(report.read_text())["files"]
    return {f["path"]: site for f in files for site in f["sites"]}


@pytest.fixture(scope="module")
def sites(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, dict[str, Any]]]:
    root = tmp_path_factory.mktemp("random")
    programs = {
        "unseeded.py": UNSEEDED,
        "entropy.py": RANDOM,
        "flaky.py": FLAKY,
        "clocked.py": CLOCKED,
    }
    for name, text in programs.items():
        (root / name).write_text(text)
    return root, run_sites(root)


def test_unseeded_global_numpy_draws_alike_on_both_sides(
    sites: tuple[Path, dict[str, dict[str, Any]]],
) -> None:
    root, found = sites
    site = found["unseeded.py"]
    assert site["status"] == "verified", site
    assert "its return value and 1 printed line(s)" in site["details"]["verification"]
    assert "jax.set_mesh" in (root / "unseeded.py").read_text()


def test_an_original_that_disagrees_with_itself_is_unverified(
    sites: tuple[Path, dict[str, dict[str, Any]]],
) -> None:
    root, found = sites
    site = found["entropy.py"]
    assert site["status"] == "unverified", site
    reason = site["details"]["verification"]
    assert reason.startswith("the original is nondeterministic: two runs disagree at output"), (
        reason
    )
    assert (root / "entropy.py").read_text() == RANDOM


def test_an_original_that_raises_only_sometimes_is_unverified(
    sites: tuple[Path, dict[str, dict[str, Any]]],
) -> None:
    root, found = sites
    (site,) = [s for f, s in found.items() if f == "flaky.py"]
    assert site["status"] == "unverified", site
    reason = site["details"]["verification"]
    assert reason == (
        "the original is nondeterministic: it raised in one of two runs and not in the other "
        "(RuntimeError: connection reset (at flaky.py:19))"
    ), reason
    assert (root / "flaky.py").read_text() == FLAKY


def test_a_main_whose_only_printed_line_varies_is_unverified(
    sites: tuple[Path, dict[str, dict[str, Any]]],
) -> None:
    root, found = sites
    site = found["clocked.py"]
    assert site["status"] == "unverified", site
    assert site["details"]["verification"] == (
        "the original is nondeterministic: printed line(s) 1 differ between two runs of the "
        "original and are not compared, and `main()` returned, printed or wrote nothing else to "
        "compare"
    )
    assert (root / "clocked.py").read_text() == CLOCKED
