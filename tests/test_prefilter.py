"""The prefilter drops passes cheaply, and never one that would find a site or a skip.

Checked against the passes themselves: every fixture (and the cases below) migrated through the
prefilter must give what running every pass whose text trigger matches gives, site for site,
skip for skip, byte for byte; and each case the prefilter is meant to drop is dropped.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import libcst as cst
import pytest
from conftest import FIXTURES

from jaxmigrate.model import Options
from jaxmigrate.pipeline import prefilter as prefilter_module
from jaxmigrate.pipeline.engine import migrate_source, run_passes
from jaxmigrate.pipeline.prefilter import passes_for
from jaxmigrate.registry import all_passes
from jaxmigrate.toolkit.facts import AstFacts, parse

CASES = sorted(p for p in FIXTURES.glob("*/*.py") if not p.name.endswith(".expected.py"))

# Files only a precise second stage can tell apart, each with the passes that must survive it.
SOURCES = {
    "make_mesh_alias_bound_then_entered": (
        """
        import jax
        from jax import make_mesh as mm
        from jax.experimental.pjit import pjit
        from jax.sharding import PartitionSpec as P

        grid = mm((8,), ("i",))
        with grid:
            f = pjit(lambda x: x, in_shardings=P("i"))
        """,
        {"pjit", "with-mesh"},
    ),
    "mesh_annotated_parameter": (
        """
        import jax
        from jax.sharding import Mesh

        def run(m: Mesh, f, x):
            with m:
                return f(x)
        """,
        {"with-mesh"},
    ),
    "only_modern_mesh_contexts": (
        """
        import jax
        from jax.sharding import Mesh

        def run(mesh: Mesh, f, x, lock):
            with jax.set_mesh(mesh), lock:
                return f(x)
        """,
        set(),
    ),
    "callback_without_shard_map": (
        """
        import jax

        def f(x):
            jax.debug.print("{}", x)  # shard_map is only named in this comment
            return x
        """,
        set(),
    ),
    "host_callback_in_partial_auto_shard_map": (
        """
        import jax
        from jax.experimental import host_callback as hcb

        def body(v):
            return hcb.call(print, v)

        def build(mesh, P):
            return jax.shard_map(body, mesh=mesh, in_specs=P("a"), out_specs=P("a"),
                                 axis_names={"a"})
        """,
        {"host-callback", "partial-auto-callback"},
    ),
    # JM203 reports only a shard_map given `axis_names=` or arguments past its body other than
    # by keyword: one with every axis manual has nothing to do (JAX's tests/api_test.py).
    "callback_in_shard_map_with_every_axis_manual": (
        """
        import jax
        from functools import partial

        def body(v):
            return jax.pure_callback(print, v, v)

        def build(mesh, P):
            jax.shard_map(body, mesh=mesh, in_specs=P("a"), out_specs=P("a"))
            return partial(jax.shard_map, mesh=mesh, in_specs=P(), out_specs=P())(body)
        """,
        set(),
    ),
    "callback_in_shard_map_axis_names_through_an_alias": (
        """
        import jax as j
        smap = j.shard_map
        other = smap

        def body(v):
            return j.pure_callback(print, v, v)

        def build(mesh, P):
            return other(body, mesh=mesh, in_specs=P("a"), out_specs=P("a"), axis_names={"a"})
        """,
        {"partial-auto-callback"},
    ),
    "callback_in_partial_shard_map_with_a_positional_mesh": (
        """
        import jax
        from functools import partial as bind
        from jax import shard_map as sm

        def body(v):
            return jax.pure_callback(print, v, v)

        def build(mesh, P):
            return bind(sm, mesh, in_specs=P("a"), out_specs=P("a"))(body)
        """,
        {"partial-auto-callback"},
    ),
    "callback_in_shard_map_given_keywords_by_unpacking": (
        """
        import jax

        @jax.shard_map(**OPTIONS)
        def body(v):
            return jax.pure_callback(print, v, v)
        """,
        {"partial-auto-callback"},
    ),
}


def outcome(code: str, passes: list) -> tuple:
    module = cst.parse_module(code)
    new, run = run_passes(module, code, passes)
    sites = sorted((s.code, s.line, s.col, s.message) for s in run.sites)
    skips = sorted((s.code, s.line, s.col, s.reason) for s in run.skips)
    return new.code, sites, skips


def through_prefilter(code: str) -> tuple:
    result = migrate_source(code, options=Options(unsafe_fixes=True))
    sites = sorted((s.code, s.line, s.col, s.message) for s in result.sites)
    skips = sorted((s.code, s.line, s.col, s.reason) for s in result.skips)
    return result.code, sites, skips


@pytest.mark.parametrize("case", CASES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_the_prefilter_loses_nothing_on_fixtures(case: Path) -> None:
    code = case.read_text()
    assert through_prefilter(code) == outcome(code, all_passes())


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_the_second_stage_keeps_exactly_what_can_match(name: str) -> None:
    code, kept = SOURCES[name]
    code = textwrap.dedent(code)
    assert {p.NAME for p in passes_for(code, all_passes())} == kept
    assert through_prefilter(code) == outcome(code, all_passes())


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="the running Python parses PEP 695")
def test_pep_695_syntax_is_lowered_for_the_name_stage() -> None:
    code = textwrap.dedent(
        """
        import jax
        from jax import pmap as pm

        type Pair[T: jax.Array] = tuple[T, T]

        class Box[T, *Ts, **P]:
            def apply[U: (int, str) = pm](self, f: U) -> U:
                return f

        def unused[T](x: T) -> T:
            return x
        """
    )
    tree = parse(code)
    assert tree is not None
    # `pm`, read only in a type parameter's default, is still seen
    assert "jax.pmap" in AstFacts(tree).names
    assert [p.NAME for p in passes_for(code, all_passes())] == ["pmap"]


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="the running Python parses PEP 695")
def test_a_pep_695_file_without_legacy_names_is_dropped() -> None:
    code = "import jax\n\nclass Tracer[T: jax.Array]:\n    pmap = None  # pjit, shard_map\n"
    assert passes_for(code, all_passes()) == []


def test_the_prefilter_returns_its_parse_for_the_engine_to_reuse() -> None:
    from jaxmigrate.pipeline.prefilter import prefilter
    from jaxmigrate.registry import all_passes

    plain = "import jax\n\n\ndef f(x):\n    return x\n\n\ny = jax.pmap(f)\n"
    found = prefilter(plain, all_passes())
    assert [p.NAME for p in found.passes] == ["pmap"]
    assert found.outline == [(1, None), (4, None), (8, None)]
    # PEP 695 syntax is lowered before Python 3.11 parses it: no outline of the source as written
    lowered = "import jax\n\n\ndef f[T](x: T) -> T:\n    return x\n\n\ny = jax.pmap(f)\n"
    found = prefilter(lowered, all_passes())
    assert [p.NAME for p in found.passes] == ["pmap"]
    assert (found.outline is None) == (sys.version_info < (3, 12))
    assert prefilter("x = 1\n", all_passes()).passes == []


def test_a_file_naming_no_part_of_a_legacy_name_is_not_parsed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The name stage keeps a pass only for a module reading one of its `QUALNAMES`, every
    part of which is then written in the text: JAX's internals name `pxla` and `maps` (JM101's
    trigger) in hundreds of files that never name `Mesh` or `PartitionSpec`. Those are decided
    by plain text tests, without Python's parse (a fifth of the prefilter's parses of JAX's
    sources ended with no pass)."""
    parsed: list[str] = []
    original = prefilter_module.parse_exactly

    def recording(source: str) -> tuple:
        parsed.append(source)
        return original(source)

    monkeypatch.setattr(prefilter_module, "parse_exactly", recording)
    code = "from jax._src.interpreters import pxla\n\nmaps = pxla.shard_args  # maps each\n"
    assert passes_for(code, all_passes()) == []
    assert parsed == []
    named = code + "from jax.interpreters.pxla import Mesh\n"
    assert [p.NAME for p in passes_for(named, all_passes())] == ["legacy-imports"]
    assert parsed == [named]
