"""The with-mesh rule and the code base's reads of the legacy mesh context.

`jax.set_mesh` leaves `thread_resources.env.physical_mesh` empty (JAX 0.10.2), so t5x's
`global_mesh_defined()` turns its `with_sharding_constraint` off under it: a `with mesh:` is
left alone, with the reason, when the module or its code base reads that context.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from clitools import jm
from conftest import FIXTURES

from jaxmigrate.model import Options
from jaxmigrate.pipeline.engine import migrate_source
from jaxmigrate.pipeline.project import Project

PROJECT = FIXTURES / "with_mesh" / "projects" / "legacy_mesh_read"
READ = "    if mesh_lib.thread_resources.env.physical_mesh.empty:\n"


def copy(tmp_path: Path) -> Path:
    tree = tmp_path / "project"
    shutil.copytree(PROJECT, tree)
    return tree


def test_a_read_in_another_file_of_the_code_base_declines_the_with(tmp_path: Path) -> None:
    train = copy(tmp_path) / "trainer" / "train.py"
    source = train.read_text()
    result = migrate_source(source, options=Options(unsafe_fixes=True), path=str(train))
    assert result.code == source
    assert [s.reason for s in result.skips if s.code == "JM201"] == [
        (
            "the code reads the legacy mesh context `with mesh:` sets (`thread_resources` or t5x's "
            "partitioning, trainer/partitioning.py:7), which `jax.set_mesh` leaves empty: a "
            "sharding constraint behind such a read would silently do nothing; move the reads (to "
            "`jax.sharding.get_abstract_mesh()`) and the `with`s together, by hand"
        )
    ]


def test_without_the_read_the_with_is_rewritten(tmp_path: Path) -> None:
    tree = copy(tmp_path)
    reader = tree / "trainer" / "partitioning.py"
    reader.write_text(reader.read_text().replace(READ, "    if x.ndim == 0:\n"))
    train = tree / "trainer" / "train.py"
    result = migrate_source(train.read_text(), options=Options(unsafe_fixes=True), path=str(train))
    assert "with jax.set_mesh(mesh):" in result.code


def test_the_result_cache_key_holds_the_reads(tmp_path: Path) -> None:
    tree = copy(tmp_path)
    train = str(tree / "trainer" / "train.py")
    text = Path(train).read_text()
    before = Project().context(train, text)
    reader = tree / "trainer" / "partitioning.py"
    reader.write_text(reader.read_text().replace(READ, "    if x.ndim == 0:\n"))
    assert Project().context(train, text) != before


def test_a_cached_run_sees_a_read_added_elsewhere(tmp_path: Path) -> None:
    """The verdict on train.py depends on partitioning.py: a cached result must not hide it."""
    tree = copy(tmp_path)
    reader = tree / "trainer" / "partitioning.py"
    with_read = reader.read_text()
    reader.write_text(with_read.replace(READ, "    if x.ndim == 0:\n"))
    first = jm("run", "--no-verify", "--unsafe-fixes", "--dry-run", ".", cwd=tree)
    assert "with jax.set_mesh(mesh):" in first.stdout, first.stdout + first.stderr
    reader.write_text(with_read)
    second = jm("run", "--no-verify", "--unsafe-fixes", "--dry-run", ".", cwd=tree)
    assert "with jax.set_mesh(mesh):" not in second.stdout, second.stdout
    assert "trainer/partitioning.py:7" in second.stdout, second.stdout


def test_a_read_in_a_package_the_file_cannot_run_does_not_count(tmp_path: Path) -> None:
    """The reads that count are in the file's own package and the packages it imports: a code
    base's unrelated package (jaxmigrate's own verifier, beside its examples) is not the
    file's code."""
    tree = copy(tmp_path)
    reader = tree / "trainer" / "partitioning.py"
    other = tree / "other"
    other.mkdir()
    (other / "__init__.py").write_text("")
    (other / "debug.py").write_text(reader.read_text())
    reader.write_text(reader.read_text().replace(READ, "    if x.ndim == 0:\n"))
    train = tree / "trainer" / "train.py"
    result = migrate_source(train.read_text(), options=Options(unsafe_fixes=True), path=str(train))
    assert "with jax.set_mesh(mesh):" in result.code


def test_a_script_importing_the_reading_package_is_declined(tmp_path: Path) -> None:
    tree = copy(tmp_path)
    script = tree / "run.py"
    script.write_text((tree / "trainer" / "train.py").read_text())
    result = migrate_source(
        script.read_text(), options=Options(unsafe_fixes=True), path=str(script)
    )
    assert "with jax.set_mesh" not in result.code
    assert any("trainer/partitioning.py:7" in s.reason for s in result.skips), result.skips
