"""The engine's contract: selection, groups, target versions, suppression, the Python API and
libcst interoperability."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import libcst as cst
import pytest

from jaxmigrate import migrate_source
from jaxmigrate.model import Options, Safety, Site, Status
from jaxmigrate.pipeline.engine import line_map_between, run_passes
from jaxmigrate.registry import all_passes

PJIT_UNDER_MESH = """\
import numpy as np
import jax
from jax.sharding import Mesh, PartitionSpec as P
from jax.experimental.pjit import pjit


def main():
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("x", "y"))
    with mesh:
        f = pjit(lambda a: a * 2, in_shardings=P("x"), out_shardings=P("x"))
        return f(np.ones((8, 2)))
"""


def test_grouped_sites_apply_together_or_not_at_all() -> None:
    alone = migrate_source(PJIT_UNDER_MESH, options=Options(unsafe_fixes=False))
    by_code = {s.code: s for s in alone.sites}
    assert by_code["JM103"].group == by_code["JM201"].group is not None
    assert not by_code["JM201"].applied, "unsafe and unverified: not applied by default"
    assert not by_code["JM103"].applied, "its group partner is not applied"
    assert alone.code == PJIT_UNDER_MESH
    both = migrate_source(PJIT_UNDER_MESH, options=Options(unsafe_fixes=True))
    assert all(s.applied for s in both.sites)
    assert "jax.set_mesh(mesh)" in both.code and "jax.jit(" in both.code


def test_a_site_needing_an_unselected_rule_is_skipped_with_the_reason() -> None:
    result = migrate_source(PJIT_UNDER_MESH, options=Options(select=("JM103",), unsafe_fixes=True))
    assert result.code == PJIT_UNDER_MESH
    assert not result.sites
    assert any("needs rule JM201" in s.reason for s in result.skips)


def test_accept_callback_decides_per_site_and_the_file_is_rerendered() -> None:
    source = (
        "from jax.experimental.maps import Mesh\nfrom jax.experimental import PartitionSpec as P\n"
    )
    first_only = migrate_source(
        source,
        accept=lambda sites: [replace(s, applied=s.line == 1) for s in sites],
    )
    assert first_only.code == (
        "from jax.sharding import Mesh\nfrom jax.experimental import PartitionSpec as P\n"
    )
    cst.parse_module(first_only.code)


def test_target_jax_too_old_skips_with_the_reason() -> None:
    source = (
        "from jax.experimental.shard_map import shard_map\nf = shard_map(g, mesh, P('x'), P('x'))\n"
    )
    result = migrate_source(source, options=Options(target_jax=(0, 5), unsafe_fixes=True))
    assert result.code == source
    assert any("needs JAX >= 0.7" in s.reason and "target is 0.5" in s.reason for s in result.skips)


def test_statuses_before_verification() -> None:
    result = migrate_source(PJIT_UNDER_MESH, options=Options(unsafe_fixes=True))
    for site in result.sites:
        expected = Status.NOT_NEEDED if site.safety is Safety.SAFE else Status.UNVERIFIED
        assert site.status is expected


@pytest.mark.parametrize("comment", ["# jaxmigrate: skip", "# jaxmigrate: skip[JM101]"])
def test_suppression(comment: str) -> None:
    source = f"from jax.experimental.maps import Mesh  {comment}\n"
    result = migrate_source(source)
    assert result.code == source
    assert [s.suppressed for s in result.skips] == [True]


def test_suppression_of_another_rule_does_not_apply() -> None:
    source = "from jax.experimental.maps import Mesh  # jaxmigrate: skip[JM202]\n"
    assert "jax.sharding" in migrate_source(source).code


def test_user_function_named_like_the_api_is_left_alone() -> None:
    source = (
        "def pmap(f, axis_name=None):\n    return f\n\n"
        "def pjit(f, in_axis_resources=None):\n    return f\n\n"
        "g = pmap(lambda x: x, 'i')\nh = pjit(lambda x: x, in_axis_resources=None)\n"
        "partitioner.partition(fn, in_axis_resources=None)\n"
    )
    result = migrate_source(source, options=Options(unsafe_fixes=True))
    assert result.code == source and not result.sites


def test_line_map_points_back_to_original_lines() -> None:
    original = ["a\n", "b\n", "c\n"]
    mapping = line_map_between(original, "a\nx\ny\nb\nc\n")
    assert [mapping(n) for n in (1, 4, 5)] == [1, 2, 3]


def test_each_pass_runs_as_a_libcst_codemod_command(tmp_path: Path) -> None:
    target = tmp_path / "a.py"
    target.write_text("from jax.experimental.maps import Mesh\n")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "libcst.tool",
            "codemod",
            "--no-format",
            "-x",
            "jaxmigrate.codemods.legacy_imports.LegacyImports",
            str(target),
        ],
        capture_output=True,
        text=True,
        check=False,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert target.read_text() == "from jax.sharding import Mesh\n"


def test_legacy_names_in_parameter_defaults_are_reached() -> None:
    source = (
        "import jax\n\n\n"
        "def f(spec=jax.experimental.PartitionSpec('x'), *, m: jax.experimental.maps.Mesh):\n"
        "    return spec\n"
    )
    result = migrate_source(source)
    assert "jax.experimental" not in result.code
    assert len(result.sites) == 2


FIXTURE_CASES = sorted(
    p
    for p in (Path(__file__).resolve().parent / "fixtures").glob("*/*.py")
    if not p.name.endswith(".expected.py")
)


@pytest.mark.parametrize("case", FIXTURE_CASES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_passes_with_no_site_enabled_change_nothing(case: Path) -> None:
    """What lets a partial apply reuse the first run's modules (`engine._rerun`)."""
    code = case.read_text()
    module, _ = run_passes(cst.parse_module(code), code, all_passes(), enabled=frozenset())
    assert module.code == code


MIXED = (
    PJIT_UNDER_MESH
    + """

def other(x):
    from jax.experimental.pjit import pjit as p2
    from jax.experimental import PartitionSpec
    return p2(lambda v: v, in_axis_resources=PartitionSpec("x"))(x), jax.pmap(abs)(x)
"""
)


@pytest.mark.parametrize("unsafe_fixes", [False, True])
@pytest.mark.parametrize("drop", [None, "JM101", "JM103", "JM202"])
def test_a_partial_apply_matches_a_fresh_run_of_just_those_sites(
    unsafe_fixes: bool, drop: str | None
) -> None:
    """Some sites applied (safe ones by default, or all but one rule's): the code is what a
    run enabling exactly them makes from scratch."""

    def accept(sites: Sequence[Site]) -> list[Site]:
        return [replace(s, applied=s.applied and s.code != drop) for s in sites]

    result = migrate_source(MIXED, options=Options(unsafe_fixes=unsafe_fixes), accept=accept)
    applied = frozenset(s.key for s in result.sites if s.applied)
    if drop is None:  # the safe JM101 alone, or everything
        assert len(applied) == (len(result.sites) if unsafe_fixes else 1)
    fresh, _ = run_passes(cst.parse_module(MIXED), MIXED, all_passes(), enabled=applied)
    assert result.code == fresh.code


def test_parsing_skips_validation_only_while_the_parser_runs() -> None:
    from jaxmigrate.pipeline.engine import parse_module

    code = "@d\nasync def f(a, /, *, b=1):\n    return [x async for x in a]\n"
    assert parse_module(code).code == code
    assert parse_module(code).deep_equals(cst.parse_module(code))
    with pytest.raises(cst.CSTValidationError):
        cst.Name("not a name")  # nodes built afterwards are checked again
    with pytest.raises(cst.ParserSyntaxError):
        parse_module("def f(:\n")
