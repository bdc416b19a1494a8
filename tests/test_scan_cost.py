"""What a scan costs: work a file pays only when its sites need it.

Over JAX's own sources (1,044 files, 36 with sites) most of a dry run's CPU went to analyses
whose answer no site used (`benchmarks/throughput.py`, README "Performance"). Each test here
pins one of them to the files that need it; the outputs are pinned elsewhere (the fixtures,
`test_prefilter.py`) and by `benchmarks/equivalence.py` over whole trees.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from pathlib import Path

import libcst as cst
import pytest
from conftest import FIXTURES
from jaxmigrate.codemods.pmap import _reach

from jaxmigrate.model import Options
from jaxmigrate.pipeline import project
from jaxmigrate.pipeline.discovery import Found
from jaxmigrate.pipeline.engine import migrate_source
from jaxmigrate.pipeline.runner import migrate_files
from jaxmigrate.toolkit import imports

FILLER = "".join(
    f"\n\ndef helper_{i}(a, b):\n    c = [a * {i} for a in b if a]\n    return c, b[1:2]\n"
    for i in range(100)
)


@pytest.fixture
def module_reads(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[cst.CSTNode]]:
    """The nodes the pmap pass's `Flow` reads whole, in the order it reads them."""
    read: list[cst.CSTNode] = []
    original = _reach.walk_in_order

    def recording(visitor: cst.CSTVisitor, node: cst.CSTNode) -> None:
        read.append(node)
        original(visitor, node)

    monkeypatch.setattr(_reach, "walk_in_order", recording)
    yield read


def test_steps_declined_before_their_flow_is_followed_never_read_the_module(
    module_reads: list[cst.CSTNode],
) -> None:
    """A step called where it is made (`jax.pmap(f)(x)`, what tests do) is declined before its
    data flow is looked at; reading the whole module for it was 18% of a dry run's CPU over
    JAX's sources. The faithful form is written all the same."""
    code = textwrap.dedent(
        """
        import jax
        import jax.numpy as jnp

        def test_psum():
            def f(x):
                return jax.lax.psum(x, "i")
            return jax.pmap(f, axis_name="i")(jnp.ones((jax.local_device_count(), 3)))

        def test_nested():
            def g(x):
                return x * 2
            return jax.pmap(g)(jnp.ones((jax.local_device_count(), 3)))
        """
    )
    result = migrate_source(code + FILLER, options=Options(unsafe_fixes=True))
    assert [s.code for s in result.sites] == ["JM202", "JM202"]
    assert all(s.applied for s in result.sites)
    assert "jax.pmap(f" not in result.code and "jax.pmap(g)" not in result.code
    assert not [n for n in module_reads if isinstance(n, cst.Module)]


def test_a_step_whose_flow_is_followed_still_reads_the_module(
    module_reads: list[cst.CSTNode],
) -> None:
    """The module is read, once, when a step's flow is followed (the program-level form)."""
    code = (FIXTURES / "pmap" / "program_batch_stats.py").read_text(encoding="utf-8")
    result = migrate_source(code, options=Options(unsafe_fixes=True))
    assert "make_array_from_process_local_data" in result.code  # the program-level form ran
    assert len([n for n in module_reads if isinstance(n, cst.Module)]) == 1


def test_an_import_still_read_is_kept_without_reading_the_rest_of_the_module(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """After a rewrite, the imports it may have left unused are looked up: the walk stops at
    the first read of each (usually near the top), not at the end of a long module."""
    names: list[str] = []
    original = imports._NameUses.visit_Name

    def recording(self: imports._NameUses, node: cst.Name) -> None:
        names.append(node.value)
        original(self, node)

    monkeypatch.setattr(imports._NameUses, "visit_Name", recording)
    module = cst.parse_module("import jax\nimport jax.numpy\n\nx = jax.numpy.ones(3)\n" + FILLER)
    assert imports.remove_unused_imports(module, {"jax", "jax.numpy"}) is module
    assert len(names) < 5, names
    names.clear()
    gone = cst.parse_module("import jax\nimport numpy as np\n\nx = np.ones(3)\n" + FILLER)
    kept = imports.remove_unused_imports(gone, {"jax", "np"})
    assert kept.code.startswith("import numpy as np\n")  # `jax` read nowhere: removed
    assert len(names) > 1000


def test_each_worker_reads_the_code_base_around_its_files_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Workers (`--jobs 2`) keep what they learnt about the code base from file to file: a
    `Project` sent with each task arrived empty, and every file with a `with mesh:` read its
    whole package again for legacy mesh reads (all of `jax/` for each such file of JAX's)."""
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    for i in range(8):
        (package / f"m{i}.py").write_text(
            f"import jax\n\n\ndef f{i}(mesh):\n    with mesh:\n        pass\n"
        )
    scans = tmp_path / "scans"
    original = project._mesh_reads

    def logging(base: Path, files: list[Path]) -> list[str]:
        with scans.open("a") as log:  # written by the worker processes
            log.write(f"{base}\n")
        return original(base, files)

    monkeypatch.setattr(project, "_mesh_reads", logging)
    found = [Found(p) for p in sorted(package.glob("m*.py"))]
    results = list(migrate_files(found, Options(), jobs=2))
    assert [s.code for r in results for s in r.sites] == ["JM201"] * 8
    assert 1 <= len(scans.read_text().splitlines()) <= 2  # once in each worker
